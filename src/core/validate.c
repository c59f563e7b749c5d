/* validate.c -- checks on DLTensors from producers we do not trust.
 *
 * Checks run in the order that makes each one safe: ndim before shape is
 * read, shape before anything multiplies extents, strides only after the
 * element count is known to fit.  Every failure names the field and value. */
#include <inttypes.h>

#include "internal.h"

/* The checks in their original order, for every tensor the fast path in
 * dlb_tensor_validate does not accept outright: it finds the first failing
 * check and writes its message, exactly as before the fast path existed. */
static int validate_slow(const DLTensor *t, unsigned options,
                                   dlb_error *err) {
  if (t == NULL) return dlb_error_set(err, DLB_EINVAL, "tensor is NULL");
  if (t->ndim < 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "ndim %" PRId32 " is negative: ndim must be >= 0",
                         t->ndim);
  /* Consumers keep shapes in DLB_MAX_NDIM-sized stack arrays. */
  if (t->ndim > DLB_MAX_NDIM)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "ndim %" PRId32 " exceeds DLB_MAX_NDIM (%d)", t->ndim,
                         DLB_MAX_NDIM);
  if (t->ndim > 0 && t->shape == NULL)
    return dlb_error_set(err, DLB_EINVAL,
                         "shape is NULL but ndim is %" PRId32, t->ndim);

  /* Rejects negative extents and an element count beyond int64. */
  int64_t numel;
  int rc = dlb_shape_numel(t->ndim, t->shape, &numel, err);
  if (rc != DLB_OK) return rc;

  if ((options & DLB_VALIDATE_STRIDES_REQUIRED) && t->ndim > 0 &&
      t->strides == NULL)
    return dlb_error_set(err, DLB_EINVAL,
                         "strides is NULL with ndim %" PRId32
                         ": DLPack >= 1.2 requires strides when ndim > 0",
                         t->ndim);

  if (!(options & DLB_VALIDATE_ANY_DTYPE)) {
    rc = dlb_dtype_check(t->dtype, err);
    if (rc != DLB_OK) return rc;
  } else if (t->dtype.bits == 0 || t->dtype.lanes == 0) {
    /* Even an unknown dtype needs a size, or no byte range can be checked. */
    char d[DLB_DESCRIBE_MAX];
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype %s: bits and lanes must be >= 1",
                         dlb_dtype_describe(t->dtype, d, sizeof d));
  }

  if (!(options & DLB_VALIDATE_ANY_DEVICE) &&
      !dlb_device_type_known((int32_t)t->device.device_type)) {
    char d[DLB_DESCRIBE_MAX];
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "device %s: not a known DLPack device type",
                         dlb_device_describe(t->device, d, sizeof d));
  }
  if (t->device.device_id < 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "device_id %" PRId32 " is negative",
                         t->device.device_id);

  if (t->byte_offset > (uint64_t)INT64_MAX)
    return dlb_error_set(err, DLB_EOVERFLOW,
                         "byte_offset %" PRIu64 " exceeds INT64_MAX",
                         t->byte_offset);

  int64_t nbytes;
  rc = dlb_dtype_storage_bytes(t->dtype, numel, false, &nbytes, err);
  if (rc != DLB_OK) return rc;

  /* Consumers synthesise row-major strides for NULL; they must fit even for
   * an empty tensor, whose byte span below never looks at them. */
  if (t->strides == NULL && t->ndim > 0) {
    int64_t scratch[DLB_MAX_NDIM];
    rc = dlb_strides_row_major(t->ndim, t->shape, scratch, err);
    if (rc != DLB_OK) return rc;
  }

  /* Also rejects sub-byte dtypes in non-contiguous layouts. */
  int64_t lo, hi;
  rc = dlb_tensor_byte_span(t, &lo, &hi, err);
  if (rc != DLB_OK) return rc;
  int64_t end, span;
  if (dlb__add_overflow(hi, (int64_t)t->byte_offset, &end))
    return dlb_error_set(err, DLB_EOVERFLOW,
                         "byte_offset %" PRIu64 " plus the byte span end %"
                         PRId64 " exceeds INT64_MAX",
                         t->byte_offset, hi);
  /* A span of more than INT64_MAX bytes is no memory and would overflow
   * every consumer's hi - lo (found by tests/fuzz/fuzz_validate). */
  if (dlb__sub_overflow(hi, lo, &span))
    return dlb_error_set(err, DLB_EOVERFLOW,
                         "the byte span [%" PRId64 ", %" PRId64
                         ") is longer than INT64_MAX bytes",
                         lo, hi);

  if (t->data == NULL && numel > 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "data is NULL but the tensor has %" PRId64
                         " elements",
                         numel);
  return DLB_OK;
}

/* DLPack device types dlb_device_type_known accepts, as a bit mask: 1-4
 * and 7-18.  Only a shortcut: a type missing here still gets the slow
 * path, which asks device.c. */
#define KNOWN_DEVICES_MASK 0x7FF9Eu

/* The common case, every check at once: each condition below is one of the
 * slow path's checks (or implied by them), and any that fails hands the
 * tensor on, in the end to validate_slow, which reports the first failure
 * in order.  So these only ever add a quicker "yes".  With careful false
 * nothing is called (the hot path stays in registers); careful true also
 * handles large values, sub-byte dtypes and empty tensors with NULL
 * strides. */
static inline bool validate_ok(const DLTensor *t, unsigned options,
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
  } else if (!dlb__dtype_known(dtype.code, dtype.bits)) {
    return false;
  }
  int32_t device_type = (int32_t)t->device.device_type;
  if (!(options & DLB_VALIDATE_ANY_DEVICE) &&
      ((uint32_t)device_type >= 32u ||
       ((KNOWN_DEVICES_MASK >> device_type) & 1u) == 0))
    return false;
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
    } else if (dlb__mul_overflow(numel, itemsize, &nbytes) |
               dlb__add_overflow(hi_e, 1, &hi_e) |
               dlb__mul_overflow(lo_e, itemsize, &lo_b) |
               dlb__mul_overflow(hi_e, itemsize, &hi_b)) {
      return false;
    } else if (dlb__sub_overflow(hi_b, lo_b, &nbytes)) {
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

/* Second try, out of line so the first stays small. */
static int validate_careful(const DLTensor *t, unsigned options,
                                      dlb_error *err) {
  if (validate_ok(t, options, true)) return DLB_OK;
  return validate_slow(t, options, err);
}

DLB__OUT_OF_LINE(int, validate_careful,
                 (const DLTensor *, unsigned, dlb_error *));

int dlb_tensor_validate(const DLTensor *t, unsigned options, dlb_error *err) {
  if (validate_ok(t, options, false)) return DLB_OK;
  return validate_careful_out_of_line(t, options, err);
}

int dlb_managed_check_version(const DLManagedTensorVersioned *m,
                              dlb_error *err) {
  if (m == NULL)
    return dlb_error_set(err, DLB_EINVAL, "managed tensor is NULL");
  if (m->version.major != DLPACK_MAJOR_VERSION)
    return dlb_error_set(err, DLB_EVERSION,
                         "DLPack version %" PRIu32 ".%" PRIu32
                         " has major %" PRIu32
                         ", but dlbridge speaks major %d: call the deleter "
                         "and read nothing else",
                         m->version.major, m->version.minor, m->version.major,
                         DLPACK_MAJOR_VERSION);
  return DLB_OK;
}
