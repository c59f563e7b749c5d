/*
 * saxpy.cu -- the saxpy examples of saxpy.c on the GPU, as dlb_kernel
 * functions (built by meson into libdlb_example_cuda_kernels.so when nvcc is
 * found):
 *   dlb_kernel_cuda_saxpy      saxpy(a: float32, x: float32[n], y: mut float32[n])
 *   dlb_kernel_cuda_saxpy_out  saxpy(a: float32, x: float32[n], y: float32[n])
 *                                  -> float32[n]
 * The launch goes on the stream dlbridge passes (the caller's current
 * stream), so the kernel is ordered with the caller's own work and can be
 * captured into a CUDA graph; nothing synchronises.  `a` may be a 0-d
 * tensor in host memory (a Python number) or on the device; any element
 * strides and byte_offset work.
 */
#include "cuda_common.cuh"

/* a comes either by value or, when a_dev is not NULL, from device memory,
 * read inside the kernel so no host sync is needed. */
__global__ void saxpy_kernel(int64_t n, float a, const float *a_dev,
                             const float *x, int64_t sx, const float *y,
                             int64_t sy, float *out, int64_t so) {
  const float alpha = a_dev != NULL ? *a_dev : a;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i * so] = alpha * x[i * sx] + y[i * sy];
}

static int run_saxpy(DLTensor *const *args, int32_t nargs, int32_t want,
                     void *stream, const char *who, dlb_error *err) {
  int device;
  device_guard guard;
  if (nargs != want)
    return dlb_error_set(err, DLB_EINVAL, "%s takes %d arguments", who, (int)want);
  int rc = check_devices(args, nargs, 1u, who, &device, err);
  if (rc != DLB_OK) return rc;
  const DLTensor *A = args[0], *X = args[1], *Y = args[2], *O = args[nargs - 1];
  if (A->ndim != 0 || X->ndim != 1 || Y->ndim != 1 || O->ndim != 1 ||
      Y->shape[0] != X->shape[0] || O->shape[0] != X->shape[0])
    return dlb_error_set(err, DLB_EINVAL, "%s: expected a scalar and vectors of one length", who);
  const int64_t n = X->shape[0];
  if (n == 0) return DLB_OK;
  float a = 0.0f;
  const float *a_dev = NULL;
  if (on_gpu(A)) a_dev = (const float *)dlb_tensor_data(A);
  else a = *(const float *)dlb_tensor_data(A);
  rc = device_enter(&guard, device, who, err);
  if (rc != DLB_OK) return rc;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65535) blocks = 65535;
  saxpy_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(
      n, a, a_dev, (const float *)dlb_tensor_data(X), stride_of(X, 0),
      (const float *)dlb_tensor_data(Y), stride_of(Y, 0),
      (float *)dlb_tensor_data(O), stride_of(O, 0));
  rc = launch_status(who, err);
  device_leave(&guard);
  return rc;
}

EXPORT int dlb_kernel_cuda_saxpy(DLTensor *const *args, int32_t nargs,
                                 void *stream, dlb_error *err) {
  return run_saxpy(args, nargs, 3, stream, "cuda_saxpy", err);
}

EXPORT int dlb_kernel_cuda_saxpy_out(DLTensor *const *args, int32_t nargs,
                                     void *stream, dlb_error *err) {
  return run_saxpy(args, nargs, 4, stream, "cuda_saxpy_out", err);
}
