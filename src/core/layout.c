/* layout.c -- element counts, strides, contiguity and byte spans.
 *
 * Everything here may be fed metadata from an untrusted producer, so every
 * product and sum is checked, no check divides by an extent (a zero extent
 * must not trap), and byte offsets are signed (negative strides reach
 * below element 0). */
#include "internal.h"

/* The checks of dlb_shape_numel in their original order, for inputs the
 * fast path below did not accept: produces every error and its message. */
static int shape_numel_slow(int32_t ndim, const int64_t *shape,
                                      int64_t *out, dlb_error *err) {
  if (ndim < 0)
    return dlb_error_set(err, DLB_EINVAL, "ndim %ld is negative", (long)ndim);
  if (ndim > 0 && shape == NULL)
    return dlb_error_set(err, DLB_EINVAL, "shape is NULL but ndim is %ld",
                         (long)ndim);
  if (out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "element count output is NULL");
  /* Look at every extent before multiplying: a zero anywhere makes the
   * product 0 even if the other extents alone would overflow, and a
   * negative extent must be reported wherever it is. */
  bool any_zero = false;
  for (int32_t i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return dlb_error_set(err, DLB_EINVAL,
                           "shape[%ld] is %lld: extents must be >= 0",
                           (long)i, (long long)shape[i]);
    if (shape[i] == 0) any_zero = true;
  }
  if (any_zero) {
    *out = 0;
    return DLB_OK;
  }
  int64_t n = 1;
  for (int32_t i = 0; i < ndim; i++) {
    if (dlb__mul_overflow(n, shape[i], &n))
      return dlb_error_set(err, DLB_EOVERFLOW,
                           "element count overflows int64 at shape[%ld] = %lld",
                           (long)i, (long long)shape[i]);
  }
  *out = n;
  return DLB_OK;
}

DLB__OUT_OF_LINE(int, shape_numel_slow,
                 (int32_t, const int64_t *, int64_t *, dlb_error *));

int dlb_shape_numel(int32_t ndim, const int64_t *shape, int64_t *out,
                    dlb_error *err) {
  /* One pass: a negative extent or (with no zero extent) an overflowing
   * product sends the call to the slow path, which reports it. */
  if (ndim >= 0 && (ndim == 0 || shape != NULL) && out != NULL) {
    int64_t n = 1, signs = 0;
    bool zero = false, ovf = false;
    for (int32_t i = 0; i < ndim; i++) {
      signs |= shape[i];
      zero |= shape[i] == 0;
      ovf |= dlb__mul_overflow(n, shape[i], &n);
    }
    if (signs >= 0 && (zero || !ovf)) {
      *out = zero ? 0 : n;
      return DLB_OK;
    }
  }
  return shape_numel_slow_out_of_line(ndim, shape, out, err);
}

bool dlb__geometry_checked(int32_t ndim, const int64_t *shape,
                           const int64_t *strides, int64_t *numel,
                           int64_t *lo_e, int64_t *hi_e) {
  int64_t n = 1, lo = 0, hi = 0, signs = 0;
  bool zero = false, ovf = false;
  if (strides != NULL) {
    for (int32_t i = 0; i < ndim; i++) {
      int64_t e = shape[i], reach;
      signs |= e;
      zero |= e == 0;
      ovf |= dlb__mul_overflow(n, e, &n);
      /* e <= 0 makes the span irrelevant (rejected or empty); clamping
       * keeps e - 1 from overflowing for INT64_MIN. */
      ovf |= dlb__mul_overflow(e > 0 ? e - 1 : 0, strides[i], &reach);
      ovf |= dlb__add_overflow(lo, reach < 0 ? reach : 0, &lo);
      ovf |= dlb__add_overflow(hi, reach > 0 ? reach : 0, &hi);
    }
    if (signs < 0) return false;
    if (zero) {
      *numel = *lo_e = *hi_e = 0;
      return true;
    }
    if (ovf) return false;
    *numel = n;
    *lo_e = lo;
    *hi_e = hi;
    return true;
  }
  for (int32_t i = 0; i < ndim; i++) {
    int64_t e = shape[i];
    signs |= e;
    zero |= e == 0;
    ovf |= dlb__mul_overflow(n, e, &n);
  }
  if (signs < 0) return false;
  if (zero) {
    /* Row-major strides step over a zero extent as if it were 1; their
     * largest is the product of the extents after dim 0. */
    int64_t step = 1;
    ovf = false;
    for (int32_t i = 1; i < ndim; i++)
      ovf |= dlb__mul_overflow(step, shape[i] == 0 ? 1 : shape[i], &step);
    if (ovf) return false;
    *numel = *lo_e = *hi_e = 0;
    return true;
  }
  if (ovf) return false;
  *numel = n;
  *lo_e = 0;
  *hi_e = n - 1;
  return true;
}

int dlb_strides_row_major(int32_t ndim, const int64_t *shape, int64_t *strides,
                          dlb_error *err) {
  if (ndim < 0)
    return dlb_error_set(err, DLB_EINVAL, "ndim %ld is negative", (long)ndim);
  if (ndim > 0 && (shape == NULL || strides == NULL))
    return dlb_error_set(err, DLB_EINVAL,
                         "%s is NULL but ndim is %ld",
                         shape == NULL ? "shape" : "strides", (long)ndim);
  for (int32_t i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return dlb_error_set(err, DLB_EINVAL,
                           "shape[%ld] is %lld: extents must be >= 0",
                           (long)i, (long long)shape[i]);
  }
  /* First pass only checks, so strides is written only on success. */
  int64_t step = 1;
  for (int32_t i = ndim - 1; i > 0; i--) {
    /* NumPy and PyTorch both step over a zero extent as if it were 1. */
    int64_t e = shape[i] == 0 ? 1 : shape[i];
    if (dlb__mul_overflow(step, e, &step))
      return dlb_error_set(err, DLB_EOVERFLOW,
                           "row-major stride of dim %ld overflows int64 "
                           "(shape[%ld] = %lld)",
                           (long)(i - 1), (long)i, (long long)shape[i]);
  }
  step = 1;
  for (int32_t i = ndim - 1; i >= 0; i--) {
    int64_t e = shape[i] == 0 ? 1 : shape[i]; /* read before strides may alias */
    strides[i] = step;
    step *= i > 0 ? e : 1;
  }
  return DLB_OK;
}

const int64_t *dlb_tensor_strides(const DLTensor *t, int64_t *scratch) {
  if (t == NULL || t->ndim <= 0 || t->ndim > DLB_MAX_NDIM || t->shape == NULL)
    return NULL;
  if (t->strides != NULL) return t->strides;
  if (scratch == NULL) return NULL;
  if (dlb_strides_row_major(t->ndim, t->shape, scratch, NULL) != DLB_OK)
    return NULL;
  return scratch;
}

int dlb_tensor_numel(const DLTensor *t, int64_t *out, dlb_error *err) {
  if (t == NULL) return dlb_error_set(err, DLB_EINVAL, "tensor is NULL");
  return dlb_shape_numel(t->ndim, t->shape, out, err);
}

int dlb_tensor_nbytes(const DLTensor *t, bool padded, int64_t *out,
                      dlb_error *err) {
  int64_t n;
  int rc = dlb_tensor_numel(t, &n, err);
  if (rc != DLB_OK) return rc;
  return dlb_dtype_storage_bytes(t->dtype, n, padded, out, err);
}

void *dlb_tensor_data(const DLTensor *t) {
  /* Pointer arithmetic on NULL is undefined; a NULL data pointer is only
   * legal for a tensor with no elements, which has no element 0 anyway. */
  if (t == NULL || t->data == NULL) return NULL;
  return (char *)t->data + t->byte_offset;
}

/* order > 0: row-major (last dim fastest); order < 0: column-major. */
static bool is_compact(const DLTensor *t, int order) {
  if (t == NULL || t->ndim < 0) return false;
  if (t->ndim == 0) return true;
  if (t->shape == NULL) return false;
  /* Every extent is looked at, so a negative one is never hidden behind a
   * zero that would otherwise make the tensor trivially compact. */
  bool empty = false;
  int32_t big = 0;
  for (int32_t i = 0; i < t->ndim; i++) {
    if (t->shape[i] < 0) return false;
    if (t->shape[i] == 0) empty = true;
    if (t->shape[i] > 1) big++;
  }
  if (empty) return true;
  /* NULL strides mean row-major, which is column-major as well only when
   * at most one dim has an extent above 1. */
  if (t->strides == NULL) return order > 0 || big <= 1;
  int64_t expected = 1;
  bool overflowed = false;
  for (int32_t k = 0; k < t->ndim; k++) {
    int32_t i = order > 0 ? t->ndim - 1 - k : k;
    /* A stride on an extent-1 dim is never used to reach an element. */
    if (t->shape[i] == 1) continue;
    /* Past int64 no stride can match; only fail if another dim needs one. */
    if (overflowed || t->strides[i] != expected) return false;
    overflowed = dlb__mul_overflow(expected, t->shape[i], &expected);
  }
  return true;
}

bool dlb_tensor_is_contiguous(const DLTensor *t) { return is_compact(t, 1); }

bool dlb_tensor_is_contiguous_f(const DLTensor *t) {
  return is_compact(t, -1);
}

bool dlb_tensor_is_dense(const DLTensor *t) {
  if (is_compact(t, 1)) return true;
  /* Not row-major: NULL strides, an empty tensor and every malformed shape
   * were answered above (is_compact calls them compact or refuses them),
   * except ndim beyond what the sort below holds. */
  if (t == NULL || t->strides == NULL || t->shape == NULL ||
      t->ndim > DLB_MAX_NDIM)
    return false;
  for (int32_t i = 0; i < t->ndim; i++)
    if (t->shape[i] < 0) return false;
  /* The dims that matter (extent > 1), sorted by stride, fastest first
   * (insertion sort: ndim is small); each stride must then be the product
   * of the extents of the faster ones. */
  int32_t order[DLB_MAX_NDIM];
  int32_t n = 0;
  for (int32_t i = 0; i < t->ndim; i++) {
    if (t->shape[i] <= 1) continue;
    int32_t k = n++;
    while (k > 0 && t->strides[order[k - 1]] > t->strides[i]) {
      order[k] = order[k - 1];
      k--;
    }
    order[k] = i;
  }
  int64_t expected = 1;
  for (int32_t k = 0; k < n; k++) {
    int32_t i = order[k];
    if (t->strides[i] != expected) return false;
    /* Past int64 no later stride can match. */
    if (dlb__mul_overflow(expected, t->shape[i], &expected) && k + 1 < n)
      return false;
  }
  return true;
}

/* The original dlb_tensor_byte_span, for every input the fast path below
 * does not take: produces every error and its message. */
static int byte_span_slow(const DLTensor *t, int64_t *lo,
                                    int64_t *hi, dlb_error *err) {
  if (t == NULL) return dlb_error_set(err, DLB_EINVAL, "tensor is NULL");
  if (lo == NULL || hi == NULL)
    return dlb_error_set(err, DLB_EINVAL, "byte span output is NULL");
  if (t->ndim > DLB_MAX_NDIM)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "ndim %ld exceeds DLB_MAX_NDIM (%d)", (long)t->ndim,
                         DLB_MAX_NDIM);
  int64_t n;
  int rc = dlb_tensor_numel(t, &n, err);
  if (rc != DLB_OK) return rc;
  if (n == 0) {
    *lo = 0;
    *hi = 0;
    return DLB_OK;
  }
  if (dlb_dtype_is_subbyte(t->dtype)) {
    char d[DLB_DESCRIBE_MAX];
    if (!dlb_tensor_is_contiguous(t))
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "sub-byte dtype %s in a non-contiguous layout: "
                           "elements smaller than a byte have no byte "
                           "address",
                           dlb_dtype_describe(t->dtype, d, sizeof d));
    /* Packed is DLPack's default for sub-byte data; the padded flag lives
     * on the managed tensor, which this function cannot see. */
    int64_t bytes;
    rc = dlb_dtype_storage_bytes(t->dtype, n, false, &bytes, err);
    if (rc != DLB_OK) return rc;
    *lo = 0;
    *hi = bytes;
    return DLB_OK;
  }
  int64_t itemsize = dlb_dtype_itemsize(t->dtype);
  if (itemsize == 0) {
    char d[DLB_DESCRIBE_MAX];
    return dlb_error_set(err, DLB_EINVAL, "dtype %s has zero-size elements",
                         dlb_dtype_describe(t->dtype, d, sizeof d));
  }
  int64_t scratch[DLB_MAX_NDIM];
  const int64_t *strides = dlb_tensor_strides(t, scratch);
  if (strides == NULL && t->ndim > 0)
    return dlb_error_set(err, DLB_EOVERFLOW,
                         "row-major strides for this shape overflow int64");
  /* Work in elements first, then scale once: the lowest and highest
   * element offsets, each a sum of (extent - 1) * stride over the dims. */
  int64_t lo_e = 0, hi_e = 0;
  for (int32_t i = 0; i < t->ndim; i++) {
    int64_t reach;
    bool ovf = dlb__mul_overflow(t->shape[i] - 1, strides[i], &reach);
    if (!ovf) ovf = reach < 0 ? dlb__add_overflow(lo_e, reach, &lo_e)
                              : dlb__add_overflow(hi_e, reach, &hi_e);
    if (ovf)
      return dlb_error_set(err, DLB_EOVERFLOW,
                           "byte span overflows int64 at dim %ld (shape %lld, "
                           "stride %lld)",
                           (long)i, (long long)t->shape[i],
                           (long long)strides[i]);
  }
  int64_t lo_b, hi_b;
  if (dlb__add_overflow(hi_e, 1, &hi_e) ||
      dlb__mul_overflow(lo_e, itemsize, &lo_b) ||
      dlb__mul_overflow(hi_e, itemsize, &hi_b))
    return dlb_error_set(err, DLB_EOVERFLOW,
                         "byte span of %lld-byte elements overflows int64",
                         (long long)itemsize);
  *lo = lo_b;
  *hi = hi_b;
  return DLB_OK;
}

/* Whole-byte elements, sane ndim and shape: the span from one pass over
 * the dims and two checked products.  careful selects the fully checked
 * pass.  False for sub-byte dtypes, zero-size elements and anything out of
 * range; the caller then falls back. */
static inline bool byte_span_ok(const DLTensor *t, int64_t *lo, int64_t *hi,
                                bool careful) {
  if (t == NULL || lo == NULL || hi == NULL || t->ndim < 0 ||
      t->ndim > DLB_MAX_NDIM || (t->ndim > 0 && t->shape == NULL))
    return false;
  int64_t n, lo_e, hi_e;
  if (!(careful ? dlb__geometry_checked(t->ndim, t->shape, t->strides, &n,
                                        &lo_e, &hi_e)
                : dlb__geometry(t->ndim, t->shape, t->strides, &n, &lo_e,
                                &hi_e)))
    return false;
  if (n == 0) {
    *lo = 0;
    *hi = 0;
    return true;
  }
  int64_t elem_bits = (int64_t)t->dtype.bits * t->dtype.lanes;
  int64_t lo_b, hi_b;
  if (elem_bits == 0 || elem_bits % 8 != 0)
    return false;
  /* All three checked, no branch between them; the int accumulator keeps
   * the order (hi_e + 1 first) that `a | b | c` on bools left unspecified. */
  int ovf = (int)dlb__add_overflow(hi_e, 1, &hi_e);
  ovf |= (int)dlb__mul_overflow(lo_e, elem_bits / 8, &lo_b);
  ovf |= (int)dlb__mul_overflow(hi_e, elem_bits / 8, &hi_b);
  if (ovf)
    return false;
  *lo = lo_b;
  *hi = hi_b;
  return true;
}

static int byte_span_careful(const DLTensor *t, int64_t *lo,
                                       int64_t *hi, dlb_error *err) {
  if (byte_span_ok(t, lo, hi, true)) return DLB_OK;
  return byte_span_slow(t, lo, hi, err);
}

DLB__OUT_OF_LINE(int, byte_span_careful,
                 (const DLTensor *, int64_t *, int64_t *, dlb_error *));

int dlb_tensor_byte_span(const DLTensor *t, int64_t *lo, int64_t *hi,
                         dlb_error *err) {
  if (byte_span_ok(t, lo, hi, false)) return DLB_OK;
  return byte_span_careful_out_of_line(t, lo, hi, err);
}

/* ---- overlap ------------------------------------------------------------------ */

/* The address of t's element 0, as an integer: data + byte_offset. */
static uint64_t element0(const DLTensor *t) {
  return (uint64_t)(uintptr_t)t->data + t->byte_offset;
}

/* Whether a and b (one device, one address of element 0) lay their
 * elements out alike: dtype, shape, and the strides of every dim of
 * extent > 1. */
static bool same_view(const DLTensor *a, const DLTensor *b) {
  if (a->dtype.code != b->dtype.code || a->dtype.bits != b->dtype.bits ||
      a->dtype.lanes != b->dtype.lanes || a->ndim != b->ndim)
    return false;
  int64_t sa_scratch[DLB_MAX_NDIM], sb_scratch[DLB_MAX_NDIM];
  const int64_t *sa = dlb_tensor_strides(a, sa_scratch);
  const int64_t *sb = dlb_tensor_strides(b, sb_scratch);
  for (int32_t i = 0; i < a->ndim; i++) {
    if (a->shape[i] != b->shape[i]) return false;
    if (a->shape[i] > 1 && (sa == NULL || sb == NULL || sa[i] != sb[i]))
      return false;
  }
  return true;
}

int dlb_tensor_overlap(const DLTensor *a, const DLTensor *b, int *out,
                       dlb_error *err) {
  if (out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "overlap output is NULL");
  if (a == NULL || b == NULL)
    return dlb_error_set(err, DLB_EINVAL, "tensor is NULL");
  int64_t alo, ahi, blo, bhi;
  int rc = dlb_tensor_byte_span(a, &alo, &ahi, err);
  if (rc != DLB_OK) return rc;
  rc = dlb_tensor_byte_span(b, &blo, &bhi, err);
  if (rc != DLB_OK) return rc;
  *out = DLB_OVERLAP_NONE;
  if (alo == ahi || blo == bhi ||
      a->device.device_type != b->device.device_type ||
      a->device.device_id != b->device.device_id)
    return DLB_OK;
  /* The ranges as addresses: two's complement wraps a negative lo
   * correctly; a tensor does not wrap around the address space. */
  uint64_t a0 = element0(a), b0 = element0(b);
  uint64_t as = a0 + (uint64_t)alo, ae = a0 + (uint64_t)ahi;
  uint64_t bs = b0 + (uint64_t)blo, be = b0 + (uint64_t)bhi;
  if (as >= be || bs >= ae) return DLB_OK;
  *out = a0 == b0 && same_view(a, b) ? DLB_OVERLAP_SAME : DLB_OVERLAP_PARTIAL;
  return DLB_OK;
}
