/*
 * test_signature.c -- dlb_signature_parse: the records a parse gives, and
 * the errors (message and byte offset) for text that is not a signature;
 * the derivatives of a signature (signature_grad.c): which parameters are
 * differentiable, result labels, the derived vjp/jvp text, the binding of
 * derived and spelled derivative signatures by name, and every refusal
 * with its whole message.  The Python-level messages of dlbridge.Function
 * are in tests/python/test_function.py and test_grad_declare.py; the
 * parser, derivation and binding are also fuzzed
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

/* ---- nodiff and named results ---------------------------------------------- */

static void test_grammar_grad(void) {
  CHECK_EQ(parse("gather(x: float64[m], idx: nodiff int64[k]) -> (y: float64[k])"),
           DLB_OK);
  CHECK_EQ(sig.nin, 2);
  CHECK_EQ(sig.params[0].nodiff, 0);
  CHECK_EQ(sig.params[1].nodiff, 1);
  CHECK_EQ(sig.params[1].mut, 0);
  CHECK(sig.param_name_len[2] == 1 && memcmp(sig.param_name[2], "y", 1) == 0);
  /* a named result's dims are checked as an unnamed one's */
  CHECK_EQ(sig.dims[2].kind, DLB_SIGNATURE_DIM_CHECK);
  CHECK_EQ(sig.dims[2].from_param, 1);
  /* one named result needs no parentheses; nodiff on results */
  CHECK_EQ(parse("f(x: float32[n]) -> lse: nodiff float32"), DLB_OK);
  CHECK_EQ(sig.nparams, 2);
  CHECK_EQ(sig.params[1].nodiff, 1);
  CHECK(sig.param_name_len[1] == 3 && memcmp(sig.param_name[1], "lse", 3) == 0);
  CHECK_EQ(parse("f(x: float32[n]) -> nodiff float32[n]"), DLB_OK);
  CHECK_EQ(sig.params[1].nodiff, 1);
  CHECK(sig.param_name[1] == NULL && sig.param_name_len[1] == 0);
  /* mixed named and unnamed, a trailing comma; a name may spell a dtype */
  CHECK_EQ(parse("f(x: float32[n]) -> (float32[n], s: float64, nodiff int8[2],"
                 " float32: float32,)"),
           DLB_OK);
  CHECK_EQ(sig.nparams, 5);
  CHECK(sig.param_name[1] == NULL && sig.param_name_len[1] == 0);
  CHECK(sig.param_name_len[2] == 1 && sig.param_name[2][0] == 's');
  CHECK(sig.param_name[3] == NULL && sig.params[3].nodiff == 1);
  CHECK(sig.param_name_len[4] == 7 && memcmp(sig.param_name[4], "float32", 7) == 0);
  CHECK(sig.params[4].dtype.code == kDLFloat && sig.params[4].dtype.bits == 32);
  /* unnamed results keep NULL names, as before */
  CHECK_EQ(parse("f() -> (float32, int8)"), DLB_OK);
  CHECK(sig.param_name[0] == NULL && sig.param_name[1] == NULL);
  /* nodiff is a keyword only when a dtype follows: it can be a name */
  CHECK_EQ(parse("g(nodiff: float32) -> (mut: float32)"), DLB_OK);
  CHECK_EQ(sig.params[0].nodiff, 0);
  CHECK_EQ(sig.params[1].nodiff, 0);
  CHECK_EQ(parse("g(nodiff: nodiff float32, mut: mut float32)"), DLB_OK);
  CHECK_EQ(sig.params[0].nodiff, 1);
  CHECK_EQ(sig.params[1].mut, 1);
  CHECK_EQ(sig.params[1].nodiff, 0);
  /* whitespace anywhere between tokens */
  CHECK_EQ(parse(" f ( x :\tnodiff\nfloat32 [ n ] ) -> ( y : nodiff float32 [ n ] ) "),
           DLB_OK);
  CHECK(sig.params[0].nodiff == 1 && sig.params[1].nodiff == 1);
  /* a result may be named out<k> when that is its own label, or when no
   * unnamed result has that label */
  CHECK_EQ(parse("f() -> (out0: float32, float32)"), DLB_OK);
  CHECK_EQ(parse("f() -> (out: float32, float32)"), DLB_OK);
  CHECK_EQ(parse("f() -> (float32, out7: float32)"), DLB_OK);
}

static void test_grammar_grad_errors(void) {
  static const struct { const char *text; const char *message; size_t at; } bad[] = {
      {"f(x: mut nodiff float32[n])",
       "'mut' with 'nodiff': a 'mut' parameter is never differentiable anyway "
       "(drop 'nodiff')", 9},
      {"f(x: nodiff mut float32[n])",
       "'mut' with 'nodiff': a 'mut' parameter is never differentiable anyway "
       "(drop 'nodiff')", 12},
      {"f(x: nodiff nodiff float32)", "'nodiff' given twice", 12},
      {"f(x: mut mut float32)", "'mut' given twice", 9},
      /* no dtype after it: nodiff is read as the dtype */
      {"f(x: nodiff)", "unknown dtype 'nodiff'", 5},
      {"f(x: nodiff[3])", "unknown dtype 'nodiff'", 5},
      {"f(x: mut nodiff)", "unknown dtype 'nodiff'", 9},
      {"f(x: float32) -> (y: mut float32)",
       "results cannot be 'mut': they are always written", 21},
      {"f(x: float32) -> (y: nodiff mut float32)",
       "results cannot be 'mut': they are always written", 28},
      {"f(x: float32) -> (y: nodiff nodiff float32)", "'nodiff' given twice", 28},
      {"f(x: float32) -> (x: float32)", "result name 'x' is also a parameter's", 18},
      {"f(x: float32) -> x: float32", "result name 'x' is also a parameter's", 17},
      {"f(x: float32) -> (y: float32, y: float64)", "duplicate result name 'y'", 30},
      {"f(x: float32) -> (y: float32, float32, y: float64)",
       "duplicate result name 'y'", 39},
      {"f(x: float32) -> (out1: float32, float32)",
       "result name 'out1' is the label of the unnamed result 1 (name that "
       "result too, or rename this one)", 18},
      {"f(x: float32) -> (y: float32[n])",
       "result dimension 'n' is not bound by any input", 29},
      {"f(x: float32) -> (y: )", "expected a dtype name", 21},
      /* a word not followed by ':' is the dtype */
      {"f(x: float32) -> (y float32)", "unknown dtype 'y'", 18},
      {"f(x: float32) -> (float32 y)", "expected ',' or ')' after a result type", 26},
      {"f(x: float32) -> (y: nope)", "unknown dtype 'nope'", 21},
      {"f(x: float32) -> y: float32 z", "unexpected text after the signature", 28},
      {"f(x: float32[n, ]) -> float32", "expected a dimension (a name or an integer)", 16},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dlb_error err;
    CHECK_EQ(dlb_signature_parse(bad[i].text, strlen(bad[i].text), &sig, &err),
             DLB_EINVAL);
    CHECK_STREQ(sig.message, bad[i].message);
    CHECK_EQ(sig.error_pos, bad[i].at);
    CHECK_MSG(err, bad[i].message);
    if (sig.message == NULL || strcmp(sig.message, bad[i].message) != 0 ||
        sig.error_pos != bad[i].at)
      fprintf(stderr, "  in: %s (at %zu)\n", bad[i].text, sig.error_pos);
  }
  /* 64 parameters and results at most, named results counted */
  static char many[2048];
  size_t n = (size_t)snprintf(many, sizeof many, "f(x: float32) -> (");
  for (int i = 0; i < 64; i++)
    n += (size_t)snprintf(many + n, sizeof many - n, "r%d: float32, ", i);
  snprintf(many + n, sizeof many - n, ")");
  dlb_error err;
  CHECK_EQ(dlb_signature_parse(many, strlen(many), &sig, &err), DLB_EINVAL);
  CHECK_STREQ(sig.message, "too many parameters (at most 64 with the results)");
  CHECK_EQ(sig.error_pos, strstr(many, "r63:") - many);
}

/* ---- differentiable, labels ------------------------------------------------- */

static void test_differentiable(void) {
  CHECK_EQ(parse("f(a: float16, b: float32, c: float64, d: bfloat16, "
                 "e: complex64, g: complex128, h: bcomplex32, i: int64, "
                 "j: uint8, k: bool, l: float8_e4m3fn, m: nodiff float32, "
                 "n: mut float32[1], o: int32x4) -> (float32, nodiff float64, "
                 "int8, complex64)"),
           DLB_OK);
  static const int want[] = {1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0,
                             1, 0, 0, 1};
  CHECK_EQ(sig.nparams, (int)(sizeof want / sizeof *want));
  for (int i = 0; i < sig.nparams; i++) {
    CHECK_EQ(dlb_signature_differentiable(&sig, i), want[i]);
    if (dlb_signature_differentiable(&sig, i) != want[i])
      fprintf(stderr, "  parameter %d\n", i);
  }
  CHECK_EQ(dlb_signature_differentiable(&sig, -1), 0);
  CHECK_EQ(dlb_signature_differentiable(&sig, sig.nparams), 0);
  CHECK_EQ(dlb_signature_differentiable(NULL, 0), 0);
}

static void test_labels(void) {
  char buf[16];
  CHECK_EQ(parse("f(alpha: float32) -> float32"), DLB_OK);
  CHECK_EQ(dlb_signature_param_label(&sig, 0, buf, sizeof buf), 5);
  CHECK_STREQ(buf, "alpha");
  CHECK_EQ(dlb_signature_param_label(&sig, 1, buf, sizeof buf), 3);
  CHECK_STREQ(buf, "out");
  CHECK_EQ(parse("f(x: float32) -> (float32, lse: float32, float32)"), DLB_OK);
  CHECK_EQ(dlb_signature_param_label(&sig, 1, buf, sizeof buf), 4);
  CHECK_STREQ(buf, "out0");
  CHECK_EQ(dlb_signature_param_label(&sig, 2, buf, sizeof buf), 3);
  CHECK_STREQ(buf, "lse");
  /* by position among the results, named ones counted */
  CHECK_EQ(dlb_signature_param_label(&sig, 3, buf, sizeof buf), 4);
  CHECK_STREQ(buf, "out2");
  /* truncated to cap with a NUL; the length is the whole label's */
  CHECK_EQ(parse("f(alpha: float32)"), DLB_OK);
  CHECK_EQ(dlb_signature_param_label(&sig, 0, buf, 3), 5);
  CHECK_STREQ(buf, "al");
  CHECK_EQ(dlb_signature_param_label(&sig, 0, NULL, 0), 5);
  memcpy(buf, "zz", 3);
  CHECK_EQ(dlb_signature_param_label(&sig, 0, buf, 0), 5);
  CHECK_STREQ(buf, "zz"); /* cap 0: nothing written */
  CHECK_EQ(dlb_signature_param_label(&sig, 1, buf, sizeof buf), 0);
  CHECK_STREQ(buf, "");
  CHECK_EQ(dlb_signature_param_label(NULL, 0, buf, sizeof buf), 0);
  CHECK_STREQ(buf, "");
}

/* ---- derive ------------------------------------------------------------------ */

static dlb_signature prim, der; /* large: not on the stack */
static char dtext[4096];

/* The derived text of kind for primal text, or NULL (message in *err). */
static const char *derive(const char *primal, int kind, dlb_error *err) {
  if (dlb_signature_parse(primal, strlen(primal), &prim, err) != DLB_OK)
    return NULL;
  size_t len = 0;
  if (dlb_signature_derive(&prim, kind, dtext, sizeof dtext, &len, err) != DLB_OK)
    return NULL;
  return len == strlen(dtext) ? dtext : "(len is wrong)";
}

/* Bind deriv (text) of kind to primal (text), 0 or the status. */
static int bind(const char *primal, const char *deriv, int kind,
                dlb_signature_binding *b, dlb_error *err) {
  int rc = dlb_signature_parse(primal, strlen(primal), &prim, err);
  if (rc != DLB_OK) return 1000 + rc; /* a parse failure is not a refusal */
  rc = dlb_signature_parse(deriv, strlen(deriv), &der, err);
  if (rc != DLB_OK) return 1000 + rc;
  return dlb_signature_bind(&prim, &der, kind, b, err);
}

/* The binding as text: "I0 R0 D1 -> 0 1" (kind letter and index per
 * argument, then the result records). */
static const char *records(const dlb_signature_binding *b) {
  static char t[512];
  size_t n = 0;
  for (int k = 0; k < b->nargs; k++)
    n += (size_t)snprintf(t + n, sizeof t - n, "%s%c%d", k ? " " : "",
                          "IRD"[b->arg[k].kind], b->arg[k].index);
  n += (size_t)snprintf(t + n, sizeof t - n, " ->");
  for (int k = 0; k < b->nresults; k++)
    n += (size_t)snprintf(t + n, sizeof t - n, " %d", b->result[k]);
  return t;
}

static void check_derive(const char *primal, int kind, const char *want,
                         const char *want_records) {
  dlb_error err;
  const char *got = derive(primal, kind, &err);
  CHECK_STREQ(got, want);
  if (got == NULL) {
    fprintf(stderr, "  derive of %s: %s\n", primal, err.message);
    return;
  }
  /* it parses, and binds back to its primal */
  CHECK_EQ(dlb_signature_parse(dtext, strlen(dtext), &der, &err), DLB_OK);
  dlb_signature_binding b;
  CHECK_EQ(dlb_signature_bind(&prim, &der, kind, &b, &err), DLB_OK);
  CHECK_STREQ(records(&b), want_records);
}

static void test_derive(void) {
  const int V = DLB_DERIVATIVE_VJP, J = DLB_DERIVATIVE_JVP;
  /* the kernels of examples/kernels/autodiff.c */
  const char *scale = "scale(a: float64, x: float64[n]) -> (y: float64[n])";
  check_derive(scale, V,
               "scale_vjp(a: float64, x: float64[n], dy: float64[n]) -> "
               "(da: float64, dx: float64[n])",
               "I0 I1 D0 -> 0 1");
  check_derive(scale, J,
               "scale_jvp(a: float64, x: float64[n], ta: float64, "
               "tx: float64[n]) -> (ty: float64[n])",
               "I0 I1 D0 D1 -> 0");
  const char *gather = "gather(x: float64[m], idx: int64[k]) -> (y: float64[k])";
  check_derive(gather, V,
               "gather_vjp(x: float64[m], idx: int64[k], dy: float64[k]) -> "
               "(dx: float64[m])",
               "I0 I1 D0 -> 0");
  check_derive(gather, J,
               "gather_jvp(x: float64[m], idx: int64[k], tx: float64[m]) -> "
               "(ty: float64[k])",
               "I0 I1 D0 -> 0");
  check_derive("gather_f32(x: float32[m], idx: int32[k]) -> (y: float32[k])", V,
               "gather_f32_vjp(x: float32[m], idx: int32[k], dy: float32[k]) "
               "-> (dx: float32[m])",
               "I0 I1 D0 -> 0");
  const char *sincos = "sincos(x: float64[n]) -> (s: float64[n], c: float64[n])";
  check_derive(sincos, V,
               "sincos_vjp(x: float64[n], ds: float64[n], dc: float64[n]) -> "
               "(dx: float64[n])",
               "I0 D0 D1 -> 0");
  check_derive(sincos, J,
               "sincos_jvp(x: float64[n], tx: float64[n]) -> (ts: float64[n], "
               "tc: float64[n])",
               "I0 D0 -> 0 1");
  const char *lse = "softmax_lse(x: float64[n]) -> (y: float64[n], lse: nodiff float64)";
  check_derive(lse, V,
               "softmax_lse_vjp(x: float64[n], dy: float64[n]) -> (dx: float64[n])",
               "I0 D0 -> 0");
  check_derive(lse, J,
               "softmax_lse_jvp(x: float64[n], tx: float64[n]) -> (ty: float64[n])",
               "I0 D0 -> 0");
  const char *cmul = "cmul(z: complex128[n], w: complex128[n]) -> (p: complex128[n])";
  check_derive(cmul, V,
               "cmul_vjp(z: complex128[n], w: complex128[n], dp: complex128[n]) "
               "-> (dz: complex128[n], dw: complex128[n])",
               "I0 I1 D0 -> 0 1");
  check_derive(cmul, J,
               "cmul_jvp(z: complex128[n], w: complex128[n], tz: complex128[n], "
               "tw: complex128[n]) -> (tp: complex128[n])",
               "I0 I1 D0 D1 -> 0");
  check_derive("mul_f32(a: float32[n], b: float32[n]) -> (y: float32[n])", V,
               "mul_f32_vjp(a: float32[n], b: float32[n], dy: float32[n]) -> "
               "(da: float32[n], db: float32[n])",
               "I0 I1 D0 -> 0 1");
  /* unnamed results: dout alone, dout<k> by position; nodiff and integer
   * inputs are kept as inputs with their marks dropped; the spelling is
   * normalised (spaces, trailing commas, "[]"), literals kept */
  check_derive("f(x: float32[n]) -> float32[n]", V,
               "f_vjp(x: float32[n], dout: float32[n]) -> (dx: float32[n])",
               "I0 D0 -> 0");
  check_derive("f(x: float32[n]) -> float32[n]", J,
               "f_jvp(x: float32[n], tx: float32[n]) -> (tout: float32[n])",
               "I0 D0 -> 0");
  check_derive(" f ( x :nodiff float32[ n ,3 ],w:bfloat16[],q: float16[007, n],) -> "
               "( float32[n] , int8 , nodiff float32, s: float64[3, n], ) ",
               V,
               "f_vjp(x: float32[n, 3], w: bfloat16, q: float16[7, n], "
               "dout0: float32[n], ds: float64[3, n]) -> (dw: bfloat16, "
               "dq: float16[7, n])",
               "I0 I1 I2 D0 D3 -> 1 2");
  check_derive(" f ( x :nodiff float32[ n ,3 ],w:bfloat16[],q: float16[007, n],) -> "
               "( float32[n] , int8 , nodiff float32, s: float64[3, n], ) ",
               J,
               "f_jvp(x: float32[n, 3], w: bfloat16, q: float16[7, n], "
               "tw: bfloat16, tq: float16[7, n]) -> (tout0: float32[n], "
               "ts: float64[3, n])",
               "I0 I1 I2 D1 D2 -> 0 3");
  /* a result named like a derived result is looked up apart from it */
  check_derive("f(x: float32) -> (dx: float32)", V,
               "f_vjp(x: float32, ddx: float32) -> (dx: float32)", "I0 D0 -> 0");
  check_derive("f(x: float32) -> (y: float32, ty: float32)", J,
               "f_jvp(x: float32, tx: float32) -> (ty: float32, tty: float32)",
               "I0 D0 -> 0 1");
  /* a vector dtype spells as dlb_dtype_name writes it */
  check_derive("v(x: float32x4[n]) -> float32x4[n]", V,
               "v_vjp(x: float32x4[n], dout: float32x4[n]) -> (dx: float32x4[n])",
               "I0 D0 -> 0");
  /* the derivative of a non-differentiable parameter never clashes: here
   * t<n> would be the input tn, but n is an int64 and has no tangent */
  check_derive("g(x: float32, tn: float32, n: int64) -> float32", J,
               "g_jvp(x: float32, tn: float32, n: int64, tx: float32, "
               "ttn: float32) -> (tout: float32)",
               "I0 I1 I2 D0 D1 -> 0");
}

static void test_derive_overflow(void) {
  dlb_error err;
  const char *scale = "scale(a: float64, x: float64[n]) -> (y: float64[n])";
  const char *want = "scale_vjp(a: float64, x: float64[n], dy: float64[n]) -> "
                     "(da: float64, dx: float64[n])";
  size_t n = strlen(want), len = 0;
  CHECK_EQ(parse(scale), DLB_OK);
  char small[16];
  CHECK_EQ(dlb_signature_derive(&sig, DLB_DERIVATIVE_VJP, small, sizeof small, &len,
                                &err),
           DLB_EOVERFLOW);
  CHECK_EQ(len, n); /* what it needs, as snprintf */
  CHECK(memcmp(small, want, 15) == 0 && small[15] == '\0');
  CHECK_MSG(err, "needs");
  /* exactly the length: no room for the NUL */
  char *exact = malloc(n + 1);
  CHECK_EQ(dlb_signature_derive(&sig, DLB_DERIVATIVE_VJP, exact, n, &len, &err),
           DLB_EOVERFLOW);
  CHECK_EQ(dlb_signature_derive(&sig, DLB_DERIVATIVE_VJP, exact, n + 1, &len, &err),
           DLB_OK);
  CHECK_STREQ(exact, want);
  free(exact);
  /* a size query: no buffer at all */
  CHECK_EQ(dlb_signature_derive(&sig, DLB_DERIVATIVE_VJP, NULL, 0, &len, &err),
           DLB_EOVERFLOW);
  CHECK_EQ(len, n);
  CHECK_EQ(dlb_signature_derive(&sig, DLB_DERIVATIVE_VJP, NULL, 8, &len, &err),
           DLB_EINVAL);
  CHECK_EQ(dlb_signature_derive(NULL, DLB_DERIVATIVE_VJP, small, 16, &len, &err),
           DLB_EINVAL);
  CHECK_EQ(dlb_signature_derive(&sig, 7, small, 16, &len, &err), DLB_EINVAL);
  CHECK_MSG(err, "DLB_DERIVATIVE_");
}

/* Each of derive and bind allocates one scratch block: its failure is
 * DLB_ENOMEM, and nothing leaks either way. */
static void test_grad_allocation(void) {
  dlb_error err;
  char buf[256];
  size_t len;
  dlb_signature_binding b;
  const char *ps = "s(a: float64) -> (y: float64)";
  const char *ds = "v(a: float64, dy: float64) -> (da: float64)";
  CHECK_EQ(dlb_signature_parse(ps, strlen(ps), &prim, &err), DLB_OK);
  CHECK_EQ(dlb_signature_parse(ds, strlen(ds), &der, &err), DLB_OK);
  failing_allocator_install(0);
  CHECK_EQ(dlb_signature_derive(&prim, DLB_DERIVATIVE_VJP, buf, sizeof buf, &len,
                                &err),
           DLB_ENOMEM);
  CHECK_MSG(err, "out of memory");
  CHECK_EQ(dlb_signature_bind(&prim, &der, DLB_DERIVATIVE_VJP, &b, &err), DLB_ENOMEM);
  CHECK_MSG(err, "out of memory");
  CHECK_EQ(failing_allocator_live(), 0);
  failing_allocator_install(-1);
  CHECK_EQ(dlb_signature_derive(&prim, DLB_DERIVATIVE_VJP, buf, sizeof buf, &len,
                                &err),
           DLB_OK);
  CHECK_EQ(dlb_signature_bind(&prim, &der, DLB_DERIVATIVE_VJP, &b, &err), DLB_OK);
  CHECK_EQ(failing_allocator_total(), 2);
  CHECK_EQ(failing_allocator_live(), 0);
  failing_allocator_remove();
}

static void check_derive_refused(const char *primal, int kind, const char *want) {
  dlb_error err;
  const char *got = derive(primal, kind, &err);
  CHECK(got == NULL);
  CHECK_EQ(err.code, DLB_EINVAL);
  CHECK_STREQ(err.message, want);
}

static void test_derive_refusals(void) {
  const int V = DLB_DERIVATIVE_VJP, J = DLB_DERIVATIVE_JVP;
  const char *saxpy = "saxpy(a: float32, x: float32[n], y: mut float32[n])";
  check_derive_refused(saxpy, V,
                       "saxpy: a Function with `mut` parameters cannot have a vjp: "
                       "its inputs are overwritten before the backward runs "
                       "(declare the result instead; 'y' is mut)");
  check_derive_refused(saxpy, J,
                       "saxpy: a Function with `mut` parameters cannot have a jvp: "
                       "its inputs are overwritten by the forward and the new "
                       "values have no tangent (declare the result instead; 'y' "
                       "is mut)");
  /* mut comes first: the kernel's results do not save it */
  check_derive_refused("f(x: float32[n], out: mut float32[n]) -> float32[n]", V,
                       "f: a Function with `mut` parameters cannot have a vjp: "
                       "its inputs are overwritten before the backward runs "
                       "(declare the result instead; 'out' is mut)");
  check_derive_refused("f(i: int64[n], x: nodiff float32[n]) -> float32[n]", V,
                       "f: no input is differentiable (a float or complex dtype, "
                       "not nodiff): a vjp would return nothing");
  check_derive_refused("f(i: int64[n]) -> float32[n]", J,
                       "f: no input is differentiable (a float or complex dtype, "
                       "not nodiff): a jvp would take no tangent");
  check_derive_refused("f(x: float32[n]) -> (i: int64[n], s: nodiff float32)", V,
                       "f: no result is differentiable (a float or complex dtype, "
                       "not nodiff): a vjp would take no cotangent");
  check_derive_refused("f(x: float32[n])", J,
                       "f: no result is differentiable (a float or complex dtype, "
                       "not nodiff): a jvp would return nothing");
  /* names with two meanings */
  check_derive_refused("f(x: float32, dy: float32) -> (y: float32)", V,
                       "f: the vjp cannot bind 'dy' by name: it is both input "
                       "'dy' and the cotangent of result 'y' (rename one)");
  check_derive_refused("f(x: float32, dx: float32) -> float32", V,
                       "f: the vjp cannot bind 'dx' by name: it is both input "
                       "'dx' and the cotangent of input 'x' (rename one)");
  check_derive_refused("f(x: float32, tx: float32) -> float32", J,
                       "f: the jvp cannot bind 'tx' by name: it is both input "
                       "'tx' and the tangent of input 'x' (rename one)");
  /* a jvp may take results: t<input> must not name one */
  check_derive_refused("f(x: float32) -> (tx: float32)", J,
                       "f: the jvp cannot bind 'tx' by name: it is both the "
                       "tangent of input 'x' and result 'tx' (rename one)");
  check_derive_refused("f(x: float32) -> (y: float32, dy: float32)", V,
                       "f: the vjp cannot bind 'dy' by name: it is both the "
                       "cotangent of result 'y' and result 'dy' (rename one)");
  /* an input named like an unnamed result's label */
  check_derive_refused("f(out: int64, x: float32) -> float32", V,
                       "f: the vjp cannot bind 'out' by name: it is both input "
                       "'out' and result 'out' (rename one)");
  check_derive_refused("f(x: float32, out1: float32) -> (float32, float32)", J,
                       "f: the jvp cannot bind 'out1' by name: it is both input "
                       "'out1' and result 'out1' (rename one)");
  /* the derived signature must itself fit: 32 inputs, 1 result -> 65 */
  static char wide[2048];
  size_t n = (size_t)snprintf(wide, sizeof wide, "w(");
  for (int i = 0; i < 32; i++)
    n += (size_t)snprintf(wide + n, sizeof wide - n, "x%d: float32, ", i);
  snprintf(wide + n, sizeof wide - n, ") -> float32");
  check_derive_refused(wide, V,
                       "w: its derived vjp would have 65 parameters and results, "
                       "more than 64 (spell one that takes fewer inputs)");
  check_derive_refused(wide, J,
                       "w: its derived jvp would have 65 parameters and results, "
                       "more than 64 (spell one that takes fewer inputs)");
  memcpy(strstr(wide, "x31: float32"), "x31: int64  ", 12); /* 32 + 1 + 31 */
  dlb_error err;
  CHECK(derive(wide, V, &err) != NULL);
  CHECK_EQ(dlb_signature_parse(dtext, strlen(dtext), &der, &err), DLB_OK);
  CHECK_EQ(der.nparams, 64);
  /* the same clash is fine for the kind it does not concern */
  CHECK(derive("f(x: float32, dx: float32) -> float32", J, &err) != NULL);
  CHECK(derive("f(x: float32, tx: float32) -> float32", V, &err) != NULL);
}

/* ---- bind ------------------------------------------------------------------- */

static void check_bind(const char *primal, const char *deriv, int kind,
                       const char *want_records) {
  dlb_error err;
  dlb_signature_binding b;
  int rc = bind(primal, deriv, kind, &b, &err);
  CHECK_EQ(rc, DLB_OK);
  if (rc != DLB_OK) {
    fprintf(stderr, "  bind %s to %s: %s\n", deriv, primal, err.message);
    return;
  }
  CHECK_EQ(b.nargs, der.nin);
  CHECK_EQ(b.nresults, der.nparams - der.nin);
  CHECK_STREQ(records(&b), want_records);
}

static void check_bind_refused(const char *primal, const char *deriv, int kind,
                               const char *want) {
  dlb_error err;
  dlb_signature_binding b;
  memset(&b, 0x5a, sizeof b);
  CHECK_EQ(bind(primal, deriv, kind, &b, &err), DLB_EINVAL);
  CHECK_STREQ(err.message, want);
  CHECK(b.nargs == 0 && b.nresults == 0 && b.arg[0].kind == 0); /* zeroed */
}

static void test_bind_spelled(void) {
  const int V = DLB_DERIVATIVE_VJP, J = DLB_DERIVATIVE_JVP;
  /* examples/kernels/autodiff.c's spelled derivatives: a saved result */
  const char *softmax = "softmax(x: float64[n]) -> (y: float64[n])";
  check_bind(softmax, "softmax_vjp(y: float64[n], dy: float64[n]) -> (dx: float64[n])",
             V, "R0 D0 -> 0");
  check_bind(softmax, "softmax_jvp(y: float64[n], tx: float64[n]) -> (ty: float64[n])",
             J, "R0 D0 -> 0");
  check_bind("softmax_f32(x: float32[n]) -> (y: float32[n])",
             "softmax_f32_vjp(y: float32[n], dy: float32[n]) -> (dx: float32[n])",
             V, "R0 D0 -> 0");
  const char *lse = "softmax_lse(x: float64[n]) -> (y: float64[n], lse: nodiff float64)";
  check_bind(lse, "softmax_lse_vjp(y: float64[n], dy: float64[n]) -> (dx: float64[n])",
             V, "R0 D0 -> 0");
  /* the nodiff result may still be read, saved from the forward */
  check_bind(lse, "v(lse: float64, dy: float64[n], x: float64[n]) -> (dx: float64[n])",
             V, "R1 D0 I0 -> 0");
  /* any order, any subset of inputs; results reordered */
  const char *scale = "scale(a: float64, x: float64[n]) -> (y: float64[n])";
  check_bind(scale, "s(dy: float64[n], x: float64[n], a: float64) -> (dx: float64[n], "
                    "da: float64)",
             V, "D0 I1 I0 -> 1 0");
  check_bind(scale, "s(tx: float64[n], ta: float64, y: float64[n], a: float64) -> "
                    "(ty: float64[n])",
             J, "D1 D0 R0 I0 -> 0");
  /* the jvp may take the results too */
  check_bind("sincos(x: float64[n]) -> (s: float64[n], c: float64[n])",
             "sincos_jvp(s: float64[n], c: float64[n], tx: float64[n]) -> "
             "(tc: float64[n], ts: float64[n])",
             J, "R0 R1 D0 -> 1 0");
  /* unnamed results bind by label; an int input is an input */
  check_bind("g(x: float32[m], idx: int64[k]) -> (float32[k], float32[k])",
             "gv(idx: int64[k], dout1: float32[k], dout0: float32[k], "
             "out1: float32[k], x: float32[m]) -> (dx: float32[m])",
             V, "I1 D1 D0 R1 I0 -> 0");
  /* dims compare by spelling: the derivative may bind them in its own
   * order, since each is spelled as in the primal */
  check_bind("m(a: float32[i, j], b: float32[j, k]) -> (c: float32[i, k])",
             "mv(dc: float32[i, k], b: float32[j, k], a: float32[i, j]) -> "
             "(db: float32[j, k], da: float32[i, j])",
             V, "D0 I1 I0 -> 1 0");
  /* a live meaning beats the dead derivative of an int: tn is the input */
  check_bind("g(x: float32, tn: float32, n: int64) -> float32",
             "gj(tn: float32, tx: float32, ttn: float32) -> (tout: float32)",
             J, "I1 D0 D1 -> 0");
  /* nodiff on a derivative's own parameters is its business */
  check_bind(scale, "s(a: nodiff float64, x: float64[n], dy: float64[n]) -> "
                    "(da: float64, dx: float64[n])",
             V, "I0 I1 D0 -> 0 1");
}

static void test_bind_refusals(void) {
  const int V = DLB_DERIVATIVE_VJP, J = DLB_DERIVATIVE_JVP;
  const char *gather = "gather(x: float64[m], idx: int64[k]) -> (y: float64[k])";
  check_bind_refused(gather,
                     "gather_vjp(x: float64[m], idx: int64[k], dy: float64[k]) -> "
                     "(dx: float64[m], didx: int64[k])",
                     V, "gather_vjp: input 'idx' is int64: it has no cotangent");
  check_bind_refused(gather,
                     "gather_vjp(x: float64[m], idx: int64[k], dy: float64[k]) -> ()",
                     V,
                     "gather_vjp: no cotangent for differentiable input(s) x "
                     "(mark them nodiff)");
  check_bind_refused(gather,
                     "gather_vjp(x: float64[m], g: int64[k], dy: float64[k]) -> "
                     "(dx: float64[m])",
                     V,
                     "gather_vjp: parameter 'g' is neither an input (x, idx), a "
                     "result (y) nor the cotangent of one (dy)");
  check_bind_refused("gather_f32(x: float32[m], idx: int32[k]) -> (y: float32[k])",
                     "gather_vjp(x: float32[m], idx: int32[k], dy: float32[n]) -> "
                     "(dx: float32[m])",
                     V,
                     "gather_vjp: dy: float32[n] does not match the primal y: "
                     "float32[k] (same dtype and dims)");
  check_bind_refused(gather,
                     "gather_vjp(x: float64[m], idx: int64[k], dy: mut float64[k]) "
                     "-> (dx: float64[m])",
                     V, "gather_vjp: parameter 'dy' is mut; a vjp must be functional");
  const char *softmax = "softmax(x: float64[n]) -> (y: float64[n])";
  check_bind_refused(softmax, "softmax_vjp(y: float64[n]) -> (dx: float64[n])", V,
                     "softmax_vjp: takes no cotangent for result 'y' (dy)");
  check_bind_refused("sincos(x: float64[n]) -> (s: float64[n], c: float64[n])",
                     "sincos_vjp(x: float64[n]) -> (dx: float64[n])", V,
                     "sincos_vjp: takes no cotangent for result 's' (ds), 'c' (dc)");
  const char *lse = "softmax_lse(x: float64[n]) -> (y: float64[n], lse: nodiff float64)";
  check_bind_refused(lse,
                     "lv(y: float64[n], dy: float64[n], dlse: float64) -> "
                     "(dx: float64[n])",
                     V, "lv: result 'lse' is nodiff: it has no cotangent");
  /* types: dtype, rank, literal, name; results too */
  check_bind_refused(gather,
                     "gv(x: float32[m], idx: int64[k], dy: float64[k]) -> (dx: float64[m])",
                     V, "gv: x: float32[m] does not match the primal x: float64[m] "
                        "(same dtype and dims)");
  check_bind_refused(gather,
                     "gv(x: float64[m, 1], idx: int64[k], dy: float64[k]) -> "
                     "(dx: float64[m, 1])",
                     V, "gv: x: float64[m, 1] does not match the primal x: "
                        "float64[m] (same dtype and dims)");
  check_bind_refused("h(x: float64[3]) -> float64[3]",
                     "hv(x: float64[4], dout: float64[3]) -> (dx: float64[3])",
                     V, "hv: x: float64[4] does not match the primal x: float64[3] "
                        "(same dtype and dims)");
  check_bind_refused("h(x: float64[3]) -> float64[3]",
                     "hv(x: float64[n], dout: float64[3]) -> (dx: float64[n])",
                     V, "hv: x: float64[n] does not match the primal x: float64[3] "
                        "(same dtype and dims)");
  check_bind_refused(gather,
                     "gv(x: float64[m], idx: int64[k], dy: float64[k]) -> (dx: float64)",
                     V, "gv: dx: float64 does not match the primal x: float64[m] "
                        "(same dtype and dims)");
  check_bind_refused(gather,
                     "gv(x: float64[m], idx: int64[k], dy: float64[k]) -> (dz: float64[m])",
                     V, "gv: result 'dz' is not the cotangent of an input (dx)");
  check_bind_refused(gather,
                     "gv(x: float64[m], idx: int64[k], dy: float64[k]) -> float64[m]",
                     V, "gv: result 0 has no name: a derivative binds its results by "
                        "name (dx)");
  /* examples/kernels/autodiff.c's bad_vjp_shape signature, paired with
   * primals it does not fit */
  const char *bad = "bad_vjp_shape(x: float64[n], dy: float64[n]) -> (dx: float64[n])";
  check_bind_refused("scale(a: float64, x: float64[n]) -> (y: float64[n])", bad, V,
                     "bad_vjp_shape: no cotangent for differentiable input(s) a "
                     "(mark them nodiff)");
  check_bind_refused(gather, bad, V,
                     "bad_vjp_shape: x: float64[n] does not match the primal x: "
                     "float64[m] (same dtype and dims)");
  /* the primal's own refusals */
  check_bind_refused("saxpy(a: float32, x: float32[n], y: mut float32[n])",
                     "saxpy_vjp(a: float32) -> ()", V,
                     "saxpy: a Function with `mut` parameters cannot have a vjp: "
                     "its inputs are overwritten before the backward runs "
                     "(declare the result instead; 'y' is mut)");
  check_bind_refused("f(i: int64[n]) -> float32[n]", "fv(i: int64[n]) -> ()", V,
                     "f: no input is differentiable (a float or complex dtype, "
                     "not nodiff): a vjp would return nothing");
  /* a name with two meanings, used */
  check_bind_refused("f(x: float32, dy: float32) -> (y: float32)",
                     "fv(dy: float32) -> (dx: float32, ddy: float32)", V,
                     "fv: cannot bind 'dy' by name: it is both input 'dy' and the "
                     "cotangent of result 'y' of f (rename one)");
  check_bind_refused("f(x: float32, out: int64) -> float32",
                     "fv(out: int64, dout: float32) -> (dx: float32)", V,
                     "fv: cannot bind 'out' by name: it is both input 'out' and "
                     "result 'out' of f (rename one)");
  /* ...and unused: a spelled signature may avoid it where the derived
   * one, which takes every input, cannot */
  check_bind("f(x: float32, out: int64) -> float32",
             "fv(x: float32, dout: float32) -> (dx: float32)", V, "I0 D0 -> 0");
  /* jvp */
  check_bind_refused(softmax, "softmax_jvp(y: float64[n]) -> (ty: float64[n])", J,
                     "softmax_jvp: takes no tangent for input 'x' (tx)");
  check_bind_refused(gather,
                     "gj(tx: float64[m], tidx: int64[k]) -> (ty: float64[k])", J,
                     "gj: input 'idx' is int64: it has no tangent");
  check_bind_refused(gather, "gj(idx: int64[k], tx: float64[m]) -> ()", J,
                     "gj: no tangent for differentiable result(s) y (mark them "
                     "nodiff)");
  check_bind_refused(lse,
                     "lj(x: float64[n], tx: float64[n]) -> (ty: float64[n], "
                     "tlse: float64)",
                     J, "lj: result 'lse' is nodiff: it has no tangent");
  check_bind_refused(gather, "gj(tx: mut float64[m], idx: int64[k]) -> (ty: float64[k])", J,
                     "gj: parameter 'tx' is mut; a jvp must be functional");
  check_bind_refused(gather, "gj(tx: float64[m], dy: float64[k]) -> (ty: float64[k])", J,
                     "gj: parameter 'dy' is neither an input (x, idx), a result (y) "
                     "nor the tangent of an input (tx)");
  check_bind_refused(gather, "gj(tx: float64[m], idx: int64[k]) -> (dy: float64[k])", J,
                     "gj: result 'dy' is not the tangent of a result (ty)");
  check_bind_refused(gather, "gj(tx: float64[k]) -> (ty: float64[k])", J,
                     "gj: tx: float64[k] does not match the primal x: float64[m] "
                     "(same dtype and dims)");
  /* a vjp's names are not a jvp's */
  check_bind_refused(softmax,
                     "softmax_vjp(y: float64[n], dy: float64[n]) -> (dx: float64[n])",
                     J, "softmax_vjp: parameter 'dy' is neither an input (x), a "
                        "result (y) nor the tangent of an input (tx)");
  /* NULL arguments and a bad kind */
  dlb_error err;
  dlb_signature_binding b;
  CHECK_EQ(parse("f(x: float32) -> float32"), DLB_OK);
  CHECK_EQ(dlb_signature_bind(NULL, &sig, V, &b, &err), DLB_EINVAL);
  CHECK_EQ(dlb_signature_bind(&sig, NULL, V, &b, &err), DLB_EINVAL);
  CHECK_EQ(dlb_signature_bind(&sig, &sig, V, NULL, &err), DLB_EINVAL);
  CHECK_EQ(dlb_signature_bind(&sig, &sig, 2, &b, &err), DLB_EINVAL);
  CHECK_MSG(err, "DLB_DERIVATIVE_");
}

/* ---- batch dimensions `...` ------------------------------------------------ */

static void test_batch_grammar(void) {
  CHECK_EQ(parse("bscale(a: float64[...], x: float64[..., n]) -> "
                 "(y: float64[..., n])"),
           DLB_OK);
  CHECK_EQ(sig.nparams, 3);
  /* the flag, and ndim / dim records of the CORE dims only */
  CHECK(sig.params[0].batch == 1 && sig.params[0].ndim == 0);
  CHECK(sig.params[1].batch == 1 && sig.params[1].ndim == 1);
  CHECK(sig.params[2].batch == 1 && sig.params[2].ndim == 1);
  CHECK_EQ(sig.ndims, 2);
  CHECK_EQ(sig.dims[0].kind, DLB_SIGNATURE_DIM_BIND);
  CHECK(sig.dims[0].from_param == 1 && sig.dims[0].from_axis == 0);
  CHECK_EQ(sig.dims[1].kind, DLB_SIGNATURE_DIM_CHECK);
  /* without `...` the flag is clear; mixed, mut and nodiff, whitespace */
  CHECK_EQ(parse("bdot(x: float64[ ... , n], w: float64[n], "
                 "y: mut float32[...,2], i: nodiff int64[...]) -> "
                 "(s: float64[...], float64)"),
           DLB_OK);
  CHECK(sig.params[0].batch && !sig.params[1].batch && sig.params[2].batch &&
        sig.params[3].batch);
  CHECK(sig.params[2].mut && sig.params[3].nodiff);
  CHECK_EQ(sig.params[2].ndim, 1);
  CHECK_EQ(sig.dims[sig.params[2].dim0].value, 2);
  CHECK(sig.params[4].batch && sig.params[4].ndim == 0);
  CHECK(!sig.params[5].batch && sig.params[5].ndim == 0);
  /* a result needs only some input with `...`; results may lack it */
  CHECK_EQ(parse("f(x: float32[n], b: float32[...]) -> (float32[..., n], "
                 "float32[n])"),
           DLB_OK);
  CHECK(sig.params[2].batch && !sig.params[3].batch);
  CHECK_EQ(parse("f(x: float32[...]) -> float32[...]"), DLB_OK);
  CHECK(sig.params[1].batch);
  /* 64 core dims after `...` are still allowed: the limit is the core's */
  char text[600];
  size_t n = (size_t)snprintf(text, sizeof text, "f(x: int8[...");
  for (int k = 0; k < DLB_MAX_NDIM; k++)
    n += (size_t)snprintf(text + n, sizeof text - n, ", 1");
  snprintf(text + n, sizeof text - n, "])");
  CHECK_EQ(parse(text), DLB_OK);
  CHECK_EQ(sig.params[0].ndim, DLB_MAX_NDIM);
}

static void test_batch_grammar_errors(void) {
  static const struct { const char *text; const char *message; size_t at; } bad[] = {
      {"f(x: float32[n, ...])",
       "'...' must come first: the batch dimensions lead (write [..., n])", 16},
      {"f(x: float32[..., ...])", "'...' given twice", 18},
      {"f(x: float32[..., n, ...])", "'...' given twice", 21},
      {"f(x: float32[..])", "expected '...' (three dots", 13},
      {"f(x: float32[.])", "expected '...' (three dots", 13},
      {"f(x: float32[.", "expected '...' (three dots", 13},
      {"f(x: float32[...n])", "expected ',' or ']' after '...'", 16},
      {"f(x: float32[....])", "expected ',' or ']' after '...'", 16},
      {"f(x: float32[..., ])", "expected a dimension", 18},
      {"f(x: float32[...", "expected ',' or ']' after '...'", 16},
      {"f(x: float32[n]) -> float32[...]",
       "result 0 has '...' but no input does: its batch dimensions would "
       "come from nothing", 28},
      {"f(x: float32[n]) -> (s: float32, y: float32[..., n])",
       "result 'y' has '...' but no input does", 44},
      {"f(x: float32[n, ...]) -> float32[...]", "'...' must come first", 16},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dlb_error err;
    CHECK_EQ(dlb_signature_parse(bad[i].text, strlen(bad[i].text), &sig, &err),
             DLB_EINVAL);
    CHECK(sig.message != NULL && strstr(sig.message, bad[i].message) != NULL);
    if (sig.error_pos != bad[i].at)
      fprintf(stderr, "  %s: at %zu\n", bad[i].text, sig.error_pos);
    CHECK_EQ(sig.error_pos, bad[i].at);
    CHECK_MSG(err, bad[i].message);
  }
}

static void test_batch_derive(void) {
  const int V = DLB_DERIVATIVE_VJP, J = DLB_DERIVATIVE_JVP;
  const char *bscale =
      "bscale(a: float64[...], x: float64[..., n]) -> (y: float64[..., n])";
  /* a cotangent / tangent has its primal's dims, `...` included */
  check_derive(bscale, V,
               "bscale_vjp(a: float64[...], x: float64[..., n], "
               "dy: float64[..., n]) -> (da: float64[...], "
               "dx: float64[..., n])",
               "I0 I1 D0 -> 0 1");
  check_derive(bscale, J,
               "bscale_jvp(a: float64[...], x: float64[..., n], "
               "ta: float64[...], tx: float64[..., n]) -> "
               "(ty: float64[..., n])",
               "I0 I1 D0 D1 -> 0");
  check_derive("bdot(x: float32[..., n], w: float32[n]) -> (s: float32[...])",
               V,
               "bdot_vjp(x: float32[..., n], w: float32[n], "
               "ds: float32[...]) -> (dx: float32[..., n], dw: float32[n])",
               "I0 I1 D0 -> 0 1");
  /* binding checks the flag as it checks the dims */
  dlb_signature_binding b;
  dlb_error err;
  CHECK_EQ(bind(bscale,
                "bscale_vjp(x: float64[..., n], dy: float64[..., n]) -> "
                "(da: float64[...], dx: float64[..., n])",
                V, &b, &err),
           DLB_OK);
  CHECK_STREQ(records(&b), "I1 D0 -> 0 1");
  CHECK_EQ(bind(bscale,
                "bscale_vjp(a: float64[...], x: float64[..., n], "
                "dy: float64[n]) -> (da: float64[...], dx: float64[..., n])",
                V, &b, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "bscale_vjp: dy: float64[n] does not match the primal "
                 "y: float64[..., n] (same dtype and dims)");
  CHECK_EQ(bind(bscale,
                "bscale_vjp(a: float64, x: float64[..., n], "
                "dy: float64[..., n]) -> (da: float64[...], "
                "dx: float64[..., n])",
                V, &b, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "a: float64 does not match the primal a: float64[...]");
  CHECK_EQ(bind(bscale,
                "bscale_jvp(a: float64[...], x: float64[..., n], "
                "ta: float64[...], tx: float64[..., n]) -> (ty: float64[n])",
                J, &b, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "ty: float64[n] does not match the primal y: "
                 "float64[..., n]");
  /* the other way: `...` where the primal has none */
  CHECK_EQ(bind("scale(a: float64, x: float64[n]) -> (y: float64[n])",
                "scale_vjp(a: float64[...], dy: float64[n]) -> "
                "(da: float64, dx: float64[n])",
                V, &b, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "a: float64[...] does not match the primal a: float64");
}

/* A DLTensor of shape (given as a list ending in -2) for the batch tests. */
typedef struct {
  DLTensor t;
  int64_t shape[DLB_MAX_NDIM + 2];
} shaped;

static DLTensor *shape_of(shaped *s, int ndim, const int64_t *shape) {
  memset(s, 0, sizeof *s);
  s->t.ndim = ndim;
  s->t.shape = s->shape;
  for (int a = 0; a < ndim; a++) s->shape[a] = shape[a];
  return &s->t;
}

#define SHAPE(s, ...)                                                   \
  shape_of(&(s), (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), \
           (int64_t[]){__VA_ARGS__})

static const char *batch_text(const dlb_signature_batch *b) {
  static char t[256];
  size_t n = (size_t)snprintf(t, sizeof t, "(");
  for (int a = 0; a < b->ndim; a++)
    n += (size_t)snprintf(t + n, sizeof t - n, "%s%lld", a ? ", " : "",
                          (long long)b->shape[a]);
  snprintf(t + n, sizeof t - n, ")");
  return t;
}

static void test_batch_shape(void) {
  static shaped s[6];
  DLTensor *argv[6];
  dlb_signature_batch b;
  dlb_error err;
  /* bscale(a: [...], x: [..., n]) -> (y: [..., n]) */
  CHECK_EQ(parse("bscale(a: float64[...], x: float64[..., n]) -> "
                 "(y: float64[..., n])"),
           DLB_OK);
  argv[0] = SHAPE(s[0], 4, 1);
  argv[1] = SHAPE(s[1], 3, 5);
  argv[2] = NULL; /* not allocated yet: skipped */
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  CHECK_STREQ(batch_text(&b), "(4, 3)");
  CHECK(b.reason == DLB_BATCH_OK && b.refused == -1 && b.other == -1 &&
        b.axis == -1);
  /* equal ranks, a 0-d batch part, no batch at all */
  argv[0] = SHAPE(s[0], 2);
  argv[1] = SHAPE(s[1], 2, 7);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  CHECK_STREQ(batch_text(&b), "(2)");
  argv[0] = shape_of(&s[0], 0, NULL);
  argv[1] = SHAPE(s[1], 7);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  CHECK_EQ(b.ndim, 0);
  /* size 0 broadcasts with 1 only */
  argv[0] = SHAPE(s[0], 0);
  argv[1] = SHAPE(s[1], 1, 7);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  CHECK_STREQ(batch_text(&b), "(0)");
  /* a conflict names the tensor refused and the one that set B there */
  argv[0] = SHAPE(s[0], 2);
  argv[1] = SHAPE(s[1], 4, 3, 5);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err),
           DLB_EINVAL);
  CHECK(b.reason == DLB_BATCH_BROADCAST && b.refused == 1 && b.other == 0 &&
        b.axis == 0 && b.ndim == 0);
  CHECK_MSG(err, "the batch part of parameter 1 does not broadcast with that "
                 "of parameter 0");
  /* the result must be the whole B (left-padded with 1s) */
  argv[0] = SHAPE(s[0], 2, 1);
  argv[1] = SHAPE(s[1], 3, 5);
  argv[2] = SHAPE(s[2], 1, 2, 3, 5);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  CHECK_STREQ(batch_text(&b), "(2, 3)");
  argv[2] = SHAPE(s[2], 2, 1, 5);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err),
           DLB_EINVAL);
  CHECK(b.reason == DLB_BATCH_NOT_FULL && b.refused == 2 && b.other == 1 &&
        b.axis == 0);
  CHECK_MSG(err, "parameter 2 is not the whole broadcast batch shape");
  argv[2] = SHAPE(s[2], 7, 2, 3, 5); /* more than the inputs give */
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err),
           DLB_EINVAL);
  CHECK(b.reason == DLB_BATCH_NOT_FULL && b.refused == 2 && b.other == -1 &&
        b.axis == 2);
  argv[2] = SHAPE(s[2], 3, 5); /* fewer */
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err),
           DLB_EINVAL);
  CHECK(b.reason == DLB_BATCH_NOT_FULL && b.refused == 2 && b.other == 0 &&
        b.axis == 1);
  /* a tensor below its core rank */
  argv[1] = shape_of(&s[1], 0, NULL);
  argv[2] = NULL;
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err),
           DLB_EINVAL);
  CHECK(b.reason == DLB_BATCH_RANK && b.refused == 1 && b.other == -1);
  CHECK_MSG(err, "fewer dimensions than its core");
  /* more than 64 batch dims */
  static int64_t ones[DLB_MAX_NDIM + 2];
  for (int a = 0; a < DLB_MAX_NDIM + 2; a++) ones[a] = 1;
  argv[1] = shape_of(&s[1], DLB_MAX_NDIM + 2, ones);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err),
           DLB_EINVAL);
  CHECK(b.reason == DLB_BATCH_TOO_MANY && b.refused == 1);
  CHECK_MSG(err, "more than 64 batch");
  argv[1] = shape_of(&s[1], DLB_MAX_NDIM + 1, ones);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  CHECK_EQ(b.ndim, DLB_MAX_NDIM);

  /* unknown extents (-1) match anything; a known one other than 1 wins */
  argv[0] = SHAPE(s[0], -1, 1);
  argv[1] = SHAPE(s[1], 1, -1, 5);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  CHECK_STREQ(batch_text(&b), "(-1, -1)");
  argv[0] = SHAPE(s[0], -1, 4);
  argv[1] = SHAPE(s[1], 3, -1, 5);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  CHECK_STREQ(batch_text(&b), "(3, 4)");
  argv[2] = SHAPE(s[2], -1, 4, 5); /* an unknown result extent matches */
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  argv[0] = SHAPE(s[0], 2, 4);
  argv[1] = SHAPE(s[1], -1, 3, 5); /* known extents still conflict */
  argv[2] = NULL;
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err),
           DLB_EINVAL);
  CHECK(b.reason == DLB_BATCH_BROADCAST && b.refused == 1 && b.other == 0 &&
        b.axis == 0);
  argv[0] = SHAPE(s[0], 2);
  argv[1] = SHAPE(s[1], -1, 5);
  argv[2] = SHAPE(s[2], 3, 5); /* unknown B: the result is not refused */
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err),
           DLB_EINVAL);
  CHECK(b.reason == DLB_BATCH_NOT_FULL && b.refused == 2 && b.other == 0);
  argv[0] = SHAPE(s[0], -1);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  CHECK_STREQ(batch_text(&b), "(-1)");

  /* a mut input broadcasts into B and must be all of it; parameters
   * without `...` are not looked at */
  CHECK_EQ(parse("baxpy(a: float64[...], x: float64[..., n], "
                 "w: float64[n], y: mut float64[..., n])"),
           DLB_OK);
  argv[0] = SHAPE(s[0], 2, 1);
  argv[1] = SHAPE(s[1], 3, 5);
  argv[2] = SHAPE(s[2], 9, 9, 9, 9);
  argv[3] = SHAPE(s[3], 2, 3, 5);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 4, 4, argv, &b, &err), DLB_OK);
  CHECK_STREQ(batch_text(&b), "(2, 3)");
  argv[3] = SHAPE(s[3], 3, 5);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 4, 4, argv, &b, &err),
           DLB_EINVAL);
  CHECK(b.reason == DLB_BATCH_NOT_FULL && b.refused == 3 && b.other == 0 &&
        b.axis == 1);
  argv[3] = SHAPE(s[3], 4, 5); /* broadcast conflict first */
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 4, 4, argv, &b, &err),
           DLB_EINVAL);
  CHECK(b.reason == DLB_BATCH_BROADCAST && b.refused == 3 && b.other == 1);
  /* the only `...` input, mut: it alone is B */
  CHECK_EQ(parse("inc(y: mut float64[..., n])"), DLB_OK);
  argv[0] = SHAPE(s[0], 4, 3, 5);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 1, 1, argv, &b, &err), DLB_OK);
  CHECK_STREQ(batch_text(&b), "(4, 3)");
  /* no `...` at all: B is () */
  CHECK_EQ(parse("f(x: float64[n]) -> float64[n]"), DLB_OK);
  argv[0] = SHAPE(s[0], 4, 3, 5);
  argv[1] = SHAPE(s[1], 8);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 1, 2, argv, &b, &err), DLB_OK);
  CHECK_EQ(b.ndim, 0);
  CHECK_EQ(dlb_signature_batch_shape(NULL, 0, 0, NULL, &b, &err), DLB_OK);
  /* bad arguments */
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 1, 2, argv, NULL, &err),
           DLB_EINVAL);
  CHECK_EQ(dlb_signature_batch_shape(NULL, 1, 2, argv, &b, &err), DLB_EINVAL);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 1, 2, NULL, &b, &err),
           DLB_EINVAL);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 3, 2, argv, &b, &err),
           DLB_EINVAL);
  CHECK_EQ(dlb_signature_batch_shape(sig.params, -1, 2, argv, &b, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "dlb_signature_batch_shape:");
}

/* the header a kernel gets: left-padded with extent 1 / stride 0, strides
 * written out (compact when the tensor has none), no copy */
static void test_batch_pad(void) {
  static shaped s[3];
  DLTensor *argv[3];
  dlb_signature_batch b;
  dlb_error err;
  int64_t shape[DLB_MAX_NDIM], strides[DLB_MAX_NDIM];
  DLTensor padded;
  CHECK_EQ(parse("bscale(a: float64[...], x: float64[..., n]) -> "
                 "(y: float64[..., n])"),
           DLB_OK);
  argv[0] = SHAPE(s[0], 3);
  argv[1] = SHAPE(s[1], 2, 1, 5);
  argv[2] = NULL;
  argv[1]->data = (void *)0x1000;
  argv[1]->byte_offset = 16;
  CHECK_EQ(dlb_signature_batch_shape(sig.params, 2, 3, argv, &b, &err), DLB_OK);
  CHECK_STREQ(batch_text(&b), "(2, 3)");
  /* a: (3,) -> (1, 3), strides (0, 1) */
  CHECK_EQ(dlb_signature_batch_pad(&sig.params[0], argv[0], &b, shape,
                                   strides, &padded, &err),
           DLB_OK);
  CHECK(padded.ndim == 2 && padded.shape == shape && padded.strides == strides);
  CHECK(shape[0] == 1 && shape[1] == 3 && strides[0] == 0 && strides[1] == 1);
  /* x: (2, 1, 5) keeps its rank; compact strides (5, 5, 1) */
  CHECK_EQ(dlb_signature_batch_pad(&sig.params[1], argv[1], &b, shape,
                                   strides, &padded, &err),
           DLB_OK);
  CHECK(padded.ndim == 3 && shape[0] == 2 && shape[1] == 1 && shape[2] == 5);
  CHECK(strides[0] == 5 && strides[1] == 5 && strides[2] == 1);
  CHECK(padded.data == (void *)0x1000 && padded.byte_offset == 16);
  /* given strides are kept, negative and 0 ones too */
  int64_t given[3] = {-5, 0, 2};
  argv[1]->strides = given;
  argv[0] = shape_of(&s[0], 0, NULL);
  CHECK_EQ(dlb_signature_batch_pad(&sig.params[1], argv[1], &b, shape,
                                   strides, &padded, &err),
           DLB_OK);
  CHECK(strides[0] == -5 && strides[1] == 0 && strides[2] == 2);
  /* a 0-d core with no batch part: all padding */
  CHECK_EQ(dlb_signature_batch_pad(&sig.params[0], argv[0], &b, shape,
                                   strides, &padded, &err),
           DLB_OK);
  CHECK(padded.ndim == 2 && shape[0] == 1 && shape[1] == 1 &&
        strides[0] == 0 && strides[1] == 0);
  /* a batch part longer than B, or not a '...' parameter: refused */
  argv[1]->strides = NULL;
  argv[1] = SHAPE(s[1], 4, 2, 3, 5);
  CHECK_EQ(dlb_signature_batch_pad(&sig.params[1], argv[1], &b, shape,
                                   strides, &padded, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "does not fit 2 batch dims");
  CHECK_EQ(parse("f(x: float64[n]) -> (y: float64[n])"), DLB_OK);
  CHECK_EQ(dlb_signature_batch_pad(&sig.params[0], argv[1], &b, shape,
                                   strides, &padded, &err),
           DLB_EINVAL);
  CHECK_EQ(dlb_signature_batch_pad(NULL, argv[1], &b, shape, strides,
                                   &padded, &err),
           DLB_EINVAL);
}

int main(void) {
  test_records();
  test_errors();
  test_grammar_grad();
  test_grammar_grad_errors();
  test_differentiable();
  test_labels();
  test_derive();
  test_derive_overflow();
  test_grad_allocation();
  test_derive_refusals();
  test_bind_spelled();
  test_bind_refusals();
  test_batch_grammar();
  test_batch_grammar_errors();
  test_batch_derive();
  test_batch_shape();
  test_batch_pad();
  return check_summary("test_signature");
}
