/* test_validate.c -- dlb_tensor_validate, dlb_managed_check_version and the
 * device helpers. */
#include "check.h"

#define P62 ((int64_t)1 << 62)
#define P40 ((int64_t)1 << 40)
#define P31 ((int64_t)1 << 31)

static char storage[256];

static DLDataType dt(unsigned code, unsigned bits, unsigned lanes) {
  DLDataType d;
  d.code = (uint8_t)code;
  d.bits = (uint8_t)bits;
  d.lanes = (uint16_t)lanes;
  return d;
}

static const DLDataType F32 = {2, 32, 1};

static DLTensor tensor(int32_t ndim, int64_t *shape, int64_t *strides) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = storage;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype = F32;
  t.shape = shape;
  t.strides = strides;
  return t;
}

static void expect_ok(const DLTensor *t, unsigned options, int line) {
  dlb_error err;
  dlb_error_clear(&err);
  int rc = dlb_tensor_validate(t, options, &err);
  CHECK_EQ(rc, DLB_OK);
  if (rc != DLB_OK) fprintf(stderr, "  line %d: %s\n", line, err.message);
}
#define OK(t, opt) expect_ok(t, opt, __LINE__)

static void expect_fail(const DLTensor *t, unsigned options, int code,
                        const char *needle, int line) {
  dlb_error err;
  dlb_error_clear(&err);
  int rc = dlb_tensor_validate(t, options, &err);
  CHECK_EQ(rc, code);
  CHECK_EQ(err.code, code);
  CHECK_MSG(err, needle);
  if (rc != code) fprintf(stderr, "  line %d: %s\n", line, err.message);
  /* A NULL err gives the same answer. */
  CHECK_EQ(dlb_tensor_validate(t, options, NULL), code);
}
#define FAIL(t, opt, code, needle) expect_fail(t, opt, code, needle, __LINE__)

static void test_valid_tensors(void) {
  int64_t shape[] = {2, 3};
  int64_t strides[] = {3, 1};
  DLTensor t = tensor(2, shape, strides);
  OK(&t, 0);
  OK(&t, DLB_VALIDATE_STRIDES_REQUIRED);

  /* NULL strides: legacy producers mean row-major. */
  t.strides = NULL;
  OK(&t, 0);

  /* 0-d with NULL shape and strides, as NumPy exports it. */
  t = tensor(0, NULL, NULL);
  OK(&t, 0);
  OK(&t, DLB_VALIDATE_STRIDES_REQUIRED);
  /* 0-d with non-NULL pointers to nothing, as PyTorch exports it. */
  t = tensor(0, shape, strides);
  OK(&t, DLB_VALIDATE_STRIDES_REQUIRED);

  /* Negative strides with the offset pointing at element 0. */
  int64_t neg[] = {-3, -1};
  t = tensor(2, shape, neg);
  t.byte_offset = 20;
  OK(&t, 0);
  /* Size-1 dims with odd strides. */
  int64_t s12[] = {1, 2};
  int64_t st32[] = {3, 2};
  t = tensor(2, s12, st32);
  OK(&t, 0);
  int64_t s1[] = {1};
  int64_t stmin[] = {INT64_MIN};
  t = tensor(1, s1, stmin);
  OK(&t, 0);

  /* Exactly DLB_MAX_NDIM dims. */
  int64_t ones[DLB_MAX_NDIM];
  for (int i = 0; i < DLB_MAX_NDIM; i++) ones[i] = 1;
  t = tensor(DLB_MAX_NDIM, ones, ones);
  OK(&t, DLB_VALIDATE_STRIDES_REQUIRED);

  /* Every known device type and dtype. */
  static const int32_t devs[] = {1, 2, 3, 4, 7, 8, 9, 10, 11, 12,
                                 13, 14, 15, 16, 17, 18};
  for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) {
    t = tensor(2, shape, strides);
    t.device.device_type = (DLDeviceType)devs[i];
    t.device.device_id = 7;
    OK(&t, 0);
  }
  static const char *const names[] = {
      "bool", "int8", "uint64", "float16", "bfloat16", "complex128",
      "float8_e8m0fnu", "float32x4", "int4x2"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    t = tensor(2, shape, strides);
    CHECK_EQ(dlb_dtype_from_name(names[i], &t.dtype, NULL), DLB_OK);
    OK(&t, 0);
  }
}

static void test_ndim_and_shape(void) {
  int64_t shape[] = {2, 3};
  DLTensor t = tensor(-1, shape, NULL);
  FAIL(&t, 0, DLB_EINVAL, "ndim -1 is negative");
  t.ndim = INT32_MIN;
  FAIL(&t, 0, DLB_EINVAL, "ndim -2147483648");

  int64_t big[DLB_MAX_NDIM + 1];
  for (int i = 0; i < DLB_MAX_NDIM + 1; i++) big[i] = 1;
  t = tensor(DLB_MAX_NDIM + 1, big, big);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "ndim 65 exceeds DLB_MAX_NDIM (64)");
  /* A huge ndim is refused before shape is read (shape here is short). */
  t = tensor(INT32_MAX, shape, NULL);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "ndim 2147483647 exceeds DLB_MAX_NDIM");

  t = tensor(2, NULL, NULL);
  FAIL(&t, 0, DLB_EINVAL, "shape is NULL but ndim is 2");
  int64_t strides[] = {3, 1};
  t = tensor(2, NULL, strides);
  FAIL(&t, 0, DLB_EINVAL, "shape is NULL");

  int64_t s_neg[] = {1, 2, -3};
  t = tensor(3, s_neg, NULL);
  FAIL(&t, 0, DLB_EINVAL, "shape[2] is -3: extents must be >= 0");
  int64_t s_neg0[] = {0, -1};
  t = tensor(2, s_neg0, NULL);
  FAIL(&t, 0, DLB_EINVAL, "shape[1] is -1");
  int64_t s_min[] = {INT64_MIN};
  t = tensor(1, s_min, NULL);
  FAIL(&t, 0, DLB_EINVAL, "shape[0] is -9223372036854775808");

  t = tensor(2, shape, NULL);
  FAIL(&t, DLB_VALIDATE_STRIDES_REQUIRED, DLB_EINVAL,
       "strides is NULL with ndim 2");

  FAIL(NULL, 0, DLB_EINVAL, "tensor is NULL");
}

static void test_sizes(void) {
  /* [2^31, 2^31, 2]: the product is 2^63 (B76). */
  int64_t s1[] = {P31, P31, 2};
  DLTensor t = tensor(3, s1, NULL);
  FAIL(&t, 0, DLB_EOVERFLOW, "element count overflows int64");
  int64_t s1b[] = {P31, P31, 4, 0};
  t = tensor(4, s1b, NULL);
  t.data = NULL;
  OK(&t, 0);

  /* Count fits, bytes do not. */
  int64_t s2[] = {P62};
  t = tensor(1, s2, NULL);
  FAIL(&t, 0, DLB_EOVERFLOW, "exceed INT64_MAX");
  t.dtype = dt(0, 8, 1);
  OK(&t, 0);

  /* Bytes fit, the strided span does not. */
  int64_t s3[] = {2};
  int64_t st3[] = {INT64_MAX};
  t = tensor(1, s3, st3);
  t.dtype = dt(0, 8, 1);
  FAIL(&t, 0, DLB_EOVERFLOW, "overflows int64");
  int64_t st3b[] = {-((int64_t)1 << 62) - 1};
  t = tensor(1, s3, st3b);
  FAIL(&t, 0, DLB_EOVERFLOW, "overflows int64");

  /* Empty, but the row-major strides a consumer would synthesise for NULL
   * do not fit. */
  int64_t s4[] = {P40, P40, P40, 0};
  t = tensor(4, s4, NULL);
  FAIL(&t, 0, DLB_EOVERFLOW, "row-major stride");
  /* The same shape with explicit strides is fine: no element is reached. */
  int64_t st4[] = {0, 0, 0, 0};
  t = tensor(4, s4, st4);
  OK(&t, 0);
}

static void test_dtype_checks(void) {
  int64_t shape[] = {4};
  int64_t strides[] = {1};
  DLTensor t = tensor(1, shape, strides);

  t.dtype = dt(15, 8, 1); /* fp6 must be 6 bits */
  FAIL(&t, 0, DLB_EUNSUPPORTED, "code 15, bits 8, lanes 1");
  OK(&t, DLB_VALIDATE_ANY_DTYPE);
  t.dtype = dt(6, 1, 1); /* bool must be 8 bits */
  FAIL(&t, 0, DLB_EUNSUPPORTED, "code 6, bits 1, lanes 1");
  t.dtype = dt(3, 64, 1);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "kDLOpaqueHandle");
  t.dtype = dt(200, 16, 1);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "unknown type code 200");
  OK(&t, DLB_VALIDATE_ANY_DTYPE);
  t.dtype = dt(2, 32, 0);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "lanes 0");
  /* Zero-size elements are refused even when any dtype is allowed. */
  FAIL(&t, DLB_VALIDATE_ANY_DTYPE, DLB_EUNSUPPORTED, "lanes 0");
  t.dtype = dt(200, 0, 1);
  FAIL(&t, DLB_VALIDATE_ANY_DTYPE, DLB_EUNSUPPORTED, "bits 0");

  /* Sub-byte: contiguous only. */
  int64_t s3[] = {3};
  int64_t st2[] = {2};
  t = tensor(1, s3, st2);
  t.dtype = dt(0, 4, 1);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "sub-byte");
  t.dtype = dt(17, 4, 1);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "non-contiguous");
  t.dtype = dt(15, 6, 1);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "non-contiguous");
  int64_t s22[] = {2, 2};
  int64_t stf[] = {1, 2};
  t = tensor(2, s22, stf);
  t.dtype = dt(17, 4, 1);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "sub-byte");
  int64_t stc[] = {2, 1};
  t.strides = stc;
  OK(&t, 0);
  t.strides = NULL;
  OK(&t, 0);
  /* A zero-size sub-byte tensor is contiguous whatever its strides. */
  int64_t s0[] = {0};
  t = tensor(1, s0, st2);
  t.dtype = dt(0, 4, 1);
  OK(&t, 0);
  /* int4x2 fills whole bytes: strided is fine. */
  t = tensor(1, s3, st2);
  t.dtype = dt(0, 4, 2);
  OK(&t, 0);

  /* 1- and 2-bit integers (onnxruntime's int2/uint2): packed, contiguous
   * only, like int4.  int2x4 and uint1x8 fill whole bytes. */
  t = tensor(1, s3, st2);
  t.dtype = dt(0, 2, 1);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "sub-byte dtype int2 in a non-contiguous");
  t.dtype = dt(1, 1, 1);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "sub-byte dtype uint1 in a non-contiguous");
  t.dtype = dt(0, 2, 4);
  OK(&t, 0);
  t.dtype = dt(1, 1, 8);
  OK(&t, 0);
  int64_t st1[] = {1};
  t = tensor(1, s3, st1);
  t.dtype = dt(0, 2, 1);
  OK(&t, 0);
  t.dtype = dt(1, 1, 3);
  OK(&t, 0);
  /* Other integer widths only in whole bytes: int24, int12x2, never int3
   * or int12 alone. */
  t.dtype = dt(0, 24, 1);
  OK(&t, 0);
  t.dtype = dt(1, 12, 2);
  OK(&t, 0);
  t.dtype = dt(0, 3, 1);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "code 0, bits 3, lanes 1");
  t.dtype = dt(1, 12, 1);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "uint allows 1, 2 or 4 bits");
  t.dtype = dt(0, 0, 8);
  FAIL(&t, 0, DLB_EUNSUPPORTED, "code 0, bits 0, lanes 8");
}

static void test_device_checks(void) {
  int64_t shape[] = {2};
  int64_t strides[] = {1};
  DLTensor t = tensor(1, shape, strides);
  /* A type without a name (5, 6, newer than the header) is a foreign
   * device: held, never read.  0 and below are no device. */
  t.device.device_type = (DLDeviceType)5;
  OK(&t, 0);
  OK(&t, DLB_VALIDATE_ANY_DEVICE);
  t.device.device_type = (DLDeviceType)6;
  OK(&t, 0);
  t.device.device_type = kDLTPUHost;
  OK(&t, 0);
  t.device.device_type = (DLDeviceType)99;
  OK(&t, 0);
  t.device.device_type = (DLDeviceType)INT32_MAX;
  OK(&t, 0);
  t.device.device_type = (DLDeviceType)0;
  FAIL(&t, 0, DLB_EUNSUPPORTED, "device type 0 is not a DLPack device type");
  OK(&t, DLB_VALIDATE_ANY_DEVICE);
  t.device.device_type = (DLDeviceType)-1;
  FAIL(&t, 0, DLB_EUNSUPPORTED, "device type -1 is not");
  t.device.device_type = (DLDeviceType)INT32_MIN;
  FAIL(&t, 0, DLB_EUNSUPPORTED, "device type -2147483648 is not");

  t.device.device_type = kDLCUDA;
  t.device.device_id = -1;
  FAIL(&t, 0, DLB_EINVAL, "device_id -1 is negative");
  /* Allowing any device type does not allow a negative id. */
  FAIL(&t, DLB_VALIDATE_ANY_DEVICE, DLB_EINVAL, "device_id -1");
  t.device.device_id = INT32_MIN;
  FAIL(&t, 0, DLB_EINVAL, "device_id -2147483648");
  t.device.device_id = INT32_MAX;
  OK(&t, 0);
}

static void test_data_and_offset(void) {
  int64_t shape[] = {2, 3};
  int64_t strides[] = {3, 1};
  DLTensor t = tensor(2, shape, strides);
  t.data = NULL;
  FAIL(&t, 0, DLB_EINVAL, "data is NULL but the tensor has 6 elements");
  t = tensor(0, NULL, NULL);
  t.data = NULL;
  FAIL(&t, 0, DLB_EINVAL, "data is NULL but the tensor has 1 elements");

  /* NULL data is legal exactly when there are no elements (B39, B41), and
   * then strides are never looked at (B21, B22). */
  int64_t s0[] = {0, 3};
  int64_t wild[] = {INT64_MAX, INT64_MIN};
  t = tensor(2, s0, wild);
  t.data = NULL;
  OK(&t, 0);
  t.data = storage; /* NumPy sends non-NULL for empty arrays */
  OK(&t, 0);

  t = tensor(2, shape, strides);
  t.byte_offset = UINT64_MAX;
  FAIL(&t, 0, DLB_EOVERFLOW, "byte_offset 18446744073709551615 exceeds INT64_MAX");
  t.byte_offset = (uint64_t)INT64_MAX + 1;
  FAIL(&t, 0, DLB_EOVERFLOW, "byte_offset 9223372036854775808");
  /* Offset fits but offset + span does not. */
  t.byte_offset = (uint64_t)INT64_MAX;
  FAIL(&t, 0, DLB_EOVERFLOW, "plus the byte span");
  t.byte_offset = (uint64_t)INT64_MAX - 24;
  OK(&t, 0);
  t.byte_offset = (uint64_t)INT64_MAX - 23;
  FAIL(&t, 0, DLB_EOVERFLOW, "plus the byte span");
  /* Both ends of the span fit in int64 but its length does not (found by
   * tests/fuzz/fuzz_validate): no memory is that long. */
  int64_t two2[] = {2, 2};
  int64_t apart[] = {(int64_t)1 << 60, -((int64_t)1 << 60)};
  t = tensor(2, two2, apart);
  FAIL(&t, 0, DLB_EOVERFLOW, "is longer than INT64_MAX bytes");
  apart[1] = -((int64_t)1 << 59);
  OK(&t, 0);
  /* With no elements there is no span to add. */
  t = tensor(2, s0, wild);
  t.byte_offset = (uint64_t)INT64_MAX;
  OK(&t, 0);
  t.byte_offset = UINT64_MAX;
  FAIL(&t, 0, DLB_EOVERFLOW, "byte_offset");
}

/* Whatever the metadata, validate never crashes (ASan/valgrind watch), and
 * whatever it accepts the layout functions can handle. */
static uint64_t rng_state = 0x9E3779B97F4A7C15u;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static void test_hostile_metadata(void) {
  static const int64_t extents[] = {0, 1, 2, 3, 7, -1, -2, P31, P40, P62,
                                    INT64_MAX, INT64_MIN};
  static const int64_t steps[] = {0, 1, -1, 2, -3, 1000, P31, -P40, P62,
                                  INT64_MAX, INT64_MIN};
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 20000; iter++) {
    int64_t shape[DLB_MAX_NDIM], strides[DLB_MAX_NDIM];
    int32_t ndim = (int32_t)(rnd() % 9) - 1; /* -1 .. 7 */
    for (int i = 0; i < DLB_MAX_NDIM; i++) {
      /* Mostly small sane values so some tensors pass. */
      shape[i] = rnd() % 4 ? (int64_t)(rnd() % 4)
                           : extents[rnd() % (sizeof extents / 8)];
      strides[i] = rnd() % 4 ? (int64_t)(rnd() % 7) - 2
                             : steps[rnd() % (sizeof steps / 8)];
    }
    DLTensor t = tensor(ndim, shape, rnd() % 3 ? strides : NULL);
    if (rnd() % 16 == 0) t.shape = NULL;
    if (rnd() % 16 == 0) t.data = NULL;
    t.dtype = dt((unsigned)(rnd() % 20), (unsigned)(rnd() % 3 ? 32 : rnd() % 256),
                 (unsigned)(rnd() % 8 ? 1 : rnd() % 4));
    t.device.device_type = (DLDeviceType)(int32_t)(rnd() % 21) - 1;
    t.device.device_id = rnd() % 16 ? 0 : (int32_t)(rnd() % 5) - 2;
    t.byte_offset = rnd() % 8 ? rnd() % 64 : rnd();
    unsigned options = (unsigned)(rnd() % 8);

    dlb_error err;
    if (dlb_tensor_validate(&t, options, &err) != DLB_OK) {
      rejected++;
      CHECK(err.code < 0 && err.message[0] != '\0');
      continue;
    }
    accepted++;
    int64_t n, nb, lo, hi;
    CHECK_EQ(dlb_tensor_numel(&t, &n, &err), DLB_OK);
    CHECK_EQ(dlb_tensor_nbytes(&t, false, &nb, &err), DLB_OK);
    CHECK_EQ(dlb_tensor_byte_span(&t, &lo, &hi, &err), DLB_OK);
    CHECK(lo <= 0 && hi >= 0 && (n == 0 ? hi == 0 : hi > 0));
    CHECK(hi <= INT64_MAX - (int64_t)t.byte_offset);
    CHECK(lo >= hi - INT64_MAX); /* the span's length fits */
    CHECK(n == 0 || t.data != NULL);
    int64_t scratch[DLB_MAX_NDIM];
    CHECK(t.ndim == 0 || dlb_tensor_strides(&t, scratch) != NULL);
  }
  /* Both outcomes must occur or the loop proves nothing. */
  CHECK(accepted > 1000);
  CHECK(rejected > 1000);
}


/* ---- differential test: the fast paths against the original code -------------
 * What follows up to ref_validate is the straightforward implementation
 * dlb_tensor_validate and its helpers had before their fast paths (checks
 * one after another, each helper re-reading the dims), renamed ref_*.  The
 * library must agree with it on every input: the same return code, the same
 * err->code and message on failure, err untouched on success, the same
 * outputs. */

static bool ref_mul_nonneg(int64_t a, int64_t b, int64_t *out) {
  if (a != 0 && b > INT64_MAX / a) return false;
  *out = a * b;
  return true;
}

static int ref_shape_numel(int32_t ndim, const int64_t *shape, int64_t *out,
                           dlb_error *err);

static int ref_tensor_numel(const DLTensor *t, int64_t *out, dlb_error *err) {
  if (t == NULL) return dlb_error_set(err, DLB_EINVAL, "tensor is NULL");
  return ref_shape_numel(t->ndim, t->shape, out, err);
}

typedef struct {
  const char *name;
  uint8_t code;
  uint8_t bits;
} ref_dtype_entry;

static const ref_dtype_entry ref_dtype_table[] = {
    {"bool", kDLBool, 8},
    {"float16", kDLFloat, 16},
    {"float32", kDLFloat, 32},
    {"float64", kDLFloat, 64},
    {"bfloat16", kDLBfloat, 16},
    {"complex32", kDLComplex, 32},
    {"complex64", kDLComplex, 64},
    {"complex128", kDLComplex, 128},
    {"float8_e3m4", kDLFloat8_e3m4, 8},
    {"float8_e4m3", kDLFloat8_e4m3, 8},
    {"float8_e4m3b11fnuz", kDLFloat8_e4m3b11fnuz, 8},
    {"float8_e4m3fn", kDLFloat8_e4m3fn, 8},
    {"float8_e4m3fnuz", kDLFloat8_e4m3fnuz, 8},
    {"float8_e5m2", kDLFloat8_e5m2, 8},
    {"float8_e5m2fnuz", kDLFloat8_e5m2fnuz, 8},
    {"float8_e8m0fnu", kDLFloat8_e8m0fnu, 8},
    {"float6_e2m3fn", kDLFloat6_e2m3fn, 6},
    {"float6_e3m2fn", kDLFloat6_e3m2fn, 6},
    {"float4_e2m1fn", kDLFloat4_e2m1fn, 4},
    {"bcomplex32", 18, 32}, /* kDLBcomplex, post-1.3 */
};

#define REF_DTYPE_TABLE_LEN (sizeof ref_dtype_table / sizeof ref_dtype_table[0])

/* Names of the codes for messages, indexed by code. */
static const char *const ref_code_names[] = {
    "int",           "uint",          "float",
    "opaque handle", "bfloat",        "complex",
    "bool",          "float8_e3m4",   "float8_e4m3",
    "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2",   "float8_e5m2fnuz", "float8_e8m0fnu",
    "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
    "bcomplex",
};

#define REF_CODE_NAMES_LEN (sizeof ref_code_names / sizeof ref_code_names[0])

static const ref_dtype_entry *ref_find_entry(uint8_t code, uint8_t bits) {
  for (size_t i = 0; i < REF_DTYPE_TABLE_LEN; i++) {
    if (ref_dtype_table[i].code == code && ref_dtype_table[i].bits == bits)
      return &ref_dtype_table[i];
  }
  return NULL;
}


static int ref_dtype_check(DLDataType dtype, dlb_error *err) {
  unsigned code = dtype.code, bits = dtype.bits, lanes = dtype.lanes;
  if (code == kDLOpaqueHandle)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype (code %u, bits %u, lanes %u): code 3 "
                         "(kDLOpaqueHandle) is not supported: its meaning is "
                         "private to the producer",
                         code, bits, lanes);
  if (code >= REF_CODE_NAMES_LEN)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype (code %u, bits %u, lanes %u): unknown type "
                         "code %u (known codes are 0-18)",
                         code, bits, lanes, code);
  /* Integers: 1, 2 or 4 bits (packed), or any bits with bits x lanes a
   * whole number of bytes; written apart from dtype.c, from the rule. */
  if (code <= 1) {
    bool sub = bits == 1 || bits == 2 || bits == 4;
    bool whole = bits > 0 && (bits * lanes) % 8 == 0;
    if (!sub && !whole)
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "dtype (code %u, bits %u, lanes %u): %s allows 1, "
                           "2 or 4 bits, or bits that make bits x lanes a "
                           "multiple of 8",
                           code, bits, lanes, ref_code_names[code]);
  } else if (ref_find_entry(dtype.code, dtype.bits) == NULL) {
    /* List what the code does allow so the producer's bug is obvious. */
    char allowed[64];
    size_t used = 0;
    allowed[0] = '\0';
    for (size_t i = 0; i < REF_DTYPE_TABLE_LEN; i++) {
      if (ref_dtype_table[i].code != code) continue;
      int n = snprintf(allowed + used, sizeof allowed - used, "%s%u",
                       used == 0 ? "" : ", ", (unsigned)ref_dtype_table[i].bits);
      if (n < 0 || (size_t)n >= sizeof allowed - used) break;
      used += (size_t)n;
    }
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype (code %u, bits %u, lanes %u): %s does not "
                         "allow bits %u (allowed: %s)",
                         code, bits, lanes, ref_code_names[code], bits, allowed);
  }
  if (lanes == 0)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype (code %u, bits %u, lanes %u): lanes must be "
                         ">= 1",
                         code, bits, lanes);
  return DLB_OK;
}

static int ref_storage_bytes(DLDataType dtype, int64_t count, bool padded,
                            int64_t *out, dlb_error *err) {
  int64_t elem_bits = (int64_t)dtype.bits * dtype.lanes;
  if (count < 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "element count %lld is negative", (long long)count);
  if (elem_bits == 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "dtype (code %u, bits %u, lanes %u) has zero-size "
                         "elements",
                         (unsigned)dtype.code, (unsigned)dtype.bits,
                         (unsigned)dtype.lanes);
  if (out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "storage size output is NULL");
  int64_t total;
  if (padded) {
    if (!ref_mul_nonneg(count, (elem_bits + 7) / 8, &total))
      goto overflow;
  } else {
    /* count * elem_bits may overflow even when the byte count fits, so split
     * count = 8a + b: ceil(count * eb / 8) = a * eb + ceil(b * eb / 8). */
    int64_t a = count / 8, b = count % 8, head;
    int64_t tail = (b * elem_bits + 7) / 8;
    if (!ref_mul_nonneg(a, elem_bits, &head) || head > INT64_MAX - tail)
      goto overflow;
    total = head + tail;
  }
  *out = total;
  return DLB_OK;

overflow:
  return dlb_error_set(err, DLB_EOVERFLOW,
                       "%lld elements of %lld bits each (%s) exceed INT64_MAX "
                       "bytes",
                       (long long)count, (long long)elem_bits,
                       padded ? "padded" : "packed");
}

static bool ref_mul_i64(int64_t a, int64_t b, int64_t *out) {
  uint64_t ua = a < 0 ? 0u - (uint64_t)a : (uint64_t)a;
  uint64_t ub = b < 0 ? 0u - (uint64_t)b : (uint64_t)b;
  if (ub != 0 && ua > UINT64_MAX / ub) return false;
  uint64_t mag = ua * ub;
  bool negative = (a < 0) != (b < 0) && mag != 0;
  if (negative) {
    if (mag > (uint64_t)INT64_MAX + 1u) return false;
    /* -(mag) computed without overflowing for mag == 2^63. */
    *out = mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)mag;
  } else {
    if (mag > (uint64_t)INT64_MAX) return false;
    *out = (int64_t)mag;
  }
  return true;
}

static bool ref_add_i64(int64_t a, int64_t b, int64_t *out) {
  if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b))
    return false;
  *out = a + b;
  return true;
}

static int ref_shape_numel(int32_t ndim, const int64_t *shape, int64_t *out,
                    dlb_error *err) {
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
    if (!ref_mul_nonneg(n, shape[i], &n))
      return dlb_error_set(err, DLB_EOVERFLOW,
                           "element count overflows int64 at shape[%ld] = %lld",
                           (long)i, (long long)shape[i]);
  }
  *out = n;
  return DLB_OK;
}

static int ref_byte_span(const DLTensor *t, int64_t *lo, int64_t *hi,
                         dlb_error *err) {
  if (t == NULL) return dlb_error_set(err, DLB_EINVAL, "tensor is NULL");
  if (lo == NULL || hi == NULL)
    return dlb_error_set(err, DLB_EINVAL, "byte span output is NULL");
  if (t->ndim > DLB_MAX_NDIM)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "ndim %ld exceeds DLB_MAX_NDIM (%d)", (long)t->ndim,
                         DLB_MAX_NDIM);
  int64_t n;
  int rc = ref_tensor_numel(t, &n, err);
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
    rc = ref_storage_bytes(t->dtype, n, false, &bytes, err);
    if (rc != DLB_OK) return rc;
    *lo = 0;
    *hi = bytes;
    return DLB_OK;
  }
  int64_t itemsize = dlb_dtype_itemsize(t->dtype);
  if (itemsize == 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "dtype (code %u, bits %u, lanes %u) has zero-size "
                         "elements",
                         (unsigned)t->dtype.code, (unsigned)t->dtype.bits,
                         (unsigned)t->dtype.lanes);
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
    bool ok = ref_mul_i64(t->shape[i] - 1, strides[i], &reach);
    if (ok) ok = reach < 0 ? ref_add_i64(lo_e, reach, &lo_e)
                           : ref_add_i64(hi_e, reach, &hi_e);
    if (!ok)
      return dlb_error_set(err, DLB_EOVERFLOW,
                           "byte span overflows int64 at dim %ld (shape %lld, "
                           "stride %lld)",
                           (long)i, (long long)t->shape[i],
                           (long long)strides[i]);
  }
  int64_t lo_b, hi_b;
  if (!ref_add_i64(hi_e, 1, &hi_e) || !ref_mul_i64(lo_e, itemsize, &lo_b) ||
      !ref_mul_i64(hi_e, itemsize, &hi_b))
    return dlb_error_set(err, DLB_EOVERFLOW,
                         "byte span of %lld-byte elements overflows int64",
                         (long long)itemsize);
  *lo = lo_b;
  *hi = hi_b;
  return DLB_OK;
}

static int ref_validate(const DLTensor *t, unsigned options, dlb_error *err) {
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
  int rc = ref_shape_numel(t->ndim, t->shape, &numel, err);
  if (rc != DLB_OK) return rc;

  if ((options & DLB_VALIDATE_STRIDES_REQUIRED) && t->ndim > 0 &&
      t->strides == NULL)
    return dlb_error_set(err, DLB_EINVAL,
                         "strides is NULL with ndim %" PRId32
                         ": DLPack >= 1.2 requires strides when ndim > 0",
                         t->ndim);

  if (!(options & DLB_VALIDATE_ANY_DTYPE)) {
    rc = ref_dtype_check(t->dtype, err);
    if (rc != DLB_OK) return rc;
  } else if (t->dtype.bits == 0 || t->dtype.lanes == 0) {
    /* Even an unknown dtype needs a size, or no byte range can be checked. */
    char d[DLB_DESCRIBE_MAX];
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype %s: bits and lanes must be >= 1",
                         dlb_dtype_describe(t->dtype, d, sizeof d));
  }

  /* Any type >= 1: one without a name is a foreign device. */
  if (!(options & DLB_VALIDATE_ANY_DEVICE) &&
      (int32_t)t->device.device_type < 1)
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
  rc = ref_storage_bytes(t->dtype, numel, false, &nbytes, err);
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
  rc = ref_byte_span(t, &lo, &hi, err);
  if (rc != DLB_OK) return rc;
  if (hi > INT64_MAX - (int64_t)t->byte_offset)
    return dlb_error_set(err, DLB_EOVERFLOW,
                         "byte_offset %" PRIu64 " plus the byte span end %"
                         PRId64 " exceeds INT64_MAX",
                         t->byte_offset, hi);
  if (lo < hi - INT64_MAX)
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

/* Runs f on the library and on the reference with a poisoned err each, and
 * once more with NULL err; compares everything. */
static void same_error(int rc_new, const dlb_error *e_new, int rc_ref,
                       const dlb_error *e_ref, const char *what, int iter) {
  CHECK_EQ(rc_new, rc_ref);
  /* The whole struct: on success neither may write it, on failure both
   * write the same code and the same message. */
  bool same = memcmp(e_new, e_ref, sizeof *e_new) == 0;
  CHECK(same);
  if (rc_new != rc_ref || !same)
    fprintf(stderr, "  %s iter %d: rc %d vs ref %d, \"%s\" vs ref \"%s\"\n",
            what, iter, rc_new, rc_ref, e_new->message, e_ref->message);
}

static void poison(dlb_error *e) {
  memset(e, 0xA5, sizeof *e);
  e->message[sizeof e->message - 1] = '\0';
}

/* Values that sit on every boundary the fast paths care about: the small
 * value bounds (2^28, 2^29), int32, and the int64 edges. */
static int64_t edge_value(void) {
  static const int64_t edges[] = {
      0, 1, 2, 3, -1, -2, 7, 8,
      ((int64_t)1 << 28) - 1, (int64_t)1 << 28, ((int64_t)1 << 28) + 1,
      -((int64_t)1 << 28), -((int64_t)1 << 28) - 1,
      ((int64_t)1 << 29) - 1, (int64_t)1 << 29, ((int64_t)1 << 29) + 1,
      P31 - 1, P31, -P31, P40, -P40, P62, -P62, P62 + 1,
      INT64_MAX, INT64_MAX - 1, INT64_MIN, INT64_MIN + 1,
      (int64_t)1 << 32, ((int64_t)1 << 21) + 3};
  return edges[rnd() % (sizeof edges / sizeof edges[0])];
}

static int64_t rand_extent(void) {
  switch (rnd() % 8) {
    case 0: return edge_value();
    case 1: return (int64_t)(rnd() % 100000);
    case 2: return (int64_t)(rnd() >> (rnd() % 64));
    default: return (int64_t)(rnd() % 5);
  }
}

static int64_t rand_stride(void) {
  switch (rnd() % 8) {
    case 0: return edge_value();
    case 1: return (int64_t)(rnd() % 2000001) - 1000000;
    case 2: {
      int64_t v = (int64_t)(rnd() >> (rnd() % 63 + 1));
      return rnd() % 2 ? v : -v;
    }
    default: return (int64_t)(rnd() % 9) - 3;
  }
}

static DLDataType rand_dtype(void) {
  switch (rnd() % 4) {
    case 0: return dt((unsigned)(rnd() % 256), (unsigned)(rnd() % 256),
                      (unsigned)(rnd() % 4 ? rnd() % 5 : rnd() % 65536));
    case 1: {
      static const unsigned bits[] = {0, 1, 4, 6, 8, 12, 16, 32, 64, 128, 255};
      return dt((unsigned)(rnd() % 20), bits[rnd() % 11],
                (unsigned)(rnd() % 4 ? 1 : rnd() % 5));
    }
    default: return dt(2, 32, 1);
  }
}

static void test_differential(void) {
  int64_t shape[DLB_MAX_NDIM + 2], strides[DLB_MAX_NDIM + 2];
  int outcomes[2] = {0, 0};
  for (int iter = 0; iter < 100000; iter++) {
    int32_t ndim;
    switch (rnd() % 16) {
      case 0: ndim = (int32_t)(rnd() % (DLB_MAX_NDIM + 2)); break;
      case 1: ndim = (int32_t)rnd(); break;
      case 2: ndim = -(int32_t)(rnd() % 3); break;
      default: ndim = (int32_t)(rnd() % 9);
    }
    /* Row-major strides for some tensors so the contiguous paths run. */
    bool contiguous = rnd() % 4 == 0, t_small_dtype = false;
    for (int i = 0; i < DLB_MAX_NDIM + 2; i++) {
      shape[i] = rnd() % 3 ? (int64_t)(rnd() % 6) : rand_extent();
      strides[i] = rand_stride();
    }
    if (contiguous && ndim > 0 && ndim <= DLB_MAX_NDIM) {
      int64_t step = 1;
      for (int32_t i = ndim - 1; i >= 0; i--) {
        strides[i] = step;
        /* Skip extents the product cannot take (ref_mul_nonneg wants
         * non-negative operands). */
        if (shape[i] > 0 && !ref_mul_nonneg(step, shape[i], &step)) step = 1;
      }
    }
    if (rnd() % 8 == 0) {
      /* Large extents and strides together, so spans land on both sides of
       * int64's edge while the element count still fits. */
      static const int64_t big_e[] = {((int64_t)1 << 29) - 1,
                                      (int64_t)1 << 29, (int64_t)1 << 28,
                                      ((int64_t)1 << 28) + 1, 1, 2};
      static const int64_t big_s[] = {((int64_t)1 << 28) - 1,
                                      (int64_t)1 << 28, (int64_t)1 << 33,
                                      (int64_t)1 << 34, ((int64_t)1 << 34) + 1,
                                      (int64_t)1 << 35, P62 / 3};
      for (int i = 0; i < DLB_MAX_NDIM + 2; i++) {
        shape[i] = big_e[rnd() % (sizeof big_e / sizeof big_e[0])];
        strides[i] = big_s[rnd() % (sizeof big_s / sizeof big_s[0])];
        if (rnd() % 2) strides[i] = -strides[i];
      }
      t_small_dtype = true;
    }
    DLTensor t = tensor(ndim, shape, rnd() % 3 ? strides : NULL);
    if (rnd() % 32 == 0) t.shape = NULL;
    if (rnd() % 16 == 0) t.data = NULL;
    t.dtype = t_small_dtype && rnd() % 2 ? dt(0, 8, 1) : rand_dtype();
    if (t_small_dtype && rnd() % 2) ndim = t.ndim = (int32_t)(rnd() % 4);
    t.device.device_type = (DLDeviceType)(rnd() % 8 ? 1 : (int32_t)(rnd() % 40) - 5);
    if (rnd() % 64 == 0) t.device.device_type = (DLDeviceType)(int32_t)rnd();
    t.device.device_id = rnd() % 16 ? 0 : (int32_t)rnd();
    t.byte_offset = rnd() % 4 ? rnd() % 64
                  : (rnd() % 2 ? rnd() : (uint64_t)INT64_MAX - rnd() % 4096);
    unsigned options = (unsigned)(rnd() % 8);
    const DLTensor *tp = rnd() % 512 == 0 ? NULL : &t;

    dlb_error e_new, e_ref;
    poison(&e_new);
    poison(&e_ref);
    int rc_new = dlb_tensor_validate(tp, options, &e_new);
    int rc_ref = ref_validate(tp, options, &e_ref);
    same_error(rc_new, &e_new, rc_ref, &e_ref, "validate", iter);
    CHECK_EQ(dlb_tensor_validate(tp, options, NULL), rc_ref);
    outcomes[rc_ref == DLB_OK]++;

    /* The helpers on the same input, valid or not. */
    int64_t n_new = -7, n_ref = -7;
    poison(&e_new);
    poison(&e_ref);
    int32_t nd = tp != NULL ? tp->ndim : 0;
    const int64_t *sh = tp != NULL ? tp->shape : NULL;
    /* Only ndim values whose shape the test owns: numel reads ndim dims. */
    if (nd <= DLB_MAX_NDIM + 2) {
      rc_new = dlb_shape_numel(nd, sh, &n_new, &e_new);
      rc_ref = ref_shape_numel(nd, sh, &n_ref, &e_ref);
      same_error(rc_new, &e_new, rc_ref, &e_ref, "shape_numel", iter);
      CHECK_EQ(n_new, n_ref);
    }

    int64_t lo_new = -7, hi_new = -7, lo_ref = -7, hi_ref = -7;
    poison(&e_new);
    poison(&e_ref);
    rc_new = dlb_tensor_byte_span(tp, &lo_new, &hi_new, &e_new);
    rc_ref = ref_byte_span(tp, &lo_ref, &hi_ref, &e_ref);
    same_error(rc_new, &e_new, rc_ref, &e_ref, "byte_span", iter);
    CHECK(lo_new == lo_ref && hi_new == hi_ref);

    int64_t count = rnd() % 2 ? n_ref : rand_extent(), b_new = -7, b_ref = -7;
    bool padded = rnd() % 2;
    poison(&e_new);
    poison(&e_ref);
    rc_new = dlb_dtype_storage_bytes(t.dtype, count, padded, &b_new, &e_new);
    rc_ref = ref_storage_bytes(t.dtype, count, padded, &b_ref, &e_ref);
    same_error(rc_new, &e_new, rc_ref, &e_ref, "storage_bytes", iter);
    CHECK_EQ(b_new, b_ref);
  }
  /* Both outcomes must be common or the comparison proves little. */
  CHECK(outcomes[0] > 10000);
  CHECK(outcomes[1] > 10000);

  /* NULL outputs. */
  int64_t s2[] = {2, 3}, st2[] = {3, 1}, lo, hi;
  DLTensor t = tensor(2, s2, st2);
  dlb_error e_new, e_ref;
  poison(&e_new);
  poison(&e_ref);
  same_error(dlb_tensor_byte_span(&t, NULL, &hi, &e_new), &e_new,
             ref_byte_span(&t, NULL, &hi, &e_ref), &e_ref, "span NULL", 0);
  poison(&e_new);
  poison(&e_ref);
  same_error(dlb_tensor_byte_span(&t, &lo, NULL, &e_new), &e_new,
             ref_byte_span(&t, &lo, NULL, &e_ref), &e_ref, "span NULL", 1);
  poison(&e_new);
  poison(&e_ref);
  same_error(dlb_shape_numel(2, s2, NULL, &e_new), &e_new,
             ref_shape_numel(2, s2, NULL, &e_ref), &e_ref, "numel NULL", 0);
  poison(&e_new);
  poison(&e_ref);
  same_error(dlb_dtype_storage_bytes(F32, 3, false, NULL, &e_new), &e_new,
             ref_storage_bytes(F32, 3, false, NULL, &e_ref), &e_ref,
             "storage NULL", 0);
}

/* Every (code, bits) pair and several lane counts: the lookup table of the
 * fast dtype check must agree with dtype.c's table. */
static void test_differential_dtype(void) {
  static const unsigned lanes[] = {0, 1, 2, 8, 65535};
  for (unsigned code = 0; code < 256; code++) {
    for (unsigned bits = 0; bits < 256; bits++) {
      for (size_t l = 0; l < sizeof lanes / sizeof lanes[0]; l++) {
        DLDataType d = dt(code, bits, lanes[l]);
        dlb_error e_new, e_ref;
        poison(&e_new);
        poison(&e_ref);
        int rc_new = dlb_dtype_check(d, &e_new);
        int rc_ref = ref_dtype_check(d, &e_ref);
        same_error(rc_new, &e_new, rc_ref, &e_ref, "dtype_check",
                   (int)(code * 256 + bits));
        /* validate, too, on a small tensor of that dtype. */
        int64_t s[] = {3}, st[] = {1};
        DLTensor t = tensor(1, s, st);
        t.dtype = d;
        /* Of the options only ANY_DTYPE changes how a dtype is judged. */
        for (unsigned opt = 0; opt <= DLB_VALIDATE_ANY_DTYPE;
             opt += DLB_VALIDATE_ANY_DTYPE) {
          poison(&e_new);
          poison(&e_ref);
          rc_new = dlb_tensor_validate(&t, opt, &e_new);
          rc_ref = ref_validate(&t, opt, &e_ref);
          same_error(rc_new, &e_new, rc_ref, &e_ref, "validate dtype",
                     (int)(code * 256 + bits));
        }
      }
    }
  }
  /* Every device type around the known range. */
  for (int32_t type = -40; type < 300; type++) {
    int64_t s[] = {3}, st[] = {1};
    DLTensor t = tensor(1, s, st);
    t.device.device_type = (DLDeviceType)type;
    for (unsigned opt = 0; opt < 8; opt++) {
      dlb_error e_new, e_ref;
      poison(&e_new);
      poison(&e_ref);
      same_error(dlb_tensor_validate(&t, opt, &e_new), &e_new,
                 ref_validate(&t, opt, &e_ref), &e_ref, "validate device",
                 type);
    }
  }
}

static void test_check_version(void) {
  DLManagedTensorVersioned m;
  memset(&m, 0, sizeof m);
  dlb_error err;
  m.version.major = 1;
  m.version.minor = 3;
  CHECK_EQ(dlb_managed_check_version(&m, &err), DLB_OK);
  m.version.minor = 0;
  CHECK_EQ(dlb_managed_check_version(&m, &err), DLB_OK);
  /* A newer minor only adds values; validate catches any we do not know. */
  m.version.minor = 99;
  CHECK_EQ(dlb_managed_check_version(&m, &err), DLB_OK);
  m.version.major = 2;
  m.version.minor = 0;
  CHECK_EQ(dlb_managed_check_version(&m, &err), DLB_EVERSION);
  CHECK_EQ(err.code, DLB_EVERSION);
  CHECK_MSG(err, "2.0");
  CHECK_MSG(err, "major 1");
  CHECK_MSG(err, "deleter");
  m.version.major = 0;
  m.version.minor = 8;
  CHECK_EQ(dlb_managed_check_version(&m, &err), DLB_EVERSION);
  CHECK_MSG(err, "0.8");
  m.version.major = UINT32_MAX;
  CHECK_EQ(dlb_managed_check_version(&m, NULL), DLB_EVERSION);
  CHECK_EQ(dlb_managed_check_version(NULL, &err), DLB_EINVAL);
  CHECK_MSG(err, "NULL");
}

/* ---- devices ------------------------------------------------------------------ */

static const struct {
  int32_t type;
  const char *name;
  bool host;
} devices[] = {
    {1, "cpu", true},         {2, "cuda", false},
    {3, "cuda_host", true},   {4, "opencl", false},
    {7, "vulkan", false},     {8, "metal", false},
    {9, "vpi", false},        {10, "rocm", false},
    {11, "rocm_host", true},  {12, "ext_dev", false},
    {13, "cuda_managed", true}, {14, "oneapi", false},
    {15, "webgpu", false},    {16, "hexagon", false},
    {17, "maia", false},      {18, "trn", false},
    {19, "tpu", false},       {20, "tpu_host", false},
    {21, "ascend", false},
};
#define NDEVICES ((int)(sizeof devices / sizeof devices[0]))

static void test_device_names(void) {
  for (int32_t type = -5; type < 300; type++) {
    int idx = -1;
    for (int i = 0; i < NDEVICES; i++)
      if (devices[i].type == type) idx = i;
    CHECK_EQ(dlb_device_type_known(type), idx >= 0);
    const char *name = dlb_device_type_name(type);
    if (idx < 0) {
      CHECK(name == NULL);
      DLDevice d = {(DLDeviceType)type, 0};
      CHECK(!dlb_device_is_host_accessible(d));
      continue;
    }
    CHECK_STREQ(name, devices[idx].name);
    DLDevice d = {(DLDeviceType)type, 0};
    CHECK_EQ(dlb_device_is_host_accessible(d), devices[idx].host);

    dlb_error err;
    DLDevice got = {(DLDeviceType)0, -9};
    CHECK_EQ(dlb_device_from_name(devices[idx].name, &got, &err), DLB_OK);
    CHECK_EQ(got.device_type, type);
    CHECK_EQ(got.device_id, 0);
    char buf[64];
    snprintf(buf, sizeof buf, "%s:3", devices[idx].name);
    CHECK_EQ(dlb_device_from_name(buf, &got, &err), DLB_OK);
    CHECK_EQ(got.device_type, type);
    CHECK_EQ(got.device_id, 3);
  }
  CHECK(dlb_device_type_name(INT32_MIN) == NULL);
  CHECK(dlb_device_type_name(INT32_MAX) == NULL);
}

static void test_device_parse(void) {
  dlb_error err;
  DLDevice d;
  CHECK_EQ(dlb_device_from_name("cuda:1", &d, &err), DLB_OK);
  CHECK(d.device_type == kDLCUDA && d.device_id == 1);
  CHECK_EQ(dlb_device_from_name("rocm:0", &d, &err), DLB_OK);
  CHECK(d.device_type == kDLROCM && d.device_id == 0);
  CHECK_EQ(dlb_device_from_name("cuda:2147483647", &d, &err), DLB_OK);
  CHECK_EQ(d.device_id, INT32_MAX);
  CHECK_EQ(dlb_device_from_name("cpu", &d, NULL), DLB_OK);
  CHECK(d.device_type == kDLCPU && d.device_id == 0);

  /* The post-1.3 names, and "device<N>" for any type (the name a foreign
   * device is described by, so describe -> parse is a round trip). */
  CHECK_EQ(dlb_device_from_name("tpu_host:0", &d, &err), DLB_OK);
  CHECK(d.device_type == kDLTPUHost && d.device_id == 0);
  CHECK_EQ(dlb_device_from_name("tpu:3", &d, &err), DLB_OK);
  CHECK(d.device_type == kDLTPU && d.device_id == 3);
  CHECK_EQ(dlb_device_from_name("ascend", &d, &err), DLB_OK);
  CHECK(d.device_type == kDLAscend && d.device_id == 0);
  CHECK_EQ(dlb_device_from_name("device99:0", &d, &err), DLB_OK);
  CHECK(d.device_type == 99 && d.device_id == 0);
  CHECK_EQ(dlb_device_from_name("device5", &d, &err), DLB_OK);
  CHECK(d.device_type == 5 && d.device_id == 0);
  CHECK_EQ(dlb_device_from_name("device2:1", &d, &err), DLB_OK);
  CHECK(d.device_type == kDLCUDA && d.device_id == 1);
  CHECK_EQ(dlb_device_from_name("device2147483647:7", &d, &err), DLB_OK);
  CHECK((int32_t)d.device_type == INT32_MAX && d.device_id == 7);
  for (int32_t type = 1; type < 300; type++) {
    char text[DLB_DESCRIBE_MAX];
    DLDevice dev = {(DLDeviceType)type, 4}, back = {kDLCPU, 0};
    CHECK_EQ(dlb_device_from_name(dlb_device_describe(dev, text, sizeof text),
                                  &back, &err),
             DLB_OK);
    CHECK((int32_t)back.device_type == type && back.device_id == 4);
  }

  static const struct {
    const char *name;
    const char *needle;
  } bad[] = {
      {"gpu", "unknown device \"gpu\""},
      {"CUDA", "unknown device"},
      {"", "unknown device"},
      {":1", "unknown device"},
      {"cpu ", "unknown device"},
      {"cud", "unknown device"},
      {"cudaa", "unknown device"},
      {"cuda_", "unknown device"},
      {"cuda:-1", "must not be negative"},
      {"cuda:", "expected a device id"},
      {"cuda:1x", "decimal digits"},
      {"cuda:1:2", "decimal digits"},
      {"cuda: 1", "decimal digits"},
      {"cuda:+1", "decimal digits"},
      {"cuda:0x1", "decimal digits"},
      {"cuda:2147483648", "exceeds INT32_MAX"},
      {"cuda:99999999999999999999999", "exceeds INT32_MAX"},
      {"device", "unknown device"},
      {"device0", "unknown device"},
      {"device0:0", "unknown device"},
      {"device-1:0", "unknown device"},
      {"device+1", "unknown device"},
      {"device07", "unknown device"},
      {"device7x", "unknown device"},
      {"device 7", "unknown device"},
      {"device2147483648", "unknown device"},
      {"device99999999999999999999", "unknown device"},
      {"Device7", "unknown device"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    DLDevice out = {(DLDeviceType)77, 77};
    int rc = dlb_device_from_name(bad[i].name, &out, &err);
    CHECK_EQ(rc, DLB_EINVAL);
    CHECK_EQ(err.code, DLB_EINVAL);
    CHECK_MSG(err, bad[i].needle);
    /* out is written only on success. */
    CHECK(out.device_type == 77 && out.device_id == 77);
    if (rc != DLB_EINVAL) fprintf(stderr, "  accepted \"%s\"\n", bad[i].name);
  }
  CHECK_EQ(dlb_device_from_name(NULL, &d, &err), DLB_EINVAL);
  CHECK_MSG(err, "NULL");
  CHECK_EQ(dlb_device_from_name("cpu", NULL, &err), DLB_EINVAL);
  CHECK_EQ(dlb_device_from_name("nope", &d, NULL), DLB_EINVAL);
}

int main(void) {
  test_valid_tensors();
  test_ndim_and_shape();
  test_sizes();
  test_dtype_checks();
  test_device_checks();
  test_data_and_offset();
  test_hostile_metadata();
  test_differential();
  test_differential_dtype();
  test_check_version();
  test_device_names();
  test_device_parse();
  return check_summary("test_validate");
}
