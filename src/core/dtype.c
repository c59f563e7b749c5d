/* dtype.c -- names, checks and sizes of DLPack element types.
 *
 * The rule (internal.h's dlb__dtype_ok is the same rule as one lookup):
 *   - integers (kDLInt, kDLUInt) of 1, 2 or 4 bits, packed below a byte
 *     unless a managed tensor says IS_SUBBYTE_TYPE_PADDED, with any lanes;
 *     of any other bits when bits * lanes is a whole number of bytes
 *     (int8, int24, int12x2); their names are made from the bits;
 *   - every other code only at its defined widths (the table below), with
 *     any lanes: fp6 is 6 bits, bool 8, complex64 is (5, 64);
 *   - lanes >= 1; the opaque-handle code never.
 * Names, checks and the "allowed bits" lists in messages all read the one
 * table and the one integer rule, so they cannot disagree. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

typedef struct {
  const char *name;
  uint8_t code;
  uint8_t bits;
} dtype_entry;

/* Every code with fixed widths, at each width it allows.  Integers are not
 * listed: any width the rule allows is named "int<bits>" / "uint<bits>". */
static const dtype_entry dtype_table[] = {
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
    {"bcomplex32", kDLBcomplex, 32}, /* post-1.3: two bfloat16 */
};

#define DTYPE_TABLE_LEN (sizeof dtype_table / sizeof dtype_table[0])

/* Names of the codes for messages, indexed by code; the first two are also
 * the prefixes of the integer names. */
static const char *const code_names[] = {
    "int",           "uint",          "float",
    "opaque handle", "bfloat",        "complex",
    "bool",          "float8_e3m4",   "float8_e4m3",
    "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2",   "float8_e5m2fnuz", "float8_e8m0fnu",
    "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
    "bcomplex",
};

#define CODE_NAMES_LEN (sizeof code_names / sizeof code_names[0])

_Static_assert(CODE_NAMES_LEN == DLB__DTYPE_CODES,
               "code_names and dlb__dtype_ok's rows cover the same codes");

static bool is_integer_code(unsigned code) {
  return code == kDLInt || code == kDLUInt;
}

/* The integer rule on its own (bits and lanes of an int or uint). */
static bool integer_width_ok(unsigned bits, unsigned lanes) {
  return bits == 1 || bits == 2 || bits == 4 ||
         (bits != 0 && (bits * lanes) % 8u == 0);
}

static const dtype_entry *find_entry(uint8_t code, uint8_t bits) {
  for (size_t i = 0; i < DTYPE_TABLE_LEN; i++) {
    if (dtype_table[i].code == code && dtype_table[i].bits == bits)
      return &dtype_table[i];
  }
  return NULL;
}

/* Builds the message for a dtype dlb_dtype_check refuses; kept out of line
 * so the check itself stays a table lookup. */
static int dtype_check_slow(DLDataType dtype, dlb_error *err) {
  unsigned code = dtype.code, bits = dtype.bits, lanes = dtype.lanes;
  char d[DLB_DESCRIBE_MAX];
  dlb_dtype_describe(dtype, d, sizeof d);
  if (code == kDLOpaqueHandle)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype %s: code 3 "
                         "(kDLOpaqueHandle) is not supported: its meaning is "
                         "private to the producer",
                         d);
  if (code >= CODE_NAMES_LEN)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype %s: unknown type "
                         "code %u (known codes are 0-%u)",
                         d, code, (unsigned)CODE_NAMES_LEN - 1);
  if (is_integer_code(code)) {
    if (!integer_width_ok(bits, lanes))
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "dtype %s: %s allows 1, 2 or 4 bits, or bits "
                           "that make bits x lanes a multiple of 8",
                           d, code_names[code]);
  } else if (find_entry(dtype.code, dtype.bits) == NULL) {
    /* List what the code does allow so the producer's bug is obvious. */
    char allowed[64];
    size_t used = 0;
    allowed[0] = '\0';
    for (size_t i = 0; i < DTYPE_TABLE_LEN; i++) {
      if (dtype_table[i].code != code) continue;
      int n = snprintf(allowed + used, sizeof allowed - used, "%s%u",
                       used == 0 ? "" : ", ", (unsigned)dtype_table[i].bits);
      if (n < 0 || (size_t)n >= sizeof allowed - used) break;
      used += (size_t)n;
    }
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype %s: %s does not "
                         "allow bits %u (allowed: %s)",
                         d, code_names[code], bits, allowed);
  }
  if (lanes == 0)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dtype %s: lanes must be "
                         ">= 1",
                         d);
  return DLB_OK;
}

DLB__OUT_OF_LINE(int, dtype_check_slow, (DLDataType, dlb_error *));

int dlb_dtype_check(DLDataType dtype, dlb_error *err) {
  /* Every validated tensor comes through here: answer the common case
   * with one table lookup and leave messages to the slow path. */
  if (dlb__dtype_ok(dtype)) return DLB_OK;
  return dtype_check_slow_out_of_line(dtype, err);
}

/* The canonical name of a dtype dlb__dtype_ok accepts, into tmp (40 bytes
 * always suffice: "float8_e4m3b11fnuzx65535"); snprintf's result. */
static int format_name(DLDataType dtype, char *tmp, size_t len) {
  char base[24];
  if (is_integer_code(dtype.code))
    snprintf(base, sizeof base, "%s%u", code_names[dtype.code],
             (unsigned)dtype.bits);
  else
    snprintf(base, sizeof base, "%s", find_entry(dtype.code, dtype.bits)->name);
  return dtype.lanes == 1
             ? snprintf(tmp, len, "%s", base)
             : snprintf(tmp, len, "%sx%u", base, (unsigned)dtype.lanes);
}

int dlb_dtype_name(DLDataType dtype, char *buf, size_t buflen,
                   dlb_error *err) {
  int rc = dlb_dtype_check(dtype, err);
  if (rc != DLB_OK) return rc;
  if (buf == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dtype name buffer is NULL");
  char tmp[40];
  int n = format_name(dtype, tmp, sizeof tmp);
  if (n < 0 || (size_t)n >= sizeof tmp)
    return dlb_error_set(err, DLB_EINVAL, "dtype name does not fit");
  if ((size_t)n >= buflen)
    return dlb_error_set(err, DLB_EINVAL,
                         "dtype name \"%s\" needs %d bytes, buffer has %zu "
                         "(32 always suffice)",
                         tmp, n + 1, buflen);
  memcpy(buf, tmp, (size_t)n + 1);
  return DLB_OK;
}

const char *dlb_dtype_describe(DLDataType dtype, char *buf, size_t buflen) {
  if (buf == NULL || buflen == 0) return buf;
  /* Not through dlb_dtype_name: its check's messages describe the dtype
   * with this very function. */
  if (dlb__dtype_ok(dtype))
    format_name(dtype, buf, buflen);
  else
    snprintf(buf, buflen, "(code %u, bits %u, lanes %u)", (unsigned)dtype.code,
             (unsigned)dtype.bits, (unsigned)dtype.lanes);
  return buf;
}

/* Parse the "x<lanes>" suffix.  Only the canonical spelling is accepted
 * (no "x1", no leading zeros, no sign), so every name maps to one dtype and
 * back to the same name. */
static int parse_lanes(const char *full, const char *s, uint16_t *out,
                       dlb_error *err) {
  if (*s == '\0') {
    *out = 1;
    return DLB_OK;
  }
  if (s[0] != 'x' || s[1] < '1' || s[1] > '9')
    return dlb_error_set(err, DLB_EINVAL,
                         "bad dtype name \"%.64s\": expected a vector suffix "
                         "like \"x4\" after the type name",
                         full);
  unsigned long v = 0;
  for (const char *p = s + 1; *p != '\0'; p++) {
    if (*p < '0' || *p > '9')
      return dlb_error_set(err, DLB_EINVAL,
                           "bad dtype name \"%.64s\": lanes must be decimal "
                           "digits after 'x'",
                           full);
    v = v * 10 + (unsigned long)(*p - '0');
    if (v > UINT16_MAX)
      return dlb_error_set(err, DLB_EINVAL,
                           "bad dtype name \"%.64s\": lanes exceed 65535",
                           full);
  }
  if (v == 1)
    return dlb_error_set(err, DLB_EINVAL,
                         "bad dtype name \"%.64s\": one lane is written "
                         "without the \"x1\" suffix",
                         full);
  *out = (uint16_t)v;
  return DLB_OK;
}

int dlb_dtype_from_name(const char *name, DLDataType *out, dlb_error *err) {
  if (name == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dtype name is NULL");
  if (out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dtype output pointer is NULL");
  /* No base name is "<other base name>x<digits>", so at most one entry can
   * match as a prefix followed by nothing or a lanes suffix. */
  for (size_t i = 0; i < DTYPE_TABLE_LEN; i++) {
    size_t len = strlen(dtype_table[i].name);
    if (strncmp(name, dtype_table[i].name, len) != 0) continue;
    const char *rest = name + len;
    if (*rest != '\0' && *rest != 'x') continue;
    uint16_t lanes = 1; /* silences -O2 maybe-uninitialized */
    int rc = parse_lanes(name, rest, &lanes, err);
    if (rc != DLB_OK) return rc;
    out->code = dtype_table[i].code;
    out->bits = dtype_table[i].bits;
    out->lanes = lanes;
    return DLB_OK;
  }
  /* Integers: "int" or "uint", the bits in decimal (no sign, no leading
   * zero), then the lanes suffix. */
  for (unsigned code = kDLInt; code <= kDLUInt; code++) {
    size_t len = strlen(code_names[code]);
    const char *p = name + len;
    if (strncmp(name, code_names[code], len) != 0 || *p < '1' || *p > '9')
      continue;
    unsigned bits = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
      bits = bits * 10 + (unsigned)(*p - '0');
      if (bits > UINT8_MAX)
        return dlb_error_set(err, DLB_EINVAL,
                             "bad dtype name \"%.64s\": an integer has at "
                             "most 255 bits",
                             name);
    }
    if (*p != '\0' && *p != 'x') break;
    uint16_t lanes = 1;
    int rc = parse_lanes(name, p, &lanes, err);
    if (rc != DLB_OK) return rc;
    if (!integer_width_ok(bits, lanes))
      return dlb_error_set(err, DLB_EINVAL,
                           "bad dtype name \"%.64s\": %s allows 1, 2 or 4 "
                           "bits, or bits that make bits x lanes a multiple "
                           "of 8",
                           name, code_names[code]);
    out->code = (uint8_t)code;
    out->bits = (uint8_t)bits;
    out->lanes = lanes;
    return DLB_OK;
  }
  return dlb_error_set(err, DLB_EINVAL,
                       "unknown dtype name \"%.64s\" (expected e.g. "
                       "\"float32\", \"int8\", \"bfloat16\", \"float8_e4m3fn\")",
                       name);
}

bool dlb_dtype_is_subbyte(DLDataType dtype) {
  return ((unsigned)dtype.bits * dtype.lanes) % 8u != 0;
}

int64_t dlb_dtype_itemsize(DLDataType dtype) {
  /* At most 255 * 65535 bits: no overflow in int64. */
  return ((int64_t)dtype.bits * dtype.lanes + 7) / 8;
}

int dlb_dtype_storage_bytes(DLDataType dtype, int64_t count, bool padded,
                            int64_t *out, dlb_error *err) {
  int64_t elem_bits = (int64_t)dtype.bits * dtype.lanes;
  /* Whole-byte elements (the usual case): packed and padded agree, and the
   * exact byte count is one checked product.  Anything else, including
   * every error, takes the general code below. */
  if (count >= 0 && elem_bits != 0 && elem_bits % 8 == 0 && out != NULL) {
    int64_t total;
    if (!dlb__mul_overflow(count, elem_bits / 8, &total)) {
      *out = total;
      return DLB_OK;
    }
  }
  if (count < 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "element count %lld is negative", (long long)count);
  if (elem_bits == 0) {
    char d[DLB_DESCRIBE_MAX];
    return dlb_error_set(err, DLB_EINVAL, "dtype %s has zero-size elements",
                         dlb_dtype_describe(dtype, d, sizeof d));
  }
  if (out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "storage size output is NULL");
  int64_t total;
  if (padded) {
    if (dlb__mul_overflow(count, (elem_bits + 7) / 8, &total))
      goto overflow;
  } else {
    /* count * elem_bits may overflow even when the byte count fits, so split
     * count = 8a + b: ceil(count * eb / 8) = a * eb + ceil(b * eb / 8). */
    int64_t a = count / 8, b = count % 8, head;
    int64_t tail = (b * elem_bits + 7) / 8;
    if (dlb__mul_overflow(a, elem_bits, &head) ||
        dlb__add_overflow(head, tail, &total))
      goto overflow;
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

/* ---- other protocols' spellings: typestrs and buffer formats -------------- */

/* The widths those protocols mean: NumPy's and the struct module's.  An
 * integer of 3 or 16 bytes is a valid DLPack dtype, but no exporter of these
 * spellings has one, so "<i3" is far likelier a mistake than an int24. */
static bool foreign_width_ok(DLDataType dt) {
  if (is_integer_code(dt.code) && dt.bits != 8 && dt.bits != 16 &&
      dt.bits != 32 && dt.bits != 64)
    return false;
  return dlb_dtype_check(dt, NULL) == DLB_OK;
}

static bool host_is_little_endian(void) {
  const uint16_t one = 1;
  uint8_t first;
  memcpy(&first, &one, 1);
  return first == 1;
}

int dlb_dtype_from_typestr(const char *typestr, DLDataType *out,
                           dlb_error *err) {
  if (typestr == NULL || out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "typestr and out must not be NULL");
  size_t n = strlen(typestr);
  /* The size is plain decimal digits, 1 or 2 of them: strtol would also
   * take leading spaces and a sign ("<f 8", "<f+8"). */
  if (n < 3 || n > 4)
    return dlb_error_set(err, DLB_EINVAL, "malformed typestr '%.40s'", typestr);
  char order = typestr[0], kind = typestr[1];
  int64_t size = 0;
  for (size_t i = 2; i < n; i++) {
    if (typestr[i] < '0' || typestr[i] > '9')
      return dlb_error_set(err, DLB_EINVAL, "malformed typestr '%.40s'", typestr);
    size = size * 10 + (typestr[i] - '0');
  }
  if (size <= 0 || size > 32 ||
      (order != '<' && order != '>' && order != '|' && order != '='))
    return dlb_error_set(err, DLB_EINVAL, "malformed typestr '%.40s'", typestr);
  bool foreign = host_is_little_endian() ? order == '>' : order == '<';
  if (foreign && size > 1)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "typestr '%s' is not in native byte order; DLPack "
                         "only describes native byte order",
                         typestr);
  uint8_t code;
  switch (kind) {
    case 'b': code = kDLBool; break;
    case 'i': code = kDLInt; break;
    case 'u': code = kDLUInt; break;
    case 'f': code = kDLFloat; break;
    case 'c': code = kDLComplex; break;
    default: goto unsupported;
  }
  DLDataType dt = {code, (uint8_t)(size * 8), 1};
  if (!foreign_width_ok(dt)) goto unsupported;
  *out = dt;
  return DLB_OK;

unsupported:
  return dlb_error_set(err, DLB_EUNSUPPORTED,
                       "typestr '%s' has no DLPack dtype; supported kinds are "
                       "b, i, u, f and c",
                       typestr);
}

int dlb_dtype_from_buffer_format(const char *fmt, int64_t itemsize,
                                 DLDataType *out, dlb_error *err) {
  const char *f = fmt != NULL ? fmt : "B";
  if (out == NULL) return dlb_error_set(err, DLB_EINVAL, "out must not be NULL");
  char order = '@';
  if (*f == '@' || *f == '=' || *f == '<' || *f == '>' || *f == '!')
    order = *f++;
  bool foreign = host_is_little_endian() ? (order == '>' || order == '!')
                                         : order == '<';
  if (foreign)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "buffer format '%.40s' is not in native byte order; "
                         "DLPack only describes native byte order (byteswap "
                         "it first)",
                         fmt);
  uint8_t code;
  bool complex = false;
  char c = *f;
  if (c == 'Z') {
    complex = true;
    c = *++f;
  }
  if (c == '\0' || f[1] != '\0') goto unsupported;
  switch (c) {
    case '?': code = kDLBool; break;
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n':
      code = kDLInt; break;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N':
    case 'c': /* a 1-byte char: its bytes are uint8 exactly */
      code = kDLUInt; break;
    case 'e': case 'f': case 'd':
      code = complex ? kDLComplex : kDLFloat; break;
    default: goto unsupported;
  }
  if (complex && code != kDLComplex) goto unsupported;
  /* The exporter's itemsize is authoritative ('l' is 4 or 8 bytes
   * depending on the prefix and the platform). */
  if (itemsize <= 0 || itemsize > 32) goto unsupported;
  DLDataType dt = {code, (uint8_t)(itemsize * 8), 1};
  if (!foreign_width_ok(dt)) goto unsupported;
  *out = dt;
  return DLB_OK;

unsupported:
  return dlb_error_set(err, DLB_EUNSUPPORTED,
                       "buffer format '%.40s' (itemsize %lld) has no DLPack "
                       "dtype; supported: bool, signed/unsigned integers, "
                       "float16/32/64 and complex64/128 in native byte order",
                       fmt != NULL ? fmt : "B", (long long)itemsize);
}
