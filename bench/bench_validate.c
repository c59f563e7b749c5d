/*
 * bench_validate.c -- nanoseconds per dlb_tensor_validate call on the tensors
 * the Python fast path sees on every exchange-table read: float32 CPU
 * tensors of 1, 2, 4 and 8 dims with explicit strides, and the same with
 * NULL strides (legacy producers).  Also the helpers validate used to call.
 *
 * Best of several runs: the minimum is the figure least disturbed by other
 * load on a shared machine.  The tensor is read through a volatile pointer
 * so the compiler cannot hoist the call out of the loop.
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dlbridge/dlbridge.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { ITERS = 2000000, REPS = 7 };

static float storage[4096];

/* Row-major strides of shape, as a producer like PyTorch exports them. */
static void row_major(int32_t ndim, const int64_t *shape, int64_t *strides) {
  int64_t step = 1;
  for (int32_t i = ndim - 1; i >= 0; i--) {
    strides[i] = step;
    step *= shape[i];
  }
}

typedef int (*case_fn)(DLTensor *t);

static int run_validate(DLTensor *t) {
  return dlb_tensor_validate(t, 0, NULL);
}

static int run_byte_span(DLTensor *t) {
  int64_t lo, hi;
  return dlb_tensor_byte_span(t, &lo, &hi, NULL);
}

static int run_numel(DLTensor *t) {
  int64_t n;
  return dlb_shape_numel(t->ndim, t->shape, &n, NULL);
}

static int run_dtype_check(DLTensor *t) {
  return dlb_dtype_check(t->dtype, NULL);
}

static double ns_per_call(DLTensor *t, case_fn fn) {
  DLTensor *volatile vt = t;
  double best = 1e30;
  for (int r = 0; r < REPS; r++) {
    int bad = 0;
    double t0 = now();
    for (int i = 0; i < ITERS; i++) bad |= fn(vt);
    double dt = now() - t0;
    if (bad != 0) {
      fprintf(stderr, "unexpected failure %d\n", bad);
      return -1.0;
    }
    if (dt < best) best = dt;
  }
  return best * 1e9 / ITERS;
}

int main(void) {
  static const int32_t ndims[] = {1, 2, 4, 8};
  static const int64_t extents[8] = {4, 3, 5, 2, 2, 3, 2, 2};
  static const struct {
    const char *name;
    case_fn fn;
  } fns[] = {
      {"validate", run_validate},
      {"byte_span", run_byte_span},
      {"shape_numel", run_numel},
      {"dtype_check", run_dtype_check},
  };
  printf("%-12s %-6s %12s %12s\n", "function", "ndim", "strides ns",
         "NULL ns");
  for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++) {
    for (size_t k = 0; k < sizeof ndims / sizeof ndims[0]; k++) {
      int32_t ndim = ndims[k];
      int64_t shape[8], strides[8];
      memcpy(shape, extents, sizeof shape);
      row_major(ndim, shape, strides);
      DLTensor t;
      memset(&t, 0, sizeof t);
      t.data = storage;
      t.device.device_type = kDLCPU;
      t.ndim = ndim;
      t.dtype.code = kDLFloat;
      t.dtype.bits = 32;
      t.dtype.lanes = 1;
      t.shape = shape;
      t.strides = strides;
      double with = ns_per_call(&t, fns[f].fn);
      t.strides = NULL;
      double without = ns_per_call(&t, fns[f].fn);
      if (with < 0 || without < 0) return 1;
      printf("%-12s %-6d %12.2f %12.2f\n", fns[f].name, (int)ndim, with,
             without);
    }
  }
  return 0;
}
