/*
 * internal.h -- helpers shared by the core's source files; not installed.
 */
#ifndef DLB_CORE_INTERNAL_H_
#define DLB_CORE_INTERNAL_H_

#include "dlbridge/dlbridge.h"

/* Allocate through the installed allocator.  Callers that hand memory to a
 * deleter which may run after the allocator changed must keep a copy of the
 * allocator (see managed.c) instead of calling dlb__free later. */
void *dlb__alloc(size_t size);
void dlb__free(void *ptr);

/* a * b into *out, false on int64 overflow.  a, b >= 0. */
static inline bool dlb__mul_nonneg(int64_t a, int64_t b, int64_t *out) {
  if (a != 0 && b > INT64_MAX / a) return false;
  *out = a * b;
  return true;
}

/* ---- hot-path helpers shared by layout.c, validate.c and dtype.c ----------
 * The fast paths below only ever answer "this input is certainly fine"; any
 * doubt sends the caller to its original, message-producing slow path, so
 * error codes and messages cannot drift between the two. */

/* The fast paths hand anything doubtful to a fallback that builds the
 * error message.  Inlined, that fallback bloats the hot function (measured:
 * dlb_tensor_validate 6 ns -> 9 ns per tensor), and standard C cannot say
 * "never inline".  A call through a volatile function pointer can: the
 * compiler must load the pointer at each call, so it cannot see the callee.
 * The load costs nothing on the fast path, which never makes the call. */
#define DLB__OUT_OF_LINE(ret, name, params) \
  static ret (*const volatile name##_out_of_line) params = name

/* Checked int64 arithmetic for any signs: true on overflow (the rare case,
 * so callers OR the flags together and branch once).  *out holds some value
 * even on overflow, so a loop may keep going and look at the flag later.
 * Plain C: measured against the compiler's overflow builtins, the fast
 * paths run no slower, because they only reach these helpers in the rare
 * "careful" tier. */
static inline bool dlb__mul_ovf(int64_t a, int64_t b, int64_t *out) {
  uint64_t ua = a < 0 ? 0u - (uint64_t)a : (uint64_t)a;
  uint64_t ub = b < 0 ? 0u - (uint64_t)b : (uint64_t)b;
  *out = 0;
  if (ub != 0 && ua > UINT64_MAX / ub) return true;
  uint64_t mag = ua * ub;
  if ((a < 0) != (b < 0) && mag != 0) {
    if (mag > (uint64_t)INT64_MAX + 1u) return true;
    *out = mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)(mag - 1u) - 1;
  } else {
    if (mag > (uint64_t)INT64_MAX) return true;
    *out = (int64_t)mag;
  }
  return false;
}

static inline bool dlb__add_ovf(int64_t a, int64_t b, int64_t *out) {
  *out = 0;
  if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b))
    return true;
  *out = a + b;
  return false;
}

/* Whether (code, bits) names a dtype in dtype.c's table, as one lookup.
 * Bit b of row `code` is set when that code allows b bits.  The table in
 * dtype.c stays the authority: dlb_dtype_check's slow path consults it, and
 * tests/c/test_dtype.c compares the two over every (code, bits) pair.
 * Code 3 (kDLOpaqueHandle) allows nothing. */
#define DLB__BITW(n, w) \
  ((n) != 0 && (n) / 64 == (w) ? (uint64_t)1 << ((n) % 64) : (uint64_t)0)
#define DLB__ALLOW(a, b, c, d, e)                                         \
  {DLB__BITW(a, 0) | DLB__BITW(b, 0) | DLB__BITW(c, 0) | DLB__BITW(d, 0) | \
       DLB__BITW(e, 0),                                                   \
   DLB__BITW(a, 1) | DLB__BITW(b, 1) | DLB__BITW(c, 1) | DLB__BITW(d, 1) | \
       DLB__BITW(e, 1),                                                   \
   DLB__BITW(a, 2) | DLB__BITW(b, 2) | DLB__BITW(c, 2) | DLB__BITW(d, 2) | \
       DLB__BITW(e, 2),                                                   \
   DLB__BITW(a, 3) | DLB__BITW(b, 3) | DLB__BITW(c, 3) | DLB__BITW(d, 3) | \
       DLB__BITW(e, 3)}
#define DLB__DTYPE_CODES 18

static inline bool dlb__dtype_known(unsigned code, unsigned bits) {
  static const uint64_t allowed[DLB__DTYPE_CODES][4] = {
      DLB__ALLOW(4, 8, 16, 32, 64),   /* kDLInt */
      DLB__ALLOW(4, 8, 16, 32, 64),   /* kDLUInt */
      DLB__ALLOW(16, 32, 64, 0, 0),   /* kDLFloat */
      DLB__ALLOW(0, 0, 0, 0, 0),      /* kDLOpaqueHandle */
      DLB__ALLOW(16, 0, 0, 0, 0),     /* kDLBfloat */
      DLB__ALLOW(32, 64, 128, 0, 0),  /* kDLComplex */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLBool */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e3m4 */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e4m3 */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e4m3b11fnuz */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e4m3fn */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e4m3fnuz */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e5m2 */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e5m2fnuz */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e8m0fnu */
      DLB__ALLOW(6, 0, 0, 0, 0),      /* kDLFloat6_e2m3fn */
      DLB__ALLOW(6, 0, 0, 0, 0),      /* kDLFloat6_e3m2fn */
      DLB__ALLOW(4, 0, 0, 0, 0),      /* kDLFloat4_e2m1fn */
  };
  /* bits is a uint8_t field, so bits / 64 < 4. */
  return code < DLB__DTYPE_CODES && bits < 256 &&
         ((allowed[code][bits / 64] >> (bits % 64)) & 1u) != 0;
}

/* One pass over the dims of a tensor whose ndim is in [0, DLB_MAX_NDIM] and
 * whose shape is non-NULL when ndim > 0: its element count and the lowest
 * and highest element offsets it reaches (strides NULL meaning row-major).
 * True only when every extent is >= 0 and everything the layout functions
 * would compute fits in int64: the count, for a non-empty tensor the span
 * (each (extent - 1) * stride and the running sums, in the order
 * dlb_tensor_byte_span adds them), and for NULL strides the row-major
 * strides a consumer would synthesise (checked even when empty).  False
 * means "take the slow path", never "invalid" by itself.  *lo_e and *hi_e
 * are 0 for an empty tensor.
 *
 * dlb__geometry_checked (layout.c) does this with every step checked.
 * dlb__geometry is a cheaper pass, exact whenever extents and strides are
 * small (nearly always), that calls nothing, so callers keep everything in
 * registers; it answers false when the values are too large for it, when
 * an extent is 0 while the product overflows, and for an empty tensor with
 * NULL strides: callers then try dlb__geometry_checked. */
bool dlb__geometry_checked(int32_t ndim, const int64_t *shape,
                           const int64_t *strides, int64_t *numel,
                           int64_t *lo_e, int64_t *hi_e);

/* With 0 <= extent < 2^29 and -2^28 <= stride < 2^28, every
 * (extent - 1) * stride is below 2^57 in magnitude, so no sum of at most
 * DLB_MAX_NDIM (2^6) of them can leave int64: the span needs no checks. */
#define DLB__SMALL_EXTENT ((uint64_t)1 << 29)
#define DLB__SMALL_STRIDE ((uint64_t)1 << 28)

static inline bool dlb__geometry(int32_t ndim, const int64_t *shape,
                                 const int64_t *strides, int64_t *numel,
                                 int64_t *lo_e, int64_t *hi_e) {
  /* The element count is kept exact without dividing: every extent here is
   * below 2^29 (or the pass gives up), so a running product below 2^34
   * cannot overflow when multiplied; one at or past 2^34 is flagged and
   * the careful pass, which checks every step, takes over. */
  const uint64_t count_limit = (uint64_t)1 << 34;
  uint64_t n = 1;
  bool ovf = false;
  if (strides != NULL) {
    /* Unsigned arithmetic: wraps instead of overflowing while the bounds
     * are unknown, and is exact once they hold. */
    uint64_t big = 0, lo = 0, hi = 0;
    for (int32_t i = 0; i < ndim; i++) {
      uint64_t e = (uint64_t)shape[i], s = (uint64_t)strides[i];
      big |= e | (s + DLB__SMALL_STRIDE);
      ovf |= n >= count_limit;
      n *= e;
      uint64_t reach = (e - 1u) * s;
      uint64_t neg = 0u - (reach >> 63); /* all ones when reach < 0 */
      lo += reach & neg;
      hi += reach & ~neg;
    }
    /* A zero extent with an overflowing product needs the careful pass,
     * as do large values. */
    if (big >= DLB__SMALL_EXTENT || ovf) return false;
    if (n == 0) {
      *numel = *lo_e = *hi_e = 0;
      return true;
    }
    *numel = (int64_t)n;
    /* lo is a two's complement value in (-2^63, 0]: negate its magnitude
     * rather than convert an out-of-range unsigned. */
    *lo_e = lo == 0 ? 0 : -(int64_t)(0u - lo);
    *hi_e = (int64_t)hi;
    return true;
  }
  uint64_t big = 0;
  for (int32_t i = 0; i < ndim; i++) {
    uint64_t e = (uint64_t)shape[i];
    big |= e; /* a negative extent sets the top bit */
    ovf |= n >= count_limit;
    n *= e;
  }
  /* With every extent in [0, 2^29) and no flag, n is the exact count: it is
   * 0 exactly when some extent is, and then the row-major strides need a
   * look of their own. */
  if (big >= DLB__SMALL_EXTENT || ovf || n == 0) return false;
  /* Non-empty row-major: offsets 0 .. numel - 1, and every stride (a
   * suffix product of the extents) fits because numel does. */
  *numel = (int64_t)n;
  *lo_e = 0;
  *hi_e = (int64_t)n - 1;
  return true;
}

#endif /* DLB_CORE_INTERNAL_H_ */
