/* validate.c -- checks on DLTensors from producers we do not trust.
 *
 * Checks run in the order that makes each one safe: ndim before shape is
 * read, shape before anything multiplies extents, strides only after the
 * element count is known to fit.  Every failure names the field and value. */
#include <inttypes.h>

#include "internal.h"
#include "validate_fast.h"

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

  /* A type without a name (newer than the header) is a foreign device:
   * accepted, its memory never read by the host (nothing here reads it). */
  if (!(options & DLB_VALIDATE_ANY_DEVICE) &&
      !dlb_device_type_valid((int32_t)t->device.device_type))
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "device type %" PRId32 " is not a DLPack device "
                         "type (types start at 1)",
                         (int32_t)t->device.device_type);
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

/* Second try, out of line so the first stays small. */
static int validate_careful(const DLTensor *t, unsigned options,
                                      dlb_error *err) {
  if (dlb__validate_ok(t, options, true)) return DLB_OK;
  return validate_slow(t, options, err);
}

DLB__OUT_OF_LINE(int, validate_careful,
                 (const DLTensor *, unsigned, dlb_error *));

int dlb_tensor_validate(const DLTensor *t, unsigned options, dlb_error *err) {
  if (dlb__validate_ok(t, options, false)) return DLB_OK;
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
