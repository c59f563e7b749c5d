/*
 * testing.c -- kernels for dlbridge.Function's tests and benchmarks, in the
 * dlb_example_kernels module next to saxpy.c and matmul.c:
 *   dlb_kernel_noop        any signature; does nothing (call overhead)
 *   dlb_kernel_fail        any signature; fails with DLB_EINVAL and a message
 *   dlb_kernel_unsupported any signature; fails with DLB_EUNSUPPORTED, no message
 *   dlb_kernel_bad_status  any signature; returns 7, which the ABI forbids
 *   dlb_kernel_record      any signature; stores the stream and the first
 *                          argument's device in dlb_example_recorded
 *   dlb_kernel_describe    describe(x: T[...]) -> int64[k]: the device, rank and
 *                          strides x arrived with (compiled handlers' tests)
 *   dlb_kernel_copy        copy(x: T[...]) -> T[...]: the result is a copy of
 *                          x (dlb_copy), so tests can read what a 0-d
 *                          parameter received from a Python number
 */
#include "dlbridge/dlbridge.h"
#include <string.h>

#if defined(_WIN32)
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

EXPORT int dlb_kernel_noop(DLTensor *const *args, int32_t nargs, void *stream,
                           dlb_error *err) {
  (void)args;
  (void)nargs;
  (void)stream;
  (void)err;
  return DLB_OK;
}

EXPORT int dlb_kernel_fail(DLTensor *const *args, int32_t nargs, void *stream,
                           dlb_error *err) {
  (void)args;
  (void)stream;
  return dlb_error_set(err, DLB_EINVAL,
                       "fail was given %d tensors and refuses them all",
                       (int)nargs);
}

EXPORT int dlb_kernel_unsupported(DLTensor *const *args, int32_t nargs,
                                  void *stream, dlb_error *err) {
  (void)args;
  (void)nargs;
  (void)stream;
  (void)err;
  return DLB_EUNSUPPORTED;
}

EXPORT int dlb_kernel_bad_status(DLTensor *const *args, int32_t nargs,
                                 void *stream, dlb_error *err) {
  (void)args;
  (void)nargs;
  (void)stream;
  (void)err;
  return 7;
}

EXPORT int dlb_kernel_copy(DLTensor *const *args, int32_t nargs, void *stream,
                           dlb_error *err) {
  (void)stream;
  if (nargs != 2) return dlb_error_set(err, DLB_EINVAL, "copy takes 2 arguments");
  return dlb_copy(args[1], args[0], err);
}

/* probe(x: T[...]) -> int64[1]: writes the stream it was given into its
 * output with a plain host store.  For tests with the fake CUDA driver,
 * whose "device memory" is host memory: they check which stream Function
 * passes and where it allocated the output. */
EXPORT int dlb_kernel_stream_probe(DLTensor *const *args, int32_t nargs,
                                   void *stream, dlb_error *err) {
  if (nargs != 2)
    return dlb_error_set(err, DLB_EINVAL, "stream_probe takes 2 arguments");
  int64_t value = (int64_t)(uintptr_t)stream;
  memcpy((char *)args[1]->data + args[1]->byte_offset, &value, sizeof value);
  return DLB_OK;
}

/* describe(x: T[...]) -> int64[k]: writes what the kernel was given for x
 * into its int64 output (host stores, as many as fit): device type, device
 * id, ndim, whether strides is non-NULL, then the strides.  For the tests
 * of a compiler's handler (src/ops/xla.c): device, layout, strides. */
EXPORT int dlb_kernel_describe(DLTensor *const *args, int32_t nargs,
                               void *stream, dlb_error *err) {
  (void)stream;
  if (nargs != 2)
    return dlb_error_set(err, DLB_EINVAL, "describe takes 2 arguments");
  const DLTensor *x = args[0];
  const DLTensor *out = args[1];
  if (out->ndim != 1 || out->dtype.code != kDLInt || out->dtype.bits != 64)
    return dlb_error_set(err, DLB_EINVAL, "describe writes an int64 vector");
  int64_t facts[4 + DLB_MAX_NDIM];
  int64_t n = 0;
  facts[n++] = (int64_t)x->device.device_type;
  facts[n++] = (int64_t)x->device.device_id;
  facts[n++] = (int64_t)x->ndim;
  facts[n++] = x->strides != NULL;
  for (int32_t a = 0; x->strides != NULL && a < x->ndim && a < DLB_MAX_NDIM; a++)
    facts[n++] = x->strides[a];
  int64_t *dst = (int64_t *)dlb_tensor_data(out);
  for (int64_t i = 0; i < n && i < out->shape[0]; i++) dst[i] = facts[i];
  return DLB_OK;
}

/* record(...): any signature; touches no data.  Stores the stream it was
 * given and the device of its first argument in dlb_example_recorded
 * (stream, device type, device id, number of calls), which tests read with
 * ctypes: the stream a compiler's handler passes on a real GPU, where the
 * arguments are device memory the host cannot write. */
EXPORT int64_t dlb_example_recorded[4];

EXPORT int dlb_kernel_record(DLTensor *const *args, int32_t nargs,
                             void *stream, dlb_error *err) {
  (void)err;
  dlb_example_recorded[0] = (int64_t)(uintptr_t)stream;
  dlb_example_recorded[1] = nargs > 0 ? (int64_t)args[0]->device.device_type : -1;
  dlb_example_recorded[2] = nargs > 0 ? (int64_t)args[0]->device.device_id : -1;
  dlb_example_recorded[3]++;
  return DLB_OK;
}
