/*
 * fuzz_signature.c -- libFuzzer target for dlb_signature_parse, the
 * signature language of dlb_kernel functions (dlbridge.Function), and for
 * the derivatives of a signature (dlb_signature_derive, _bind, _label).
 *
 * The input is "PRIMAL" or "PRIMAL;DERIV": each copied into an exactly
 * sized heap block with no NUL after it (the parser takes a length), so
 * AddressSanitizer catches any read past its end.  Whatever parses must be
 * self-consistent: counts within the record arrays, every parameter's dim
 * records inside dims[], every dim that checks a name pointing at an
 * earlier (parameter, axis) that exists, every name inside the text.  A
 * failure must carry a message and an error offset within the text.
 *
 * Then, for the vjp and the jvp of every primal that parses: its derived
 * signature is either refused (EINVAL with a message) or text of exactly
 * the length it reports (asked for with no buffer first, then written
 * into a block of exactly that size) that parses and binds back to the
 * primal with exactly the derived records (every input, then one
 * derivative per differentiable result or input, in order).  DERIV, and
 * the primal itself, are bound too: refused with a message, or records
 * whose every index is in range and names something differentiable where
 * it must, with every differentiable derivative taken and returned once.
 *
 * Batch dimensions: when the input holds a NUL, the text is what precedes
 * it and the bytes after it are shapes.  For a primal that parses, each
 * parameter and result gets a tensor from them (a `...` one a batch part
 * of 0 to 4 extents, 0 to 3 or unknown (-1); a result may be missing;
 * strides compact, NULL or anything): dlb_signature_batch_shape must agree
 * with NumPy's rule computed here independently (inputs broadcast, a `mut`
 * input and a result are all of B), and dlb_signature_batch_pad must give
 * every `...` tensor B's rank with 1 / stride 0 in front and its own dims
 * and strides after, or refuse one longer than B.
 */
#include <stdlib.h>
#include <string.h>

#include "dlbridge/dlbridge.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_name(const dlb_signature *s, const char *p, size_t n) {
  if (p < s->text || n > s->length || p + n > s->text + s->length) abort();
}

static void check_message(const dlb_error *err) {
  if (memchr(err->message, '\0', sizeof err->message) == NULL ||
      err->message[0] == '\0')
    abort();
}

/* Parse and check one signature's records; 1 when it parsed. */
static int parse_checked(const char *text, size_t size, dlb_signature *s);

/* The next shape byte, 0 once they are used up. */
typedef struct {
  const uint8_t *p;
  size_t n;
} cursor;

static unsigned take(cursor *c) {
  if (c->n == 0) return 0;
  c->n--;
  return *c->p++;
}

/* NumPy's broadcast of the batch parts of s's `...` tensors (NULL: not
 * given), written plainly: DLB_BATCH_OK with B in *b, or the reason. */
static int reference_batch(const dlb_signature *s, DLTensor *const *ts,
                           dlb_signature_batch *b) {
  int r = 0;
  for (int i = 0; i < s->nin; i++)
    if (s->params[i].batch && ts[i] != NULL &&
        ts[i]->ndim - s->params[i].ndim > r)
      r = ts[i]->ndim - s->params[i].ndim;
  b->ndim = r;
  for (int a = 0; a < r; a++) {
    /* axis a of B, from the left; axis k = r - 1 - a from the right */
    int64_t known = 1;
    int unknown = 0;
    for (int i = 0; i < s->nin; i++) {
      const dlb_signature_param *p = &s->params[i];
      if (!p->batch || ts[i] == NULL) continue;
      int nb = ts[i]->ndim - p->ndim, at = nb - (r - a);
      int64_t e = at >= 0 ? ts[i]->shape[at] : 1;
      if (e < 0) unknown = 1;
      else if (e != 1 && known != 1 && e != known) return DLB_BATCH_BROADCAST;
      else if (e != 1) known = e;
    }
    b->shape[a] = known == 1 && unknown ? -1 : known;
  }
  for (int i = 0; i < s->nparams; i++) {
    const dlb_signature_param *p = &s->params[i];
    if (!p->batch || ts[i] == NULL || (i < s->nin && !p->mut)) continue;
    int nb = ts[i]->ndim - p->ndim;
    int m = nb > r ? nb : r;
    for (int k = 0; k < m; k++) {
      int64_t e = k < nb ? ts[i]->shape[nb - 1 - k] : 1;
      int64_t f = k < r ? b->shape[r - 1 - k] : 1;
      if (e >= 0 && f >= 0 && e != f) return DLB_BATCH_NOT_FULL;
    }
  }
  return DLB_BATCH_OK;
}

/* Random tensors for s's parameters from c, then the batch shape and the
 * padded headers checked (see the top of the file). */
static void check_batch(const dlb_signature *s, cursor *c) {
  static int64_t shapes[DLB_SIGNATURE_MAX_PARAMS][DLB_MAX_NDIM];
  static int64_t strides[DLB_SIGNATURE_MAX_PARAMS][DLB_MAX_NDIM];
  static int64_t pshape[DLB_MAX_NDIM], pstrides[DLB_MAX_NDIM];
  static char data[1];
  DLTensor t[DLB_SIGNATURE_MAX_PARAMS];
  DLTensor *ts[DLB_SIGNATURE_MAX_PARAMS];
  for (int i = 0; i < s->nparams; i++) {
    const dlb_signature_param *p = &s->params[i];
    unsigned u = take(c);
    int nb = p->batch ? (int)(u % 5) : 0;
    if (nb + p->ndim > DLB_MAX_NDIM) nb = DLB_MAX_NDIM - p->ndim;
    ts[i] = &t[i];
    if (i >= s->nin && (u & 0x80)) ts[i] = NULL; /* not allocated yet */
    memset(&t[i], 0, sizeof t[i]);
    t[i].data = data;
    t[i].byte_offset = u & 0x40 ? 8 : 0;
    t[i].dtype = p->dtype;
    t[i].ndim = nb + p->ndim;
    t[i].shape = shapes[i];
    t[i].strides = u & 0x20 ? NULL : strides[i];
    for (int a = 0; a < t[i].ndim; a++) {
      unsigned v = take(c);
      shapes[i][a] = a < nb ? (v % 5 == 4 ? -1 : (int64_t)(v % 5))
                            : (int64_t)(v % 3);
      strides[i][a] = (int64_t)(v >> 4) - 8;
    }
  }
  dlb_signature_batch b, want;
  dlb_error err;
  int rc = dlb_signature_batch_shape(s->params, s->nin, s->nparams, ts, &b,
                                     &err);
  int reason = reference_batch(s, ts, &want);
  if (reason != DLB_BATCH_OK) {
    if (rc != DLB_EINVAL || b.reason != reason || b.ndim != 0 ||
        b.refused < 0 || b.refused >= s->nparams || ts[b.refused] == NULL ||
        !s->params[b.refused].batch || b.other >= s->nparams ||
        (reason == DLB_BATCH_BROADCAST &&
         (b.other < 0 || b.other >= s->nin || b.axis < 0)))
      abort();
    check_message(&err);
    return;
  }
  if (rc != DLB_OK || b.reason != DLB_BATCH_OK || b.refused != -1 ||
      b.other != -1 || b.axis != -1 || b.ndim != want.ndim ||
      memcmp(b.shape, want.shape, (size_t)b.ndim * sizeof b.shape[0]) != 0)
    abort();
  for (int i = 0; i < s->nparams; i++) {
    const dlb_signature_param *p = &s->params[i];
    if (!p->batch || ts[i] == NULL) continue;
    DLTensor out;
    int pad = b.ndim + p->ndim - t[i].ndim;
    rc = dlb_signature_batch_pad(p, &t[i], &b, pshape, pstrides, &out, &err);
    if (pad < 0 || b.ndim + p->ndim > DLB_MAX_NDIM) {
      /* a result with more (leading 1) batch dims than B, or too many */
      if (rc != DLB_EINVAL) abort();
      check_message(&err);
      continue;
    }
    if (rc != DLB_OK || out.ndim != b.ndim + p->ndim || out.data != data ||
        out.byte_offset != t[i].byte_offset || out.shape != pshape ||
        out.strides != pstrides || out.dtype.code != p->dtype.code)
      abort();
    int64_t step = 1;
    for (int a = t[i].ndim - 1; a >= 0; a--) {
      int64_t st = t[i].strides ? t[i].strides[a] : step;
      if (pshape[pad + a] != t[i].shape[a] || pstrides[pad + a] != st)
        abort();
      step *= t[i].shape[a] > 0 ? t[i].shape[a] : 1;
    }
    for (int a = 0; a < pad; a++)
      if (pshape[a] != 1 || pstrides[a] != 0) abort();
  }
}

/* A binding's records against primal p and derivative d of kind. */
static void check_binding(const dlb_signature *p, const dlb_signature *d,
                          int kind, const dlb_signature_binding *b) {
  const int vjp = kind == DLB_DERIVATIVE_VJP, nres = p->nparams - p->nin;
  uint8_t taken[DLB_SIGNATURE_MAX_PARAMS] = {0}, given[DLB_SIGNATURE_MAX_PARAMS] = {0};
  if (b->nargs != d->nin || b->nresults != d->nparams - d->nin) abort();
  for (int k = 0; k < b->nargs; k++) {
    int i = b->arg[k].index;
    switch (b->arg[k].kind) {
      case DLB_BIND_INPUT:
        if (i < 0 || i >= p->nin) abort();
        break;
      case DLB_BIND_RESULT:
        if (i < 0 || i >= nres) abort();
        break;
      case DLB_BIND_DERIVATIVE: {
        int prim = vjp ? p->nin + i : i;
        if (i < 0 || i >= (vjp ? nres : p->nin) ||
            !dlb_signature_differentiable(p, prim) || taken[prim]++)
          abort();
        break;
      }
      default:
        abort();
    }
  }
  for (int k = 0; k < b->nresults; k++) {
    int i = b->result[k], prim = vjp ? i : p->nin + i;
    if (i < 0 || i >= (vjp ? p->nin : nres) ||
        !dlb_signature_differentiable(p, prim) || given[prim]++)
      abort();
  }
  for (int i = 0; i < p->nparams; i++)
    if (dlb_signature_differentiable(p, i) &&
        ((i < p->nin) == vjp ? !given[i] : !taken[i]))
      abort(); /* a differentiable derivative missing */
}

/* The derived signature of kind: refused, or text that parses and binds
 * back with the derived records. */
static void check_derived(const dlb_signature *p, int kind) {
  static dlb_signature d;
  dlb_error err;
  size_t need = 0, len = 0;
  int rc = dlb_signature_derive(p, kind, NULL, 0, &need, &err);
  if (rc == DLB_EINVAL) {
    check_message(&err);
    return;
  }
  if (rc != DLB_EOVERFLOW) abort();
  char *text = malloc(need + 1);
  if (text == NULL) return;
  if (dlb_signature_derive(p, kind, text, need + 1, &len, &err) != DLB_OK ||
      len != need || strlen(text) != need)
    abort();
  /* exactly sized, no NUL, as the fuzzed text */
  char *exact = malloc(need ? need : 1);
  if (exact == NULL) {
    free(text);
    return;
  }
  memcpy(exact, text, need);
  free(text);
  dlb_signature_binding b;
  if (!parse_checked(exact, need, &d) ||
      dlb_signature_bind(p, &d, kind, &b, &err) != DLB_OK)
    abort();
  check_binding(p, &d, kind, &b);
  /* the derived records: every input in order, then the derivatives */
  const int vjp = kind == DLB_DERIVATIVE_VJP;
  int k = 0;
  for (int i = 0; i < p->nin; i++, k++)
    if (b.arg[k].kind != DLB_BIND_INPUT || b.arg[k].index != i) abort();
  for (int i = vjp ? p->nin : 0; i < (vjp ? p->nparams : p->nin); i++)
    if (dlb_signature_differentiable(p, i)) {
      if (b.arg[k].kind != DLB_BIND_DERIVATIVE ||
          b.arg[k].index != (vjp ? i - p->nin : i))
        abort();
      k++;
    }
  if (k != b.nargs) abort();
  free(exact);
}

static void check_bound(const dlb_signature *p, const dlb_signature *d) {
  for (int kind = DLB_DERIVATIVE_VJP; kind <= DLB_DERIVATIVE_JVP; kind++) {
    dlb_signature_binding b;
    dlb_error err;
    int rc = dlb_signature_bind(p, d, kind, &b, &err);
    if (rc == DLB_OK)
      check_binding(p, d, kind, &b);
    else if (rc == DLB_EINVAL)
      check_message(&err);
    else
      abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static dlb_signature sig, deriv; /* ~130 KB each: not on the stack */
  const uint8_t *nul = memchr(data, '\0', size);
  cursor shapes = {NULL, 0};
  if (nul != NULL) {
    shapes.p = nul + 1;
    shapes.n = size - (size_t)(nul - data) - 1;
    size = (size_t)(nul - data);
  }
  const uint8_t *semi = memchr(data, ';', size);
  size_t n1 = semi ? (size_t)(semi - data) : size;
  char *text = malloc(n1 ? n1 : 1);
  if (text == NULL) return 0;
  memcpy(text, data, n1);
  if (parse_checked(text, n1, &sig)) {
    char label[8];
    for (int i = 0; i < sig.nparams; i++) {
      size_t n = dlb_signature_param_label(&sig, i, label, sizeof label);
      if (n == 0 || strlen(label) != (n < sizeof label ? n : sizeof label - 1))
        abort();
    }
    check_derived(&sig, DLB_DERIVATIVE_VJP);
    check_derived(&sig, DLB_DERIVATIVE_JVP);
    check_bound(&sig, &sig);
    if (nul != NULL) check_batch(&sig, &shapes);
    if (semi != NULL) {
      size_t n2 = size - n1 - 1;
      char *text2 = malloc(n2 ? n2 : 1);
      if (text2 != NULL) {
        memcpy(text2, semi + 1, n2);
        if (parse_checked(text2, n2, &deriv)) check_bound(&sig, &deriv);
        free(text2);
      }
    }
  }
  free(text);
  return 0;
}

static int parse_checked(const char *text, size_t size, dlb_signature *s) {
  dlb_error err;
  int rc = dlb_signature_parse(text, size, s, &err);
  if (rc != DLB_OK) {
    if (rc != DLB_EINVAL || s->message == NULL || s->error_pos > size)
      abort();
    check_message(&err);
    return 0;
  }
  if (s->nin < 0 || s->nin > s->nparams ||
      s->nparams > DLB_SIGNATURE_MAX_PARAMS || s->ndims < 0 ||
      s->ndims > DLB_SIGNATURE_MAX_PARAMS * DLB_MAX_NDIM)
    abort();
  check_name(s, s->name, s->name_len);
  int32_t next = 0;
  for (int i = 0; i < s->nparams; i++) {
    const dlb_signature_param *p = &s->params[i];
    if (p->ndim < 0 || p->ndim > DLB_MAX_NDIM || p->dim0 != next) abort();
    if (dlb_dtype_check(p->dtype, NULL) != DLB_OK) abort();
    if (i >= s->nin && p->mut) abort(); /* results are never 'mut' */
    /* every input is named; a result is named or has no name at all */
    if (i < s->nin || s->param_name[i] != NULL)
      check_name(s, s->param_name[i], s->param_name_len[i]);
    if (i < s->nin ? s->param_name_len[i] == 0
                   : (s->param_name[i] == NULL) != (s->param_name_len[i] == 0))
      abort();
    if (p->mut && p->nodiff) abort();
    for (int a = 0; a < p->ndim; a++) {
      const dlb_signature_dim *d = &s->dims[p->dim0 + a];
      if (d->kind == DLB_SIGNATURE_DIM_LITERAL) {
        if (d->value < 0 || d->sym != -1) abort();
      } else {
        if (d->sym < 0 || d->sym >= s->nsyms) abort();
        check_name(s, s->sym[d->sym], s->sym_len[d->sym]);
        if (d->from_param < 0 || d->from_param > i ||
            d->from_param >= s->nin ||
            d->from_axis < 0 || d->from_axis >= s->params[d->from_param].ndim)
          abort();
        if (d->kind == DLB_SIGNATURE_DIM_BIND &&
            (d->from_param != i || d->from_axis != a || i >= s->nin))
          abort();
      }
    }
    next += p->ndim;
  }
  if (next != s->ndims) abort();
  return 1;
}
