/*
 * autodiff.cu -- forward kernels and their vjp kernels on the GPU (built by
 * meson into libdlb_example_cuda_kernels.so with the other CUDA examples),
 * for the gradient checks of scripts/gpu-check (tests/gpu):
 *   dlb_kernel_cuda_mul_f32       mul(a: float32[n], b: float32[n]) -> (y: float32[n])
 *   dlb_kernel_cuda_mul_f32_vjp   derived: (a, b, dy) -> (da, db)
 *   dlb_kernel_cuda_softmax_f32_slow      softmax(x: float32[n]) -> (y: float32[n])
 *   dlb_kernel_cuda_softmax_f32_vjp_slow  spelled:
 *       softmax_vjp(y: float32[n], dy: float32[n]) -> (dx: float32[n])
 * The two softmax kernels first spin for SLOW_CYCLES GPU clock cycles
 * (milliseconds): the vjp reads the y the forward writes late, and the
 * framework reads the dx the vjp writes late, so a gradient is right only
 * when dlbridge launched both on the framework's stream of the moment
 * (the forward's, then the backward's) -- a launch on any other stream
 * reads memory not yet written.  Launches go on the stream dlbridge passes;
 * nothing synchronises.  Single-block softmax: these are checks, not speed.
 */
#include "cuda_common.cuh"

/* About 10 ms on a 1.5-2 GHz GPU. */
#define SLOW_CYCLES 20000000LL
#define SOFTMAX_THREADS 256

__device__ void spin(void) {
  const long long start = clock64();
  while (clock64() - start < SLOW_CYCLES) {
  }
}

__global__ void mul_kernel(int64_t n, const float *a, int64_t sa,
                           const float *b, int64_t sb, float *y, int64_t sy) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i * sy] = a[i * sa] * b[i * sb];
}

__global__ void mul_vjp_kernel(int64_t n, const float *a, int64_t sa,
                               const float *b, int64_t sb, const float *dy,
                               int64_t sdy, float *da, int64_t sda, float *db,
                               int64_t sdb) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    da[i * sda] = dy[i * sdy] * b[i * sb];
    db[i * sdb] = dy[i * sdy] * a[i * sa];
  }
}

/* The block's sum (op 0) or maximum (op 1) of v, in every thread. */
__device__ float block_reduce(float v, int op) {
  __shared__ float part[SOFTMAX_THREADS];
  part[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = SOFTMAX_THREADS / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float o = part[threadIdx.x + half];
      part[threadIdx.x] = op == 0 ? part[threadIdx.x] + o
                                  : fmaxf(part[threadIdx.x], o);
    }
    __syncthreads();
  }
  const float out = part[0];
  __syncthreads();
  return out;
}

__global__ void softmax_slow_kernel(int64_t n, const float *x, int64_t sx,
                                    float *y, int64_t sy) {
  if (threadIdx.x == 0) spin();
  __syncthreads();
  float top = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) top = fmaxf(top, x[i * sx]);
  top = block_reduce(top, 1);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    y[i * sy] = expf(x[i * sx] - top);
    sum += y[i * sy];
  }
  sum = block_reduce(sum, 0);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i * sy] /= sum;
}

/* dx = y (dy - <y, dy>) */
__global__ void softmax_vjp_slow_kernel(int64_t n, const float *y, int64_t sy,
                                        const float *dy, int64_t sdy, float *dx,
                                        int64_t sdx) {
  if (threadIdx.x == 0) spin();
  __syncthreads();
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dot += y[i * sy] * dy[i * sdy];
  dot = block_reduce(dot, 0);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    dx[i * sdx] = y[i * sy] * (dy[i * sdy] - dot);
}

/* The checks every entry starts with: the count, one CUDA device, 1-d
 * tensors of one length (*n). */
static int vectors(DLTensor *const *args, int32_t nargs, int32_t want,
                   const char *who, int *device, int64_t *n, dlb_error *err) {
  if (nargs != want)
    return dlb_error_set(err, DLB_EINVAL, "%s takes %d arguments", who, (int)want);
  int rc = check_devices(args, nargs, 0u, who, device, err);
  if (rc != DLB_OK) return rc;
  for (int32_t i = 0; i < nargs; i++)
    if (args[i]->ndim != 1 || args[i]->shape[0] != args[0]->shape[0])
      return dlb_error_set(err, DLB_EINVAL, "%s: expected vectors of one length", who);
  *n = args[0]->shape[0];
  return DLB_OK;
}

static unsigned grid_of(int64_t n) {
  int64_t blocks = (n + 255) / 256;
  return (unsigned)(blocks > 65535 ? 65535 : blocks < 1 ? 1 : blocks);
}

#define DATA(i) ((float *)dlb_tensor_data(args[i])), stride_of(args[i], 0)

EXPORT int dlb_kernel_cuda_mul_f32(DLTensor *const *args, int32_t nargs,
                                   void *stream, dlb_error *err) {
  int device;
  int64_t n;
  device_guard guard;
  int rc = vectors(args, nargs, 3, "cuda_mul_f32", &device, &n, err);
  if (rc != DLB_OK || n == 0) return rc;
  rc = device_enter(&guard, device, "cuda_mul_f32", err);
  if (rc != DLB_OK) return rc;
  mul_kernel<<<grid_of(n), 256, 0, (cudaStream_t)stream>>>(n, DATA(0), DATA(1),
                                                           DATA(2));
  rc = launch_status("cuda_mul_f32", err);
  device_leave(&guard);
  return rc;
}

EXPORT int dlb_kernel_cuda_mul_f32_vjp(DLTensor *const *args, int32_t nargs,
                                       void *stream, dlb_error *err) {
  int device;
  int64_t n;
  device_guard guard;
  int rc = vectors(args, nargs, 5, "cuda_mul_f32_vjp", &device, &n, err);
  if (rc != DLB_OK || n == 0) return rc;
  rc = device_enter(&guard, device, "cuda_mul_f32_vjp", err);
  if (rc != DLB_OK) return rc;
  mul_vjp_kernel<<<grid_of(n), 256, 0, (cudaStream_t)stream>>>(
      n, DATA(0), DATA(1), DATA(2), DATA(3), DATA(4));
  rc = launch_status("cuda_mul_f32_vjp", err);
  device_leave(&guard);
  return rc;
}

EXPORT int dlb_kernel_cuda_softmax_f32_slow(DLTensor *const *args,
                                            int32_t nargs, void *stream,
                                            dlb_error *err) {
  int device;
  int64_t n;
  device_guard guard;
  int rc = vectors(args, nargs, 2, "cuda_softmax_f32_slow", &device, &n, err);
  if (rc != DLB_OK || n == 0) return rc;
  rc = device_enter(&guard, device, "cuda_softmax_f32_slow", err);
  if (rc != DLB_OK) return rc;
  softmax_slow_kernel<<<1, SOFTMAX_THREADS, 0, (cudaStream_t)stream>>>(
      n, DATA(0), DATA(1));
  rc = launch_status("cuda_softmax_f32_slow", err);
  device_leave(&guard);
  return rc;
}

EXPORT int dlb_kernel_cuda_softmax_f32_vjp_slow(DLTensor *const *args,
                                                int32_t nargs, void *stream,
                                                dlb_error *err) {
  int device;
  int64_t n;
  device_guard guard;
  int rc = vectors(args, nargs, 3, "cuda_softmax_f32_vjp_slow", &device, &n, err);
  if (rc != DLB_OK || n == 0) return rc;
  rc = device_enter(&guard, device, "cuda_softmax_f32_vjp_slow", err);
  if (rc != DLB_OK) return rc;
  softmax_vjp_slow_kernel<<<1, SOFTMAX_THREADS, 0, (cudaStream_t)stream>>>(
      n, DATA(0), DATA(1), DATA(2));
  rc = launch_status("cuda_softmax_f32_vjp_slow", err);
  device_leave(&guard);
  return rc;
}
