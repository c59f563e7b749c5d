/* signature_grad.c -- the derivatives of a signature: which parameters and
 * results are differentiable, the vjp and jvp signatures derived from a
 * primal's, and the binding of a derivative signature (derived or spelled
 * by the user) to its primal by name (include/dlbridge/dlbridge.h,
 * "Derivatives of a signature"; docs/function.md, "Gradients").
 *
 * Everything here is resolved through one table of the names a derivative
 * may use for a primal of one kind: the primal's inputs, its results (by
 * label), the derivatives a derivative kernel takes (d<result> for a vjp,
 * t<input> for a jvp) and the ones it returns (d<input>, t<result>).  The
 * derivation writes the names of that table, and refuses when two of the
 * names it needs are one string; the binding looks each of the derivative's
 * names up in it.  So the derived signature always binds back to the
 * primal it came from (tests/c/test_signature.c and the fuzzer check it),
 * and a clash is reported once, in both places, naming both meanings.
 *
 * Derivatives of non-differentiable things (an int64 index, a nodiff
 * statistic) are in the table too, marked dead: they are never derived, a
 * live meaning of the same name wins over them, and a spelled signature
 * that uses one gets "is int64: it has no cotangent" rather than "unknown
 * parameter".
 *
 * Messages: prefixed with the derivative's name ("gather_vjp: ..."), or
 * the primal's when the primal itself is the reason (mut, nothing
 * differentiable).  They are bounded by dlb_error's buffer; a long list of
 * names is cut, its head says what is wrong.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* ---- bounded text ------------------------------------------------------- */

/* Text appended into buf (cap bytes); len counts every byte asked for, so
 * len + 1 > cap afterwards means it did not fit. */
typedef struct {
  char *buf;
  size_t cap, len;
} text_out;

static void put(text_out *o, const char *s, size_t n) {
  if (o->len < o->cap) {
    size_t room = o->cap - o->len;
    memcpy(o->buf + o->len, s, n < room ? n : room);
  }
  o->len += n;
}

static void put_str(text_out *o, const char *s) { put(o, s, strlen(s)); }

/* NUL-terminate (cutting the last byte when full). */
static void finish(text_out *o) {
  if (o->cap > 0) o->buf[o->len < o->cap ? o->len : o->cap - 1] = '\0';
}

/* "float32[n, 3]": the type of parameter or result i as the signature
 * language spells it (no mut, no nodiff), "float32" when 0-d, with its
 * `...` ("float32[..., n]", "float32[...]"): a derivative has its
 * primal's batch dimensions. */
static void put_type(text_out *o, const dlb_signature *s, int i) {
  const dlb_signature_param *prm = &s->params[i];
  char name[DLB_DESCRIBE_MAX];
  /* Every parsed dtype came from dlb_dtype_from_name, so it has a name
   * that reads back; the description is a guard, never a signature. */
  if (dlb_dtype_name(prm->dtype, name, sizeof name, NULL) != DLB_OK)
    dlb_dtype_describe(prm->dtype, name, sizeof name);
  put_str(o, name);
  if (prm->batch) put_str(o, prm->ndim == 0 ? "[...]" : "[..., ");
  if (prm->ndim == 0) return;
  for (int a = 0; a < prm->ndim; a++) {
    const dlb_signature_dim *d = &s->dims[prm->dim0 + a];
    if (a > 0 || !prm->batch) put_str(o, a == 0 ? "[" : ", ");
    if (d->kind == DLB_SIGNATURE_DIM_LITERAL) {
      char num[24];
      int n = snprintf(num, sizeof num, "%lld", (long long)d->value);
      put(o, num, (size_t)n);
    } else {
      put(o, s->sym[d->sym], s->sym_len[d->sym]);
    }
  }
  put_str(o, "]");
}

/* Whether parameter i of a and parameter j of b have one type: dtype, rank,
 * `...` or not, and each dimension spelled alike (a literal of the same value, a name of
 * the same text).  By spelling, not by binding: a derivative signature
 * that spells every type as its primal does means what the primal means,
 * so the kernel gets tensors of the shapes its primal's had. */
static int same_type(const dlb_signature *a, int i, const dlb_signature *b,
                     int j) {
  const dlb_signature_param *p = &a->params[i], *q = &b->params[j];
  if (p->dtype.code != q->dtype.code || p->dtype.bits != q->dtype.bits ||
      p->dtype.lanes != q->dtype.lanes || p->ndim != q->ndim ||
      p->batch != q->batch)
    return 0;
  for (int k = 0; k < p->ndim; k++) {
    const dlb_signature_dim *x = &a->dims[p->dim0 + k],
                            *y = &b->dims[q->dim0 + k];
    int xl = x->kind == DLB_SIGNATURE_DIM_LITERAL,
        yl = y->kind == DLB_SIGNATURE_DIM_LITERAL;
    if (xl != yl) return 0;
    if (xl ? x->value != y->value
           : a->sym_len[x->sym] != b->sym_len[y->sym] ||
                 memcmp(a->sym[x->sym], b->sym[y->sym],
                        a->sym_len[x->sym]) != 0)
      return 0;
  }
  return 1;
}

/* ---- the public queries --------------------------------------------------- */

int dlb_signature_differentiable(const dlb_signature *s, int i) {
  if (s == NULL || i < 0 || i >= s->nparams) return 0;
  const dlb_signature_param *p = &s->params[i];
  if (p->mut || p->nodiff) return 0;
  /* The float8/6/4 formats are storage formats no framework differentiates
   * through; integers, bools and handles have no tangent space. */
  switch (p->dtype.code) {
    case kDLFloat:
    case kDLBfloat:
    case kDLComplex:
    case kDLBcomplex:
      return 1;
    default:
      return 0;
  }
}

size_t dlb_signature_param_label(const dlb_signature *s, int i, char *buf,
                                 size_t cap) {
  char own[16];
  const char *w = "";
  size_t n = 0;
  if (s != NULL && i >= 0 && i < s->nparams) {
    if (s->param_name_len[i] > 0) {
      w = s->param_name[i];
      n = s->param_name_len[i];
    } else if (i >= s->nin) {
      /* "out" alone, else "out<k>" by position among the results: the
       * labels dlbridge has always given results (its dout, dout0...). */
      int k = s->nparams - s->nin == 1
                  ? snprintf(own, sizeof own, "out")
                  : snprintf(own, sizeof own, "out%d", i - s->nin);
      w = own;
      n = (size_t)k;
    }
  }
  if (buf != NULL && cap > 0) {
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(buf, w, k);
    buf[k] = '\0';
  }
  return n;
}

/* ---- the table of names --------------------------------------------------- */

enum { SIDE_PARAM = 0, SIDE_RESULT = 1 };

typedef struct {
  char prefix;          /* 0, or 'd' / 't' before the base */
  const char *base;     /* the primal name or label after it (or own) */
  size_t len;
  char own[16];         /* an unnamed result's label */
  int16_t kind;         /* DLB_BIND_*: what a parameter of this name gets */
  int16_t index;        /* the binding record's index */
  int16_t prim;         /* the primal parameter whose type it has */
  uint8_t side;         /* SIDE_PARAM: a derivative's parameter; _RESULT */
  uint8_t live;         /* 0: the derivative of a non-differentiable one */
} name_entry;

typedef struct {
  int n;
  name_entry e[2 * DLB_SIGNATURE_MAX_PARAMS];
} name_table;

static const char *entry_base(const name_entry *e) {
  return e->base != NULL ? e->base : e->own;
}

static void add(name_table *t, const dlb_signature *s, int prim, char prefix,
                int kind, int index, int side, int live) {
  name_entry *e = &t->e[t->n++];
  e->prefix = prefix;
  if (s->param_name_len[prim] > 0) {
    e->base = s->param_name[prim];
    e->len = s->param_name_len[prim];
  } else {
    e->base = NULL;
    e->len = dlb_signature_param_label(s, prim, e->own, sizeof e->own);
  }
  e->kind = (int16_t)kind;
  e->index = (int16_t)index;
  e->prim = (int16_t)prim;
  e->side = (uint8_t)side;
  e->live = (uint8_t)live;
}

/* Every name a derivative of kind may use for s.  vjp: parameters are the
 * inputs, the results (saved from the forward) and d<result>; results are
 * d<input>.  jvp: parameters are the inputs, the results (the forward runs
 * first) and t<input>; results are t<result>. */
static void build(name_table *t, const dlb_signature *s, int kind) {
  char mark = kind == DLB_DERIVATIVE_VJP ? 'd' : 't';
  t->n = 0;
  for (int i = 0; i < s->nin; i++)
    add(t, s, i, 0, DLB_BIND_INPUT, i, SIDE_PARAM, 1);
  for (int i = s->nin; i < s->nparams; i++)
    add(t, s, i, 0, DLB_BIND_RESULT, i - s->nin, SIDE_PARAM, 1);
  /* what the derivative takes, then what it returns */
  int take0 = kind == DLB_DERIVATIVE_VJP ? s->nin : 0;
  int take1 = kind == DLB_DERIVATIVE_VJP ? s->nparams : s->nin;
  int give0 = kind == DLB_DERIVATIVE_VJP ? 0 : s->nin;
  int give1 = kind == DLB_DERIVATIVE_VJP ? s->nin : s->nparams;
  for (int i = take0; i < take1; i++)
    add(t, s, i, mark, DLB_BIND_DERIVATIVE, i - take0, SIDE_PARAM,
        dlb_signature_differentiable(s, i));
  for (int i = give0; i < give1; i++)
    add(t, s, i, mark, DLB_BIND_DERIVATIVE, i - give0, SIDE_RESULT,
        dlb_signature_differentiable(s, i));
}

static int entry_is(const name_entry *e, const char *w, size_t n) {
  size_t off = e->prefix != 0;
  return n == off + e->len && (off == 0 || w[0] == e->prefix) &&
         memcmp(w + off, entry_base(e), e->len) == 0;
}

/* Byte k of e's full name (prefix, then base). */
static char entry_char(const name_entry *e, size_t k) {
  if (e->prefix != 0) {
    if (k == 0) return e->prefix;
    k--;
  }
  return entry_base(e)[k];
}

static int same_name(const name_entry *e, const name_entry *f) {
  size_t n = e->len + (e->prefix != 0);
  if (n != f->len + (f->prefix != 0)) return 0;
  for (size_t k = 0; k < n; k++)
    if (entry_char(e, k) != entry_char(f, k)) return 0;
  return 1;
}

static void put_entry_name(text_out *o, const name_entry *e) {
  if (e->prefix != 0) put(o, &e->prefix, 1);
  put(o, entry_base(e), e->len);
}

/* "input 'x'", "the cotangent of result 'y'", ... */
static void put_meaning(text_out *o, const dlb_signature *s,
                        const name_entry *e, int kind) {
  int of_input = e->prim < s->nin;
  if (e->kind == DLB_BIND_DERIVATIVE)
    put_str(o, kind == DLB_DERIVATIVE_VJP ? "the cotangent of "
                                          : "the tangent of ");
  put_str(o, of_input ? "input '" : "result '");
  put(o, entry_base(e), e->len);
  put_str(o, "'");
}

/* The entry on side named w: a live one if any (*other: a second live one,
 * an ambiguity, or -1), else a dead one; -1 when none has the name. */
static int lookup(const name_table *t, int side, const char *w, size_t n,
                  int *other) {
  int live = -1, dead = -1;
  *other = -1;
  for (int k = 0; k < t->n; k++) {
    const name_entry *e = &t->e[k];
    if (e->side != side || !entry_is(e, w, n)) continue;
    if (!e->live) {
      if (dead < 0) dead = k;
    } else if (live < 0) {
      live = k;
    } else if (*other < 0) {
      *other = k;
    }
  }
  return live >= 0 ? live : dead;
}

/* ---- messages ------------------------------------------------------------- */

typedef struct {
  char buf[DLB_ERROR_MESSAGE_SIZE];
  text_out o;
} message;

/* Start a message with "<name>: " (the signature's function name). */
static text_out *begin(message *m, const dlb_signature *s) {
  m->o.buf = m->buf;
  m->o.cap = sizeof m->buf;
  m->o.len = 0;
  put(&m->o, s->name, s->name_len);
  put_str(&m->o, ": ");
  return &m->o;
}

static int fail(message *m, dlb_error *err) {
  finish(&m->o);
  return dlb_error_set(err, DLB_EINVAL, "%s", m->buf);
}

/* "x: float32[n]" for parameter i of s, under the name w. */
static void put_typed(text_out *o, const char *w, size_t n,
                      const dlb_signature *s, int i) {
  put(o, w, n);
  put_str(o, ": ");
  put_type(o, s, i);
}

/* The names of the live entries of one kind on one side, ", "-separated. */
static void put_names(text_out *o, const name_table *t, int side,
                      int bind_kind) {
  int first = 1;
  for (int k = 0; k < t->n; k++) {
    const name_entry *e = &t->e[k];
    if (e->side != side || e->kind != bind_kind || !e->live) continue;
    if (!first) put_str(o, ", ");
    put_entry_name(o, e);
    first = 0;
  }
}

/* Why primal parameter i is not differentiable: "nodiff" or its dtype. */
static void put_reason(text_out *o, const dlb_signature *s, int i) {
  if (s->params[i].nodiff) {
    put_str(o, "nodiff");
  } else {
    char name[DLB_DESCRIBE_MAX];
    put_str(o, dlb_dtype_describe(s->params[i].dtype, name, sizeof name));
  }
}

/* What every derivative of kind needs of the primal: no mut parameter (a
 * kernel that overwrites an input leaves the derivative nothing true to
 * read), something differentiable on each side. */
static int check_primal(const dlb_signature *s, int kind, dlb_error *err) {
  message m;
  const char *k = kind == DLB_DERIVATIVE_VJP ? "vjp" : "jvp";
  for (int i = 0; i < s->nin; i++) {
    if (!s->params[i].mut) continue;
    text_out *o = begin(&m, s);
    put_str(o, "a Function with `mut` parameters cannot have a ");
    put_str(o, k);
    put_str(o, kind == DLB_DERIVATIVE_VJP
                   ? ": its inputs are overwritten before the backward runs"
                   : ": its inputs are overwritten by the forward and the "
                     "new values have no tangent");
    put_str(o, " (declare the result instead; '");
    put(o, s->param_name[i], s->param_name_len[i]);
    put_str(o, "' is mut)");
    return fail(&m, err);
  }
  int din = 0, dres = 0;
  for (int i = 0; i < s->nparams; i++)
    if (dlb_signature_differentiable(s, i)) ++*(i < s->nin ? &din : &dres);
  if (din == 0 || dres == 0) {
    text_out *o = begin(&m, s);
    put_str(o, din == 0 ? "no input" : "no result");
    put_str(o, " is differentiable (a float or complex dtype, not nodiff): "
               "a ");
    put_str(o, k);
    put_str(o, (din == 0) == (kind == DLB_DERIVATIVE_VJP)
                   ? " would return nothing"
                   : (kind == DLB_DERIVATIVE_VJP ? " would take no cotangent"
                                                 : " would take no tangent"));
    return fail(&m, err);
  }
  return DLB_OK;
}

/* ---- derive ---------------------------------------------------------------- */

/* Whether the derived signature writes e: every input, every live
 * derivative (the primal's results are not passed). */
static int written(const name_entry *e) {
  return e->live && e->kind != DLB_BIND_RESULT;
}

/* The names the derived signature writes must each mean one thing on
 * their side (a parameter named like a result of the primal would bind
 * ambiguously), and no parameter of it may be named like one of its
 * results (the text would not parse).  A result of the primal named like
 * a derived result is harmless: parameters and results are looked up
 * apart. */
static int check_clashes(const dlb_signature *s, const name_table *t,
                         int kind, dlb_error *err) {
  for (int a = 0; a < t->n; a++) {
    const name_entry *e = &t->e[a];
    if (!written(e)) continue;
    for (int b = 0; b < t->n; b++) {
      const name_entry *f = &t->e[b];
      if (b == a || !f->live || (f->side != e->side && !written(f)) ||
          !same_name(e, f))
        continue;
      message m;
      text_out *mo = begin(&m, s);
      put_str(mo, "the ");
      put_str(mo, kind == DLB_DERIVATIVE_VJP ? "vjp" : "jvp");
      put_str(mo, " cannot bind '");
      put_entry_name(mo, e);
      put_str(mo, "' by name: it is both ");
      put_meaning(mo, s, e, kind);
      put_str(mo, " and ");
      put_meaning(mo, s, f, kind);
      put_str(mo, " (rename one)");
      return fail(&m, err);
    }
  }
  return DLB_OK;
}

int dlb_signature_derive(const dlb_signature *primal, int kind, char *buf,
                         size_t cap, size_t *len, dlb_error *err) {
  int rc = DLB_OK;
  name_table *t = NULL;
  if (len != NULL) *len = 0;
  if (primal == NULL || (buf == NULL && cap > 0) ||
      (kind != DLB_DERIVATIVE_VJP && kind != DLB_DERIVATIVE_JVP)) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "dlb_signature_derive: primal is NULL, buf is NULL "
                       "with a capacity, or kind is not a DLB_DERIVATIVE_*");
    goto cleanup;
  }
  rc = check_primal(primal, kind, err);
  if (rc != DLB_OK) goto cleanup;
  /* ~6 KB: off the stack of whatever thread derives */
  t = (name_table *)dlb__alloc(sizeof *t);
  if (t == NULL) {
    rc = dlb_error_set(err, DLB_ENOMEM,
                       "dlb_signature_derive: out of memory");
    goto cleanup;
  }
  build(t, primal, kind);
  rc = check_clashes(primal, t, kind, err);
  if (rc != DLB_OK) goto cleanup;
  /* The derived signature is a signature: at most 64 parameters and
   * results, which every input plus the derivatives may exceed. */
  int count = primal->nin;
  for (int k = 0; k < t->n; k++)
    count += t->e[k].live && t->e[k].kind == DLB_BIND_DERIVATIVE;
  if (count > DLB_SIGNATURE_MAX_PARAMS) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "%.*s: its derived %s would have %d parameters and "
                       "results, more than %d (spell one that takes fewer "
                       "inputs)",
                       (int)(primal->name_len < 64 ? primal->name_len : 64),
                       primal->name,
                       kind == DLB_DERIVATIVE_VJP ? "vjp" : "jvp", count,
                       DLB_SIGNATURE_MAX_PARAMS);
    goto cleanup;
  }
  text_out o = {buf, cap, 0};
  put(&o, primal->name, primal->name_len);
  put_str(&o, kind == DLB_DERIVATIVE_VJP ? "_vjp(" : "_jvp(");
  int nput = 0;
  for (int side = SIDE_PARAM; side <= SIDE_RESULT; side++) {
    for (int k = 0; k < t->n; k++) {
      const name_entry *e = &t->e[k];
      if (e->side != side || !written(e)) continue;
      if (nput++ > 0) put_str(&o, ", ");
      put_entry_name(&o, e);
      put_str(&o, ": ");
      put_type(&o, primal, e->prim);
    }
    if (side == SIDE_PARAM) put_str(&o, ") -> (");
    nput = 0;
  }
  put_str(&o, ")");
  finish(&o);
  if (len != NULL) *len = o.len;
  if (o.len + 1 > cap)
    rc = dlb_error_set(err, DLB_EOVERFLOW,
                       "dlb_signature_derive: the derived signature needs "
                       "%zu bytes, the buffer has %zu",
                       o.len + 1, cap);
cleanup:
  dlb__free(t);
  return rc;
}

/* ---- bind ------------------------------------------------------------------ */

/* Refuse parameter or result j of d (named w), bound to entry e, whose
 * type is not its primal's. */
static int type_mismatch(const dlb_signature *p, const dlb_signature *d,
                         int j, const name_entry *e, dlb_error *err) {
  message m;
  text_out *o = begin(&m, d);
  put_typed(o, d->param_name[j], d->param_name_len[j], d, j);
  put_str(o, " does not match the primal ");
  put_typed(o, entry_base(e), e->len, p, e->prim);
  put_str(o, " (same dtype and dims)");
  return fail(&m, err);
}

/* "input 'idx' is int64: it has no cotangent" */
static int not_differentiable(const dlb_signature *p, const dlb_signature *d,
                              const name_entry *e, int kind,
                              dlb_error *err) {
  message m;
  text_out *o = begin(&m, d);
  put_str(o, e->prim < p->nin ? "input '" : "result '");
  put(o, entry_base(e), e->len);
  put_str(o, "' is ");
  put_reason(o, p, e->prim);
  put_str(o, kind == DLB_DERIVATIVE_VJP ? ": it has no cotangent"
                                        : ": it has no tangent");
  return fail(&m, err);
}

static int ambiguous(const dlb_signature *p, const dlb_signature *d,
                     const char *w, size_t n, const name_entry *e,
                     const name_entry *f, int kind, dlb_error *err) {
  message m;
  text_out *o = begin(&m, d);
  put_str(o, "cannot bind '");
  put(o, w, n);
  put_str(o, "' by name: it is both ");
  put_meaning(o, p, e, kind);
  put_str(o, " and ");
  put_meaning(o, p, f, kind);
  put_str(o, " of ");
  put(o, p->name, p->name_len);
  put_str(o, " (rename one)");
  return fail(&m, err);
}

/* Derivative parameter or result j, found by name as entry k of t (other:
 * a second entry of that name, or -1): refused when the name is ambiguous,
 * names something not differentiable, or its type is not the primal's;
 * else marked seen.  bind_params's and bind_results's common checks. */
static int bind_entry(const dlb_signature *p, const dlb_signature *d,
                      int kind, const name_table *t, int j, int k, int other,
                      uint8_t *seen, dlb_error *err) {
  const name_entry *e = &t->e[k];
  if (other >= 0)
    return ambiguous(p, d, d->param_name[j], d->param_name_len[j], e,
                     &t->e[other], kind, err);
  if (!e->live) return not_differentiable(p, d, e, kind, err);
  if (!same_type(d, j, p, e->prim)) return type_mismatch(p, d, j, e, err);
  seen[k] = 1;
  return DLB_OK;
}

/* The derivative's parameters: each a primal input, result or derivative
 * (by name, of its type, not mut); then every live derivative taken. */
static int bind_params(const dlb_signature *p, const dlb_signature *d,
                       int kind, const name_table *t, uint8_t *seen,
                       dlb_signature_binding *out, dlb_error *err) {
  const char *what = kind == DLB_DERIVATIVE_VJP ? "cotangent" : "tangent";
  message m;
  for (int j = 0; j < d->nin; j++) {
    const char *w = d->param_name[j];
    size_t n = d->param_name_len[j];
    if (d->params[j].mut) {
      text_out *o = begin(&m, d);
      put_str(o, "parameter '");
      put(o, w, n);
      put_str(o, kind == DLB_DERIVATIVE_VJP
                     ? "' is mut; a vjp must be functional"
                     : "' is mut; a jvp must be functional");
      return fail(&m, err);
    }
    int other, k = lookup(t, SIDE_PARAM, w, n, &other);
    if (k < 0) {
      text_out *o = begin(&m, d);
      put_str(o, "parameter '");
      put(o, w, n);
      put_str(o, "' is neither an input (");
      put_names(o, t, SIDE_PARAM, DLB_BIND_INPUT);
      put_str(o, "), a result (");
      put_names(o, t, SIDE_PARAM, DLB_BIND_RESULT);
      put_str(o, kind == DLB_DERIVATIVE_VJP
                     ? ") nor the cotangent of one ("
                     : ") nor the tangent of an input (");
      put_names(o, t, SIDE_PARAM, DLB_BIND_DERIVATIVE);
      put_str(o, ")");
      return fail(&m, err);
    }
    int rc = bind_entry(p, d, kind, t, j, k, other, seen, err);
    if (rc != DLB_OK) return rc;
    const name_entry *e = &t->e[k];
    out->arg[j].kind = e->kind;
    out->arg[j].index = e->index;
  }
  int missing = 0;
  text_out *o = begin(&m, d);
  put_str(o, "takes no ");
  put_str(o, what);
  put_str(o, " for ");
  for (int k = 0; k < t->n; k++) {
    const name_entry *e = &t->e[k];
    if (e->side != SIDE_PARAM || e->kind != DLB_BIND_DERIVATIVE ||
        !e->live || seen[k])
      continue;
    if (missing++ == 0)
      put_str(o, e->prim < p->nin ? "input '" : "result '");
    else
      put_str(o, ", '");
    put(o, entry_base(e), e->len);
    put_str(o, "' (");
    put_entry_name(o, e);
    put_str(o, ")");
  }
  return missing > 0 ? fail(&m, err) : DLB_OK;
}

/* The derivative's results: each named d<input> (t<result>) of a live one,
 * of its type; every live one returned. */
static int bind_results(const dlb_signature *p, const dlb_signature *d,
                        int kind, const name_table *t, uint8_t *seen,
                        dlb_signature_binding *out, dlb_error *err) {
  const int vjp = kind == DLB_DERIVATIVE_VJP;
  message m;
  for (int j = d->nin; j < d->nparams; j++) {
    const char *w = d->param_name[j];
    size_t n = d->param_name_len[j];
    int other, k = n > 0 ? lookup(t, SIDE_RESULT, w, n, &other) : -1;
    if (k < 0) {
      text_out *o = begin(&m, d);
      if (n == 0) {
        char num[16];
        snprintf(num, sizeof num, "%d", j - d->nin);
        put_str(o, "result ");
        put_str(o, num);
        put_str(o, " has no name: a derivative binds its results by name (");
      } else {
        put_str(o, "result '");
        put(o, w, n);
        put_str(o, vjp ? "' is not the cotangent of an input ("
                       : "' is not the tangent of a result (");
      }
      put_names(o, t, SIDE_RESULT, DLB_BIND_DERIVATIVE);
      put_str(o, ")");
      return fail(&m, err);
    }
    /* two results of one name cannot parse: other is always -1 there */
    int rc = bind_entry(p, d, kind, t, j, k, other, seen, err);
    if (rc != DLB_OK) return rc;
    out->result[j - d->nin] = t->e[k].index;
  }
  int missing = 0;
  text_out *o = begin(&m, d);
  put_str(o, vjp ? "no cotangent for differentiable input(s) "
                 : "no tangent for differentiable result(s) ");
  for (int k = 0; k < t->n; k++) {
    const name_entry *e = &t->e[k];
    if (e->side != SIDE_RESULT || !e->live || seen[k]) continue;
    if (missing++ > 0) put_str(o, ", ");
    put(o, entry_base(e), e->len);
  }
  put_str(o, " (mark them nodiff)");
  return missing > 0 ? fail(&m, err) : DLB_OK;
}

int dlb_signature_bind(const dlb_signature *primal,
                       const dlb_signature *deriv, int kind,
                       dlb_signature_binding *out, dlb_error *err) {
  int rc = DLB_OK;
  struct {
    name_table t;
    uint8_t seen[2 * DLB_SIGNATURE_MAX_PARAMS];
  } *w = NULL;
  if (primal == NULL || deriv == NULL || out == NULL ||
      (kind != DLB_DERIVATIVE_VJP && kind != DLB_DERIVATIVE_JVP)) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "dlb_signature_bind: primal, deriv or out is NULL, "
                       "or kind is not a DLB_DERIVATIVE_*");
    goto cleanup;
  }
  memset(out, 0, sizeof *out);
  rc = check_primal(primal, kind, err);
  if (rc != DLB_OK) goto cleanup;
  w = dlb__alloc(sizeof *w);
  if (w == NULL) {
    rc = dlb_error_set(err, DLB_ENOMEM, "dlb_signature_bind: out of memory");
    goto cleanup;
  }
  memset(w->seen, 0, sizeof w->seen);
  build(&w->t, primal, kind);
  out->nargs = deriv->nin;
  out->nresults = deriv->nparams - deriv->nin;
  rc = bind_params(primal, deriv, kind, &w->t, w->seen, out, err);
  if (rc == DLB_OK)
    rc = bind_results(primal, deriv, kind, &w->t, w->seen, out, err);
cleanup:
  if (rc != DLB_OK && out != NULL) memset(out, 0, sizeof *out);
  dlb__free(w);
  return rc;
}
