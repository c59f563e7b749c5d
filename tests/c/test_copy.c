/* test_copy.c -- dlb_copy against a naive reference on every layout we can
 * think of: transposed, negative strides, byte_offset, broadcast sources,
 * every element size, random 5-D permutations, overlapping spans, the tiled
 * transpose path at its tile edges, plus the errors and the allocation
 * failure of the overlap path. */
#include <stdint.h>
#include <string.h>

#include "check.h"

static const DLDevice CPU = {kDLCPU, 0};

/* Element types by size; 3, 6, 12 and 32 bytes take the generic path. */
static const DLDataType TYPES[] = {
    {kDLUInt, 8, 1},     /* 1 */
    {kDLFloat, 16, 1},   /* 2 */
    {kDLFloat, 32, 1},   /* 4 */
    {kDLFloat, 64, 1},   /* 8 */
    {kDLComplex, 128, 1},/* 16: complex128 */
    {kDLUInt, 8, 3},     /* 3: odd lanes */
    {kDLInt, 16, 3},     /* 6 */
    {kDLFloat, 32, 3},   /* 12 */
    {kDLFloat, 64, 4},   /* 32 */
};
#define NTYPES ((int)(sizeof TYPES / sizeof TYPES[0]))

/* ---- a deterministic random source ---------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng(void) {
  /* xorshift64*: good enough to pick layouts, reproducible. */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}

static int rnd(int n) { return (int)(rng() % (uint64_t)n); }

static void fill_random(unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)rng();
}

/* ---- the reference ---------------------------------------------------------- */

/* Element offsets (in elements) of the lowest and highest element. */
static void elem_range(int ndim, const int64_t *shape, const int64_t *strides,
                       int64_t *lo, int64_t *hi) {
  *lo = 0;
  *hi = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == 0) {
      *lo = *hi = 0;
      return;
    }
    int64_t r = (shape[i] - 1) * strides[i];
    if (r < 0) *lo += r; else *hi += r;
  }
}

/* Naive copy: visit every logical index, read from src_base (a snapshot, so
 * overlapping copies behave as if src were read first), write into
 * dst_base.  Byte offsets come from each tensor's byte_offset relative to
 * its arena base. */
static void ref_copy(unsigned char *dst_base, const DLTensor *dst,
                     const unsigned char *src_base, const DLTensor *src) {
  int ndim = dst->ndim;
  size_t isz = (size_t)dlb_dtype_itemsize(dst->dtype);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= dst->shape[i];
  int64_t idx[DLB_MAX_NDIM] = {0};
  int64_t ds[DLB_MAX_NDIM], ss[DLB_MAX_NDIM];
  CHECK(dlb_tensor_strides(dst, ds) != NULL || ndim == 0);
  const int64_t *dstr = ndim ? dlb_tensor_strides(dst, ds) : NULL;
  const int64_t *sstr = ndim ? dlb_tensor_strides(src, ss) : NULL;
  for (int64_t e = 0; e < n; e++) {
    int64_t doff = 0, soff = 0;
    for (int i = 0; i < ndim; i++) {
      doff += idx[i] * dstr[i];
      soff += idx[i] * sstr[i];
    }
    memcpy(dst_base + (int64_t)dst->byte_offset + doff * (int64_t)isz,
           src_base + (int64_t)src->byte_offset + soff * (int64_t)isz, isz);
    for (int i = ndim - 1; i >= 0; i--) {
      if (++idx[i] < dst->shape[i]) break;
      idx[i] = 0;
    }
  }
}

/* A tensor view over an arena, its shape and strides beside it. */
typedef struct view {
  DLTensor t;
  int64_t shape[DLB_MAX_NDIM];
  int64_t strides[DLB_MAX_NDIM];
} view;

/* Point v at arena with byte_offset chosen so its lowest element is at
 * `slack` bytes into the arena; returns the bytes the view needs. */
static size_t place(view *v, unsigned char *arena, int ndim, DLDataType dt,
                    size_t slack) {
  v->t.data = arena;
  v->t.device = CPU;
  v->t.ndim = ndim;
  v->t.dtype = dt;
  v->t.shape = v->shape;
  v->t.strides = v->strides;
  int64_t lo, hi;
  elem_range(ndim, v->shape, v->strides, &lo, &hi);
  int64_t isz = dlb_dtype_itemsize(dt);
  v->t.byte_offset = (uint64_t)(-lo * isz + (int64_t)slack);
  return (size_t)((hi - lo + 1) * isz) + slack;
}

/* Run dlb_copy(dst, src) where dst lives in darena and src in sarena (they
 * may be the same arena), and compare every byte of both arenas with the
 * reference.  Returns true when everything matched. */
static bool run_case(unsigned char *darena, size_t dbytes, const DLTensor *dst,
                     unsigned char *sarena, size_t sbytes,
                     const DLTensor *src) {
  unsigned char *snap = malloc(sbytes);
  unsigned char *expect = malloc(dbytes);
  if (snap == NULL || expect == NULL) {
    free(snap);
    free(expect);
    CHECK(!"test out of memory");
    return false;
  }
  memcpy(snap, sarena, sbytes);
  memcpy(expect, darena, dbytes);
  ref_copy(expect, dst, snap, src);
  dlb_error err;
  dlb_error_clear(&err);
  int rc = dlb_copy(dst, src, &err);
  bool ok = rc == DLB_OK && memcmp(darena, expect, dbytes) == 0;
  if (sarena != darena) ok = ok && memcmp(sarena, snap, sbytes) == 0;
  if (!ok) fprintf(stderr, "  dlb_copy rc %d (%s)\n", rc, err.message);
  free(snap);
  free(expect);
  return ok;
}

/* Random strides for shape: a random memory order, gaps, sign flips, and
 * (for sources) zero strides. */
static void random_strides(view *v, int ndim, bool allow_zero) {
  int order[DLB_MAX_NDIM];
  for (int i = 0; i < ndim; i++) order[i] = i;
  for (int i = ndim - 1; i > 0; i--) {
    int j = rnd(i + 1);
    int tmp = order[i];
    order[i] = order[j];
    order[j] = tmp;
  }
  int64_t running = 1 + rnd(2); /* sometimes every other element */
  for (int k = ndim - 1; k >= 0; k--) {
    int d = order[k];
    int64_t s = running;
    if (rnd(4) == 0) s = -s;
    if (allow_zero && rnd(6) == 0) s = 0;
    v->strides[d] = s;
    running *= v->shape[d] + rnd(2); /* sometimes a gap */
  }
}

/* ---- tests ------------------------------------------------------------------- */

static void test_contiguous(void) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {0};
  int64_t shape[2] = {2, 3};
  DLTensor src = {a, CPU, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
  int64_t st[2] = {3, 1};
  DLTensor dst = {b, CPU, 2, {kDLFloat, 32, 1}, shape, st, 0};
  CHECK_EQ(dlb_copy(&dst, &src, NULL), DLB_OK);
  CHECK(memcmp(a, b, sizeof a) == 0);
}

static void test_transposed(void) {
  double a[6] = {0, 1, 2, 3, 4, 5}, b[6] = {0};
  int64_t tshape[2] = {3, 2}, tstr[2] = {1, 3}; /* a viewed as a^T */
  int64_t dshape[2] = {3, 2};
  DLTensor src = {a, CPU, 2, {kDLFloat, 64, 1}, tshape, tstr, 0};
  DLTensor dst = {b, CPU, 2, {kDLFloat, 64, 1}, dshape, NULL, 0};
  CHECK_EQ(dlb_copy(&dst, &src, NULL), DLB_OK);
  double want[6] = {0, 3, 1, 4, 2, 5};
  CHECK(memcmp(b, want, sizeof b) == 0);
}

static void test_negative_and_offset(void) {
  int32_t a[8] = {0, 1, 2, 3, 4, 5, 6, 7}, b[10];
  for (int i = 0; i < 10; i++) b[i] = -1;
  /* src: a[6:0:-2] via byte_offset 24 and stride -2 -> 6, 4, 2, 0 */
  int64_t shape[1] = {4}, sstr[1] = {-2}, dstr[1] = {2};
  DLTensor src = {a, CPU, 1, {kDLInt, 32, 1}, shape, sstr, 24};
  /* dst: every other slot starting at b[1] */
  DLTensor dst = {b, CPU, 1, {kDLInt, 32, 1}, shape, dstr, 4};
  CHECK_EQ(dlb_copy(&dst, &src, NULL), DLB_OK);
  int32_t want[10] = {-1, 6, -1, 4, -1, 2, -1, 0, -1, -1};
  CHECK(memcmp(b, want, sizeof b) == 0);

  /* Negative strides on dst in 2-D: a flipped both ways. */
  int16_t m[6] = {1, 2, 3, 4, 5, 6}, out[6] = {0};
  int64_t shp[2] = {2, 3}, fst[2] = {-3, -1};
  DLTensor ms = {m, CPU, 2, {kDLInt, 16, 1}, shp, NULL, 0};
  DLTensor md = {out, CPU, 2, {kDLInt, 16, 1}, shp, fst, 5 * sizeof(int16_t)};
  CHECK_EQ(dlb_copy(&md, &ms, NULL), DLB_OK);
  int16_t wantm[6] = {6, 5, 4, 3, 2, 1};
  CHECK(memcmp(out, wantm, sizeof out) == 0);
}

static void test_broadcast_src(void) {
  float row[3] = {1, 2, 3}, out[12] = {0};
  int64_t shape[2] = {4, 3}, bst[2] = {0, 1};
  DLTensor src = {row, CPU, 2, {kDLFloat, 32, 1}, shape, bst, 0};
  DLTensor dst = {out, CPU, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
  CHECK_EQ(dlb_copy(&dst, &src, NULL), DLB_OK);
  for (int i = 0; i < 12; i++) CHECK_EQ(out[i], row[i % 3]);
  /* A scalar broadcast over everything. */
  float one = 7;
  int64_t zst[2] = {0, 0};
  src.data = &one;
  src.strides = zst;
  CHECK_EQ(dlb_copy(&dst, &src, NULL), DLB_OK);
  for (int i = 0; i < 12; i++) CHECK_EQ(out[i], 7);
  /* dst may have any stride over an extent-1 dim, 0 included. */
  int64_t s1[2] = {1, 3}, d1st[2] = {0, 1};
  DLTensor d1 = {out, CPU, 2, {kDLFloat, 32, 1}, s1, d1st, 0};
  DLTensor s1t = {row, CPU, 2, {kDLFloat, 32, 1}, s1, NULL, 0};
  CHECK_EQ(dlb_copy(&d1, &s1t, NULL), DLB_OK);
  CHECK_EQ(out[2], 3);
}

static void test_every_itemsize(void) {
  /* A strided copy (every other element, reversed) for each type size. */
  for (int ti = 0; ti < NTYPES; ti++) {
    DLDataType dt = TYPES[ti];
    view s, d;
    int nd = 2;
    s.shape[0] = d.shape[0] = 5;
    s.shape[1] = d.shape[1] = 7;
    s.strides[0] = -16;
    s.strides[1] = 2;
    d.strides[0] = 1;
    d.strides[1] = 5; /* column-major dst */
    unsigned char sa[4096], da[4096];
    fill_random(sa, sizeof sa);
    fill_random(da, sizeof da);
    size_t sb = place(&s, sa, nd, dt, 3);
    size_t db = place(&d, da, nd, dt, 0);
    CHECK(sb <= sizeof sa && db <= sizeof da);
    if (!run_case(da, sizeof da, &d.t, sa, sizeof sa, &s.t)) {
      fprintf(stderr, "  itemsize case %d failed\n", ti);
      CHECK(0);
    } else {
      CHECK(1);
    }
    /* And contiguous -> strided, strided -> contiguous 1-D. */
    view s1, d1;
    s1.shape[0] = d1.shape[0] = 9;
    s1.strides[0] = 1;
    d1.strides[0] = -3;
    fill_random(da, sizeof da);
    place(&s1, sa, 1, dt, 0);
    place(&d1, da, 1, dt, 1);
    CHECK(run_case(da, sizeof da, &d1.t, sa, sizeof sa, &s1.t));
    CHECK(run_case(sa, sizeof sa, &s1.t, da, sizeof da, &d1.t));
  }
}

static void test_random_5d(void) {
  /* 5-D tensors with random extents, permutations, gaps, signs and
   * broadcast sources against the naive reference. */
  enum { TRIALS = 600, ARENA = 1 << 16 };
  unsigned char *sa = malloc(ARENA), *da = malloc(ARENA);
  if (sa == NULL || da == NULL) {
    free(sa);
    free(da);
    CHECK(!"test out of memory");
    return;
  }
  int failures = 0, ran = 0;
  for (int trial = 0; trial < TRIALS; trial++) {
    DLDataType dt = TYPES[rnd(NTYPES)];
    int nd = trial % 7 == 0 ? 1 + rnd(5) : 5;
    view s, d;
    for (int i = 0; i < nd; i++) {
      s.shape[i] = d.shape[i] = 1 + rnd(trial % 11 == 0 ? 1 : 4);
    }
    if (trial % 50 == 0) s.shape[rnd(nd)] = d.shape[0] = 0; /* zero-size */
    for (int i = 0; i < nd; i++) d.shape[i] = s.shape[i];
    random_strides(&s, nd, true);
    random_strides(&d, nd, false);
    bool null_src_strides = rnd(5) == 0;
    if (null_src_strides) {
      /* Legacy-style NULL strides mean compact row-major. */
      CHECK_EQ(dlb_strides_row_major(nd, s.shape, s.strides, NULL), DLB_OK);
    }
    fill_random(sa, ARENA);
    fill_random(da, ARENA);
    size_t sb = place(&s, sa, nd, dt, (size_t)rnd(8));
    size_t db = place(&d, da, nd, dt, (size_t)rnd(8));
    if (sb > ARENA || db > ARENA) continue;
    if (null_src_strides) s.t.strides = NULL;
    if (!run_case(da, ARENA, &d.t, sa, ARENA, &s.t)) failures++;
    ran++;
  }
  CHECK_EQ(failures, 0);
  CHECK(ran > TRIALS / 2); /* the arena was big enough for most layouts */
  free(sa);
  free(da);
}

/* ---- the tiled path ----------------------------------------------------------
 *
 * copy.c tiles a transpose-like copy TILE_A_ELEMS = 8 elements along dst's
 * innermost dim by TILE_B_BYTES = 1024 bytes along src's.  The extents below
 * straddle those edges and those of nearby tunings (16, 32, 64). */

static const int64_t TILE_EDGES[] = {1, 2, 7, 8, 9, 31, 32, 33, 63, 64, 65, 200};
#define NEDGES ((int)(sizeof TILE_EDGES / sizeof TILE_EDGES[0]))

/* Itemsizes 1, 2, 4, 8, 16 and 3: the specialised kernels and the generic
 * one. */
static const int TILE_TYPES[] = {0, 1, 2, 3, 4, 5};
#define NTILE_TYPES ((int)(sizeof TILE_TYPES / sizeof TILE_TYPES[0]))

/* dlb_copy of a rows x cols transpose (src column-major, gap elements
 * between its columns; dst row-major with dgap between rows), with the
 * signs of the four strides taken from the low bits of `flips`, against the
 * reference.  Arenas are sized to the views, with slack on both sides, so
 * ASan and valgrind see any stray access. */
static bool transpose_case(DLDataType dt, int64_t rows, int64_t cols,
                           int64_t gap, int64_t dgap, unsigned flips) {
  view s, d;
  s.shape[0] = d.shape[0] = rows;
  s.shape[1] = d.shape[1] = cols;
  s.strides[0] = 1;
  s.strides[1] = rows + gap;
  d.strides[0] = cols + dgap;
  d.strides[1] = 1;
  if (flips & 1u) s.strides[0] = -s.strides[0];
  if (flips & 2u) s.strides[1] = -s.strides[1];
  if (flips & 4u) d.strides[0] = -d.strides[0];
  if (flips & 8u) d.strides[1] = -d.strides[1];
  size_t sb = place(&s, NULL, 2, dt, 5) + 5;
  size_t db = place(&d, NULL, 2, dt, 7) + 7;
  unsigned char *sa = malloc(sb), *da = malloc(db);
  if (sa == NULL || da == NULL) {
    free(sa);
    free(da);
    CHECK(!"test out of memory");
    return false;
  }
  s.t.data = sa;
  d.t.data = da;
  fill_random(sa, sb);
  fill_random(da, db);
  bool ok = run_case(da, db, &d.t, sa, sb, &s.t);
  if (!ok) {
    fprintf(stderr,
            "  transpose %lldx%lld itemsize %lld gap %lld/%lld flips %u\n",
            (long long)rows, (long long)cols,
            (long long)dlb_dtype_itemsize(dt), (long long)gap,
            (long long)dgap, flips);
  }
  free(sa);
  free(da);
  return ok;
}

static void test_tiled_edges(void) {
  int failures = 0;
  unsigned k = 0;
  for (int ti = 0; ti < NTILE_TYPES; ti++) {
    DLDataType dt = TYPES[TILE_TYPES[ti]];
    for (int r = 0; r < NEDGES; r++) {
      for (int c = 0; c < NEDGES; c++, k++) {
        /* Every sign combination comes round for each itemsize; a gap
         * makes short columns strided enough to be tiled too. */
        int64_t gap = (k / 16) % 2 ? 17 : 0;
        if (!transpose_case(dt, TILE_EDGES[r], TILE_EDGES[c], gap, k % 3,
                            k % 16)) {
          failures++;
        }
      }
    }
  }
  CHECK_EQ(failures, 0);
}

static void test_tiled_long_edge(void) {
  /* Around the tile edge along src's contiguous dim, in elements of each
   * size: 1024 bytes / itemsize (at least 4), one and two tiles. */
  int failures = 0;
  unsigned k = 0;
  for (int ti = 0; ti < NTILE_TYPES; ti++) {
    DLDataType dt = TYPES[TILE_TYPES[ti]];
    int64_t isz = dlb_dtype_itemsize(dt);
    int64_t tb = 1024 / isz < 4 ? 4 : 1024 / isz;
    const int64_t rows[] = {tb - 1, tb, tb + 1, 2 * tb + 1};
    const int64_t cols[] = {3, 8, 9, 17};
    for (int i = 0; i < 4; i++) {
      for (int j = 0; j < 4; j++, k++) {
        if (!transpose_case(dt, rows[i], cols[j], 0, 0, k % 16)) failures++;
      }
    }
  }
  CHECK_EQ(failures, 0);
}

static void test_random_permuted(void) {
  /* 2- to 4-D tensors large enough to be tiled, random memory orders for
   * both sides, gaps, signs and zero src strides, against the reference. */
  enum { TRIALS = 300, ARENA = 1 << 20 };
  unsigned char *sa = malloc(ARENA), *da = malloc(ARENA);
  if (sa == NULL || da == NULL) {
    free(sa);
    free(da);
    CHECK(!"test out of memory");
    return;
  }
  int failures = 0, ran = 0;
  for (int trial = 0; trial < TRIALS; trial++) {
    DLDataType dt = TYPES[rnd(NTYPES)];
    int nd = 2 + rnd(3);
    static const int max_extent[5] = {0, 0, 90, 24, 10};
    view s, d;
    for (int i = 0; i < nd; i++) {
      s.shape[i] = d.shape[i] = 1 + rnd(max_extent[nd]);
    }
    random_strides(&s, nd, true);
    random_strides(&d, nd, false);
    size_t sb = place(&s, sa, nd, dt, (size_t)rnd(8));
    size_t db = place(&d, da, nd, dt, (size_t)rnd(8));
    if (sb > ARENA || db > ARENA) continue;
    fill_random(sa, sb);
    fill_random(da, db);
    if (!run_case(da, db, &d.t, sa, sb, &s.t)) failures++;
    ran++;
  }
  CHECK_EQ(failures, 0);
  CHECK(ran > TRIALS / 2);
  free(sa);
  free(da);
}

static void test_tiled_overlap(void) {
  /* In-place transposes big enough to tile: both halves of the temporary
   * round trip (gather, scatter) run the tiled path. */
  int failures = 0;
  for (int ti = 0; ti < NTILE_TYPES; ti++) {
    DLDataType dt = TYPES[TILE_TYPES[ti]];
    view s, d;
    s.shape[0] = s.shape[1] = d.shape[0] = d.shape[1] = 67;
    s.strides[0] = 1;
    s.strides[1] = 67;
    d.strides[0] = 67;
    d.strides[1] = 1;
    size_t bytes = place(&s, NULL, 2, dt, 0);
    place(&d, NULL, 2, dt, 0);
    unsigned char *a = malloc(bytes);
    if (a == NULL) {
      CHECK(!"test out of memory");
      return;
    }
    s.t.data = d.t.data = a;
    fill_random(a, bytes);
    if (!run_case(a, bytes, &d.t, a, bytes, &s.t)) failures++;
    free(a);
  }
  CHECK_EQ(failures, 0);
}

static void test_overlap(void) {
  /* In-place transpose of a square matrix: src and dst are the same bytes
   * in different orders. */
  float m[16];
  for (int i = 0; i < 16; i++) m[i] = (float)i;
  int64_t shape[2] = {4, 4}, tst[2] = {1, 4};
  DLTensor src = {m, CPU, 2, {kDLFloat, 32, 1}, shape, tst, 0};
  DLTensor dst = {m, CPU, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
  failing_allocator_install(-1);
  long base = failing_allocator_live();
  CHECK_EQ(dlb_copy(&dst, &src, NULL), DLB_OK);
  CHECK_EQ(failing_allocator_total(), 1); /* the temporary */
  CHECK_EQ(failing_allocator_live(), base);
  failing_allocator_remove();
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) CHECK_EQ(m[i * 4 + j], (float)(j * 4 + i));

  /* Contiguous overlap, shifted by one element: memmove semantics. */
  int32_t v[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  int64_t n[1] = {8};
  DLTensor vs = {v, CPU, 1, {kDLInt, 32, 1}, n, NULL, 0};
  DLTensor vd = {v, CPU, 1, {kDLInt, 32, 1}, n, NULL, 4};
  CHECK_EQ(dlb_copy(&vd, &vs, NULL), DLB_OK);
  int32_t want[9] = {0, 0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(memcmp(v, want, sizeof v) == 0);

  /* Reverse in place (strided overlap). */
  int64_t rst[1] = {-1};
  int32_t r[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  DLTensor rs = {r, CPU, 1, {kDLInt, 32, 1}, n, rst, 7 * 4};
  DLTensor rd = {r, CPU, 1, {kDLInt, 32, 1}, n, NULL, 0};
  CHECK_EQ(dlb_copy(&rd, &rs, NULL), DLB_OK);
  for (int i = 0; i < 8; i++) CHECK_EQ(r[i], 7 - i);

  /* Random overlapping layouts within one arena, against the reference
   * (which reads a snapshot). */
  enum { ARENA = 1 << 14 };
  unsigned char *a = malloc(ARENA);
  if (a == NULL) {
    CHECK(!"test out of memory");
    return;
  }
  int failures = 0;
  for (int trial = 0; trial < 300; trial++) {
    DLDataType dt = TYPES[rnd(NTYPES)];
    int nd = 1 + rnd(4);
    view s, d;
    for (int i = 0; i < nd; i++) s.shape[i] = d.shape[i] = 1 + rnd(4);
    random_strides(&s, nd, true);
    random_strides(&d, nd, false);
    fill_random(a, ARENA);
    size_t sb = place(&s, a, nd, dt, (size_t)rnd(64));
    size_t db = place(&d, a, nd, dt, (size_t)rnd(64));
    if (sb > ARENA || db > ARENA) continue;
    if (!run_case(a, ARENA, &d.t, a, ARENA, &s.t)) failures++;
  }
  CHECK_EQ(failures, 0);
  free(a);
}

static void test_overlap_enomem(void) {
  float m[16], orig[16];
  for (int i = 0; i < 16; i++) m[i] = orig[i] = (float)i;
  int64_t shape[2] = {4, 4}, tst[2] = {1, 4};
  DLTensor src = {m, CPU, 2, {kDLFloat, 32, 1}, shape, tst, 0};
  DLTensor dst = {m, CPU, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
  bool succeeded = false;
  for (long k = 0; k < 8 && !succeeded; k++) {
    failing_allocator_install(k);
    long base = failing_allocator_live();
    dlb_error err;
    int rc = dlb_copy(&dst, &src, &err);
    CHECK_EQ(failing_allocator_live(), base);
    if (rc == DLB_OK) {
      succeeded = true;
      CHECK_EQ(k, 1);
      CHECK_EQ(m[1], 4.0f);
    } else {
      CHECK_EQ(rc, DLB_ENOMEM);
      CHECK_EQ(err.code, DLB_ENOMEM);
      CHECK_MSG(err, "out of memory");
      CHECK_MSG(err, "overlap");
      CHECK(memcmp(m, orig, sizeof m) == 0); /* nothing written */
    }
    failing_allocator_remove();
  }
  CHECK(succeeded);
}

static void test_no_alloc_without_overlap(void) {
  /* Strided copies between distinct buffers never allocate. */
  float a[12], b[12];
  for (int i = 0; i < 12; i++) a[i] = (float)i;
  int64_t shape[2] = {3, 4}, st[2] = {1, 3};
  DLTensor src = {a, CPU, 2, {kDLFloat, 32, 1}, shape, st, 0};
  DLTensor dst = {b, CPU, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
  failing_allocator_install(0);
  CHECK_EQ(dlb_copy(&dst, &src, NULL), DLB_OK);
  CHECK_EQ(failing_allocator_total(), 0);
  failing_allocator_remove();
  CHECK_EQ(b[1], 3.0f);

  /* Nor does the tiled path. */
  enum { T = 100 };
  static double ta[T * T], tb[T * T];
  for (int i = 0; i < T * T; i++) ta[i] = (double)i;
  int64_t tshape[2] = {T, T}, tst[2] = {1, T};
  DLTensor tsrc = {ta, CPU, 2, {kDLFloat, 64, 1}, tshape, tst, 0};
  DLTensor tdst = {tb, CPU, 2, {kDLFloat, 64, 1}, tshape, NULL, 0};
  failing_allocator_install(0);
  CHECK_EQ(dlb_copy(&tdst, &tsrc, NULL), DLB_OK);
  CHECK_EQ(failing_allocator_total(), 0);
  failing_allocator_remove();
  CHECK_EQ(tb[1], (double)T);
  CHECK_EQ(tb[T * T - 2], (double)(T * T - 1 - T));
}

static void test_zero_d_and_empty(void) {
  /* 0-d: one element, shape and strides NULL. */
  double x = 2.5, y = 0;
  DLTensor s0 = {&x, CPU, 0, {kDLFloat, 64, 1}, NULL, NULL, 0};
  DLTensor d0 = {&y, CPU, 0, {kDLFloat, 64, 1}, NULL, NULL, 0};
  CHECK_EQ(dlb_copy(&d0, &s0, NULL), DLB_OK);
  CHECK_EQ(y, 2.5);

  /* Zero elements: success with NULL data and arbitrary strides. */
  int64_t shape[2] = {0, 3}, junk[2] = {0, 0};
  DLTensor se = {NULL, CPU, 2, {kDLFloat, 32, 1}, shape, junk, 0};
  DLTensor de = {NULL, CPU, 2, {kDLFloat, 32, 1}, shape, junk, 0};
  CHECK_EQ(dlb_copy(&de, &se, NULL), DLB_OK);

  /* All extents 1 with odd strides. */
  int64_t ones[3] = {1, 1, 1}, odd[3] = {-7, 0, 99};
  float a = 4, b = 0;
  DLTensor s1 = {&a, CPU, 3, {kDLFloat, 32, 1}, ones, odd, 0};
  DLTensor d1 = {&b, CPU, 3, {kDLFloat, 32, 1}, ones, odd, 0};
  CHECK_EQ(dlb_copy(&d1, &s1, NULL), DLB_OK);
  CHECK_EQ(b, 4.0f);
}

static void test_subbyte(void) {
  /* Packed int4, contiguous: 5 elements are 3 bytes; byte 4 untouched. */
  unsigned char a[4] = {0x21, 0x43, 0x05, 0xEE}, b[4] = {0, 0, 0, 0x77};
  int64_t shape[1] = {5};
  DLDataType i4 = {kDLInt, 4, 1};
  DLTensor s = {a, CPU, 1, i4, shape, NULL, 0};
  DLTensor d = {b, CPU, 1, i4, shape, NULL, 0};
  CHECK_EQ(dlb_copy(&d, &s, NULL), DLB_OK);
  CHECK_EQ(b[0], 0x21);
  CHECK_EQ(b[1], 0x43);
  CHECK_EQ(b[2], 0x05);
  CHECK_EQ(b[3], 0x77);

  /* Strided sub-byte: refused. */
  int64_t st[1] = {2};
  int64_t sh3[1] = {3};
  DLTensor ss = {a, CPU, 1, i4, sh3, st, 0};
  DLTensor dd = {b, CPU, 1, i4, sh3, NULL, 0};
  dlb_error err;
  CHECK_EQ(dlb_copy(&dd, &ss, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "sub-byte");
  CHECK_MSG(err, "src");

  /* Packed int2 (onnxruntime's): 7 elements are 14 bits, 2 bytes; a stride
   * on the extent-1 dim does not make it strided.  Byte 3 stays. */
  unsigned char c[3] = {0xE4, 0x1B, 0xAA}, e[3] = {0, 0, 0x55};
  int64_t sh17[2] = {1, 7}, st17[2] = {99, 1};
  DLDataType i2 = {kDLInt, 2, 1}, u1 = {kDLUInt, 1, 1};
  DLTensor s2 = {c, CPU, 2, i2, sh17, NULL, 0};
  DLTensor d2 = {e, CPU, 2, i2, sh17, st17, 0};
  CHECK_EQ(dlb_copy(&d2, &s2, NULL), DLB_OK);
  CHECK_EQ(e[0], 0xE4);
  CHECK_EQ(e[1], 0x1B);
  CHECK_EQ(e[2], 0x55);
  /* uint1: 9 bits are 2 bytes. */
  int64_t sh9[1] = {9};
  DLTensor s1 = {c, CPU, 1, u1, sh9, NULL, 0};
  DLTensor d1 = {e, CPU, 1, u1, sh9, NULL, 0};
  e[0] = e[1] = 0;
  CHECK_EQ(dlb_copy(&d1, &s1, NULL), DLB_OK);
  CHECK_EQ(e[0], 0xE4);
  CHECK_EQ(e[1], 0x1B);
  CHECK_EQ(e[2], 0x55);
  DLTensor s1s = {c, CPU, 1, u1, sh3, st, 0};
  DLTensor d1s = {e, CPU, 1, u1, sh3, NULL, 0};
  CHECK_EQ(dlb_copy(&d1s, &s1s, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "sub-byte elements (1 bits x 1 lanes)");
}

static void test_errors(void) {
  float a[6] = {0}, b[6] = {0};
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s6[1] = {6};
  DLTensor f32 = {a, CPU, 2, {kDLFloat, 32, 1}, s23, NULL, 0};
  DLTensor i32 = {b, CPU, 2, {kDLInt, 32, 1}, s23, NULL, 0};
  DLTensor f32t = {b, CPU, 2, {kDLFloat, 32, 1}, s32, NULL, 0};
  DLTensor f32v = {b, CPU, 1, {kDLFloat, 32, 1}, s6, NULL, 0};
  dlb_error err;

  CHECK_EQ(dlb_copy(&i32, &f32, &err), DLB_EINVAL);
  CHECK_EQ(err.code, DLB_EINVAL);
  CHECK_MSG(err, "dtype");
  CHECK_MSG(err, "int32");
  CHECK_MSG(err, "float32");

  /* A dtype without a name is shown by its fields. */
  DLTensor odd = f32;
  odd.dtype.code = 99;
  CHECK_EQ(dlb_copy(&odd, &f32, &err), DLB_EINVAL);
  CHECK_MSG(err, "code 99");

  CHECK_EQ(dlb_copy(&f32t, &f32, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape");
  CHECK_MSG(err, "(3, 2)");
  CHECK_MSG(err, "(2, 3)");

  CHECK_EQ(dlb_copy(&f32v, &f32, &err), DLB_EINVAL);
  CHECK_MSG(err, "(6,)");

  DLTensor cuda = f32;
  cuda.device.device_type = kDLCUDA;
  cuda.device.device_id = 1;
  CHECK_EQ(dlb_copy(&cuda, &f32, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "dst");
  CHECK_MSG(err, "cuda:1");
  CHECK_EQ(dlb_copy(&f32, &cuda, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "src");
  /* Pinned and managed memory are host-accessible. */
  DLTensor pinned = f32t;
  pinned.shape = s23;
  pinned.device.device_type = kDLCUDAHost;
  CHECK_EQ(dlb_copy(&pinned, &f32, &err), DLB_OK);

  int64_t bst[2] = {0, 1};
  DLTensor bdst = f32t;
  bdst.shape = s23;
  bdst.strides = bst;
  CHECK_EQ(dlb_copy(&bdst, &f32, &err), DLB_EINVAL);
  CHECK_MSG(err, "stride 0 is 0");

  DLTensor nodata = f32;
  nodata.data = NULL;
  CHECK_EQ(dlb_copy(&f32t, &nodata, &err), DLB_EINVAL);
  CHECK_EQ(dlb_copy(&nodata, &f32, &err), DLB_EINVAL);
  CHECK_MSG(err, "data is NULL");

  CHECK_EQ(dlb_copy(NULL, &f32, &err), DLB_EINVAL);
  CHECK_MSG(err, "dst is NULL");
  CHECK_EQ(dlb_copy(&f32, NULL, &err), DLB_EINVAL);
  CHECK_MSG(err, "src is NULL");

  DLTensor noshape = f32;
  noshape.shape = NULL;
  CHECK_EQ(dlb_copy(&noshape, &f32, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape is NULL");
  DLTensor bigdim = f32;
  bigdim.ndim = DLB_MAX_NDIM + 1;
  CHECK_EQ(dlb_copy(&bigdim, &f32, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "ndim");

  int64_t neg[2] = {-1, 3};
  DLTensor ns = f32, nd = f32;
  ns.shape = neg;
  nd.shape = neg;
  CHECK_EQ(dlb_copy(&nd, &ns, &err), DLB_EINVAL);

  DLTensor zb = f32, zb2 = f32;
  zb.dtype.bits = 0;
  zb2.dtype.bits = 0;
  CHECK_EQ(dlb_copy(&zb, &zb2, &err), DLB_EUNSUPPORTED);

  /* NULL err is fine. */
  CHECK_EQ(dlb_copy(&i32, &f32, NULL), DLB_EINVAL);
}

static void test_many_dims(void) {
  /* 64 dims, mostly extent 1 and some 2, non-contiguous: exercises the
   * counter over the widest tensor we accept. */
  view s, d;
  int nd = DLB_MAX_NDIM;
  /* Extent-2 dims get a permuted power-of-two (or, in src, zero) stride;
   * extent-1 dims get junk strides, which must be ignored. */
  int64_t ds = 1, ss = 1;
  for (int i = nd - 1; i >= 0; i--) {
    s.shape[i] = d.shape[i] = (i % 9 == 0) ? 2 : 1;
    if (s.shape[i] == 1) {
      s.strides[i] = rnd(1000) - 500;
      d.strides[i] = rnd(1000) - 500;
    } else {
      d.strides[i] = rnd(2) ? ds : -ds;
      s.strides[i] = rnd(4) == 0 ? 0 : (rnd(2) ? ss : -ss);
      ds *= 2;
      ss *= 3;
    }
  }
  /* Swap two dst strides so dst's memory order differs from src's. */
  int64_t t = d.strides[0];
  d.strides[0] = d.strides[63];
  d.strides[63] = t;
  enum { ARENA = 1 << 14 };
  static unsigned char sa[ARENA], da[ARENA];
  fill_random(sa, ARENA);
  fill_random(da, ARENA);
  DLDataType dt = {kDLFloat, 32, 1};
  size_t sb = place(&s, sa, nd, dt, 0);
  size_t db = place(&d, da, nd, dt, 0);
  CHECK(sb <= ARENA && db <= ARENA);
  if (sb <= ARENA && db <= ARENA) {
    CHECK(run_case(da, ARENA, &d.t, sa, ARENA, &s.t));
  }
}

int main(void) {
  test_contiguous();
  test_transposed();
  test_negative_and_offset();
  test_broadcast_src();
  test_every_itemsize();
  test_random_5d();
  test_tiled_edges();
  test_tiled_long_edge();
  test_random_permuted();
  test_tiled_overlap();
  test_overlap();
  test_overlap_enomem();
  test_no_alloc_without_overlap();
  test_zero_d_and_empty();
  test_subbyte();
  test_errors();
  test_many_dims();
  return check_summary("copy");
}
