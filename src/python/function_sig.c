/*
 * function_sig.c -- a Function's signature: the parse into the records the
 * call checks against (function.h), the messages of a mismatch with it,
 * and the signature in one spelling with the identity compiled graphs name
 * the Function by.
 *
 * A signature such as
 *     "saxpy(a: float32, x: float32[n], y: mut float32[n]) -> float32[n]"
 * is parsed once, at construction, by the core (dlb_signature_parse; the
 * grammar and the rules for dimension names are in src/core/signature.c
 * and docs/function.md) into a flat array of parameter and dim records.
 * Every check that can be decided from the signature alone is decided
 * then: each dim record says whether it binds a name, checks a literal,
 * or checks against the (parameter, axis) that bound its name -- so a call
 * needs no symbol table, just compares against the shape of the view that
 * bound it (function.h's inline checks).
 */
#include "dlbridge_py.h"
#include "function.h"

#include <stdio.h>
#include <string.h>

/* ValueError: message, the signature, and a caret under the bad character.
 * Control whitespace is shown as spaces and the caret column counts code
 * points, so it lines up for any signature. */
static void raise_parse_error(PyObject *sig, const dlb_signature *p) {
  Py_ssize_t col = 0;
  for (size_t i = 0; i < p->error_pos && i < p->length; i++)
    if (((unsigned char)p->text[i] & 0xC0) != 0x80) col++;
  PyObject *shown = NULL, *pad = NULL, *tmp = NULL;
  shown = Py_NewRef(sig);
  for (const char *ws = "\n\r\t"; *ws; ws++) {
    PyObject *from = PyUnicode_FromOrdinal(*ws);
    PyObject *to = PyUnicode_FromOrdinal(' ');
    tmp = (from && to) ? PyUnicode_Replace(shown, from, to, -1) : NULL;
    Py_XDECREF(from);
    Py_XDECREF(to);
    if (tmp == NULL) goto done;
    Py_SETREF(shown, tmp);
    tmp = NULL;
  }
  pad = PyUnicode_New(col, 127);
  if (pad == NULL) goto done;
  if (col > 0 && PyUnicode_Fill(pad, 0, col, ' ') < 0) goto done;
  PyErr_Format(PyExc_ValueError, "%s\n  %U\n  %U^", p->message, shown, pad);
done:
  Py_XDECREF(shown);
  Py_XDECREF(pad);
}

/* ---- construction ------------------------------------------------------------------ */

static PyObject *names_tuple(const char *const *w, const size_t *len,
                             int n) {
  PyObject *t = PyTuple_New(n);
  if (t == NULL) return NULL;
  for (int i = 0; i < n; i++) {
    PyObject *s = PyUnicode_FromStringAndSize(w[i], (Py_ssize_t)len[i]);
    if (s == NULL) {
      Py_DECREF(t);
      return NULL;
    }
    PyUnicode_InternInPlace(&s);
    PyTuple_SET_ITEM(t, i, s);
  }
  return t;
}

dlb_signature *dlb__fn_parse(PyObject *sig) {
  dlb_error err;
  if (!PyUnicode_Check(sig)) {
    PyErr_Format(PyExc_TypeError, "signature must be a str, not %.100s",
                 Py_TYPE(sig)->tp_name);
    return NULL;
  }
  Py_ssize_t len;
  const char *s = PyUnicode_AsUTF8AndSize(sig, &len);
  if (s == NULL) return NULL;
  /* The parse is large (every possible dim); it lives only as long as its
   * caller needs it. */
  dlb_signature *p = (dlb_signature *)PyMem_Calloc(1, sizeof *p);
  if (p == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  if (dlb_signature_parse(s, (size_t)len, p, &err) != DLB_OK) {
    raise_parse_error(sig, p);
    PyMem_Free(p);
    return NULL;
  }
  return p;
}

/* The labels of p's results (tuple of str). */
static PyObject *result_labels(const dlb_signature *p) {
  PyObject *t = PyTuple_New(p->nparams - p->nin);
  for (int i = p->nin; t != NULL && i < p->nparams; i++) {
    /* a name as written (of any length); out / out<k> otherwise */
    char label[32];
    PyObject *s =
        p->param_name_len[i] > 0
            ? PyUnicode_FromStringAndSize(p->param_name[i],
                                          (Py_ssize_t)p->param_name_len[i])
            : PyUnicode_FromStringAndSize(
                  label, (Py_ssize_t)dlb_signature_param_label(
                             p, i, label, sizeof label));
    if (s == NULL) {
      Py_CLEAR(t);
      break;
    }
    PyUnicode_InternInPlace(&s);
    PyTuple_SET_ITEM(t, i - p->nin, s);
  }
  return t;
}

/* The indices (counted from first) of p's differentiable parameters or
 * results in [first, end), as a tuple of int. */
static PyObject *differentiable(const dlb_signature *p, int first, int end) {
  PyObject *list = PyList_New(0), *t = NULL;
  if (list == NULL) return NULL;
  for (int i = first; i < end; i++) {
    if (!dlb_signature_differentiable(p, i)) continue;
    PyObject *k = PyLong_FromLong(i - first);
    if (k == NULL || PyList_Append(list, k) < 0) {
      Py_XDECREF(k);
      goto cleanup;
    }
    Py_DECREF(k);
  }
  t = PyList_AsTuple(list);
cleanup:
  Py_DECREF(list);
  return t;
}

/* Parse sig into fn (fields params/dims/memos/nin/nout/name/cname/
 * param_names/sym_names/result_names/diff_inputs/diff_results/signature).
 * 0, or -1 with ValueError/TypeError/MemoryError. */
int dlb__fn_compile_signature(fn_object *fn, PyObject *sig) {
  int rc = -1;
  dlb_signature *p = dlb__fn_parse(sig);
  if (p == NULL) goto cleanup;
  size_t bytes = (size_t)p->nparams * sizeof(fn_param) +
                 (size_t)p->ndims * sizeof(fn_dim);
  fn->params = (fn_param *)PyMem_Malloc(bytes ? bytes : 1);
  if (fn->params == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  memcpy(fn->params, p->params, (size_t)p->nparams * sizeof(fn_param));
  fn->dims = (fn_dim *)(fn->params + p->nparams);
  memcpy(fn->dims, p->dims, (size_t)p->ndims * sizeof(fn_dim));
  fn->memos = (dlb_handler_memo *)PyMem_Calloc(p->nin ? (size_t)p->nin : 1,
                                               sizeof *fn->memos);
  if (fn->memos == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  fn->nin = p->nin;
  fn->nout = p->nparams - p->nin;
  fn->nmut = 0;
  for (int32_t i = 0; i < p->nin; i++)
    if (p->params[i].mut) fn->nmut++;
  fn->nbatch = 0;
  for (int32_t i = 0; i < p->nparams; i++)
    if (p->params[i].batch) fn->nbatch++;
  fn->name = PyUnicode_FromStringAndSize(p->name, (Py_ssize_t)p->name_len);
  if (fn->name == NULL) goto cleanup;
  fn->cname = (char *)PyMem_Malloc(p->name_len + 1);
  if (fn->cname == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  memcpy(fn->cname, p->name, p->name_len);
  fn->cname[p->name_len] = '\0';
  fn->param_names = names_tuple(p->param_name, p->param_name_len, p->nin);
  if (fn->param_names == NULL) goto cleanup;
  fn->sym_names = names_tuple(p->sym, p->sym_len, p->nsyms);
  if (fn->sym_names == NULL) goto cleanup;
  fn->result_names = result_labels(p);
  if (fn->result_names == NULL) goto cleanup;
  fn->named_results = 0;
  for (int i = p->nin; i < p->nparams; i++)
    if (p->param_name_len[i] > 0)
      fn->named_results |= UINT64_C(1) << (i - p->nin);
  fn->diff_inputs = differentiable(p, 0, p->nin);
  if (fn->diff_inputs == NULL) goto cleanup;
  fn->diff_results = differentiable(p, p->nin, p->nparams);
  if (fn->diff_results == NULL) goto cleanup;
  fn->signature = Py_NewRef(sig);
  rc = 0;
cleanup:
  PyMem_Free(p);
  return rc;
}

/* ---- the messages of a mismatch ---------------------------------------------------- */

/* Re-raise the pending exception (same type) with the argument named. */
void dlb__fn_prefix_error(const fn_object *fn, int i) {
  dlb__error_prefix_argument(fn->name, pname(fn, i));
}

int dlb__fn_dim_error(const fn_object *fn, int i, int axis, int64_t got,
                     const fn_dim *d, DLTensor *const *argv) {
  /* A batched parameter's core axes follow its batch axes: counted from
   * the end ("dimension -1") they mean the same whatever the batch. */
  const fn_param *p = &fn->params[i];
  int shown = p->batch ? axis - (int)p->ndim : axis;
  if (d->kind == DIM_LITERAL)
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U': dimension %d is %lld but the signature "
                 "says %lld",
                 fn->name, pname(fn, i), shown, (long long)got,
                 (long long)d->value);
  else
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U': dimension %U is %lld here but %lld "
                 "from argument '%U'",
                 fn->name, pname(fn, i), PyTuple_GET_ITEM(fn->sym_names, d->sym),
                 (long long)got,
                 (long long)core_extent(fn, d->from_param, argv[d->from_param],
                                        d->from_axis),
                 pname(fn, d->from_param));
  return -1;
}

/* "(4, 3)" for a batch shape. */
static PyObject *shape_text(const int64_t *shape, int n) {
  PyObject *text = PyUnicode_FromString("(");
  for (int a = 0; a < n && text != NULL; a++) {
    PyObject *joined = PyUnicode_FromFormat(
        "%U%lld%s", text, (long long)shape[a],
        n == 1 ? "," : a + 1 < n ? ", " : "");
    Py_SETREF(text, joined);
  }
  if (text != NULL) {
    PyObject *joined = PyUnicode_FromFormat("%U)", text);
    Py_SETREF(text, joined);
  }
  return text;
}

/* "(4, 3)": the batch part of tensor t of parameter i. */
static PyObject *batch_text(const fn_object *fn, int i, const DLTensor *t) {
  return shape_text(t->shape, t->ndim - fn->params[i].ndim);
}

/* An input's name, or a result's label, for a message. */
static PyObject *param_label(const fn_object *fn, int i) {
  return i < fn->nin ? pname(fn, i)
                     : PyTuple_GET_ITEM(fn->result_names, i - fn->nin);
}

int dlb__fn_batch_error(const fn_object *fn, const dlb_signature_batch *b,
                        DLTensor *const *argv) {
  int i = b->refused, j = b->other;
  const DLTensor *t = argv[i];
  PyObject *mine = NULL, *theirs = NULL;
  const char *kind = i < fn->nin ? "argument" : "result";
  switch (b->reason) {
    case DLB_BATCH_RANK:
      PyErr_Format(PyExc_ValueError,
                   "%U() %s '%U': expected at least %d dimension%s (the core "
                   "dims after '...'), got %d",
                   fn->name, kind, param_label(fn, i), (int)fn->params[i].ndim,
                   fn->params[i].ndim == 1 ? "" : "s", (int)t->ndim);
      break;
    case DLB_BATCH_TOO_MANY:
      PyErr_Format(PyExc_ValueError,
                   "%U() %s '%U': %d batch dimensions, more than %d", fn->name,
                   kind, param_label(fn, i),
                   (int)(t->ndim - fn->params[i].ndim), DLB_MAX_NDIM);
      break;
    case DLB_BATCH_BROADCAST:
      mine = batch_text(fn, i, t);
      theirs = mine ? batch_text(fn, j, argv[j]) : NULL;
      if (theirs != NULL)
        PyErr_Format(PyExc_ValueError,
                     "%U(): batch dimensions of %U %U and %U %U do not "
                     "broadcast",
                     fn->name, param_label(fn, i), mine, param_label(fn, j),
                     theirs);
      break;
    default: {
      /* DLB_BATCH_NOT_FULL: a `mut` input or a result, which the kernel
       * writes whole, against the shape the inputs broadcast to */
      mine = batch_text(fn, i, t);
      theirs = mine && j >= 0 ? batch_text(fn, j, argv[j]) : NULL;
      if (mine == NULL || (j >= 0 && theirs == NULL)) break;
      if (j >= 0)
        PyErr_Format(PyExc_ValueError,
                     "%U(): batch dimensions of %s '%U' %U must be the whole "
                     "broadcast batch shape, but %U %U broadcasts beyond them "
                     "(a %s is written whole: give it the full batch shape)",
                     fn->name, i < fn->nin ? "mut argument" : "result",
                     param_label(fn, i), mine, param_label(fn, j), theirs,
                     i < fn->nin ? "mut argument" : "result");
      else
        PyErr_Format(PyExc_ValueError,
                     "%U(): batch dimensions of %s '%U' %U are more than the "
                     "inputs broadcast to",
                     fn->name, i < fn->nin ? "mut argument" : "result",
                     param_label(fn, i), mine);
      break;
    }
  }
  Py_XDECREF(mine);
  Py_XDECREF(theirs);
  return -1;
}

int dlb__fn_check_error(const fn_object *fn, int i, const DLTensor *t,
                       const fn_param *p, const DLTensor *first, int ifirst) {
  char a[48], b[48];
  if (t->dtype.code != p->dtype.code || t->dtype.bits != p->dtype.bits ||
      t->dtype.lanes != p->dtype.lanes) {
    dlb__dtype_str(p->dtype, a, sizeof a);
    dlb__dtype_str(t->dtype, b, sizeof b);
    PyErr_Format(PyExc_TypeError,
                 "%U() argument '%U': expected dtype %s, got %s", fn->name,
                 pname(fn, i), a, b);
  } else if (p->batch && t->ndim < p->ndim) {
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U': expected at least %d dimension%s (the "
                 "core dims after '...'), got %d",
                 fn->name, pname(fn, i), (int)p->ndim,
                 p->ndim == 1 ? "" : "s", (int)t->ndim);
  } else if (t->ndim != p->ndim && !p->batch) {
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U': expected %d dimension%s, got %d",
                 fn->name, pname(fn, i), (int)p->ndim,
                 p->ndim == 1 ? "" : "s", (int)t->ndim);
  } else {
    dlb__device_str(t->device, a, sizeof a);
    dlb__device_str(first->device, b, sizeof b);
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U' is on %s but argument '%U' is on %s",
                 fn->name, pname(fn, i), a, pname(fn, ifirst), b);
  }
  return -1;
}

PyObject *dlb__fn_nargs_error(const fn_object *fn, Py_ssize_t nargs) {
  PyErr_Format(PyExc_TypeError, "%U() takes %d argument%s (%zd given)",
               fn->name, (int)fn->nin, fn->nin == 1 ? "" : "s", nargs);
  return NULL;
}

int dlb__fn_mut_number_error(const fn_object *fn, int i, PyObject *obj) {
  PyErr_Format(PyExc_TypeError,
               "%U() argument '%U' is 'mut': it needs a writable 0-d tensor, "
               "not a Python %.50s",
               fn->name, pname(fn, i), Py_TYPE(obj)->tp_name);
  return -1;
}

/* ---- the signature in one spelling, and the identity ---------------------------- */

/* One parameter or result as the signature language writes it, always the
 * same way: "x: mut float32[n, 3]", "x: float32[..., n]", "a:
 * float32[...]" (name NULL for results). */
static PyObject *param_text(const fn_object *fn, const fn_param *p,
                            PyObject *name) {
  char dtype[DLB_DESCRIBE_MAX];
  dlb__dtype_str(p->dtype, dtype, sizeof dtype);
  const char *mark = p->mut ? "mut " : p->nodiff ? "nodiff " : "";
  PyObject *text = name ? PyUnicode_FromFormat("%U: %s%s", name, mark, dtype)
                        : PyUnicode_FromFormat("%s%s", mark, dtype);
  if (text == NULL || (p->ndim == 0 && !p->batch)) return text;
  if (p->batch) {
    /* "[...", then the core dims after ", " */
    PyObject *joined = PyUnicode_FromFormat("%U[...", text);
    Py_SETREF(text, joined);
  }
  const fn_dim *d = &fn->dims[p->dim0];
  for (int a = 0; a < p->ndim && text != NULL; a++, d++) {
    const char *sep = a || p->batch ? ", " : "[";
    PyObject *dim =
        d->kind == DIM_LITERAL
            ? PyUnicode_FromFormat("%s%lld", sep, (long long)d->value)
            : PyUnicode_FromFormat("%s%U", sep,
                                   PyTuple_GET_ITEM(fn->sym_names, d->sym));
    PyObject *joined = dim ? PyUnicode_Concat(text, dim) : NULL;
    Py_XDECREF(dim);
    Py_SETREF(text, joined);
  }
  if (text != NULL) {
    PyObject *close = PyUnicode_FromString("]");
    PyObject *joined = close ? PyUnicode_Concat(text, close) : NULL;
    Py_XDECREF(close);
    Py_SETREF(text, joined);
  }
  return text;
}

/* The signature in one spelling, whatever spacing it was written with:
 * "name(x: float32[n], y: mut float32[n]) -> (float32[n])"; a named
 * result keeps its name ("-> (y: float32[n])"): a derivative binds by
 * it. */
PyObject *dlb__fn_normalized_signature(const fn_object *fn) {
  PyObject *result = NULL, *ins = NULL, *outs = NULL, *sep = NULL;
  ins = PyList_New(0);
  outs = PyList_New(0);
  sep = PyUnicode_FromString(", ");
  if (ins == NULL || outs == NULL || sep == NULL) goto cleanup;
  for (int i = 0; i < fn->nin + fn->nout; i++) {
    PyObject *text = param_text(fn, &fn->params[i],
                                i < fn->nin ? pname(fn, i)
                                            : (fn->named_results >>
                                               (i - fn->nin)) & 1
                                                  ? PyTuple_GET_ITEM(
                                                        fn->result_names,
                                                        i - fn->nin)
                                                  : NULL);
    if (text == NULL ||
        PyList_Append(i < fn->nin ? ins : outs, text) < 0) {
      Py_XDECREF(text);
      goto cleanup;
    }
    Py_DECREF(text);
  }
  PyObject *a = PyUnicode_Join(sep, ins);
  PyObject *b = a ? PyUnicode_Join(sep, outs) : NULL;
  if (b != NULL) result = PyUnicode_FromFormat("%U(%U) -> (%U)", fn->name, a, b);
  Py_XDECREF(a);
  Py_XDECREF(b);
cleanup:
  Py_XDECREF(sep);
  Py_XDECREF(outs);
  Py_XDECREF(ins);
  return result;
}

/* "<forward>; vjp <vjp's>; jvp <jvp's>", each part only when declared:
 * two Functions with one forward and other derivatives are two
 * identities. */
PyObject *dlb__fn_identity_text(const fn_object *fn) {
  PyObject *text = dlb__fn_normalized_signature(fn);
  const char *label[2] = {"vjp", "jvp"};
  PyObject *deriv[2] = {fn->vjp, fn->jvp};
  for (int k = 0; k < 2 && text != NULL; k++) {
    if (deriv[k] == NULL) continue;
    PyObject *part =
        dlb__fn_normalized_signature((const fn_object *)deriv[k]);
    PyObject *joined =
        part ? PyUnicode_FromFormat("%U; %s %U", text, label[k], part) : NULL;
    Py_XDECREF(part);
    Py_SETREF(text, joined);
  }
  return text;
}

PyObject *dlb__function_normalized(PyObject *self) {
  return dlb__fn_identity_text((const fn_object *)self);
}

/* The identity's hash: FNV-1a over the normalised signature's UTF-8, all
 * 64 bits (16 hex digits).  The same in every process, version and
 * machine -- never salted (Python's hash() of a str is), never an address
 * -- so a graph exported in one process names the same Function in
 * another.  Until issue 23 the 64 bits were folded to 32, and a birthday
 * search found two signatures under one identity in about a second; the
 * registry now compares whole signatures too (ops/registry.c), so a
 * collision is an error, never one Function serving another's calls. */
static uint64_t identity_hash(const char *utf8, Py_ssize_t len) {
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (Py_ssize_t k = 0; k < len; k++) {
    h ^= (unsigned char)utf8[k];
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

PyObject *dlb__function_identity(PyObject *self) {
  fn_object *fn = (fn_object *)self;
  PyObject *made = DLB_FT_LOAD_PTR(&fn->identity);
  if (made != NULL) return Py_NewRef(made);
  PyObject *text = dlb__fn_identity_text(fn);
  if (text == NULL) return NULL;
  Py_ssize_t len;
  const char *utf8 = PyUnicode_AsUTF8AndSize(text, &len);
  if (utf8 == NULL) {
    Py_DECREF(text);
    return NULL;
  }
  uint64_t h = identity_hash(utf8, len);
  Py_DECREF(text);
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  PyObject *identity = PyUnicode_FromFormat("%U_%s", fn->name, hex);
  if (identity == NULL) return NULL;
  /* Kept by the first thread to make it; another's equal one is just
   * returned (the Function holds the kept one until it dies). */
  if (dlb__ft_set_once(&fn->identity, identity)) Py_INCREF(identity);
  return identity;
}

int dlb__function_force_identity(PyObject *self, PyObject *identity) {
  fn_object *fn = (fn_object *)self;
  if (!PyUnicode_Check(identity)) {
    PyErr_Format(PyExc_TypeError, "an identity is a str, not %.100s",
                 Py_TYPE(identity)->tp_name);
    return -1;
  }
  if (!dlb__ft_set_once(&fn->identity, identity)) {
    PyErr_SetString(PyExc_ValueError,
                    "the Function's identity was already made");
    return -1;
  }
  Py_INCREF(identity);
  return 0;
}
