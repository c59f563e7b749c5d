/* validate.c -- checks on DLTensors from producers we do not trust.
 *
 * Checks run in the order that makes each one safe: ndim before shape is
 * read, shape before anything multiplies extents, strides only after the
 * element count is known to fit.  Every failure names the field and value. */
#include <inttypes.h>

#include "internal.h"

int dlb_tensor_validate(const DLTensor *t, unsigned options, dlb_error *err) {
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
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype (code %u, bits %u, lanes %u): bits and lanes "
                         "must be >= 1",
                         (unsigned)t->dtype.code, (unsigned)t->dtype.bits,
                         (unsigned)t->dtype.lanes);
  }

  if (!(options & DLB_VALIDATE_ANY_DEVICE) &&
      !dlb_device_type_known((int32_t)t->device.device_type))
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "device_type %d is not a known DLPack device type",
                         (int)t->device.device_type);
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
  if (hi > INT64_MAX - (int64_t)t->byte_offset)
    return dlb_error_set(err, DLB_EOVERFLOW,
                         "byte_offset %" PRIu64 " plus the byte span end %"
                         PRId64 " exceeds INT64_MAX",
                         t->byte_offset, hi);

  if (t->data == NULL && numel > 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "data is NULL but the tensor has %" PRId64
                         " elements",
                         numel);
  return DLB_OK;
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
