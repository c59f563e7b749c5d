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
}

static void test_device_checks(void) {
  int64_t shape[] = {2};
  int64_t strides[] = {1};
  DLTensor t = tensor(1, shape, strides);
  t.device.device_type = (DLDeviceType)5;
  FAIL(&t, 0, DLB_EUNSUPPORTED, "device_type 5 is not a known");
  OK(&t, DLB_VALIDATE_ANY_DEVICE);
  t.device.device_type = (DLDeviceType)6;
  FAIL(&t, 0, DLB_EUNSUPPORTED, "device_type 6");
  t.device.device_type = (DLDeviceType)0;
  FAIL(&t, 0, DLB_EUNSUPPORTED, "device_type 0");
  t.device.device_type = (DLDeviceType)19;
  FAIL(&t, 0, DLB_EUNSUPPORTED, "device_type 19");
  t.device.device_type = (DLDeviceType)-1;
  FAIL(&t, 0, DLB_EUNSUPPORTED, "device_type -1");

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
    CHECK(n == 0 || t.data != NULL);
    int64_t scratch[DLB_MAX_NDIM];
    CHECK(t.ndim == 0 || dlb_tensor_strides(&t, scratch) != NULL);
  }
  /* Both outcomes must occur or the loop proves nothing. */
  CHECK(accepted > 1000);
  CHECK(rejected > 1000);
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
  test_check_version();
  test_device_names();
  test_device_parse();
  return check_summary("test_validate");
}
