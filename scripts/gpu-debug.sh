#!/usr/bin/env bash
# debug: build, then all of tests/gpu in one pytest -v process, then gpu-check
cd "$(dirname "$0")/.."
GPU_CHECK_STAGES=build bash scripts/gpu-check > $OUT/build.log 2>&1
B=$PWD/build-gpu
export PYTHONPATH=$B/stage:$B/src/python
export DLB_EXAMPLE_CUDA_KERNELS=$B/libdlb_example_cuda_kernels.so
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 250 python3 -X faulthandler -m pytest -p no:cacheprovider -v --tb=short -rf tests/gpu "$@" > $OUT/all.log 2>&1
echo "all rc=$? $(tail -1 $OUT/all.log)"
grep -E "^FAILED|Fatal" $OUT/all.log | cut -c1-200
bash scripts/gpu-check > $OUT/check.log 2>&1
echo "check rc=$?"
sed -n '/===== summary/,$p' $OUT/check.log
