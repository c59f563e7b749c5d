/*
 * demo_c.c -- libdlbridge from plain C, no Python: build a tensor, describe
 * it, turn away a hostile one, and copy a transposed view into compact
 * memory.  `make demo` runs it.
 */
#include <stdio.h>
#include <string.h>

#include "dlbridge/dlbridge.h"

static void describe(const char *label, const DLTensor *t) {
  char dtype_name[32] = "?";
  int64_t numel = 0, nbytes = 0, scratch[DLB_MAX_NDIM];
  dlb_dtype_name(t->dtype, dtype_name, sizeof dtype_name, NULL);
  dlb_tensor_numel(t, &numel, NULL);
  dlb_tensor_nbytes(t, false, &nbytes, NULL);
  const int64_t *strides = dlb_tensor_strides(t, scratch);
  printf("%-10s %s on %s, shape (", label, dtype_name,
         dlb_device_type_name(t->device.device_type));
  for (int i = 0; i < t->ndim; i++) printf("%s%lld", i ? ", " : "", (long long)t->shape[i]);
  printf("), strides (");
  for (int i = 0; i < t->ndim; i++) printf("%s%lld", i ? ", " : "", (long long)strides[i]);
  printf("), %lld elements, %lld bytes, %s\n", (long long)numel,
         (long long)nbytes,
         dlb_tensor_is_contiguous(t) ? "row-major contiguous" : "not contiguous");
}

static void print_matrix(const DLTensor *t) {
  const float *p = (const float *)dlb_tensor_data(t);
  for (int64_t i = 0; i < t->shape[0]; i++) {
    printf("             ");
    for (int64_t j = 0; j < t->shape[1]; j++)
      printf(" %5.1f", p[i * t->strides[0] + j * t->strides[1]]);
    printf("\n");
  }
}

int main(void) {
  dlb_error err;
  DLManagedTensorVersioned *a = NULL, *at = NULL;
  int rc = 1;
  DLDataType f32;
  if (dlb_dtype_from_name("float32", &f32, &err) != DLB_OK) goto done;

  /* 1. An owning 2x3 float32 tensor, filled 0..5. */
  int64_t shape[2] = {2, 3};
  DLDevice cpu = {kDLCPU, 0};
  if (dlb_managed_empty(2, shape, f32, cpu, false, &a, &err) != DLB_OK) goto done;
  float *pa = (float *)a->dl_tensor.data;
  for (int i = 0; i < 6; i++) pa[i] = (float)i;
  describe("a", &a->dl_tensor);
  print_matrix(&a->dl_tensor);

  /* 2. Its transpose as a view: same memory, swapped shape and strides. */
  int64_t tshape[2] = {3, 2}, tstrides[2] = {1, 3};
  DLTensor view = a->dl_tensor;
  view.shape = tshape;
  view.strides = tstrides;
  describe("a.T", &view);

  /* 3. A hostile tensor, as a broken producer might send: the validator
   * names what is wrong instead of letting a consumer read past memory. */
  int64_t bad_shape[2] = {4, -3};
  DLTensor hostile = {pa, cpu, 2, f32, bad_shape, NULL, 0};
  if (dlb_tensor_validate(&hostile, 0, &err) != DLB_OK)
    printf("hostile    rejected: %s (%s)\n", err.message, dlb_status_name(err.code));
  int64_t huge[3] = {INT64_C(1) << 32, INT64_C(1) << 32, 16};
  hostile.shape = huge;
  hostile.ndim = 3;
  if (dlb_tensor_validate(&hostile, 0, &err) != DLB_OK)
    printf("hostile    rejected: %s (%s)\n", err.message, dlb_status_name(err.code));

  /* 4. Copy the transposed view into compact row-major memory. */
  if (dlb_managed_empty(2, tshape, f32, cpu, false, &at, &err) != DLB_OK) goto done;
  if (dlb_copy(&at->dl_tensor, &view, &err) != DLB_OK) goto done;
  describe("copy(a.T)", &at->dl_tensor);
  print_matrix(&at->dl_tensor);
  rc = 0;

done:
  if (rc != 0) fprintf(stderr, "demo failed: %s\n", err.message);
  dlb_managed_delete(at);
  dlb_managed_delete(a);
  return rc;
}
