/*
 * fuzz_validate.c -- libFuzzer target for dlb_tensor_validate and the
 * layout maths behind it.
 *
 * The input describes a DLTensor field by field (fuzz_input.h).  Whatever
 * the validator accepts must then be safe to use as the library promises:
 * its element count, byte span and size compute without overflow, and a
 * strided copy of it into a fresh contiguous tensor reads only the bytes of
 * the span -- the data pointer is placed in an allocation of exactly that
 * span, so AddressSanitizer reports any byte read outside it.
 */
#include <stdlib.h>

#include "dlbridge/dlbridge.h"
#include "fuzz_input.h"

/* Larger spans are valid but not worth allocating for a copy. */
#define SPAN_LIMIT (1 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void copy_out(const DLTensor *t) {
  int64_t lo = 0, hi = 0;
  if (dlb_device_is_host_accessible(t->device) == false) return;
  if (dlb_dtype_is_subbyte(t->dtype)) return;
  if (dlb_tensor_byte_span(t, &lo, &hi, NULL) != DLB_OK) abort();
  if (hi - lo > SPAN_LIMIT || hi < lo) return;
  /* Zero strides make a small span of many elements: the destination is
   * allocated compact, so bound its size too. */
  int64_t nbytes = 0;
  if (dlb_tensor_nbytes(t, false, &nbytes, NULL) != DLB_OK) abort();
  if (nbytes > SPAN_LIMIT) return;
  uint8_t *block = malloc((size_t)(hi - lo) + 1);
  if (block == NULL) return;
  DLTensor src = *t;
  src.device = (DLDevice){kDLCPU, 0};
  src.data = block - lo; /* element 0 lies -lo bytes into the block */
  src.byte_offset = 0;
  DLManagedTensorVersioned *dst = NULL;
  if (dlb_managed_empty(src.ndim, src.shape, src.dtype, src.device, false,
                        &dst, NULL) == DLB_OK) {
    if (dlb_copy(&dst->dl_tensor, &src, NULL) != DLB_OK) abort();
    dlb_managed_delete(dst);
  }
  free(block);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_input in = {data, size};
  int64_t shape[DLB_MAX_NDIM + 2], strides[DLB_MAX_NDIM + 2];
  static uint8_t backing[16];
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.ndim = (int8_t)fuzz_u8(&in) % (DLB_MAX_NDIM + 3);
  int has_strides = fuzz_u8(&in) & 1;
  int32_t stored = t.ndim > 0 ? t.ndim : 0;
  for (int32_t i = 0; i < stored; i++) {
    shape[i] = fuzz_dim(&in);
    strides[i] = fuzz_dim(&in);
  }
  t.shape = stored > 0 ? shape : NULL;
  t.strides = has_strides ? strides : NULL;
  t.dtype.code = fuzz_u8(&in);
  t.dtype.bits = fuzz_u8(&in);
  t.dtype.lanes = (uint16_t)(fuzz_u8(&in) | (fuzz_u8(&in) << 8));
  t.device.device_type = (DLDeviceType)(int8_t)fuzz_u8(&in);
  t.device.device_id = (int32_t)(int8_t)fuzz_u8(&in);
  t.byte_offset = (uint64_t)fuzz_dim(&in);
  t.data = (fuzz_u8(&in) & 1) ? backing : NULL;
  unsigned options = fuzz_u8(&in) & 7u;

  dlb_error err;
  if (dlb_tensor_validate(&t, options, &err) != DLB_OK) {
    /* A refusal always says why. */
    if (err.message[0] == '\0') abort();
    return 0;
  }
  int64_t numel = 0;
  if (dlb_tensor_numel(&t, &numel, NULL) != DLB_OK || numel < 0) abort();
  if ((options & DLB_VALIDATE_ANY_DTYPE) == 0 && t.data != NULL &&
      t.byte_offset == 0)
    copy_out(&t);
  return 0;
}
