/* test_layout.c -- element counts, strides, contiguity, byte spans and
 * overlap. */
#include "check.h"
/* The core's checked-arithmetic helpers (static inline, not exported). */
#include "../../src/core/internal.h"

#define P62 ((int64_t)1 << 62)
#define P40 ((int64_t)1 << 40)
#define P31 ((int64_t)1 << 31)

static DLDataType dt(unsigned code, unsigned bits, unsigned lanes) {
  DLDataType d;
  d.code = (uint8_t)code;
  d.bits = (uint8_t)bits;
  d.lanes = (uint16_t)lanes;
  return d;
}

static const DLDataType F32 = {2, 32, 1};
static const DLDataType I8 = {0, 8, 1};
static const DLDataType I4 = {0, 4, 1};

static DLTensor tensor(int32_t ndim, int64_t *shape, int64_t *strides,
                       DLDataType dtype) {
  static char storage[64];
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = storage;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = strides;
  return t;
}

/* ---- dlb_shape_numel -------------------------------------------------------- */

static int64_t numel_ok(int32_t ndim, const int64_t *shape) {
  dlb_error err;
  int64_t n = -99;
  int rc = dlb_shape_numel(ndim, shape, &n, &err);
  CHECK_EQ(rc, DLB_OK);
  if (rc != DLB_OK) fprintf(stderr, "  %s\n", err.message);
  return n;
}

static void test_numel(void) {
  CHECK_EQ(numel_ok(0, NULL), 1);
  int64_t s1[] = {2, 3, 4};
  CHECK_EQ(numel_ok(3, s1), 24);
  int64_t s2[] = {0};
  CHECK_EQ(numel_ok(1, s2), 0);
  /* Zero extents next to huge ones: the product is 0, not an overflow. */
  int64_t s3[] = {P40, P40, 0};
  CHECK_EQ(numel_ok(3, s3), 0);
  int64_t s4[] = {0, P40, P40};
  CHECK_EQ(numel_ok(3, s4), 0);
  int64_t s5[] = {P62, 0, P62, INT64_MAX};
  CHECK_EQ(numel_ok(4, s5), 0);
  int64_t s6[] = {INT64_MAX, 1};
  CHECK_EQ(numel_ok(2, s6), INT64_MAX);
  int64_t s7[] = {3037000499, 3037000499};
  CHECK_EQ(numel_ok(2, s7), (int64_t)3037000499 * 3037000499);
  int64_t s8[] = {P31, P31};
  CHECK_EQ(numel_ok(2, s8), P62);

  dlb_error err;
  int64_t n = -99;
  int64_t o1[] = {P31, P31, 2};
  CHECK_EQ(dlb_shape_numel(3, o1, &n, &err), DLB_EOVERFLOW);
  CHECK_EQ(err.code, DLB_EOVERFLOW);
  CHECK_MSG(err, "shape[2]");
  CHECK_EQ(n, -99);
  int64_t o2[] = {3037000500, 3037000500};
  CHECK_EQ(dlb_shape_numel(2, o2, &n, &err), DLB_EOVERFLOW);
  int64_t o3[] = {INT64_MAX, 2};
  CHECK_EQ(dlb_shape_numel(2, o3, &n, &err), DLB_EOVERFLOW);
  int64_t o4[] = {2, INT64_MAX};
  CHECK_EQ(dlb_shape_numel(2, o4, &n, &err), DLB_EOVERFLOW);
  CHECK_EQ(n, -99);

  int64_t b1[] = {2, -3};
  CHECK_EQ(dlb_shape_numel(2, b1, &n, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape[1] is -3: extents must be >= 0");
  /* A negative extent is reported even when a zero would make the count 0. */
  int64_t b2[] = {0, -1};
  CHECK_EQ(dlb_shape_numel(2, b2, &n, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape[1] is -1");
  int64_t b3[] = {INT64_MIN, 0};
  CHECK_EQ(dlb_shape_numel(2, b3, &n, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape[0]");
  CHECK_EQ(dlb_shape_numel(-1, s1, &n, &err), DLB_EINVAL);
  CHECK_MSG(err, "ndim -1 is negative");
  CHECK_EQ(dlb_shape_numel(2, NULL, &n, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape is NULL but ndim is 2");
  CHECK_EQ(dlb_shape_numel(3, s1, NULL, &err), DLB_EINVAL);
  CHECK_EQ(n, -99);
  CHECK_EQ(dlb_shape_numel(2, b1, &n, NULL), DLB_EINVAL);
}

/* ---- dlb_strides_row_major ---------------------------------------------------- */

static void test_row_major(void) {
  dlb_error err;
  int64_t st[8];

  int64_t s1[] = {2, 3, 4};
  CHECK_EQ(dlb_strides_row_major(3, s1, st, &err), DLB_OK);
  CHECK(st[0] == 12 && st[1] == 4 && st[2] == 1);
  /* Zero extents step like 1, as NumPy and PyTorch do: (2,0,3) -> (3,3,1). */
  int64_t s2[] = {2, 0, 3};
  CHECK_EQ(dlb_strides_row_major(3, s2, st, &err), DLB_OK);
  CHECK(st[0] == 3 && st[1] == 3 && st[2] == 1);
  int64_t s3[] = {1, 1};
  CHECK_EQ(dlb_strides_row_major(2, s3, st, &err), DLB_OK);
  CHECK(st[0] == 1 && st[1] == 1);
  int64_t s4[] = {0};
  CHECK_EQ(dlb_strides_row_major(1, s4, st, &err), DLB_OK);
  CHECK_EQ(st[0], 1);
  CHECK_EQ(dlb_strides_row_major(0, NULL, NULL, &err), DLB_OK);
  /* The outermost extent never enters a stride. */
  int64_t s5[] = {INT64_MAX, 1};
  CHECK_EQ(dlb_strides_row_major(2, s5, st, &err), DLB_OK);
  CHECK(st[0] == 1 && st[1] == 1);
  int64_t s6[] = {3, INT64_MAX};
  CHECK_EQ(dlb_strides_row_major(2, s6, st, &err), DLB_OK);
  CHECK(st[0] == INT64_MAX && st[1] == 1);
  /* strides may be the shape array itself. */
  int64_t s7[] = {2, 3, 4};
  CHECK_EQ(dlb_strides_row_major(3, s7, s7, &err), DLB_OK);
  CHECK(s7[0] == 12 && s7[1] == 4 && s7[2] == 1);

  /* Overflow leaves strides untouched. */
  int64_t o1[] = {2, P62, 4};
  st[0] = st[1] = st[2] = -5;
  CHECK_EQ(dlb_strides_row_major(3, o1, st, &err), DLB_EOVERFLOW);
  CHECK_MSG(err, "overflows int64");
  CHECK(st[0] == -5 && st[1] == -5 && st[2] == -5);
  int64_t o2[] = {P40, P40, P40, 0};
  CHECK_EQ(dlb_strides_row_major(4, o2, st, &err), DLB_EOVERFLOW);

  int64_t b1[] = {2, -1};
  CHECK_EQ(dlb_strides_row_major(2, b1, st, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape[1] is -1");
  CHECK_EQ(st[0], -5);
  CHECK_EQ(dlb_strides_row_major(-2, s1, st, &err), DLB_EINVAL);
  CHECK_MSG(err, "ndim -2");
  CHECK_EQ(dlb_strides_row_major(2, NULL, st, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape is NULL");
  CHECK_EQ(dlb_strides_row_major(2, s1, NULL, &err), DLB_EINVAL);
  CHECK_MSG(err, "strides is NULL");
}

static void test_tensor_strides(void) {
  int64_t scratch[DLB_MAX_NDIM];
  int64_t shape[] = {2, 3};
  int64_t strides[] = {1, 2};
  DLTensor t = tensor(2, shape, strides, F32);
  CHECK(dlb_tensor_strides(&t, scratch) == strides);
  t.strides = NULL;
  const int64_t *s = dlb_tensor_strides(&t, scratch);
  CHECK(s == scratch);
  CHECK(s != NULL && s[0] == 3 && s[1] == 1);
  CHECK(dlb_tensor_strides(&t, NULL) == NULL);
  t.ndim = 0;
  CHECK(dlb_tensor_strides(&t, scratch) == NULL);
  t.ndim = DLB_MAX_NDIM + 1;
  CHECK(dlb_tensor_strides(&t, scratch) == NULL);
  t.ndim = -1;
  CHECK(dlb_tensor_strides(&t, scratch) == NULL);
  t.ndim = 2;
  t.shape = NULL;
  CHECK(dlb_tensor_strides(&t, scratch) == NULL);
  CHECK(dlb_tensor_strides(NULL, scratch) == NULL);
  int64_t huge[] = {P40, P40, P40, 0};
  t = tensor(4, huge, NULL, F32);
  CHECK(dlb_tensor_strides(&t, scratch) == NULL);
  int64_t neg[] = {2, -1};
  t = tensor(2, neg, NULL, F32);
  CHECK(dlb_tensor_strides(&t, scratch) == NULL);
}

/* ---- numel, nbytes, data -------------------------------------------------------- */

static void test_tensor_sizes(void) {
  dlb_error err;
  int64_t n = -99;
  int64_t shape[] = {2, 3};
  DLTensor t = tensor(2, shape, NULL, F32);
  CHECK_EQ(dlb_tensor_numel(&t, &n, &err), DLB_OK);
  CHECK_EQ(n, 6);
  CHECK_EQ(dlb_tensor_nbytes(&t, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 24);
  t.ndim = 0;
  t.shape = NULL;
  CHECK_EQ(dlb_tensor_numel(&t, &n, &err), DLB_OK);
  CHECK_EQ(n, 1);
  CHECK_EQ(dlb_tensor_nbytes(&t, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 4);

  int64_t s3[] = {3};
  t = tensor(1, s3, NULL, I4);
  CHECK_EQ(dlb_tensor_nbytes(&t, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 2);
  CHECK_EQ(dlb_tensor_nbytes(&t, true, &n, &err), DLB_OK);
  CHECK_EQ(n, 3);

  int64_t big[] = {P62};
  t = tensor(1, big, NULL, F32);
  n = -99;
  CHECK_EQ(dlb_tensor_nbytes(&t, false, &n, &err), DLB_EOVERFLOW);
  CHECK_EQ(n, -99);
  t.dtype = I8;
  CHECK_EQ(dlb_tensor_nbytes(&t, false, &n, &err), DLB_OK);
  CHECK_EQ(n, P62);

  int64_t neg[] = {-4};
  t = tensor(1, neg, NULL, F32);
  CHECK_EQ(dlb_tensor_numel(&t, &n, &err), DLB_EINVAL);
  CHECK_MSG(err, "shape[0] is -4");
  CHECK_EQ(dlb_tensor_nbytes(&t, false, &n, &err), DLB_EINVAL);
  CHECK_EQ(dlb_tensor_numel(NULL, &n, &err), DLB_EINVAL);
  CHECK_MSG(err, "tensor is NULL");
  CHECK_EQ(dlb_tensor_nbytes(NULL, false, &n, &err), DLB_EINVAL);
  CHECK_EQ(n, P62);
}

static void test_tensor_data(void) {
  char buf[16];
  DLTensor t = tensor(0, NULL, NULL, F32);
  t.data = buf;
  t.byte_offset = 12;
  CHECK(dlb_tensor_data(&t) == buf + 12);
  t.byte_offset = 0;
  CHECK(dlb_tensor_data(&t) == buf);
  t.data = NULL;
  CHECK(dlb_tensor_data(&t) == NULL);
  CHECK(dlb_tensor_data(NULL) == NULL);
}

/* ---- contiguity ------------------------------------------------------------------- */

static void expect_contig(int32_t ndim, int64_t *shape, int64_t *strides,
                          bool c, bool f, int line) {
  DLTensor t = tensor(ndim, shape, strides, F32);
  bool got_c = dlb_tensor_is_contiguous(&t);
  bool got_f = dlb_tensor_is_contiguous_f(&t);
  CHECK_EQ(got_c, c);
  CHECK_EQ(got_f, f);
  if (got_c != c || got_f != f)
    fprintf(stderr, "  case at line %d: C %d (want %d), F %d (want %d)\n",
            line, got_c, c, got_f, f);
  /* C and Fortran order are two of the orders a dense tensor may have. */
  if (c || f) {
    CHECK(dlb_tensor_is_dense(&t));
    if (!dlb_tensor_is_dense(&t))
      fprintf(stderr, "  case at line %d: compact but not dense\n", line);
  }
}

#define DENSE(nd, sh, st, want)                                             \
  do {                                                                      \
    DLTensor t_ = tensor(nd, sh, st, F32);                                  \
    CHECK_EQ(dlb_tensor_is_dense(&t_), want);                               \
  } while (0)

static void test_dense(void) {
  /* Transpositions of a compact 2x3x4 block, in any order. */
  int64_t s234[] = {2, 3, 4};
  int64_t s_perm_shape[] = {3, 4, 2}, st_perm[] = {4, 1, 12};
  DENSE(3, s_perm_shape, st_perm, true);
  int64_t s_rev[] = {4, 3, 2}, st_rev[] = {1, 4, 12}; /* Fortran */
  DENSE(3, s_rev, st_rev, true);
  int64_t st_row[] = {12, 4, 1};
  DENSE(3, s234, st_row, true);
  DENSE(3, s234, NULL, true);
  /* Gaps, overlaps, broadcasting and negative strides are not dense. */
  int64_t st_gap[] = {24, 8, 2}, st_overlap[] = {4, 4, 1};
  int64_t st_bcast[] = {0, 4, 1}, st_neg[] = {-12, 4, 1};
  DENSE(3, s234, st_gap, false);
  DENSE(3, s234, st_overlap, false);
  DENSE(3, s234, st_bcast, false);
  DENSE(3, s234, st_neg, false);
  /* Extent-1 dims say nothing, whatever their stride; empty tensors are
   * dense. */
  int64_t s_one[] = {3, 1, 4}, st_one[] = {1, -7, 3};
  DENSE(3, s_one, st_one, true);
  int64_t s_empty[] = {2, 0, 4}, st_junk[] = {5, -1, 9};
  DENSE(3, s_empty, st_junk, true);
  /* Malformed or absent tensors are never dense. */
  int64_t s_negext[] = {2, -1}, st_2[] = {1, 2};
  DENSE(2, s_negext, st_2, false);
  DENSE(2, NULL, st_2, false);
  CHECK(!dlb_tensor_is_dense(NULL));
  /* Near the int64 limit: the last product may overflow, not an earlier one. */
  int64_t sbig[] = {2, P62}, stbig[] = {1, 2};
  DENSE(2, sbig, stbig, true);
  int64_t sbig3[] = {2, P62, 4}, stbig3[] = {1, 2, INT64_MAX};
  DENSE(3, sbig3, stbig3, false);
}
#define CONTIG(nd, sh, st, c, f) expect_contig(nd, sh, st, c, f, __LINE__)

static void test_contiguity(void) {
  CONTIG(0, NULL, NULL, true, true);

  int64_t s23[] = {2, 3};
  int64_t st31[] = {3, 1}, st12[] = {1, 2}, st41[] = {4, 1}, st30[] = {3, 0};
  int64_t stneg[] = {-3, -1}, st61[] = {6, 1}, st32[] = {3, 2};
  CONTIG(2, s23, NULL, true, false); /* NULL strides mean row-major */
  CONTIG(2, s23, st31, true, false);
  CONTIG(2, s23, st12, false, true);
  CONTIG(2, s23, st41, false, false); /* padded rows */
  CONTIG(2, s23, st30, false, false); /* broadcast */
  CONTIG(2, s23, stneg, false, false);
  CONTIG(2, s23, st61, false, false);
  CONTIG(2, s23, st32, false, false);

  /* Size-1 dims: their strides are ignored (B18-B21).  Shape [1,2] with
   * strides [3,2], as PyTorch exported it, is NOT compact: its second dim
   * steps 2 elements.  With strides [3,1] it is compact both ways. */
  int64_t s12[] = {1, 2};
  int64_t st_3_2[] = {3, 2}, st_3_1[] = {3, 1}, st_m5_1[] = {-5, 1};
  CONTIG(2, s12, st_3_2, false, false);
  CONTIG(2, s12, st_3_1, true, true);
  CONTIG(2, s12, st_m5_1, true, true);
  CONTIG(2, s12, NULL, true, true);
  /* Column-major (1024,1) with strides (1,1024) (B20): the extent-1 dim is
   * skipped and dim 0 has stride 1, so it is row-major compact too. */
  int64_t s1024[] = {1024, 1};
  int64_t st_1_1024[] = {1, 1024}, st_1_1[] = {1, 1};
  CONTIG(2, s1024, st_1_1024, true, true);
  CONTIG(2, s1024, st_1_1, true, true);
  /* (1,77) with strides (1,1) was rejected by TVM (B19). */
  int64_t s177[] = {1, 77};
  CONTIG(2, s177, st_1_1, true, true);
  int64_t s213[] = {2, 1, 3};
  int64_t st_3_0_1[] = {3, 0, 1}, st_3_999_1[] = {3, 999, 1};
  int64_t st_1_7_2[] = {1, 7, 2};
  CONTIG(3, s213, st_3_0_1, true, false);
  CONTIG(3, s213, st_3_999_1, true, false);
  CONTIG(3, s213, st_1_7_2, false, true);
  int64_t s111[] = {1, 1, 1};
  int64_t st_wild[] = {INT64_MIN, 0, INT64_MAX};
  CONTIG(3, s111, st_wild, true, true);

  /* No elements: always contiguous, whatever the strides (B22). */
  int64_t s03[] = {0, 3}, s20[] = {2, 0}, s1803[] = {1, 8, 0, 128};
  int64_t st00[] = {0, 0}, st_7_m9[] = {7, -9};
  int64_t st_junk4[] = {5, -1, 0, INT64_MAX};
  CONTIG(2, s03, st00, true, true);
  CONTIG(2, s20, st_7_m9, true, true);
  CONTIG(2, s20, NULL, true, true);
  CONTIG(4, s1803, st_junk4, true, true);

  int64_t s3[] = {3}, st1[] = {1}, st0[] = {0}, stm1[] = {-1}, st2[] = {2};
  CONTIG(1, s3, st1, true, true);
  CONTIG(1, s3, st0, false, false);
  CONTIG(1, s3, stm1, false, false);
  CONTIG(1, s3, st2, false, false);

  /* Near the int64 limit the running product overflows only after the last
   * stride is checked. */
  int64_t sbig[] = {P62, 2};
  int64_t stbig[] = {2, 1};
  CONTIG(2, sbig, stbig, true, false);

  /* Malformed tensors are never called contiguous. */
  int64_t sneg[] = {2, -1};
  CONTIG(2, sneg, st31, false, false);
  CONTIG(2, sneg, NULL, false, false);
  /* A zero extent does not hide a negative one after it. */
  int64_t s0neg[] = {0, -1};
  CONTIG(2, s0neg, st00, false, false);
  CONTIG(2, s0neg, NULL, false, false);
  CONTIG(2, NULL, st31, false, false);
  DLTensor t = tensor(-1, s23, st31, F32);
  CHECK(!dlb_tensor_is_contiguous(&t));
  CHECK(!dlb_tensor_is_contiguous_f(&t));
  CHECK(!dlb_tensor_is_contiguous(NULL));
  CHECK(!dlb_tensor_is_contiguous_f(NULL));
}

/* ---- byte span ---------------------------------------------------------------------- */

static void expect_span(int32_t ndim, int64_t *shape, int64_t *strides,
                        DLDataType dtype, int64_t lo, int64_t hi, int line) {
  DLTensor t = tensor(ndim, shape, strides, dtype);
  dlb_error err;
  int64_t glo = -12345, ghi = -12345;
  int rc = dlb_tensor_byte_span(&t, &glo, &ghi, &err);
  CHECK_EQ(rc, DLB_OK);
  CHECK_EQ(glo, lo);
  CHECK_EQ(ghi, hi);
  if (rc != DLB_OK || glo != lo || ghi != hi)
    fprintf(stderr, "  case at line %d: rc %d [%lld, %lld) want [%lld, %lld) %s\n",
            line, rc, (long long)glo, (long long)ghi, (long long)lo,
            (long long)hi, rc ? err.message : "");
}
#define SPAN(nd, sh, st, dtp, lo, hi) \
  expect_span(nd, sh, st, dtp, lo, hi, __LINE__)

static void expect_span_fail(int32_t ndim, int64_t *shape, int64_t *strides,
                             DLDataType dtype, int code, const char *needle,
                             int line) {
  DLTensor t = tensor(ndim, shape, strides, dtype);
  dlb_error err;
  int64_t lo = -12345, hi = -12345;
  int rc = dlb_tensor_byte_span(&t, &lo, &hi, &err);
  CHECK_EQ(rc, code);
  CHECK_EQ(err.code, code);
  CHECK_MSG(err, needle);
  CHECK(lo == -12345 && hi == -12345);
  if (rc != code) fprintf(stderr, "  case at line %d\n", line);
}
#define SPAN_FAIL(nd, sh, st, dtp, code, needle) \
  expect_span_fail(nd, sh, st, dtp, code, needle, __LINE__)

static void test_byte_span(void) {
  SPAN(0, NULL, NULL, F32, 0, 4);
  int64_t s23[] = {2, 3};
  SPAN(2, s23, NULL, F32, 0, 24);
  int64_t st31[] = {3, 1}, stm3m1[] = {-3, -1}, st3m1[] = {3, -1};
  int64_t st12[] = {1, 2}, st00[] = {0, 0};
  SPAN(2, s23, st31, F32, 0, 24);
  SPAN(2, s23, stm3m1, F32, -20, 4); /* a[::-1, ::-1] */
  SPAN(2, s23, st3m1, F32, -8, 16);
  SPAN(2, s23, st12, F32, 0, 24);
  SPAN(2, s23, st00, F32, 0, 4); /* broadcast: one element */
  int64_t s3[] = {3}, stm1[] = {-1}, st2[] = {2};
  SPAN(1, s3, stm1, F32, -8, 4);
  SPAN(1, s3, st2, dt(5, 128, 1), 0, 80);

  /* Size-1 dims contribute nothing, whatever their stride. */
  int64_t s1[] = {1}, stmin[] = {INT64_MIN}, stmax[] = {INT64_MAX};
  SPAN(1, s1, stmin, F32, 0, 4);
  SPAN(1, s1, stmax, F32, 0, 4);

  /* Zero elements: [0, 0), strides never looked at. */
  int64_t s05[] = {0, 5}, stwild[] = {INT64_MAX, INT64_MIN};
  SPAN(2, s05, stwild, F32, 0, 0);
  SPAN(2, s05, NULL, F32, 0, 0);
  int64_t shuge0[] = {P40, P40, P40, 0};
  SPAN(4, shuge0, NULL, F32, 0, 0);

  /* The int64 boundary, both ways. */
  int64_t s2[] = {2};
  int64_t st_m2_61[] = {-((int64_t)1 << 61)};
  SPAN(1, s2, st_m2_61, F32, INT64_MIN, 4);
  int64_t st_2_61_m2[] = {((int64_t)1 << 61) - 2};
  SPAN(1, s2, st_2_61_m2, F32, 0, INT64_MAX - 3);
  SPAN(1, s2, stmin, I8, INT64_MIN, 1);
  int64_t st_max_m1[] = {INT64_MAX - 1};
  SPAN(1, s2, st_max_m1, I8, 0, INT64_MAX);

  int64_t st_2_61_m1[] = {((int64_t)1 << 61) - 1};
  SPAN_FAIL(1, s2, st_2_61_m1, F32, DLB_EOVERFLOW, "overflows int64");
  SPAN_FAIL(1, s2, stmax, I8, DLB_EOVERFLOW, "overflows int64");
  SPAN_FAIL(1, s2, stmin, F32, DLB_EOVERFLOW, "overflows int64");
  SPAN_FAIL(1, s3, stmax, I8, DLB_EOVERFLOW, "dim 0");
  /* A negative reach just past INT64_MIN (2 * -(2^62 + 1)). */
  int64_t st_m62m1[] = {-P62 - 1};
  SPAN_FAIL(1, s3, st_m62m1, I8, DLB_EOVERFLOW, "dim 0");
  int64_t st_m62[] = {-P62};
  SPAN(1, s3, st_m62, I8, INT64_MIN, 1);
  int64_t s22[] = {2, 2};
  int64_t sthalf[] = {INT64_MAX / 2 + 1, INT64_MAX / 2 + 1};
  SPAN_FAIL(2, s22, sthalf, I8, DLB_EOVERFLOW, "dim 1");
  int64_t sthalfneg[] = {-(INT64_MAX / 2) - 1, -(INT64_MAX / 2) - 2};
  SPAN_FAIL(2, s22, sthalfneg, I8, DLB_EOVERFLOW, "overflows int64");
  int64_t sbig[] = {P62};
  SPAN_FAIL(1, sbig, NULL, F32, DLB_EOVERFLOW, "overflows int64");
  int64_t sovf[] = {P31, P31, 2};
  SPAN_FAIL(3, sovf, NULL, F32, DLB_EOVERFLOW, "element count");

  /* Sub-byte: a range only for compact layouts, sized packed. */
  SPAN(1, s3, NULL, I4, 0, 2);
  int64_t st1[] = {1};
  SPAN(1, s3, st1, dt(15, 6, 1), 0, 3);
  int64_t s41[] = {4, 1}, st17[] = {1, 7};
  SPAN(2, s41, st17, I4, 0, 2);
  SPAN_FAIL(1, s3, st2, I4, DLB_EUNSUPPORTED, "sub-byte");
  SPAN_FAIL(1, s3, stm1, dt(17, 4, 1), DLB_EUNSUPPORTED, "non-contiguous");
  int64_t st12b[] = {1, 2};
  SPAN_FAIL(2, s23, st12b, I4, DLB_EUNSUPPORTED, "sub-byte dtype int4 in a non-contiguous");
  int64_t s0[] = {0};
  SPAN(1, s0, st2, I4, 0, 0);
  /* Two nibbles per element are a whole byte: strided is fine. */
  SPAN(1, s3, st2, dt(0, 4, 2), 0, 5);
  /* int2 and uint1: packed, compact only. */
  SPAN(1, s3, NULL, dt(0, 2, 1), 0, 1);
  SPAN(1, s3, st1, dt(1, 1, 1), 0, 1);
  int64_t s9[] = {9};
  SPAN(1, s9, NULL, dt(1, 1, 1), 0, 2);
  SPAN(2, s41, st17, dt(0, 2, 1), 0, 1);
  SPAN_FAIL(1, s3, st2, dt(0, 2, 1), DLB_EUNSUPPORTED, "sub-byte dtype int2");
  SPAN(1, s3, st2, dt(0, 2, 4), 0, 5);

  SPAN_FAIL(1, s3, st1, dt(2, 32, 0), DLB_EINVAL, "zero-size");
  int64_t sneg[] = {-1};
  SPAN_FAIL(1, sneg, st1, F32, DLB_EINVAL, "shape[0] is -1");
  SPAN_FAIL(2, NULL, st1, F32, DLB_EINVAL, "shape is NULL");
  SPAN_FAIL(-3, s3, st1, F32, DLB_EINVAL, "ndim -3");
  int64_t s65[DLB_MAX_NDIM + 1];
  for (int i = 0; i < DLB_MAX_NDIM + 1; i++) s65[i] = 1;
  SPAN_FAIL(DLB_MAX_NDIM + 1, s65, NULL, F32, DLB_EUNSUPPORTED,
            "ndim 65 exceeds DLB_MAX_NDIM (64)");
  SPAN(DLB_MAX_NDIM, s65, NULL, F32, 0, 4);

  dlb_error err;
  int64_t lo, hi;
  CHECK_EQ(dlb_tensor_byte_span(NULL, &lo, &hi, &err), DLB_EINVAL);
  CHECK_MSG(err, "tensor is NULL");
  DLTensor t = tensor(1, s3, NULL, F32);
  CHECK_EQ(dlb_tensor_byte_span(&t, NULL, &hi, &err), DLB_EINVAL);
  CHECK_EQ(dlb_tensor_byte_span(&t, &lo, NULL, &err), DLB_EINVAL);
}

/* dlb__mul_overflow / dlb__add_overflow / dlb__sub_overflow /
 * dlb__size_overflow: the one convention for checked arithmetic in the core
 * (true on overflow, exact result otherwise), at every edge. */
static void test_checked_arithmetic(void) {
  int64_t r = 7;
  size_t z = 7;
  const int64_t P32 = (int64_t)1 << 32;
  CHECK(!dlb__mul_overflow(P32, P31 - 1, &r) && r == P32 * (P31 - 1));
  CHECK(!dlb__mul_overflow(-P32, P31, &r) && r == INT64_MIN);
  CHECK(dlb__mul_overflow(P32, P31, &r) && r == 0);
  CHECK(dlb__mul_overflow(P32, P32, &r));
  CHECK(!dlb__mul_overflow(INT64_MIN, 1, &r) && r == INT64_MIN);
  CHECK(dlb__mul_overflow(INT64_MIN, -1, &r));
  CHECK(!dlb__mul_overflow(INT64_MAX, -1, &r) && r == -INT64_MAX);
  CHECK(!dlb__mul_overflow(0, INT64_MIN, &r) && r == 0);
  CHECK(!dlb__mul_overflow(-3, -5, &r) && r == 15);
  CHECK(!dlb__add_overflow(INT64_MAX - 1, 1, &r) && r == INT64_MAX);
  CHECK(dlb__add_overflow(INT64_MAX, 1, &r) && r == 0);
  CHECK(!dlb__add_overflow(INT64_MIN + 1, -1, &r) && r == INT64_MIN);
  CHECK(dlb__add_overflow(INT64_MIN, -1, &r));
  CHECK(!dlb__sub_overflow(INT64_MAX, 0, &r) && r == INT64_MAX);
  CHECK(dlb__sub_overflow(0, INT64_MIN, &r));
  CHECK(!dlb__sub_overflow(-1, INT64_MIN, &r) && r == INT64_MAX);
  CHECK(dlb__sub_overflow(INT64_MAX, -1, &r));
  CHECK(!dlb__sub_overflow(INT64_MIN, -1, &r) && r == INT64_MIN + 1);
  CHECK(dlb__sub_overflow(INT64_MIN, 1, &r));
  CHECK(!dlb__size_overflow(10, 5, &z) && z == 15);
  CHECK(dlb__size_overflow(-1, 0, &z) && z == 0);
  CHECK(!dlb__size_overflow(INT64_MAX, 0, &z) && z == (size_t)INT64_MAX);
  CHECK(dlb__size_overflow(INT64_MAX, SIZE_MAX - (size_t)INT64_MAX + 1, &z));
  CHECK(!dlb__size_overflow(0, SIZE_MAX, &z) && z == SIZE_MAX);
}

/* ---- overlap ----------------------------------------------------------------------- */

/* A view of base: ndim dims of shape/strides (elements), starting at
 * element off of a float32 buffer. */
static DLTensor view_at(float *base, int64_t off, int32_t ndim, int64_t *shape,
                        int64_t *strides) {
  DLTensor t = tensor(ndim, shape, strides, F32);
  t.data = base;
  t.byte_offset = (uint64_t)off * sizeof(float);
  return t;
}

static int overlap_of(const DLTensor *a, const DLTensor *b) {
  dlb_error err;
  int got = -1, back = -1;
  CHECK_EQ(dlb_tensor_overlap(a, b, &got, &err), DLB_OK);
  CHECK_EQ(dlb_tensor_overlap(b, a, &back, &err), DLB_OK);
  CHECK_EQ(got, back); /* symmetric */
  return got;
}

static void test_overlap(void) {
  float base[16];
  int64_t s4[] = {4}, s1[] = {1}, s2[] = {2}, s8[] = {8}, s0[] = {0};
  int64_t m1[] = {-1};
  /* base[0:4] and base[1:5]: partial */
  DLTensor x = view_at(base, 0, 1, s4, s1), y = view_at(base, 1, 1, s4, s1);
  CHECK_EQ(overlap_of(&x, &y), DLB_OVERLAP_PARTIAL);
  /* base[0:4] and base[4:8]: touching, disjoint */
  DLTensor z = view_at(base, 4, 1, s4, s1);
  CHECK_EQ(overlap_of(&x, &z), DLB_OVERLAP_NONE);
  /* the same view twice, NULL strides for one of them */
  DLTensor x2 = view_at(base, 0, 1, s4, NULL);
  CHECK_EQ(overlap_of(&x, &x2), DLB_OVERLAP_SAME);
  CHECK_EQ(overlap_of(&x, &x), DLB_OVERLAP_SAME);
  /* one address, another shape (a prefix) or stride: partial */
  DLTensor pre = view_at(base, 0, 1, s2, s1);
  CHECK_EQ(overlap_of(&x, &pre), DLB_OVERLAP_PARTIAL);
  DLTensor even = view_at(base, 0, 1, s4, s2), odd = view_at(base, 1, 1, s4, s2);
  CHECK_EQ(overlap_of(&x, &even), DLB_OVERLAP_PARTIAL);
  /* interleaved views share no byte but their ranges intersect: partial
   * (the documented rule) */
  CHECK_EQ(overlap_of(&even, &odd), DLB_OVERLAP_PARTIAL);
  /* another dtype at one address: partial */
  DLTensor bytes = tensor(1, s4, s1, I8);
  bytes.data = base;
  CHECK_EQ(overlap_of(&x, &bytes), DLB_OVERLAP_PARTIAL);
  /* negative strides: base[3::-1] spans base[0:4] */
  DLTensor rev = view_at(base, 3, 1, s4, m1);
  CHECK_EQ(overlap_of(&rev, &x), DLB_OVERLAP_PARTIAL);
  CHECK_EQ(overlap_of(&rev, &z), DLB_OVERLAP_NONE);
  /* a broadcast (stride 0) view of element 4 and base[4:8] */
  DLTensor bc = view_at(base, 4, 1, s8, s0);
  CHECK_EQ(overlap_of(&bc, &z), DLB_OVERLAP_PARTIAL);
  CHECK_EQ(overlap_of(&bc, &x), DLB_OVERLAP_NONE);
  /* an extent-1 dim's stride is not compared */
  int64_t sh14[] = {1, 4}, st_a[] = {4, 1}, st_b[] = {99, 1};
  DLTensor r1 = view_at(base, 0, 2, sh14, st_a), r2 = view_at(base, 0, 2, sh14, st_b);
  CHECK_EQ(overlap_of(&r1, &r2), DLB_OVERLAP_SAME);
  /* empty tensors and other devices share nothing */
  int64_t e0[] = {0};
  DLTensor empty = view_at(base, 0, 1, e0, s1);
  CHECK_EQ(overlap_of(&empty, &x), DLB_OVERLAP_NONE);
  DLTensor dev = x;
  dev.device.device_type = kDLCUDA;
  CHECK_EQ(overlap_of(&dev, &x), DLB_OVERLAP_NONE);
  dev.device.device_type = kDLCPU;
  dev.device.device_id = 1;
  CHECK_EQ(overlap_of(&dev, &x), DLB_OVERLAP_NONE);
  /* data NULL: addresses are data + byte_offset as integers */
  DLTensor n1 = view_at(NULL, 0, 1, s4, s1), n2 = view_at(NULL, 3, 1, s4, s1);
  CHECK_EQ(overlap_of(&n1, &n2), DLB_OVERLAP_PARTIAL);
  n2.byte_offset = 16;
  CHECK_EQ(overlap_of(&n1, &n2), DLB_OVERLAP_NONE);
  /* errors: NULL arguments, a span that overflows */
  dlb_error err;
  int got;
  CHECK_EQ(dlb_tensor_overlap(NULL, &x, &got, &err), DLB_EINVAL);
  CHECK_EQ(dlb_tensor_overlap(&x, &x, NULL, &err), DLB_EINVAL);
  int64_t big[] = {P62}, bigs[] = {P62};
  DLTensor huge = view_at(base, 0, 1, big, bigs);
  CHECK_EQ(dlb_tensor_overlap(&x, &huge, &got, &err), DLB_EOVERFLOW);
}

int main(void) {
  test_checked_arithmetic();
  test_numel();
  test_row_major();
  test_tensor_strides();
  test_tensor_sizes();
  test_tensor_data();
  test_contiguity();
  test_dense();
  test_byte_span();
  test_overlap();
  return check_summary("test_layout");
}
