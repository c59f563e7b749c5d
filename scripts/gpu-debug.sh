#!/usr/bin/env bash
# debug: build, then each tests/gpu file in its own pytest -v process
cd "$(dirname "$0")/.."
GPU_CHECK_STAGES=build bash scripts/gpu-check > $OUT/build.log 2>&1
B=$PWD/build-gpu
export PYTHONPATH=$B/stage:$B/src/python
export DLB_EXAMPLE_CUDA_KERNELS=$B/libdlb_example_cuda_kernels.so
export XLA_PYTHON_CLIENT_PREALLOCATE=false
for f in tests/gpu/test_gpu_*.py; do
  n=$(basename $f .py)
  timeout 200 python3 -X faulthandler -m pytest -p no:cacheprovider -v --tb=short -rf $f "$@" > $OUT/$n.log 2>&1
  echo "$n rc=$? $(tail -1 $OUT/$n.log)"
done
