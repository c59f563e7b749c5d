#!/usr/bin/env bash
# gpu-check.sh -- build the core with cc and tests/cuda/gpu_check.cu and the
# example CUDA kernels with nvcc, then run the check on the real GPU.  For a
# GPU machine (no meson needed); prints one summary line at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${GPU_CHECK_BUILD:-/tmp/dlb-gpu-check}
mkdir -p "$B"
for f in src/core/*.c; do
  cc -std=c11 -O2 -fPIC -Wall -Wextra -Werror -Iinclude -c "$f" -o "$B/$(basename "$f" .c).o"
done
rm -f "$B/libdlbridge.a" && ar rcs "$B/libdlbridge.a" "$B"/*.o
ARCH=-gencode=arch=compute_75,code=[compute_75,sm_90]
nvcc -O2 -Iinclude $ARCH tests/cuda/gpu_check.cu "$B/libdlbridge.a" -ldl -lpthread -o "$B/gpu_check"
nvcc -shared -O2 --cudart static -Xcompiler -fPIC,-fvisibility=hidden -Iinclude $ARCH \
  examples/kernels/saxpy.cu examples/kernels/matmul.cu "$B/libdlbridge.a" \
  -o "$B/libdlb_example_cuda_kernels.so"
# NVRTC: the default names first; otherwise the toolkit's or pip's copy.
if [ -z "${DLB_CUDA_NVRTC:-}" ] && ! ldconfig -p | grep -q 'libnvrtc\.so\.1[0-9]'; then
  for c in /usr/local/cuda/lib64/libnvrtc.so.1[0-9] /usr/local/cuda*/lib64/libnvrtc.so.1[0-9]* \
           $(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.dirname(nvidia.cuda_nvrtc.__file__))' 2>/dev/null)/lib/libnvrtc.so.1[0-9]; do
    if [ -e "$c" ]; then export DLB_CUDA_NVRTC=$c; break; fi
  done
fi
echo "NVRTC: ${DLB_CUDA_NVRTC:-(default search)}"
DLB_EXAMPLE_CUDA_KERNELS="$B/libdlb_example_cuda_kernels.so" "$B/gpu_check"
