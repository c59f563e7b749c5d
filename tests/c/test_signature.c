/*
 * test_signature.c -- dlb_signature_parse: the records a parse gives, and
 * the errors (message and byte offset) for text that is not a signature.
 * The Python-level messages of dlbridge.Function are in
 * tests/python/test_function.py; the parser is also fuzzed
 * (tests/fuzz/fuzz_signature.c).
 */
#include "check.h"

static dlb_signature sig; /* large: not on the stack */

static int parse(const char *text) {
  dlb_error err;
  return dlb_signature_parse(text, strlen(text), &sig, &err);
}

static void test_records(void) {
  CHECK_EQ(parse("saxpy(a: float32, x: float32[n], y: mut float32[n]) -> float32[n]"),
           DLB_OK);
  CHECK_EQ(sig.nin, 3);
  CHECK_EQ(sig.nparams, 4);
  CHECK(sig.name_len == 5 && memcmp(sig.name, "saxpy", 5) == 0);
  CHECK_EQ(sig.params[0].ndim, 0);
  CHECK_EQ(sig.params[2].mut, 1);
  CHECK_EQ(sig.params[1].mut, 0);
  CHECK_EQ(sig.ndims, 3);
  CHECK_EQ(sig.dims[0].kind, DLB_SIGNATURE_DIM_BIND);
  CHECK_EQ(sig.dims[1].kind, DLB_SIGNATURE_DIM_CHECK);
  CHECK_EQ(sig.dims[1].from_param, 1);
  CHECK_EQ(sig.dims[2].kind, DLB_SIGNATURE_DIM_CHECK); /* the result's n */
  CHECK(sig.params[3].dtype.code == kDLFloat && sig.params[3].dtype.bits == 32);
  CHECK_EQ(parse("f(x: int8[3, k, 2]) -> (bfloat16[], uint8[k])"), DLB_OK);
  CHECK_EQ(sig.nparams, 3);
  CHECK_EQ(sig.dims[0].kind, DLB_SIGNATURE_DIM_LITERAL);
  CHECK_EQ(sig.dims[0].value, 3);
  CHECK_EQ(sig.params[1].ndim, 0);
  CHECK_EQ(sig.params[2].ndim, 1);
  /* "mut" is a parameter's dtype-less name only when no dtype follows */
  CHECK_EQ(parse("g(mut: float32)"), DLB_OK);
  /* no NUL needed: the length bounds the text */
  dlb_error err;
  CHECK_EQ(dlb_signature_parse("h(x: float32)garbage", 13, &sig, &err), DLB_OK);
}

static void test_errors(void) {
  static const struct { const char *text; const char *message; size_t at; } bad[] = {
      {"", "expected the function name", 0},
      {"f", "expected '(' after the function name", 1},
      {"f(x float32)", "expected ':' after parameter name", 4},
      {"f(x: nope)", "unknown dtype 'nope'", 5},
      {"f(x: float32[n]) -> float32[m]", "result dimension 'm' is not bound", 28},
      {"f(x: float32, x: int8)", "duplicate parameter name 'x'", 14},
      {"f() -> mut float32", "results cannot be 'mut'", 7},
      {"f(x: float32[99999999999999999999])", "dimension too large", 13},
      {"f(x: float32) junk", "expected '->' or the end of the signature", 14},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dlb_error err;
    CHECK_EQ(dlb_signature_parse(bad[i].text, strlen(bad[i].text), &sig, &err),
             DLB_EINVAL);
    CHECK(sig.message != NULL && strstr(sig.message, bad[i].message) != NULL);
    CHECK_EQ(sig.error_pos, bad[i].at);
    CHECK_MSG(err, bad[i].message);
  }
  dlb_error err;
  CHECK_EQ(dlb_signature_parse(NULL, 3, &sig, &err), DLB_EINVAL);
  CHECK_EQ(dlb_signature_parse("f()", 3, NULL, &err), DLB_EINVAL);
}

int main(void) {
  test_records();
  test_errors();
  return check_summary("test_signature");
}
