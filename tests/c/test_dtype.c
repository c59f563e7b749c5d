/* test_dtype.c -- dtype names, checks, item sizes and storage sizes. */
#include "check.h"

typedef struct {
  const char *name;
  uint8_t code;
  uint8_t bits;
  int64_t itemsize;
  bool subbyte;
} known_dtype;

/* Written out independently of dtype.c's table, from dlpack-facts.md. */
static const known_dtype known[] = {
    {"bool", 6, 8, 1, false},
    {"int1", 0, 1, 1, true},
    {"int2", 0, 2, 1, true},
    {"int4", 0, 4, 1, true},
    {"int8", 0, 8, 1, false},
    {"int16", 0, 16, 2, false},
    {"int32", 0, 32, 4, false},
    {"int64", 0, 64, 8, false},
    {"uint1", 1, 1, 1, true},
    {"uint2", 1, 2, 1, true},
    {"uint4", 1, 4, 1, true},
    {"uint8", 1, 8, 1, false},
    {"uint16", 1, 16, 2, false},
    {"uint32", 1, 32, 4, false},
    {"uint64", 1, 64, 8, false},
    {"float16", 2, 16, 2, false},
    {"float32", 2, 32, 4, false},
    {"float64", 2, 64, 8, false},
    {"bfloat16", 4, 16, 2, false},
    {"complex32", 5, 32, 4, false},
    {"complex64", 5, 64, 8, false},
    {"complex128", 5, 128, 16, false},
    {"float8_e3m4", 7, 8, 1, false},
    {"float8_e4m3", 8, 8, 1, false},
    {"float8_e4m3b11fnuz", 9, 8, 1, false},
    {"float8_e4m3fn", 10, 8, 1, false},
    {"float8_e4m3fnuz", 11, 8, 1, false},
    {"float8_e5m2", 12, 8, 1, false},
    {"float8_e5m2fnuz", 13, 8, 1, false},
    {"float8_e8m0fnu", 14, 8, 1, false},
    {"float6_e2m3fn", 15, 6, 1, true},
    {"float6_e3m2fn", 16, 6, 1, true},
    {"float4_e2m1fn", 17, 4, 1, true},
    /* post-1.3 kDLBcomplex: a complex of two bfloat16 */
    {"bcomplex32", 18, 32, 4, false},
};
#define NKNOWN ((int)(sizeof known / sizeof known[0]))

static DLDataType dt(unsigned code, unsigned bits, unsigned lanes) {
  DLDataType d;
  d.code = (uint8_t)code;
  d.bits = (uint8_t)bits;
  d.lanes = (uint16_t)lanes;
  return d;
}

static void test_every_name_round_trips(void) {
  for (int i = 0; i < NKNOWN; i++) {
    dlb_error err;
    DLDataType d;
    CHECK_EQ(dlb_dtype_from_name(known[i].name, &d, &err), DLB_OK);
    CHECK_EQ(d.code, known[i].code);
    CHECK_EQ(d.bits, known[i].bits);
    CHECK_EQ(d.lanes, 1);
    CHECK_EQ(dlb_dtype_check(d, &err), DLB_OK);
    char buf[32];
    CHECK_EQ(dlb_dtype_name(d, buf, sizeof buf, &err), DLB_OK);
    CHECK_STREQ(buf, known[i].name);
    CHECK_EQ(dlb_dtype_itemsize(d), known[i].itemsize);
    CHECK_EQ(dlb_dtype_is_subbyte(d), known[i].subbyte);

    /* The same type as a 4-lane vector. */
    char vname[48];
    snprintf(vname, sizeof vname, "%sx4", known[i].name);
    CHECK_EQ(dlb_dtype_from_name(vname, &d, &err), DLB_OK);
    CHECK_EQ(d.code, known[i].code);
    CHECK_EQ(d.bits, known[i].bits);
    CHECK_EQ(d.lanes, 4);
    CHECK_EQ(dlb_dtype_name(d, buf, sizeof buf, &err), DLB_OK);
    CHECK_STREQ(buf, vname);

    /* The longest lanes suffix still fits the documented 32 bytes. */
    snprintf(vname, sizeof vname, "%sx65535", known[i].name);
    CHECK_EQ(dlb_dtype_from_name(vname, &d, &err), DLB_OK);
    CHECK_EQ(d.lanes, 65535);
    CHECK_EQ(dlb_dtype_name(d, buf, sizeof buf, &err), DLB_OK);
    CHECK_STREQ(buf, vname);
  }
}

/* The rule, written from the task's words and not from dtype.c: integers
 * of 1, 2 or 4 bits, or of any bits whose bits x lanes is a multiple of 8;
 * every other code only at the widths in the list above; lanes >= 1. */
static bool oracle_accepts(unsigned code, unsigned bits, unsigned lanes) {
  if (lanes == 0) return false;
  if (code == 0 || code == 1)
    return bits == 1 || bits == 2 || bits == 4 ||
           (bits > 0 && bits * lanes % 8 == 0);
  for (int i = 0; i < NKNOWN; i++)
    if (known[i].code == code && known[i].bits == bits) return true;
  return false;
}

/* Every (code, bits) pair at several lane counts: accepted exactly when the
 * oracle says so, and every accepted one has a name that reads back as the
 * same dtype and is how messages describe it. */
static void test_check_exhaustive(void) {
  static const unsigned lane_counts[] = {0, 1, 2, 3, 4, 8, 65535};
  int accepted_scalars = 0;
  for (unsigned code = 0; code < 256; code++) {
    for (unsigned bits = 0; bits < 256; bits++) {
      for (size_t l = 0; l < sizeof lane_counts / sizeof *lane_counts; l++) {
        unsigned lanes = lane_counts[l];
        bool expect = oracle_accepts(code, bits, lanes);
        dlb_error err;
        DLDataType d = dt(code, bits, lanes);
        int rc = dlb_dtype_check(d, &err);
        if (rc != (expect ? DLB_OK : DLB_EUNSUPPORTED)) {
          CHECK_EQ(rc, expect ? DLB_OK : DLB_EUNSUPPORTED);
          fprintf(stderr, "  code %u bits %u lanes %u\n", code, bits, lanes);
          continue;
        }
        if (!expect) {
          /* Every refusal names the three fields. */
          char fields[64];
          snprintf(fields, sizeof fields, "code %u, bits %u, lanes %u", code,
                   bits, lanes);
          if (strstr(err.message, fields) == NULL) {
            CHECK(!"refusal does not name code, bits and lanes");
            fprintf(stderr, "  %s\n", err.message);
          }
          continue;
        }
        if (lanes == 1) accepted_scalars++;
        char name[32], described[DLB_DESCRIBE_MAX];
        DLDataType back = dt(99, 99, 99);
        if (dlb_dtype_name(d, name, sizeof name, &err) != DLB_OK ||
            dlb_dtype_from_name(name, &back, &err) != DLB_OK ||
            back.code != code || back.bits != bits || back.lanes != lanes ||
            strcmp(dlb_dtype_describe(d, described, sizeof described),
                   name) != 0) {
          CHECK(!"accepted dtype does not round-trip through its name");
          fprintf(stderr, "  code %u bits %u lanes %u: \"%s\" (%s)\n", code,
                  bits, lanes, name, err.message);
        }
      }
    }
  }
  /* Integers: 1, 2, 4 and the 31 multiples of 8 up to 248, twice; every
   * other named type once. */
  int others = 0;
  for (int i = 0; i < NKNOWN; i++) others += known[i].code > 1;
  CHECK_EQ(accepted_scalars, 2 * (3 + 31) + others);
}

static void test_check_messages(void) {
  dlb_error err;
  /* Opaque handles have no meaning we could know. */
  CHECK_EQ(dlb_dtype_check(dt(3, 64, 1), &err), DLB_EUNSUPPORTED);
  CHECK_EQ(err.code, DLB_EUNSUPPORTED);
  CHECK_MSG(err, "code 3, bits 64, lanes 1");
  CHECK_MSG(err, "kDLOpaqueHandle");
  CHECK_MSG(err, "not supported");

  /* fp6 must be 6 bits, even though 8 would be a whole byte. */
  CHECK_EQ(dlb_dtype_check(dt(15, 8, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "code 15, bits 8, lanes 1");
  CHECK_MSG(err, "float6_e2m3fn");
  CHECK_MSG(err, "allowed: 6");
  CHECK_EQ(dlb_dtype_check(dt(16, 8, 1), &err), DLB_EUNSUPPORTED);
  CHECK_EQ(dlb_dtype_check(dt(17, 8, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "allowed: 4");

  /* Bool is 8 bits: (bool, 1) is not bool.  (uint, 1), which old
   * producers used for bool stored a byte each, is a packed uint1 now: a
   * legacy capsule cannot say it is padded (docs/decisions.md, "Dtypes"). */
  CHECK_EQ(dlb_dtype_check(dt(6, 1, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "code 6, bits 1, lanes 1");
  CHECK_MSG(err, "bool");
  CHECK_MSG(err, "allowed: 8");
  CHECK_EQ(dlb_dtype_check(dt(1, 1, 1), &err), DLB_OK);

  /* Integers: 1, 2 or 4 bits at any lanes, other widths in whole bytes. */
  CHECK_EQ(dlb_dtype_check(dt(0, 2, 1), &err), DLB_OK);
  CHECK_EQ(dlb_dtype_check(dt(1, 2, 3), &err), DLB_OK);
  CHECK_EQ(dlb_dtype_check(dt(0, 24, 1), &err), DLB_OK);
  CHECK_EQ(dlb_dtype_check(dt(1, 248, 1), &err), DLB_OK);
  CHECK_EQ(dlb_dtype_check(dt(0, 12, 2), &err), DLB_OK);
  CHECK_EQ(dlb_dtype_check(dt(0, 3, 8), &err), DLB_OK);
  CHECK_EQ(dlb_dtype_check(dt(0, 3, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "dtype (code 0, bits 3, lanes 1): int allows 1, 2 or 4 "
                 "bits, or bits that make bits x lanes a multiple of 8");
  CHECK_EQ(dlb_dtype_check(dt(1, 12, 3), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "code 1, bits 12, lanes 3): uint allows");
  CHECK_EQ(dlb_dtype_check(dt(1, 0, 8), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "code 1, bits 0, lanes 8");
  CHECK_EQ(dlb_dtype_check(dt(0, 255, 1), &err), DLB_EUNSUPPORTED);
  CHECK_EQ(dlb_dtype_check(dt(0, 255, 8), &err), DLB_OK);
  /* An integer width the rule allows but lanes 0 is still no dtype. */
  CHECK_EQ(dlb_dtype_check(dt(0, 2, 0), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "lanes must be >= 1");

  CHECK_EQ(dlb_dtype_check(dt(2, 8, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "allowed: 16, 32, 64");
  /* complex64 is (5, 64, 1), never (2, 32, 2)-style halves. */
  CHECK_EQ(dlb_dtype_check(dt(5, 16, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "allowed: 32, 64, 128");
  CHECK_EQ(dlb_dtype_check(dt(4, 32, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "allowed: 16");

  /* kDLBcomplex (post-1.3) is 32 bits only; 19 is the first unknown code,
   * refused by number, never guessed at. */
  CHECK_EQ(dlb_dtype_check(dt(18, 8, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "bcomplex does not allow bits 8 (allowed: 32)");
  CHECK_EQ(dlb_dtype_check(dt(18, 64, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "allowed: 32");
  CHECK_EQ(dlb_dtype_check(dt(19, 32, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "unknown type code 19 (known codes are 0-18)");
  CHECK_EQ(dlb_dtype_check(dt(99, 32, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "unknown type code 99");
  CHECK_EQ(dlb_dtype_check(dt(255, 8, 1), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "code 255");

  CHECK_EQ(dlb_dtype_check(dt(2, 32, 0), &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "code 2, bits 32, lanes 0");
  CHECK_MSG(err, "lanes must be >= 1");

  /* Many lanes are fine. */
  CHECK_EQ(dlb_dtype_check(dt(2, 32, 65535), &err), DLB_OK);
  /* NULL err is allowed. */
  CHECK_EQ(dlb_dtype_check(dt(3, 8, 1), NULL), DLB_EUNSUPPORTED);
}

static void test_from_name_errors(void) {
  static const char *const bad[] = {
      "",           "float",       "Float32",    "float32 ",  " float32",
      "double",     "half",        "int",        "int3",      "uint12",
      "int0",       "int08",       "int256",     "uint999",   "int-8",
      "int+8",      "int 8",       "int12x3",    "uintx2",    "int8y",
      "complex",    "bfloat",      "bfloat8",    "float8",    "float8_e4m3fnu",
      "float32x",   "float32x0",   "float32x1",  "float32x04", "float32x-4",
      "float32x+4", "float32x4a",  "float32x65536", "float32x99999999999999999999",
      "float32y4",  "float32_x4",  "float32x4x4", "boolx",      "cpu",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dlb_error err;
    DLDataType d = dt(99, 99, 99);
    int rc = dlb_dtype_from_name(bad[i], &d, &err);
    if (rc != DLB_EINVAL) fprintf(stderr, "  accepted \"%s\"\n", bad[i]);
    CHECK_EQ(rc, DLB_EINVAL);
    CHECK_EQ(err.code, DLB_EINVAL);
    /* out is written only on success. */
    CHECK(d.code == 99 && d.bits == 99 && d.lanes == 99);
    /* Each message quotes what it was given so the user can find it. */
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", bad[i]);
    CHECK_MSG(err, quoted);
  }
  dlb_error err;
  DLDataType d;
  CHECK_EQ(dlb_dtype_from_name("foo", &d, &err), DLB_EINVAL);
  CHECK_MSG(err, "unknown dtype name \"foo\"");
  CHECK_EQ(dlb_dtype_from_name("float32x0", &d, &err), DLB_EINVAL);
  CHECK_MSG(err, "vector suffix");
  CHECK_EQ(dlb_dtype_from_name("float32x1", &d, &err), DLB_EINVAL);
  CHECK_MSG(err, "without the \"x1\" suffix");
  CHECK_EQ(dlb_dtype_from_name("float32x65536", &d, &err), DLB_EINVAL);
  CHECK_MSG(err, "65535");
  CHECK_EQ(dlb_dtype_from_name(NULL, &d, &err), DLB_EINVAL);
  CHECK_MSG(err, "NULL");
  CHECK_EQ(dlb_dtype_from_name("float32", NULL, &err), DLB_EINVAL);
  CHECK_EQ(dlb_dtype_from_name("nope", &d, NULL), DLB_EINVAL);

  /* A long hostile name is cut, not overflowed. */
  char longname[1000];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  CHECK_EQ(dlb_dtype_from_name(longname, &d, &err), DLB_EINVAL);
  CHECK(strlen(err.message) < DLB_ERROR_MESSAGE_SIZE);
}

/* Names that share a prefix pick the right entry. */
static void test_prefix_names(void) {
  dlb_error err;
  DLDataType d;
  CHECK_EQ(dlb_dtype_from_name("float8_e4m3x2", &d, &err), DLB_OK);
  CHECK(d.code == 8 && d.bits == 8 && d.lanes == 2);
  CHECK_EQ(dlb_dtype_from_name("float8_e4m3fnx2", &d, &err), DLB_OK);
  CHECK(d.code == 10 && d.bits == 8 && d.lanes == 2);
  CHECK_EQ(dlb_dtype_from_name("float8_e4m3fnuz", &d, &err), DLB_OK);
  CHECK(d.code == 11 && d.lanes == 1);
  CHECK_EQ(dlb_dtype_from_name("complex128x2", &d, &err), DLB_OK);
  CHECK(d.code == 5 && d.bits == 128 && d.lanes == 2);
  CHECK_EQ(dlb_dtype_from_name("uint16", &d, &err), DLB_OK);
  CHECK(d.code == 1 && d.bits == 16 && d.lanes == 1);
  CHECK_EQ(dlb_dtype_from_name("int4x2", &d, &err), DLB_OK);
  CHECK(d.code == 0 && d.bits == 4 && d.lanes == 2);
  /* Integer names are made from the bits. */
  CHECK_EQ(dlb_dtype_from_name("int2", &d, &err), DLB_OK);
  CHECK(d.code == 0 && d.bits == 2 && d.lanes == 1);
  CHECK_EQ(dlb_dtype_from_name("uint1x3", &d, &err), DLB_OK);
  CHECK(d.code == 1 && d.bits == 1 && d.lanes == 3);
  CHECK_EQ(dlb_dtype_from_name("uint24", &d, &err), DLB_OK);
  CHECK(d.code == 1 && d.bits == 24 && d.lanes == 1);
  CHECK_EQ(dlb_dtype_from_name("int12x2", &d, &err), DLB_OK);
  CHECK(d.code == 0 && d.bits == 12 && d.lanes == 2);
  CHECK_EQ(dlb_dtype_from_name("int128", &d, &err), DLB_OK);
  CHECK(d.code == 0 && d.bits == 128 && d.lanes == 1);
  CHECK_EQ(dlb_dtype_from_name("int3", &d, &err), DLB_EINVAL);
  CHECK_MSG(err, "bad dtype name \"int3\": int allows 1, 2 or 4 bits");
  CHECK_EQ(dlb_dtype_from_name("uint256", &d, &err), DLB_EINVAL);
  CHECK_MSG(err, "at most 255 bits");
}

static void test_name_errors(void) {
  dlb_error err;
  char buf[32];
  memcpy(buf, "untouched", 10);
  CHECK_EQ(dlb_dtype_name(dt(3, 8, 1), buf, sizeof buf, &err),
           DLB_EUNSUPPORTED);
  CHECK_MSG(err, "code 3");
  CHECK_STREQ(buf, "untouched");
  CHECK_EQ(dlb_dtype_name(dt(2, 32, 0), buf, sizeof buf, &err),
           DLB_EUNSUPPORTED);
  CHECK_MSG(err, "lanes 0");
  CHECK_EQ(dlb_dtype_name(dt(15, 8, 1), buf, sizeof buf, &err),
           DLB_EUNSUPPORTED);
  CHECK_STREQ(buf, "untouched");

  /* "float32" needs 8 bytes with its terminator. */
  CHECK_EQ(dlb_dtype_name(dt(2, 32, 1), buf, 7, &err), DLB_EINVAL);
  CHECK_MSG(err, "needs 8 bytes");
  CHECK_STREQ(buf, "untouched");
  CHECK_EQ(dlb_dtype_name(dt(2, 32, 1), buf, 8, &err), DLB_OK);
  CHECK_STREQ(buf, "float32");
  CHECK_EQ(dlb_dtype_name(dt(2, 32, 1), buf, 0, &err), DLB_EINVAL);
  CHECK_EQ(dlb_dtype_name(dt(2, 32, 1), NULL, 32, &err), DLB_EINVAL);
  CHECK_MSG(err, "NULL");

  /* The longest name there is fits the documented 32 bytes. */
  CHECK_EQ(dlb_dtype_name(dt(9, 8, 65535), buf, 32, &err), DLB_OK);
  CHECK_STREQ(buf, "float8_e4m3b11fnuzx65535");
}

static void test_itemsize_and_subbyte(void) {
  CHECK_EQ(dlb_dtype_itemsize(dt(2, 32, 4)), 16);
  CHECK_EQ(dlb_dtype_itemsize(dt(0, 4, 2)), 1);
  CHECK_EQ(dlb_dtype_itemsize(dt(0, 4, 3)), 2);  /* 12 bits, padded to 2 */
  CHECK_EQ(dlb_dtype_itemsize(dt(15, 6, 4)), 3); /* 24 bits */
  CHECK_EQ(dlb_dtype_itemsize(dt(5, 128, 65535)), (int64_t)16 * 65535);
  /* No overflow at the largest representable element. */
  CHECK_EQ(dlb_dtype_itemsize(dt(255, 255, 65535)),
           ((int64_t)255 * 65535 + 7) / 8);
  CHECK_EQ(dlb_dtype_itemsize(dt(2, 32, 0)), 0);

  CHECK(dlb_dtype_is_subbyte(dt(0, 4, 1)));
  CHECK(!dlb_dtype_is_subbyte(dt(0, 4, 2))); /* two nibbles: one byte */
  CHECK(dlb_dtype_is_subbyte(dt(0, 4, 3)));
  CHECK(dlb_dtype_is_subbyte(dt(15, 6, 1)));
  CHECK(dlb_dtype_is_subbyte(dt(16, 6, 2)));
  CHECK(!dlb_dtype_is_subbyte(dt(16, 6, 4)));
  CHECK(dlb_dtype_is_subbyte(dt(17, 4, 1)));
  CHECK(!dlb_dtype_is_subbyte(dt(2, 32, 1)));
  CHECK(!dlb_dtype_is_subbyte(dt(6, 8, 1)));
}

static void test_storage_bytes(void) {
  dlb_error err;
  int64_t n = -7;
  /* 1- and 2-bit integers: packed 8 and 4 to a byte, padded 1 each. */
  CHECK_EQ(dlb_dtype_storage_bytes(dt(0, 2, 1), 5, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 2);
  CHECK_EQ(dlb_dtype_storage_bytes(dt(0, 2, 1), 5, true, &n, &err), DLB_OK);
  CHECK_EQ(n, 5);
  CHECK_EQ(dlb_dtype_storage_bytes(dt(1, 1, 1), 9, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 2);
  CHECK_EQ(dlb_dtype_storage_bytes(dt(1, 1, 1), 8, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 1);
  CHECK_EQ(dlb_dtype_storage_bytes(dt(1, 1, 1), INT64_MAX, false, &n, &err),
           DLB_OK);
  CHECK_EQ(n, (int64_t)1 << 60); /* ceil((2^63 - 1) / 8) */
  CHECK_EQ(dlb_dtype_storage_bytes(dt(0, 2, 3), 3, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 3); /* 18 bits */
  CHECK_EQ(dlb_dtype_storage_bytes(dt(0, 12, 2), 5, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 15);
  n = -7;
  DLDataType i4 = dt(0, 4, 1), f6 = dt(15, 6, 1), f32 = dt(2, 32, 1);

  CHECK_EQ(dlb_dtype_storage_bytes(i4, 3, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 2);
  CHECK_EQ(dlb_dtype_storage_bytes(i4, 3, true, &n, &err), DLB_OK);
  CHECK_EQ(n, 3);
  CHECK_EQ(dlb_dtype_storage_bytes(i4, 4, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 2);
  CHECK_EQ(dlb_dtype_storage_bytes(f6, 4, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 3);
  CHECK_EQ(dlb_dtype_storage_bytes(f6, 5, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 4); /* 30 bits */
  CHECK_EQ(dlb_dtype_storage_bytes(f6, 5, true, &n, &err), DLB_OK);
  CHECK_EQ(n, 5);
  CHECK_EQ(dlb_dtype_storage_bytes(dt(17, 4, 1), 1, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 1);
  CHECK_EQ(dlb_dtype_storage_bytes(dt(0, 4, 3), 3, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 5); /* 36 bits */
  CHECK_EQ(dlb_dtype_storage_bytes(dt(0, 4, 3), 3, true, &n, &err), DLB_OK);
  CHECK_EQ(n, 6);
  CHECK_EQ(dlb_dtype_storage_bytes(f32, 10, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 40);
  CHECK_EQ(dlb_dtype_storage_bytes(f32, 10, true, &n, &err), DLB_OK);
  CHECK_EQ(n, 40);
  CHECK_EQ(dlb_dtype_storage_bytes(dt(2, 32, 4), 10, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 160);
  CHECK_EQ(dlb_dtype_storage_bytes(f32, 0, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 0);
  CHECK_EQ(dlb_dtype_storage_bytes(i4, 0, false, &n, &err), DLB_OK);
  CHECK_EQ(n, 0);

  /* The int64 boundary: the byte count fits although count * bits does
   * not, and one more element tips it over. */
  CHECK_EQ(dlb_dtype_storage_bytes(f32, INT64_MAX / 4, false, &n, &err),
           DLB_OK);
  CHECK_EQ(n, INT64_MAX - 3);
  n = -7;
  CHECK_EQ(dlb_dtype_storage_bytes(f32, INT64_MAX / 4 + 1, false, &n, &err),
           DLB_EOVERFLOW);
  CHECK_EQ(err.code, DLB_EOVERFLOW);
  CHECK_MSG(err, "exceed INT64_MAX");
  CHECK_EQ(n, -7);
  CHECK_EQ(dlb_dtype_storage_bytes(f32, INT64_MAX / 4 + 1, true, &n, &err),
           DLB_EOVERFLOW);
  CHECK_MSG(err, "padded");
  CHECK_EQ(dlb_dtype_storage_bytes(dt(6, 8, 1), INT64_MAX, false, &n, &err),
           DLB_OK);
  CHECK_EQ(n, INT64_MAX);
  CHECK_EQ(dlb_dtype_storage_bytes(dt(0, 16, 1), INT64_MAX, false, &n, &err),
           DLB_EOVERFLOW);
  CHECK_EQ(dlb_dtype_storage_bytes(i4, INT64_MAX, false, &n, &err), DLB_OK);
  CHECK_EQ(n, (int64_t)1 << 62); /* ceil((2^63 - 1) / 2) */
  CHECK_EQ(dlb_dtype_storage_bytes(i4, INT64_MAX, true, &n, &err), DLB_OK);
  CHECK_EQ(n, INT64_MAX);
  CHECK_EQ(dlb_dtype_storage_bytes(f6, INT64_MAX, false, &n, &err), DLB_OK);
  CHECK_EQ(n, (int64_t)3 << 61); /* ceil((2^63 - 1) * 3 / 4) */
  CHECK_EQ(dlb_dtype_storage_bytes(dt(0, 4, 3), INT64_MAX, false, &n, &err),
           DLB_EOVERFLOW);
  CHECK_EQ(dlb_dtype_storage_bytes(dt(5, 128, 65535), 1 << 20, false, &n,
                                   &err),
           DLB_OK);
  CHECK_EQ(n, (int64_t)16 * 65535 * (1 << 20));
  CHECK_EQ(dlb_dtype_storage_bytes(dt(5, 128, 65535), INT64_MAX / 1000,
                                   false, &n, &err),
           DLB_EOVERFLOW);

  n = -7;
  CHECK_EQ(dlb_dtype_storage_bytes(f32, -1, false, &n, &err), DLB_EINVAL);
  CHECK_MSG(err, "element count -1 is negative");
  CHECK_EQ(n, -7);
  CHECK_EQ(dlb_dtype_storage_bytes(f32, INT64_MIN, true, &n, &err),
           DLB_EINVAL);
  CHECK_EQ(dlb_dtype_storage_bytes(dt(2, 32, 0), 5, false, &n, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "zero-size");
  CHECK_EQ(dlb_dtype_storage_bytes(dt(2, 0, 1), 5, false, &n, &err),
           DLB_EINVAL);
  CHECK_EQ(n, -7);
  CHECK_EQ(dlb_dtype_storage_bytes(f32, 5, false, NULL, &err), DLB_EINVAL);
}

/* dlb_dtype_describe / dlb_device_describe: the one spelling of a dtype and
 * of a device in messages. */
static void test_describe(void) {
  char buf[DLB_DESCRIBE_MAX];
  DLDataType f32 = {kDLFloat, 32, 1}, v4 = {kDLFloat, 32, 4};
  DLDataType bad = {kDLFloat, 7, 1}, nolanes = {kDLFloat, 32, 0};
  DLDataType worst = {255, 255, 65535};
  CHECK_STREQ(dlb_dtype_describe(f32, buf, sizeof buf), "float32");
  CHECK_STREQ(dlb_dtype_describe(v4, buf, sizeof buf), "float32x4");
  CHECK_STREQ(dlb_dtype_describe(bad, buf, sizeof buf),
              "(code 2, bits 7, lanes 1)");
  CHECK_STREQ(dlb_dtype_describe(nolanes, buf, sizeof buf),
              "(code 2, bits 32, lanes 0)");
  /* DLB_DESCRIBE_MAX holds the longest text there is. */
  CHECK_STREQ(dlb_dtype_describe(worst, buf, sizeof buf),
              "(code 255, bits 255, lanes 65535)");
  /* Every named dtype describes as its name. */
  for (unsigned code = 0; code < 256; code++) {
    for (unsigned bits = 0; bits < 256; bits++) {
      DLDataType d = {(uint8_t)code, (uint8_t)bits, 1};
      char name[32];
      if (dlb_dtype_name(d, name, sizeof name, NULL) == DLB_OK)
        CHECK_STREQ(dlb_dtype_describe(d, buf, sizeof buf), name);
    }
  }
  /* Truncated, still terminated; a zero-size buffer is left alone. */
  char small[4] = {'x', 'x', 'x', 'x'};
  CHECK(dlb_dtype_describe(f32, small, sizeof small) == small);
  CHECK_STREQ(small, "flo");
  CHECK(dlb_dtype_describe(f32, small, 0) == small && small[0] == 'f');

  DLDevice cpu0 = {kDLCPU, 0}, cpu1 = {kDLCPU, 1}, cuda1 = {kDLCUDA, 1};
  DLDevice unk = {(DLDeviceType)5, 0}, neg = {(DLDeviceType)INT32_MIN, INT32_MIN};
  CHECK_STREQ(dlb_device_describe(cpu0, buf, sizeof buf), "cpu");
  CHECK_STREQ(dlb_device_describe(cpu1, buf, sizeof buf), "cpu:1");
  CHECK_STREQ(dlb_device_describe(cuda1, buf, sizeof buf), "cuda:1");
  DLDevice tpuh = {kDLTPUHost, 2}, far = {(DLDeviceType)99, 0};
  CHECK_STREQ(dlb_device_describe(unk, buf, sizeof buf), "device5:0");
  CHECK_STREQ(dlb_device_describe(tpuh, buf, sizeof buf), "tpu_host:2");
  CHECK_STREQ(dlb_device_describe(far, buf, sizeof buf), "device99:0");
  CHECK_STREQ(dlb_device_describe(neg, buf, sizeof buf),
              "device-2147483648:-2147483648");
  char tiny[3];
  CHECK_STREQ(dlb_device_describe(cuda1, tiny, sizeof tiny), "cu");
}

/* typestrs and buffer formats: the spellings of other protocols. */
static void test_foreign_spellings(void) {
  dlb_error err;
  DLDataType d = {0, 0, 0};
  const uint16_t one = 1;
  const bool little = *(const uint8_t *)&one == 1;
  const char *native_f8 = little ? "<f8" : ">f8";
  const char *foreign_f8 = little ? ">f8" : "<f8";
  CHECK_EQ(dlb_dtype_from_typestr(native_f8, &d, &err), DLB_OK);
  CHECK(d.code == kDLFloat && d.bits == 64 && d.lanes == 1);
  CHECK_EQ(dlb_dtype_from_typestr("|b1", &d, &err), DLB_OK);
  CHECK(d.code == kDLBool && d.bits == 8);
  CHECK_EQ(dlb_dtype_from_typestr("=c16", &d, &err), DLB_OK);
  CHECK(d.code == kDLComplex && d.bits == 128);
  CHECK_EQ(dlb_dtype_from_typestr(">u1", &d, &err), DLB_OK); /* one byte: any order */
  CHECK_EQ(dlb_dtype_from_typestr(foreign_f8, &d, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "not in native byte order");
  CHECK_EQ(dlb_dtype_from_typestr("<V8", &d, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "has no DLPack dtype");
  /* Integer widths NumPy has: "<i3" is no int24, "<u16" no uint128. */
  CHECK_EQ(dlb_dtype_from_typestr(little ? "<i3" : ">i3", &d, &err),
           DLB_EUNSUPPORTED);
  CHECK_EQ(dlb_dtype_from_typestr(little ? "<u16" : ">u16", &d, &err),
           DLB_EUNSUPPORTED);
  CHECK_EQ(dlb_dtype_from_typestr("|i1", &d, &err), DLB_OK);
  CHECK(d.code == kDLInt && d.bits == 8);
  CHECK_EQ(dlb_dtype_from_buffer_format("i", 3, &d, &err), DLB_EUNSUPPORTED);
  CHECK_EQ(dlb_dtype_from_buffer_format("q", 16, &d, &err), DLB_EUNSUPPORTED);
  static const char *const malformed[] = {"<f 8", "<f+8", "<f", "", "<f123",
                                          "xf8", "<f0", "<f64", "<f-8"};
  for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++) {
    CHECK_EQ(dlb_dtype_from_typestr(malformed[i], &d, &err), DLB_EINVAL);
  }
  CHECK_EQ(dlb_dtype_from_typestr(NULL, &d, &err), DLB_EINVAL);
  CHECK_EQ(dlb_dtype_from_buffer_format("f", 4, &d, &err), DLB_OK);
  CHECK(d.code == kDLFloat && d.bits == 32);
  CHECK_EQ(dlb_dtype_from_buffer_format(NULL, 1, &d, &err), DLB_OK);
  CHECK(d.code == kDLUInt && d.bits == 8);
  CHECK_EQ(dlb_dtype_from_buffer_format("=l", 8, &d, &err), DLB_OK);
  CHECK(d.code == kDLInt && d.bits == 64);
  CHECK_EQ(dlb_dtype_from_buffer_format("Zd", 16, &d, &err), DLB_OK);
  CHECK(d.code == kDLComplex && d.bits == 128);
  CHECK_EQ(dlb_dtype_from_buffer_format("?", 1, &d, &err), DLB_OK);
  CHECK(d.code == kDLBool);
  CHECK_EQ(dlb_dtype_from_buffer_format(little ? ">f" : "<f", 4, &d, &err),
           DLB_EUNSUPPORTED);
  CHECK_MSG(err, "not in native byte order");
  static const char *const unsupported[] = {"Zi", "ff", "x", "Z", "", "@", "P", "3f"};
  for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
    CHECK_EQ(dlb_dtype_from_buffer_format(unsupported[i], 4, &d, &err),
             DLB_EUNSUPPORTED);
  }
  CHECK_EQ(dlb_dtype_from_buffer_format("f", 0, &d, &err), DLB_EUNSUPPORTED);
  CHECK_EQ(dlb_dtype_from_buffer_format("f", 64, &d, &err), DLB_EUNSUPPORTED);
  CHECK_EQ(dlb_dtype_from_buffer_format("f", 4, NULL, &err), DLB_EINVAL);
}

int main(void) {
  test_foreign_spellings();
  test_describe();
  test_every_name_round_trips();
  test_check_exhaustive();
  test_check_messages();
  test_from_name_errors();
  test_prefix_names();
  test_name_errors();
  test_itemsize_and_subbyte();
  test_storage_bytes();
  return check_summary("test_dtype");
}
