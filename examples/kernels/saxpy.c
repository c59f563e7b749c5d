/*
 * saxpy.c -- example kernels for dlbridge.Function (the dlb_kernel ABI in
 * dlbridge.h), built by meson as the shared module dlb_example_kernels and
 * loaded with dlbridge.load(path, "dlb_kernel_saxpy", signature).
 *
 * Each kernel trusts dlbridge for what the signature says (count, dtypes,
 * ndim, matching extents, writable `mut` parameters) and handles the rest
 * itself: any element strides, byte_offset (through dlb_tensor_data) and
 * NULL strides from producers that send them for compact tensors.
 *
 *   dlb_kernel_saxpy      saxpy(a: float32, x: float32[n], y: mut float32[n])
 *   dlb_kernel_saxpy_out  saxpy(a: float32, x: float32[n], y: float32[n])
 *                             -> float32[n]
 *   dlb_kernel_add3       add3(x: float32[n], y: float32[n], z: mut float32[n])
 * (testing.c holds the kernels the tests and benchmarks use.)
 */
#include "dlbridge/dlbridge.h"

#if defined(_WIN32)
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

/* Element stride of a 1-d tensor (NULL strides mean compact). */
static int64_t stride0(const DLTensor *t) {
  return t->strides != NULL ? t->strides[0] : 1;
}

static int host_only(DLTensor *const *args, int32_t nargs, const char *who,
                     dlb_error *err) {
  for (int32_t i = 0; i < nargs; i++)
    if (!dlb_device_is_host_accessible(args[i]->device))
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "%s runs on the CPU only (argument %d is not)", who,
                           (int)i);
  return DLB_OK;
}

EXPORT int dlb_kernel_saxpy(DLTensor *const *args, int32_t nargs, void *stream,
                            dlb_error *err) {
  (void)stream;
  if (nargs != 3) return dlb_error_set(err, DLB_EINVAL, "saxpy takes 3 arguments");
  int rc = host_only(args, nargs, "saxpy", err);
  if (rc != DLB_OK) return rc;
  const float a = *(const float *)dlb_tensor_data(args[0]);
  const float *x = (const float *)dlb_tensor_data(args[1]);
  float *y = (float *)dlb_tensor_data(args[2]);
  const int64_t n = args[1]->shape[0], sx = stride0(args[1]), sy = stride0(args[2]);
  for (int64_t i = 0; i < n; i++) y[i * sy] = a * x[i * sx] + y[i * sy];
  return DLB_OK;
}

EXPORT int dlb_kernel_saxpy_out(DLTensor *const *args, int32_t nargs,
                                void *stream, dlb_error *err) {
  (void)stream;
  if (nargs != 4) return dlb_error_set(err, DLB_EINVAL, "saxpy_out takes 4 arguments");
  int rc = host_only(args, nargs, "saxpy_out", err);
  if (rc != DLB_OK) return rc;
  const float a = *(const float *)dlb_tensor_data(args[0]);
  const float *x = (const float *)dlb_tensor_data(args[1]);
  const float *y = (const float *)dlb_tensor_data(args[2]);
  float *out = (float *)dlb_tensor_data(args[3]);
  const int64_t n = args[1]->shape[0];
  const int64_t sx = stride0(args[1]), sy = stride0(args[2]), so = stride0(args[3]);
  for (int64_t i = 0; i < n; i++) out[i * so] = a * x[i * sx] + y[i * sy];
  return DLB_OK;
}

EXPORT int dlb_kernel_add3(DLTensor *const *args, int32_t nargs, void *stream,
                           dlb_error *err) {
  (void)stream;
  if (nargs != 3) return dlb_error_set(err, DLB_EINVAL, "add3 takes 3 arguments");
  int rc = host_only(args, nargs, "add3", err);
  if (rc != DLB_OK) return rc;
  const float *x = (const float *)dlb_tensor_data(args[0]);
  const float *y = (const float *)dlb_tensor_data(args[1]);
  float *z = (float *)dlb_tensor_data(args[2]);
  const int64_t n = args[0]->shape[0];
  const int64_t sx = stride0(args[0]), sy = stride0(args[1]), sz = stride0(args[2]);
  for (int64_t i = 0; i < n; i++) z[i * sz] = x[i * sx] + y[i * sy];
  return DLB_OK;
}
