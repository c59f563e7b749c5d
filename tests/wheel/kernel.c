/*
 * kernel.c -- the wheel smoke test's kernel (scripts/wheel-smoke): built
 * with the system compiler before the compiler is taken out of reach, and
 * linked against nothing, so a Function can run in an environment that has
 * only the wheel.  Needs only dlbridge.h's types.
 *
 *   smoke_scale   scale(a: float32, x: float32[n]) -> float32[n]
 */
#include <string.h>

#include "dlbridge/dlbridge.h"

static const char *bytes_at(const DLTensor *t) {
  return (const char *)t->data + t->byte_offset;
}

__attribute__((visibility("default"))) int smoke_scale(DLTensor *const *args,
                                                       int32_t nargs,
                                                       void *stream,
                                                       dlb_error *err) {
  (void)stream;
  if (nargs != 3) {
    if (err != NULL) {
      err->code = DLB_EINVAL;
      strcpy(err->message, "scale takes 3 arguments");
    }
    return DLB_EINVAL;
  }
  const float a = *(const float *)bytes_at(args[0]);
  const DLTensor *x = args[1], *y = args[2];
  const int64_t sx = x->strides != NULL ? x->strides[0] : 1;
  const int64_t sy = y->strides != NULL ? y->strides[0] : 1;
  const float *xs = (const float *)bytes_at(x);
  float *ys = (float *)bytes_at(y);
  for (int64_t i = 0; i < x->shape[0]; i++) ys[i * sy] = a * xs[i * sx];
  return DLB_OK;
}
