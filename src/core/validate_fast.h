/*
 * validate_fast.h -- the fast path of dlb_tensor_validate, inline; not
 * installed.
 *
 * validate.c calls it first and falls back to the checks that name the
 * failure.  A hot caller inside this project that validates a foreign
 * tensor on every call (the extension's Function, three times per call on
 * torch tensors) includes it too: through a call the check cost ~5 ns per
 * tensor, inline with constant options about a third of that (measured on
 * Function with three torch tensors).  Such a caller calls
 * dlb_tensor_validate when this says no, for the exact error.
 */
#ifndef DLB_CORE_VALIDATE_FAST_H_
#define DLB_CORE_VALIDATE_FAST_H_

#include "internal.h"


/* The common case, every check at once: each condition below is one of the
 * slow path's checks (or implied by them), and any that fails hands the
 * tensor on, in the end to validate_slow, which reports the first failure
 * in order.  So these only ever add a quicker "yes".  With careful false
 * nothing is called (the hot path stays in registers); careful true also
 * handles large values, sub-byte dtypes and empty tensors with NULL
 * strides. */
static inline bool dlb__validate_ok(const DLTensor *t, unsigned options,
                               bool careful) {
  if (t == NULL) return false;
  int32_t ndim = t->ndim;
  const int64_t *shape = t->shape, *strides = t->strides;
  if (ndim < 0 || ndim > DLB_MAX_NDIM || (ndim > 0 && shape == NULL))
    return false;
  if ((options & DLB_VALIDATE_STRIDES_REQUIRED) && ndim > 0 &&
      strides == NULL)
    return false;
  DLDataType dtype = t->dtype;
  if (dtype.lanes == 0) return false;
  if (options & DLB_VALIDATE_ANY_DTYPE) {
    if (dtype.bits == 0) return false;
  } else if (!dlb__dtype_ok(dtype)) {
    return false;
  }
  int32_t device_type = (int32_t)t->device.device_type;
  /* dlb_device_type_valid's rule (>= 1), inline. */
  if (!(options & DLB_VALIDATE_ANY_DEVICE) && device_type < 1) return false;
  if (t->device.device_id < 0 || t->byte_offset > (uint64_t)INT64_MAX)
    return false;

  /* Count, span in elements, and the fit of synthesised row-major strides. */
  int64_t numel, lo_e, hi_e;
  if (!(careful ? dlb__geometry_checked(ndim, shape, strides, &numel, &lo_e,
                                        &hi_e)
                : dlb__geometry(ndim, shape, strides, &numel, &lo_e, &hi_e)))
    return false;
  /* Empty: no storage, no span, any data pointer. */
  if (numel == 0) return true;
  if (t->data == NULL) return false;

  /* bits, lanes >= 1 here, and bits * lanes <= 255 * 65535. */
  int64_t elem_bits = (int64_t)dtype.bits * dtype.lanes, hi_b;
  if (elem_bits % 8 == 0) {
    /* Storage is numel * itemsize; the span ends at (hi_e + 1) * itemsize
     * and starts at lo_e * itemsize; all three must fit. */
    int64_t itemsize = elem_bits / 8, nbytes, lo_b;
    /* Operands below 2^40 times an itemsize below 2^22 stay below 2^62:
     * the usual case needs no checked (dividing) multiply. */
    const int64_t small = (int64_t)1 << 40;
    if (numel < small && lo_e > -small && hi_e < small &&
        itemsize < ((int64_t)1 << 22)) {
      hi_b = (hi_e + 1) * itemsize;
    } else {
      /* All four checked, no branch between them; the int accumulator
       * keeps the order (hi_e + 1 before hi_e * itemsize). */
      int ovf = (int)dlb__mul_overflow(numel, itemsize, &nbytes);
      ovf |= (int)dlb__add_overflow(hi_e, 1, &hi_e);
      ovf |= (int)dlb__mul_overflow(lo_e, itemsize, &lo_b);
      ovf |= (int)dlb__mul_overflow(hi_e, itemsize, &hi_b);
      if (ovf)
        return false;
      if (dlb__sub_overflow(hi_b, lo_b, &nbytes))
        return false; /* a span longer than INT64_MAX bytes */
    }
  } else {
    /* Sub-byte: contiguous only, and the span is the packed storage. */
    if (!careful || !dlb_tensor_is_contiguous(t) ||
        dlb_dtype_storage_bytes(dtype, numel, false, &hi_b, NULL) != DLB_OK)
      return false;
  }
  int64_t end;
  return !dlb__add_overflow(hi_b, (int64_t)t->byte_offset, &end);
}

#endif /* DLB_CORE_VALIDATE_FAST_H_ */
