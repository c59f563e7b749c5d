/* copy.c -- dlb_copy: element-wise copy between any two strided layouts of
 * host-accessible memory.
 *
 * Plan: check compatibility; memmove when both sides are contiguous;
 * otherwise describe both tensors as one list of (extent, dst byte stride,
 * src byte stride) dims, drop extent-1 dims, order the dims by |dst stride|
 * (so writes walk dst's memory order), merge neighbours that are contiguous
 * in both tensors, and run an index-counter loop (no recursion, so ndim up
 * to DLB_MAX_NDIM costs no stack) whose innermost loop is specialised by
 * element size.  When src's most compact dim is not dst's, that dim and
 * dst's innermost are copied together in cache-sized tiles (see "tiling").
 * When the byte spans of dst and src overlap, src is first
 * gathered into a temporary compact buffer so the result is as if src had
 * been read before anything was written.
 *
 * Offsets are kept as int64_t and turned into pointers only for the element
 * being touched: walking a pointer past the ends of a tensor with negative
 * strides would be undefined behaviour even if never dereferenced.
 *
 * dtypes are compared exactly but not otherwise interpreted: any dtype whose
 * elements are whole bytes is copied as bytes (bits * lanes / 8 per
 * element), so vector and opaque types work.  Sub-byte types are copied only
 * between contiguous tensors, as packed data; a DLTensor cannot say it is
 * padded, so padded sub-byte data must be copied as uint8 by the caller.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* One dimension of the copy, strides in bytes. */
typedef struct copy_dim {
  int64_t n;
  int64_t ds;
  int64_t ss;
} copy_dim;

static int64_t abs64(int64_t v) { return v < 0 ? -v : v; }

/* Innermost loop, elements of fixed size K: memcpy of a constant size
 * compiles to a single load/store pair. */
#define COPY_RUN(K)                                                    \
  for (int64_t i = 0; i < n; i++) memcpy(d + i * ds, s + i * ss, (K)); \
  break

static void copy_run(char *d, const char *s, int64_t n, int64_t ds,
                     int64_t ss, size_t itemsize) {
  if (ds == (int64_t)itemsize && ss == (int64_t)itemsize) {
    memcpy(d, s, (size_t)n * itemsize);
    return;
  }
  switch (itemsize) {
    case 1: COPY_RUN(1);
    case 2: COPY_RUN(2);
    case 4: COPY_RUN(4);
    case 8: COPY_RUN(8);
    case 16: COPY_RUN(16);
    default:
      for (int64_t i = 0; i < n; i++) memcpy(d + i * ds, s + i * ss, itemsize);
      break;
  }
}

#undef COPY_RUN

/* outer == inner * n, decided without forming the product: n * inner may
 * overflow even though (n - 1) * inner fits in the span. */
static bool is_step(int64_t outer, int64_t inner, int64_t n) {
  if (inner == 0) return outer == 0;
  if (outer == INT64_MIN) return false; /* INT64_MIN % -1 traps */
  return outer % inner == 0 && outer / inner == n;
}

/* ---- tiling ---------------------------------------------------------------
 *
 * When the dim that is innermost for dst (smallest |dst stride|, "a") is not
 * the one innermost for src ("b"), a plain loop reads src with a large
 * stride: every element read touches a new cache line, and by the time the
 * loop comes back for the neighbouring element that line has been evicted
 * (a 4096x4096 float32 transpose runs at memory latency, ~7 ns an
 * element).  Copying in tiles over (a, b) keeps the source lines of one
 * tile in cache until every byte of them has been used, so each line is
 * fetched once, while the writes still run along dst's memory order.
 *
 * The tile is TILE_A_ELEMS elements along a by TILE_B_BYTES bytes along b.
 * The inner loop runs along a, so it keeps TILE_A_ELEMS src lines open at
 * once; with the power-of-two row strides that transposes usually have,
 * those lines all fall in the same L1 set, so their number (not their
 * bytes) must stay within the L1 associativity (8 ways on current x86-64
 * and Arm cores).  Along b, each open src line is then read to its end and
 * beyond before the tile moves on; 1 KiB along b measured best on AMD
 * Zen 4 for 1- to 16-byte elements (a 4096x4096 float32 transpose ~9x
 * faster than the plain loop); shorter tiles pay the per-tile overhead and
 * re-fetch partial lines more often, longer ones push the destination
 * lines out of L2. */
#define TILE_A_ELEMS 8
#define TILE_B_BYTES 1024
/* Tiling pays only when the plain loop's reads along a leave a cache line
 * between two elements. */
#define TILE_MIN_STRIDE 64

/* Elements along b per tile; at least a few, so that large elements still
 * get a tile rather than a column. */
static int64_t tile_b_extent(size_t itemsize) {
  int64_t t = TILE_B_BYTES / (int64_t)itemsize;
  return t < 4 ? 4 : t;
}

/* One tile: bn rows along b, each a run of an elements along a.  The
 * element size is a constant in each expansion, so every memcpy becomes a
 * single load/store pair. */
#define TILE_BODY(K)                                            \
  for (int64_t j = 0; j < bn; j++) {                            \
    char *dr = d + j * dsb;                                     \
    const char *sr = s + j * ssb;                               \
    for (int64_t i = 0; i < an; i++)                            \
      memcpy(dr + i * dsa, sr + i * ssa, (K));                  \
  }                                                             \
  break

static void copy_tile(char *d, const char *s, int64_t an, int64_t dsa,
                      int64_t ssa, int64_t bn, int64_t dsb, int64_t ssb,
                      size_t itemsize) {
  switch (itemsize) {
    case 1: TILE_BODY(1);
    case 2: TILE_BODY(2);
    case 4: TILE_BODY(4);
    case 8: TILE_BODY(8);
    case 16: TILE_BODY(16);
    default: TILE_BODY(itemsize);
  }
}

#undef TILE_BODY

/* Copy the 2-D block (a, b) tile by tile.  d/s address element (0, 0).
 * Offsets are formed as integers and added once, for an element that
 * exists (see the top of the file). */
static void copy_tiled2d(char *d, const char *s, const copy_dim *a,
                         const copy_dim *b, size_t itemsize) {
  const int64_t ta = TILE_A_ELEMS;
  const int64_t tb = tile_b_extent(itemsize);
  for (int64_t b0 = 0; b0 < b->n; b0 += tb) {
    int64_t bn = b->n - b0 < tb ? b->n - b0 : tb;
    for (int64_t a0 = 0; a0 < a->n; a0 += ta) {
      int64_t an = a->n - a0 < ta ? a->n - a0 : ta;
      copy_tile(d + (b0 * b->ds + a0 * a->ds), s + (b0 * b->ss + a0 * a->ss),
                an, a->ds, a->ss, bn, b->ds, b->ss, itemsize);
    }
  }
}

/* The dim (other than the last, "a") along which src is most compact, when
 * reading along a strides past a cache line and that dim would do better;
 * -1 when the plain loop is already cache-friendly for src.  Zero src
 * strides (broadcast) re-read one element and are never chosen. */
static int tile_partner(const copy_dim *dims, int nd) {
  const int64_t sa = abs64(dims[nd - 1].ss);
  if (sa <= TILE_MIN_STRIDE) return -1;
  int best = -1;
  int64_t best_ss = sa;
  for (int k = 0; k < nd - 1; k++) {
    int64_t ss = abs64(dims[k].ss);
    if (ss != 0 && ss < best_ss) {
      best = k;
      best_ss = ss;
    }
  }
  return best;
}

/* Copy element by element.  d0/s0 address element 0; dims as described
 * above, in logical order.  Every dim has n >= 1 and the tensor is
 * non-empty; byte strides times (n - 1) fit in int64_t (the caller checked
 * the byte spans). */
static void strided_copy(char *d0, const char *s0, int ndim,
                         const copy_dim *in, size_t itemsize) {
  copy_dim dims[DLB_MAX_NDIM];
  int nd = 0;

  /* Extent-1 dims move nothing; their strides may be anything. */
  for (int i = 0; i < ndim; i++) {
    if (in[i].n != 1) dims[nd++] = in[i];
  }
  if (nd == 0) {
    memcpy(d0, s0, itemsize);
    return;
  }

  /* Order outer to inner by |dst stride| descending.  Insertion sort:
   * stable, so dims with equal dst strides keep their logical order, and
   * ndim is at most 64. */
  for (int i = 1; i < nd; i++) {
    copy_dim key = dims[i];
    int j = i - 1;
    while (j >= 0 && abs64(dims[j].ds) < abs64(key.ds)) {
      dims[j + 1] = dims[j];
      j--;
    }
    dims[j + 1] = key;
  }

  /* Merge dim i into its inner neighbour when stepping the outer one is the
   * same as running on in the inner one, in both tensors. */
  int m = 0;
  for (int i = 1; i < nd; i++) {
    copy_dim *outer = &dims[m];
    const copy_dim *inner = &dims[i];
    if (is_step(outer->ds, inner->ds, inner->n) &&
        is_step(outer->ss, inner->ss, inner->n)) {
      outer->n *= inner->n;
      outer->ds = inner->ds;
      outer->ss = inner->ss;
    } else {
      dims[++m] = *inner;
    }
  }
  nd = m + 1;

  /* The kernel handles the innermost dim, plus src's innermost one when
   * tiling; the counter below walks the rest.  Removing the tile partner
   * keeps the others in their dst order. */
  const copy_dim inner = dims[nd - 1];
  const int partner = nd >= 2 ? tile_partner(dims, nd) : -1;
  copy_dim tiled = {0, 0, 0};
  int outer_nd = 0;
  for (int k = 0; k < nd - 1; k++) {
    if (k == partner) {
      tiled = dims[k];
    } else {
      dims[outer_nd++] = dims[k];
    }
  }

  int64_t idx[DLB_MAX_NDIM] = {0};
  int64_t doff = 0, soff = 0;
  for (;;) {
    if (partner >= 0) {
      copy_tiled2d(d0 + doff, s0 + soff, &inner, &tiled, itemsize);
    } else {
      copy_run(d0 + doff, s0 + soff, inner.n, inner.ds, inner.ss, itemsize);
    }
    /* Advance the outer index counter, innermost outer dim first. */
    int k = outer_nd - 1;
    while (k >= 0) {
      if (++idx[k] < dims[k].n) {
        doff += dims[k].ds;
        soff += dims[k].ss;
        break;
      }
      idx[k] = 0;
      doff -= dims[k].ds * (dims[k].n - 1);
      soff -= dims[k].ss * (dims[k].n - 1);
      k--;
    }
    if (k < 0) break;
  }
}

/* "(2, 3)"; truncated with "..." when it does not fit. */
static void shape_text(int32_t ndim, const int64_t *shape, char *buf,
                       size_t len) {
  size_t used = 0;
  int w = snprintf(buf, len, "(");
  used = (size_t)w;
  for (int32_t i = 0; i < ndim && used < len; i++) {
    w = snprintf(buf + used, len - used, "%s%lld", i ? ", " : "",
                 (long long)shape[i]);
    if (w < 0) break;
    used += (size_t)w;
  }
  if (used < len) {
    snprintf(buf + used, len - used, ndim == 1 ? ",)" : ")");
  } else if (len >= 4) {
    memcpy(buf + len - 4, "...", 4);
  }
}

static bool ranges_overlap(const DLTensor *dst, int64_t dlo, int64_t dhi,
                           const DLTensor *src, int64_t slo, int64_t shi) {
  /* Compare as integers: relational operators on pointers into different
   * objects are undefined in C. */
  uintptr_t d = (uintptr_t)dlb_tensor_data(dst);
  uintptr_t s = (uintptr_t)dlb_tensor_data(src);
  uintptr_t d_lo = d + (uintptr_t)dlo, d_hi = d + (uintptr_t)dhi;
  uintptr_t s_lo = s + (uintptr_t)slo, s_hi = s + (uintptr_t)shi;
  return d_lo < s_hi && s_lo < d_hi;
}

int dlb_copy(const DLTensor *dst, const DLTensor *src, dlb_error *err) {
  int rc = DLB_OK;
  void *tmp = NULL;
  int64_t dscratch[DLB_MAX_NDIM], sscratch[DLB_MAX_NDIM];

  if (dst == NULL || src == NULL) {
    rc = dlb_error_set(err, DLB_EINVAL, "dlb_copy: %s is NULL",
                       dst == NULL ? "dst" : "src");
    goto cleanup;
  }
  const DLTensor *sides[2] = {dst, src};
  for (int i = 0; i < 2; i++) {
    const char *which = i == 0 ? "dst" : "src";
    const DLTensor *t = sides[i];
    if (t->ndim < 0 || t->ndim > DLB_MAX_NDIM) {
      rc = dlb_error_set(err, t->ndim < 0 ? DLB_EINVAL : DLB_EUNSUPPORTED,
                         "dlb_copy: %s ndim is %d; it must be in [0, %d]",
                         which, (int)t->ndim, DLB_MAX_NDIM);
      goto cleanup;
    }
    if (t->ndim > 0 && t->shape == NULL) {
      rc = dlb_error_set(err, DLB_EINVAL,
                         "dlb_copy: %s shape is NULL but ndim is %d", which,
                         (int)t->ndim);
      goto cleanup;
    }
  }
  if (dst->dtype.code != src->dtype.code || dst->dtype.bits != src->dtype.bits ||
      dst->dtype.lanes != src->dtype.lanes) {
    char a[DLB_DESCRIBE_MAX], b[DLB_DESCRIBE_MAX];
    dlb_dtype_describe(dst->dtype, a, sizeof a);
    dlb_dtype_describe(src->dtype, b, sizeof b);
    rc = dlb_error_set(err, DLB_EINVAL,
                       "dlb_copy: dtype mismatch: dst is %s, src is %s; "
                       "convert the dtype first",
                       a, b);
    goto cleanup;
  }
  bool same_shape = dst->ndim == src->ndim;
  for (int32_t i = 0; same_shape && i < dst->ndim; i++) {
    same_shape = dst->shape[i] == src->shape[i];
  }
  if (!same_shape) {
    char a[96], b[96];
    shape_text(dst->ndim, dst->shape, a, sizeof a);
    shape_text(src->ndim, src->shape, b, sizeof b);
    rc = dlb_error_set(err, DLB_EINVAL,
                       "dlb_copy: shape mismatch: dst is %s, src is %s", a,
                       b);
    goto cleanup;
  }
  for (int i = 0; i < 2; i++) {
    if (!dlb_device_is_host_accessible(sides[i]->device)) {
      char d[DLB_DESCRIBE_MAX];
      rc = dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dlb_copy: %s is on %s, which the CPU cannot "
                         "address; copy device memory with the device API",
                         i == 0 ? "dst" : "src",
                         dlb_device_describe(sides[i]->device, d, sizeof d));
      goto cleanup;
    }
  }
  if ((uint32_t)dst->dtype.bits * dst->dtype.lanes == 0) {
    rc = dlb_error_set(err, DLB_EUNSUPPORTED,
                       "dlb_copy: dtype has bits %u and lanes %u; elements "
                       "of no size cannot be copied",
                       (unsigned)dst->dtype.bits, (unsigned)dst->dtype.lanes);
    goto cleanup;
  }

  int64_t numel = 0;
  rc = dlb_shape_numel(dst->ndim, dst->shape, &numel, err);
  if (rc != DLB_OK) goto cleanup;
  if (numel == 0) goto cleanup; /* nothing to copy; data may be NULL */
  if (dst->data == NULL || src->data == NULL) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "dlb_copy: %s data is NULL but the tensor has %lld "
                       "elements",
                       dst->data == NULL ? "dst" : "src", (long long)numel);
    goto cleanup;
  }

  const int32_t ndim = dst->ndim;
  const int64_t *dstr = dlb_tensor_strides(dst, dscratch);
  const int64_t *sstr = dlb_tensor_strides(src, sscratch);
  if (ndim > 0 && (dstr == NULL || sstr == NULL)) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "dlb_copy: the strides of %s could not be determined "
                       "(run dlb_tensor_validate on it)",
                       dstr == NULL ? "dst" : "src");
    goto cleanup;
  }
  for (int32_t i = 0; i < ndim; i++) {
    if (dstr[i] == 0 && dst->shape[i] > 1) {
      rc = dlb_error_set(err, DLB_EINVAL,
                         "dlb_copy: dst stride %d is 0 over extent %lld; a "
                         "broadcast destination would receive several "
                         "elements in one place",
                         (int)i, (long long)dst->shape[i]);
      goto cleanup;
    }
  }

  bool dcontig = dlb_tensor_is_contiguous(dst);
  bool scontig = dlb_tensor_is_contiguous(src);
  if (dcontig && scontig) {
    /* Same dtype and shape, both compact: the bytes are the same sequence.
     * memmove, because the two may overlap. */
    int64_t nbytes = 0;
    size_t n = 0;
    rc = dlb_dtype_storage_bytes(dst->dtype, numel, false, &nbytes, err);
    if (rc != DLB_OK) goto cleanup;
    if (dlb__size_overflow(nbytes, 0, &n)) {
      rc = dlb_error_set(err, DLB_EOVERFLOW,
                         "dlb_copy: %lld bytes do not fit in size_t",
                         (long long)nbytes);
      goto cleanup;
    }
    memmove(dlb_tensor_data(dst), dlb_tensor_data(src), n);
    goto cleanup;
  }
  if (dlb_dtype_is_subbyte(dst->dtype)) {
    rc = dlb_error_set(err, DLB_EUNSUPPORTED,
                       "dlb_copy: sub-byte elements (%u bits x %u lanes) can "
                       "only be copied between contiguous tensors; %s is "
                       "strided",
                       (unsigned)dst->dtype.bits, (unsigned)dst->dtype.lanes,
                       dcontig ? "src" : "dst");
    goto cleanup;
  }

  /* The spans also prove that every stride * (extent - 1) * itemsize fits
   * in int64_t, which strided_copy relies on. */
  int64_t dlo = 0, dhi = 0, slo = 0, shi = 0;
  rc = dlb_tensor_byte_span(dst, &dlo, &dhi, err);
  if (rc != DLB_OK) goto cleanup;
  rc = dlb_tensor_byte_span(src, &slo, &shi, err);
  if (rc != DLB_OK) goto cleanup;

  const size_t itemsize = (size_t)dlb_dtype_itemsize(dst->dtype);
  copy_dim dims[DLB_MAX_NDIM];
  for (int32_t i = 0; i < ndim; i++) {
    dims[i].n = dst->shape[i];
    /* Cannot overflow when n > 1 (span checked); n == 1 dims are dropped
     * before their strides are used, so their product is not formed. */
    dims[i].ds = dims[i].n > 1 ? dstr[i] * (int64_t)itemsize : 0;
    dims[i].ss = dims[i].n > 1 ? sstr[i] * (int64_t)itemsize : 0;
  }
  char *d0 = dlb_tensor_data(dst);
  const char *s0 = dlb_tensor_data(src);

  if (ranges_overlap(dst, dlo, dhi, src, slo, shi)) {
    /* Gather src into a compact buffer, then scatter into dst. */
    int64_t tmp_total = 0;
    size_t tmp_bytes = 0;
    if (dlb__mul_overflow(numel, (int64_t)itemsize, &tmp_total) ||
        dlb__size_overflow(tmp_total, 0, &tmp_bytes)) {
      rc = dlb_error_set(err, DLB_EOVERFLOW,
                         "dlb_copy: dst and src overlap and a %lld-element "
                         "temporary is too large to allocate",
                         (long long)numel);
      goto cleanup;
    }
    tmp = dlb__alloc(tmp_bytes);
    if (tmp == NULL) {
      rc = dlb_error_set(err, DLB_ENOMEM,
                         "dlb_copy: out of memory allocating a %zu-byte "
                         "temporary (dst and src overlap)",
                         tmp_bytes);
      goto cleanup;
    }
    /* Zeroed only to quiet -Wmaybe-uninitialized for ndim == 0, where the
     * loops below fill nothing and strided_copy reads nothing. */
    copy_dim tdims[DLB_MAX_NDIM] = {{0, 0, 0}};
    int64_t step = (int64_t)itemsize; /* <= tmp_total: cannot overflow */
    for (int32_t i = ndim - 1; i >= 0; i--) {
      tdims[i].n = dims[i].n;
      tdims[i].ds = step;
      tdims[i].ss = dims[i].ss;
      step *= dims[i].n;
    }
    strided_copy(tmp, s0, ndim, tdims, itemsize);
    for (int32_t i = 0; i < ndim; i++) tdims[i].ss = tdims[i].ds;
    for (int32_t i = 0; i < ndim; i++) tdims[i].ds = dims[i].ds;
    strided_copy(d0, tmp, ndim, tdims, itemsize);
    goto cleanup;
  }
  strided_copy(d0, s0, ndim, dims, itemsize);

cleanup:
  dlb__free(tmp);
  return rc;
}
