/*
 * matmul.c -- c = a @ b for float32 matrices of any strides, as a dlb_kernel:
 *     dlb_kernel_matmul  matmul(a: float32[m, k], b: float32[k, n])
 *                            -> float32[m, n]
 * Transposed, sliced, negatively strided and byte_offset views all work: the
 * kernel walks element strides from element 0 (dlb_tensor_data) and never
 * assumes a layout, so callers need not make copies.
 */
#include "dlbridge/dlbridge.h"

#if defined(_WIN32)
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

EXPORT int dlb_kernel_matmul(DLTensor *const *args, int32_t nargs, void *stream,
                             dlb_error *err) {
  (void)stream;
  if (nargs != 3) return dlb_error_set(err, DLB_EINVAL, "matmul takes 3 arguments");
  for (int32_t i = 0; i < nargs; i++) {
    if (!dlb_device_is_host_accessible(args[i]->device))
      return dlb_error_set(err, DLB_EUNSUPPORTED, "matmul runs on the CPU only");
    if (args[i]->ndim != 2)
      return dlb_error_set(err, DLB_EINVAL, "matmul takes matrices");
  }
  const DLTensor *A = args[0], *B = args[1], *C = args[2];
  int64_t sa_buf[DLB_MAX_NDIM], sb_buf[DLB_MAX_NDIM], sc_buf[DLB_MAX_NDIM];
  const int64_t *sa = dlb_tensor_strides(A, sa_buf);
  const int64_t *sb = dlb_tensor_strides(B, sb_buf);
  const int64_t *sc = dlb_tensor_strides(C, sc_buf);
  if (sa == NULL || sb == NULL || sc == NULL)
    return dlb_error_set(err, DLB_EINVAL, "matmul: malformed tensor");
  const int64_t m = A->shape[0], k = A->shape[1], n = B->shape[1];
  if (B->shape[0] != k || C->shape[0] != m || C->shape[1] != n)
    return dlb_error_set(err, DLB_EINVAL, "matmul: shapes do not agree");
  const float *a = (const float *)dlb_tensor_data(A);
  const float *b = (const float *)dlb_tensor_data(B);
  float *c = (float *)dlb_tensor_data(C);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) c[i * sc[0] + j * sc[1]] = 0.0f;
  /* i-p-j order: the inner loop runs along a row of b and c, which is the
   * contiguous direction for row-major operands. */
  for (int64_t i = 0; i < m; i++)
    for (int64_t p = 0; p < k; p++) {
      const float aip = a[i * sa[0] + p * sa[1]];
      for (int64_t j = 0; j < n; j++)
        c[i * sc[0] + j * sc[1]] += aip * b[p * sb[0] + j * sb[1]];
    }
  return DLB_OK;
}
