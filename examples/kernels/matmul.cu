/*
 * matmul.cu -- c = a @ b for float32 matrices of any strides on the GPU, a
 * shared-memory tiled kernel, as a dlb_kernel:
 *   dlb_kernel_cuda_matmul  matmul(a: float32[m, k], b: float32[k, n])
 *                               -> float32[m, n]
 * Each 16x16 block of threads computes a 16x16 tile of c, walking k in
 * tiles staged through shared memory, so each element of a and b is read
 * from global memory once per tile instead of once per product.  Strides
 * are honoured on all three operands (transposed and sliced views need no
 * copy).  Launched on the caller's stream; nothing synchronises.
 */
#include "cuda_common.cuh"

#define TILE 16

__global__ void matmul_kernel(int64_t m, int64_t n, int64_t k,
                              const float *a, int64_t sa0, int64_t sa1,
                              const float *b, int64_t sb0, int64_t sb1,
                              float *c, int64_t sc0, int64_t sc1) {
  __shared__ float ta[TILE][TILE];
  __shared__ float tb[TILE][TILE];
  const int64_t row = blockIdx.y * (int64_t)TILE + threadIdx.y;
  const int64_t col = blockIdx.x * (int64_t)TILE + threadIdx.x;
  float acc = 0.0f;
  for (int64_t p0 = 0; p0 < k; p0 += TILE) {
    const int64_t pa = p0 + threadIdx.x, pb = p0 + threadIdx.y;
    ta[threadIdx.y][threadIdx.x] = row < m && pa < k ? a[row * sa0 + pa * sa1] : 0.0f;
    tb[threadIdx.y][threadIdx.x] = pb < k && col < n ? b[pb * sb0 + col * sb1] : 0.0f;
    __syncthreads();
    for (int q = 0; q < TILE; q++) acc += ta[threadIdx.y][q] * tb[q][threadIdx.x];
    __syncthreads();
  }
  if (row < m && col < n) c[row * sc0 + col * sc1] = acc;
}

EXPORT int dlb_kernel_cuda_matmul(DLTensor *const *args, int32_t nargs,
                                  void *stream, dlb_error *err) {
  static const char who[] = "cuda_matmul";
  int device;
  device_guard guard;
  if (nargs != 3) return dlb_error_set(err, DLB_EINVAL, "%s takes 3 arguments", who);
  int rc = check_devices(args, nargs, 0u, who, &device, err);
  if (rc != DLB_OK) return rc;
  const DLTensor *A = args[0], *B = args[1], *C = args[2];
  if (A->ndim != 2 || B->ndim != 2 || C->ndim != 2)
    return dlb_error_set(err, DLB_EINVAL, "%s takes matrices", who);
  const int64_t m = A->shape[0], k = A->shape[1], n = B->shape[1];
  if (B->shape[0] != k || C->shape[0] != m || C->shape[1] != n)
    return dlb_error_set(err, DLB_EINVAL, "%s: shapes do not agree", who);
  if (m == 0 || n == 0) return DLB_OK;
  if ((m + TILE - 1) / TILE > 65535)
    return dlb_error_set(err, DLB_EUNSUPPORTED, "%s: m = %lld is too large", who, (long long)m);
  rc = device_enter(&guard, device, who, err);
  if (rc != DLB_OK) return rc;
  dim3 block(TILE, TILE);
  dim3 grid((unsigned)((n + TILE - 1) / TILE), (unsigned)((m + TILE - 1) / TILE));
  matmul_kernel<<<grid, block, 0, (cudaStream_t)stream>>>(
      m, n, k, (const float *)dlb_tensor_data(A), stride_of(A, 0), stride_of(A, 1),
      (const float *)dlb_tensor_data(B), stride_of(B, 0), stride_of(B, 1),
      (float *)dlb_tensor_data(C), stride_of(C, 0), stride_of(C, 1));
  rc = launch_status(who, err);
  device_leave(&guard);
  return rc;
}
