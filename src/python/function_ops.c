/*
 * function_ops.c -- what graph compilers ask of a Function (src/ops,
 * python/dlbridge/_ops_*.py): its records and name, its kernel run on
 * tensors a compiler allocated (no Python, no GIL), and the shape function
 * of every compiled route (Function._result_specs), which checks a traced
 * call with the eager call's rules and messages.
 */
#include "dlbridge_py.h"
#include "function.h"

#include <stdio.h>
#include <string.h>

/* ---- what compilers ask of a Function (src/ops, python/dlbridge/_ops_*.py) -------- */

int dlb__function_check(PyObject *obj) {
  dlb_module_state *st = dlb__state_from_type(Py_TYPE(obj));
  return st != NULL && PyObject_TypeCheck(obj, st->FunctionType);
}

const dlb_signature_param *dlb__function_params(PyObject *self, int32_t *nin,
                                                int32_t *nout) {
  const fn_object *fn = (const fn_object *)self;
  *nin = fn->nin;
  *nout = fn->nout;
  return fn->params;
}

const char *dlb__function_name(PyObject *self) {
  return ((const fn_object *)self)->cname;
}

/* The kernels, and the derivatives' (an identity covers the derivatives'
 * signatures, not their kernels: addresses differ between processes). */
int dlb__function_same_kernel(PyObject *a, PyObject *b) {
  const fn_object *x = (const fn_object *)a, *y = (const fn_object *)b;
  if (x->kernel != y->kernel) return 0;
  PyObject *dx[2] = {x->vjp, x->jvp}, *dy[2] = {y->vjp, y->jvp};
  for (int k = 0; k < 2; k++) {
    if ((dx[k] == NULL) != (dy[k] == NULL)) return 0;
    if (dx[k] != NULL && !dlb__function_same_kernel(dx[k], dy[k])) return 0;
  }
  return 1;
}

/* The kernel on argv as it is (checked already): DLB_OK, or its status
 * with a message that names the Function. */
static int call_kernel(const fn_object *fn, DLTensor *const *argv,
                       int32_t nargs, void *stream, dlb_error *err) {
  err->code = DLB_OK;
  err->message[0] = '\0';
  int rc = fn->kernel(argv, nargs, stream, err);
  if (rc > 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "%s: the kernel returned %d; a kernel returns 0 or a "
                         "negative dlb_status",
                         fn->cname, rc);
  if (rc < 0) {
    /* The kernel's own message, named: "<name>: <message>". */
    char message[DLB_ERROR_MESSAGE_SIZE];
    err->message[DLB_ERROR_MESSAGE_SIZE - 1] = '\0';
    memcpy(message, err->message, sizeof message);
    if (message[0] != '\0')
      return dlb_error_set(err, rc, "%s: %s", fn->cname, message);
    return dlb_error_set(err, rc, "%s: the kernel failed with %s", fn->cname,
                         dlb_status_name(rc));
  }
  return DLB_OK;
}

/* "argument 2" / "result 0": tensor i of a call, for messages made without
 * Python (the names are str objects). */
static void tensor_what(const fn_object *fn, int i, char *out, size_t size) {
  snprintf(out, size, "%s %d", i < fn->nin ? "argument" : "result",
           i < fn->nin ? i : i - fn->nin);
}

/* t's batch part (its leading ndim - p->ndim extents) as "[2, 1, 3]". */
static void batch_str(const fn_param *p, const DLTensor *t, char *out,
                      size_t size) {
  size_t n = 0;
  int nb = t->ndim - p->ndim;
  out[0] = '\0';
  for (int a = 0; a < nb && n + 1 < size; a++) {
    int w = snprintf(out + n, size - n, "%s%lld", a ? ", " : "[",
                     (long long)t->shape[a]);
    if (w < 0) break;
    n += (size_t)w;
  }
  if (n + 1 < size) snprintf(out + n, size - n, "%s", nb > 0 ? "]" : "[]");
}

/* The refusal of dlb_signature_batch_shape (b) as a message by the
 * Function's name and the tensors' positions, both batch parts shown (the
 * eager call's dlb__fn_batch_error, without Python). */
static int batch_refusal(const fn_object *fn, const dlb_signature_batch *b,
                         DLTensor *const *argv, dlb_error *err) {
  char what[32], other[32], mine[96], theirs[96];
  int i = b->refused, j = b->other;
  if (i < 0) return DLB_EINVAL; /* err says why: a call it cannot read */
  tensor_what(fn, i, what, sizeof what);
  batch_str(&fn->params[i], argv[i], mine, sizeof mine);
  if (j >= 0) {
    tensor_what(fn, j, other, sizeof other);
    batch_str(&fn->params[j], argv[j], theirs, sizeof theirs);
  }
  switch (b->reason) {
    case DLB_BATCH_BROADCAST:
      return dlb_error_set(err, DLB_EINVAL,
                           "%s(): batch dimensions of %s %s and %s %s do not "
                           "broadcast",
                           fn->cname, what, mine, other, theirs);
    case DLB_BATCH_NOT_FULL:
      if (j >= 0)
        return dlb_error_set(
            err, DLB_EINVAL,
            "%s(): batch dimensions of %s%s %s must be the whole broadcast "
            "batch shape, but %s %s broadcasts beyond them (it is written "
            "whole)",
            fn->cname, i < fn->nin ? "mut " : "", what, mine, other, theirs);
      return dlb_error_set(err, DLB_EINVAL,
                           "%s(): batch dimensions of %s%s %s are more than "
                           "the inputs broadcast to",
                           fn->cname, i < fn->nin ? "mut " : "", what, mine);
    default:
      return dlb_error_set(err, DLB_EINVAL,
                           "%s(): %s has %d dimensions, which do not fit its "
                           "'...' and %d core dimensions",
                           fn->cname, what, (int)argv[i]->ndim,
                           (int)fn->params[i].ndim);
  }
}

/* A run's padded headers: on the stack for a call of up to RUN_INLINE
 * tensors of up to RUN_INLINE_DIMS padded dims in all, else one block of
 * the core's allocator (no Python: this runs without the GIL). */
#define RUN_INLINE 8
#define RUN_INLINE_DIMS 64

/* Whether tensor t of `...` parameter p must be padded for the kernel to
 * see it with B's batch rank (b): fewer batch dims than B, or no strides.
 * The one rule of run_batched and dlb__function_runs_as_is. */
static int needs_padding(const fn_param *p, const DLTensor *t,
                         const dlb_signature_batch *b) {
  return t->ndim != b->ndim + p->ndim || t->strides == NULL;
}

/* The kernel on argv with batch dims (fn->nbatch > 0, argv checked against
 * the core dims): B from the inputs, every result (and `mut` input) the
 * whole of it, every `...` tensor left-padded to B's rank with strides
 * written (dlb_signature_batch_pad), then the kernel. */
static int run_batched(const fn_object *fn, DLTensor *const *argv,
                       int32_t nargs, void *stream, dlb_error *err) {
  dlb_signature_batch b;
  DLTensor ts_inline[RUN_INLINE];
  DLTensor *av_inline[RUN_INLINE];
  int64_t dims_inline[2 * RUN_INLINE_DIMS];
  DLTensor *ts = ts_inline, **av = av_inline;
  int64_t *dims = dims_inline;
  void *block = NULL;
  const dlb_allocator *allocator = NULL;
  int rc = dlb_signature_batch_shape(fn->params, fn->nin, nargs, argv, &b,
                                     err);
  if (rc != DLB_OK) {
    rc = batch_refusal(fn, &b, argv, err);
    goto cleanup;
  }
  /* what padding takes: the tensors that need it (fewer batch dims than
   * B, or no strides) and their padded ranks */
  int32_t npad = 0;
  size_t ndims = 0;
  for (int32_t i = 0; i < nargs; i++) {
    const fn_param *p = &fn->params[i];
    if (!p->batch || !needs_padding(p, argv[i], &b)) continue;
    if (b.ndim + p->ndim > DLB_MAX_NDIM) {
      char what[32];
      tensor_what(fn, i, what, sizeof what);
      rc = dlb_error_set(err, DLB_EINVAL,
                         "%s(): %s: %d batch and %d core dimensions; at most "
                         "%d are supported",
                         fn->cname, what, (int)b.ndim, (int)p->ndim,
                         DLB_MAX_NDIM);
      goto cleanup;
    }
    npad++;
    ndims += (size_t)(b.ndim + p->ndim);
  }
  if (npad == 0) {
    rc = call_kernel(fn, argv, nargs, stream, err);
    goto cleanup;
  }
  if (nargs > RUN_INLINE || ndims > RUN_INLINE_DIMS) {
    allocator = dlb_get_allocator();
    block = allocator->alloc((size_t)nargs * (sizeof *ts + sizeof *av) +
                                 2 * ndims * sizeof *dims,
                             allocator->ctx);
    if (block == NULL) {
      rc = dlb_error_set(err, DLB_ENOMEM,
                         "%s(): out of memory for the batch dimensions of a "
                         "call of %d tensors",
                         fn->cname, (int)nargs);
      goto cleanup;
    }
    ts = block;
    av = (DLTensor **)(ts + nargs);
    dims = (int64_t *)(av + nargs);
  }
  int64_t *next = dims;
  for (int32_t i = 0; i < nargs; i++) {
    const fn_param *p = &fn->params[i];
    av[i] = argv[i];
    if (!p->batch || !needs_padding(p, argv[i], &b)) continue;
    int32_t n = b.ndim + p->ndim;
    rc = dlb_signature_batch_pad(p, argv[i], &b, next, next + n, &ts[i], err);
    if (rc != DLB_OK) goto cleanup; /* checked above: cannot happen */
    av[i] = &ts[i];
    next += 2 * n;
  }
  rc = call_kernel(fn, av, nargs, stream, err);
cleanup:
  if (block != NULL) allocator->release(block, allocator->ctx);
  return rc;
}

int dlb__function_check_run(PyObject *self, DLTensor *const *argv,
                            int32_t nargs, dlb_error *err) {
  const fn_object *fn = (const fn_object *)self;
  if (nargs != fn->nin + fn->nout)
    return dlb_error_set(err, DLB_EINVAL,
                         "%s(): called with %d tensors; the signature has %d "
                         "parameters and %d results",
                         fn->cname, (int)nargs, (int)fn->nin, (int)fn->nout);
  for (int32_t i = 0; i < nargs; i++) {
    const fn_param *p = &fn->params[i];
    const DLTensor *t = argv[i];
    int axis = -1;
    if (!type_matches(p, t) || (axis = dim_mismatch(fn, p, t, argv)) >= 0) {
      char want[DLB_DESCRIBE_MAX], got[DLB_DESCRIBE_MAX];
      dlb__dtype_str(p->dtype, want, sizeof want);
      dlb__dtype_str(t->dtype, got, sizeof got);
      return dlb_error_set(
          err, DLB_EINVAL,
          "%s(): %s %d is a %s tensor of %d dimensions%s; the signature "
          "says %s with %d%s",
          fn->cname, i < fn->nin ? "argument" : "result",
          (int)(i < fn->nin ? i : i - fn->nin), got, (int)t->ndim,
          axis >= 0 ? " with another extent" : "", want, (int)p->ndim,
          p->batch ? " core dimensions after '...'" : "");
    }
  }
  return DLB_OK;
}

int dlb__function_runs_as_is(PyObject *self, DLTensor *const *argv,
                             int32_t nargs) {
  const fn_object *fn = (const fn_object *)self;
  if (fn->nbatch == 0) return 1;
  dlb_signature_batch b;
  dlb_error err;
  if (dlb_signature_batch_shape(fn->params, fn->nin, nargs, argv, &b, &err) !=
      DLB_OK)
    return 0;
  for (int32_t i = 0; i < nargs; i++)
    if (fn->params[i].batch && needs_padding(&fn->params[i], argv[i], &b))
      return 0;
  return 1;
}

int dlb__function_run_as_is(PyObject *self, DLTensor *const *argv,
                            int32_t nargs, void *stream, dlb_error *err) {
  return call_kernel((const fn_object *)self, argv, nargs, stream, err);
}

int dlb__function_run_checked(PyObject *self, DLTensor *const *argv,
                              int32_t nargs, void *stream, dlb_error *err) {
  const fn_object *fn = (const fn_object *)self;
  if (fn->nbatch > 0) return run_batched(fn, argv, nargs, stream, err);
  return call_kernel(fn, argv, nargs, stream, err);
}

int dlb__function_run(PyObject *self, DLTensor *const *argv, int32_t nargs,
                      void *stream, dlb_error *err) {
  int rc = dlb__function_check_run(self, argv, nargs, err);
  if (rc != DLB_OK) return rc;
  return dlb__function_run_checked(self, argv, nargs, stream, err);
}

int dlb__function_run_looped(PyObject *self, DLTensor *const *argv,
                             int32_t nargs, int32_t nloop, void *stream,
                             dlb_error *err) {
  const fn_object *fn = (const fn_object *)self;
  DLTensor ts_inline[RUN_INLINE];
  DLTensor *av_inline[RUN_INLINE];
  int64_t strides_inline[RUN_INLINE_DIMS];
  const int64_t *whole_inline[RUN_INLINE];
  DLTensor *ts = ts_inline, **av = av_inline;
  const int64_t **whole = whole_inline;
  int64_t *strides = strides_inline;
  void *block = NULL;
  const dlb_allocator *allocator = NULL;
  int64_t loop[DLB_MAX_NDIM], index[DLB_MAX_NDIM];
  int64_t count = 1;
  int rc = DLB_OK;
  if (nloop == 0) return dlb__function_run(self, argv, nargs, stream, err);
  if (nargs != fn->nin + fn->nout)
    return dlb__function_run(self, argv, nargs, stream, err); /* refuses */
  if (nloop < 0 || nloop > DLB_MAX_NDIM)
    return dlb_error_set(err, DLB_EINVAL,
                         "%s(): a loop over %d leading dimensions; 0 to %d "
                         "are possible",
                         fn->cname, (int)nloop, DLB_MAX_NDIM);
  /* Which tensors carry the loop dims: results and `...` tensors always; a
   * tensor of a parameter without `...` when it has nloop more dims than
   * its core (else it is the same for every item: a number, an operand
   * the loop does not batch).  They agree on the loop extents. */
  int first = -1;
  size_t nstrides = 0;
  for (int32_t i = 0; i < nargs; i++) {
    const fn_param *p = &fn->params[i];
    const DLTensor *t = argv[i];
    char what[32];
    if (!p->batch && i < fn->nin && t->ndim == p->ndim) continue;
    if (p->batch ? t->ndim < nloop + p->ndim : t->ndim != nloop + p->ndim) {
      tensor_what(fn, i, what, sizeof what);
      rc = dlb_error_set(err, DLB_EINVAL,
                         "%s(): %s has %d dimension%s; in a loop over %d "
                         "leading dimensions it needs %s%d (the loop's, then "
                         "its parameter's %d)",
                         fn->cname, what, (int)t->ndim,
                         t->ndim == 1 ? "" : "s", (int)nloop,
                         p->batch ? "at least " : "", (int)(nloop + p->ndim),
                         (int)p->ndim);
      goto cleanup;
    }
    if (first < 0) {
      first = i;
      for (int32_t k = 0; k < nloop; k++) {
        loop[k] = t->shape[k];
        count *= loop[k] > 0 ? loop[k] : 0;
      }
    } else if (memcmp(loop, t->shape, (size_t)nloop * sizeof *loop) != 0) {
      char other[32];
      tensor_what(fn, i, what, sizeof what);
      tensor_what(fn, first, other, sizeof other);
      rc = dlb_error_set(err, DLB_EINVAL,
                         "%s(): the %d loop dimensions of %s are not those "
                         "of %s",
                         fn->cname, (int)nloop, what, other);
      goto cleanup;
    }
    if (t->strides == NULL) nstrides += (size_t)t->ndim;
  }
  if (first < 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "%s(): a loop over %d leading dimensions, but no "
                         "tensor of the call has them",
                         fn->cname, (int)nloop);
  if (nargs > RUN_INLINE || nstrides > RUN_INLINE_DIMS) {
    allocator = dlb_get_allocator();
    block = allocator->alloc((size_t)nargs * (sizeof *ts + sizeof *av +
                                              sizeof *whole) +
                                 (nstrides + 1) * sizeof *strides,
                             allocator->ctx);
    if (block == NULL) {
      rc = dlb_error_set(err, DLB_ENOMEM,
                         "%s(): out of memory for a loop over a call of %d "
                         "tensors",
                         fn->cname, (int)nargs);
      goto cleanup;
    }
    ts = block;
    av = (DLTensor **)(ts + nargs);
    whole = (const int64_t **)(av + nargs);
    strides = (int64_t *)(whole + nargs);
  }
  /* Each looped tensor's item view: its dims after the loop's, the whole
   * tensor's strides after the loop's (compact ones written out when it
   * has none); av[i] is argv[i] itself for one the loop does not batch. */
  int64_t *next = strides;
  for (int32_t i = 0; i < nargs; i++) {
    const DLTensor *t = argv[i];
    const fn_param *p = &fn->params[i];
    av[i] = argv[i];
    whole[i] = NULL;
    if (!p->batch && i < fn->nin && t->ndim == p->ndim) continue;
    whole[i] = t->strides;
    if (t->strides == NULL) {
      int64_t step = 1;
      for (int32_t a = t->ndim - 1; a >= 0; a--) {
        next[a] = step;
        step *= t->shape[a] > 0 ? t->shape[a] : 1;
      }
      whole[i] = next;
      next += t->ndim;
    }
    ts[i] = *t;
    ts[i].ndim = t->ndim - nloop;
    ts[i].shape = t->shape + nloop;
    ts[i].strides = (int64_t *)whole[i] + nloop;
    av[i] = &ts[i];
  }
  for (int32_t k = 0; k < nloop; k++) index[k] = 0;
  for (int64_t item = 0; item < count; item++) {
    /* item index[] of every looped tensor: its byte offset moved on by
     * the loop dims' strides (the data pointer, should a negative stride
     * take the offset below 0) */
    for (int32_t i = 0; i < nargs; i++) {
      if (whole[i] == NULL) continue;
      const DLTensor *t = argv[i];
      int64_t elems = 0;
      for (int32_t k = 0; k < nloop; k++) elems += index[k] * whole[i][k];
      int64_t at = (int64_t)t->byte_offset +
                   elems * (int64_t)(((size_t)t->dtype.bits * t->dtype.lanes +
                                      7) / 8);
      if (at >= 0) {
        ts[i].data = t->data;
        ts[i].byte_offset = (uint64_t)at;
      } else {
        ts[i].data = (char *)t->data + at;
        ts[i].byte_offset = 0;
      }
    }
    rc = dlb__function_run(self, av, nargs, stream, err);
    if (rc != DLB_OK) goto cleanup;
    for (int32_t k = nloop - 1; k >= 0; k--) {
      if (++index[k] < loop[k]) break;
      index[k] = 0;
    }
  }
cleanup:
  if (block != NULL) allocator->release(block, allocator->ctx);
  return rc;
}

int dlb__function_result_shape(PyObject *self, DLTensor *const *argv,
                               int32_t o, int64_t *shape, int32_t *ndim,
                               dlb_error *err) {
  const fn_object *fn = (const fn_object *)self;
  const fn_param *p = &fn->params[fn->nin + o];
  dlb_signature_batch b;
  b.ndim = 0;
  if (p->batch) {
    int rc = dlb_signature_batch_shape(fn->params, fn->nin, fn->nin, argv, &b,
                                       err);
    if (rc != DLB_OK) return batch_refusal(fn, &b, argv, err);
    if (b.ndim + p->ndim > DLB_MAX_NDIM)
      return dlb_error_set(err, DLB_EINVAL,
                           "%s(): result %d: %d batch and %d core "
                           "dimensions; at most %d are supported",
                           fn->cname, (int)o, (int)b.ndim, (int)p->ndim,
                           DLB_MAX_NDIM);
    memcpy(shape, b.shape, (size_t)b.ndim * sizeof *shape);
  }
  result_shape(fn, p, argv, shape + b.ndim);
  *ndim = b.ndim + p->ndim;
  return DLB_OK;
}

/* One tensor of specs for Function._result_specs: shape (a sequence of
 * ints) and dtype (anything dlb.dtype takes) into t, its extents stored at
 * shape.  0, or -1 with an exception. */
static int spec_tensor(const fn_object *fn, int i, PyObject *spec, DLTensor *t,
                       int64_t *shape) {
  int rc = -1;
  PyObject *dims = NULL;
  if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2) {
    PyErr_Format(PyExc_TypeError,
                 "%U()._result_specs: the spec of argument '%U' must be a "
                 "(shape, dtype) pair or None, not %.100s",
                 fn->name, pname(fn, i), Py_TYPE(spec)->tp_name);
    goto cleanup;
  }
  if (dlb__dtype_converter(fn->st, PyTuple_GET_ITEM(spec, 1), &t->dtype) < 0)
    goto cleanup;
  dims = PySequence_Tuple(PyTuple_GET_ITEM(spec, 0));
  if (dims == NULL) goto cleanup;
  Py_ssize_t n = PyTuple_GET_SIZE(dims);
  if (n > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U': %zd dimensions; at most %d are "
                 "supported",
                 fn->name, pname(fn, i), n, DLB_MAX_NDIM);
    goto cleanup;
  }
  for (Py_ssize_t a = 0; a < n; a++) {
    PyObject *d = PyTuple_GET_ITEM(dims, a);
    if (d == Py_None) {
      shape[a] = -1; /* not known until the graph runs */
      continue;
    }
    if (!PyLong_Check(d)) {
      PyErr_Format(PyExc_TypeError,
                   "%U() argument '%U': dimension %zd is %R; an extent is an "
                   "int, or None when it is not known until the graph runs",
                   fn->name, pname(fn, i), a, d);
      goto cleanup;
    }
    shape[a] = PyLong_AsLongLong(d);
    if (shape[a] == -1 && PyErr_Occurred()) goto cleanup;
    if (shape[a] < 0) {
      PyErr_Format(PyExc_ValueError,
                   "%U() argument '%U': dimension %zd is negative (%lld)",
                   fn->name, pname(fn, i), a, (long long)shape[a]);
      goto cleanup;
    }
  }
  t->data = NULL;
  t->device.device_type = kDLCPU;
  t->device.device_id = 0;
  t->ndim = (int32_t)n;
  t->shape = shape;
  t->strides = NULL;
  t->byte_offset = 0;
  rc = 0;
cleanup:
  Py_XDECREF(dims);
  return rc;
}

/* A shape as a tuple: an int per extent, None where it is -1 (unknown). */
static PyObject *extents_tuple(int32_t n, const int64_t *v) {
  PyObject *t = PyTuple_New(n);
  for (int32_t a = 0; t != NULL && a < n; a++) {
    PyObject *e = v[a] < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(v[a]);
    if (e == NULL) Py_CLEAR(t);
    else PyTuple_SET_ITEM(t, a, e);
  }
  return t;
}

/* specs, one per input, as a sequence that stays as it is while it is read
 * (a list is read from a copy: another thread may change it meanwhile); NULL
 * with TypeError (not a sequence: not_sequence) or the argument-count error. */
static PyObject *specs_per_input(const fn_object *fn, PyObject *specs,
                                 const char *not_sequence) {
  PyObject *seq = PyList_Check(specs) ? PyList_AsTuple(specs)
                                      : PySequence_Fast(specs, not_sequence);
  if (seq != NULL && PySequence_Fast_GET_SIZE(seq) != fn->nin) {
    dlb__fn_nargs_error(fn, PySequence_Fast_GET_SIZE(seq));
    Py_CLEAR(seq);
  }
  return seq;
}

/* Function._result_specs(specs) -> (results, aliases).  What a call with
 * inputs described by specs produces, checked as the eager call checks
 * its arguments (same rule, same exception and message): specs holds one
 * item per input in parameter order -- a (shape, dtype) pair for a tensor
 * (an extent may be None: not known until the graph runs, checked then),
 * the Python number itself for a number, or None for a number whose value
 * is not known.  results: a (shape, DType) pair per declared result (None
 * extents where they come from unknown ones); aliases: the indices of the
 * `mut` inputs, whose new values a compiler that cannot write its inputs
 * returns after the results.  The shape function of every compiled route. */
PyObject *dlb__fn_result_specs(PyObject *self, PyObject *specs) {
  fn_object *fn = (fn_object *)self;
  PyObject *result = NULL, *seq = NULL, *results = NULL, *aliases = NULL;
  int nin = fn->nin, nout = fn->nout, nmut = 0;
  DLTensor *ts = NULL, **argv = NULL;
  int64_t *shapes = NULL;
  seq = specs_per_input(fn, specs, "_result_specs() takes a sequence of specs");
  if (seq == NULL) goto cleanup;
  ts = PyMem_Calloc((size_t)nin + 1, sizeof *ts);
  argv = PyMem_Calloc((size_t)nin + 1, sizeof *argv);
  shapes = PyMem_Calloc(((size_t)nin + 1) * DLB_MAX_NDIM, sizeof *shapes);
  if (ts == NULL || argv == NULL || shapes == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  for (int i = 0; i < nin; i++) {
    const fn_param *p = &fn->params[i];
    PyObject *spec = PySequence_Fast_GET_ITEM(seq, i);
    argv[i] = &ts[i];
    if (p->mut) nmut++;
    if (spec == Py_None) {
      /* A number whose value is not known (a compiler's scalar). */
      if (p->mut) {
        dlb__fn_mut_number_error(fn, i, spec);
        goto cleanup;
      }
      if (p->ndim != 0) {
        PyErr_Format(PyExc_TypeError,
                     "%U() argument '%U': a Python number is accepted only "
                     "for a 0-d parameter",
                     fn->name, pname(fn, i));
        goto cleanup;
      }
      ts[i].dtype = p->dtype; /* a number takes the parameter's dtype */
      continue;
    }
    if (PyLong_Check(spec) || PyFloat_Check(spec) || PyComplex_Check(spec)) {
      /* The number itself: the eager call's steps exactly, so the same
       * exception and message (range, kind, 'mut', not tensor-like). */
      dlb_scalar value;
      if (p->ndim == 0) {
        if (p->mut) {
          dlb__fn_mut_number_error(fn, i, spec);
          goto cleanup;
        }
        if (dlb__scalar_from_number(fn->name, pname(fn, i), spec, p->dtype,
                                    &value) < 0)
          goto cleanup;
        ts[i].dtype = p->dtype;
        continue;
      }
      dlb_view view;
      if (dlb__view_get(fn->st, spec, 0, &view) == 0) {
        dlb__view_release(&view); /* no number is tensor-like today */
        PyErr_Format(PyExc_TypeError,
                     "%U() argument '%U': a Python number is accepted only "
                     "for a 0-d parameter",
                     fn->name, pname(fn, i));
      }
      dlb__fn_prefix_error(fn, i);
      goto cleanup;
    }
    if (spec_tensor(fn, i, spec, &ts[i], shapes + (size_t)i * DLB_MAX_NDIM) < 0)
      goto cleanup;
    if (!type_matches(p, &ts[i])) {
      dlb__fn_check_error(fn, i, &ts[i], p, NULL, -1);
      goto cleanup;
    }
    int axis = dim_mismatch_in(fn, p, &ts[i], argv, 1);
    if (axis >= 0) {
      dlb__fn_dim_error(fn, i, axis, core_extent(fn, i, &ts[i], axis),
                        &fn->dims[p->dim0 + axis], argv);
      goto cleanup;
    }
    /* An extent bound where it is unknown and known further on: the known
     * one stands for the name from here (later checks and the results). */
    const fn_dim *d = &fn->dims[p->dim0];
    for (int a = 0; a < p->ndim; a++, d++) {
      if (d->kind != DIM_CHECK) continue;
      DLTensor *from = argv[d->from_param];
      int64_t *bound =
          &from->shape[from->ndim - fn->params[d->from_param].ndim +
                       d->from_axis];
      int64_t here = core_extent(fn, i, &ts[i], a);
      if (here >= 0 && *bound < 0) *bound = here;
    }
  }
  /* The batch shape B every `...` result has in front of its core dims
   * (by the eager call's rule: dlb_signature_batch_shape), unknown
   * extents staying unknown. */
  dlb_signature_batch batch;
  batch.ndim = 0;
  if (fn->nbatch > 0) {
    dlb_error err;
    if (dlb_signature_batch_shape(fn->params, nin, nin, argv, &batch, &err) !=
        DLB_OK) {
      dlb__fn_batch_error(fn, &batch, argv);
      goto cleanup;
    }
  }
  results = PyTuple_New(nout);
  aliases = PyTuple_New(nmut);
  if (results == NULL || aliases == NULL) goto cleanup;
  for (int o = 0; o < nout; o++) {
    const fn_param *p = &fn->params[nin + o];
    int64_t shape[2 * DLB_MAX_NDIM];
    int32_t nb = p->batch ? batch.ndim : 0;
    if (nb + p->ndim > DLB_MAX_NDIM) {
      PyErr_Format(PyExc_ValueError,
                   "%U() result '%U': %d batch and %d core dimensions; at "
                   "most %d are supported",
                   fn->name, PyTuple_GET_ITEM(fn->result_names, o), (int)nb,
                   (int)p->ndim, DLB_MAX_NDIM);
      goto cleanup;
    }
    memcpy(shape, batch.shape, (size_t)nb * sizeof *shape);
    result_shape(fn, p, argv, shape + nb);
    PyObject *pair = Py_BuildValue("(NN)", extents_tuple(nb + p->ndim, shape),
                                   dlb__dtype_new(fn->st, p->dtype));
    if (pair == NULL) goto cleanup;
    PyTuple_SET_ITEM(results, o, pair);
  }
  for (int i = 0, k = 0; i < nin; i++) {
    if (!fn->params[i].mut) continue;
    PyObject *index = PyLong_FromLong(i);
    if (index == NULL) goto cleanup;
    PyTuple_SET_ITEM(aliases, k++, index);
  }
  result = PyTuple_Pack(2, results, aliases);
cleanup:
  PyMem_Free(shapes);
  PyMem_Free(argv);
  PyMem_Free(ts);
  Py_XDECREF(aliases);
  Py_XDECREF(results);
  Py_XDECREF(seq);
  return result;
}

/* Function._refuse_overlap(specs): the eager call's overlap rule
 * (dlb__fn_refuse_overlap) for a compiler's placeholders, which have no
 * memory to compare but say where they would lie.  specs has one entry
 * per input: None (not a tensor), or (storage, byte_offset, shape,
 * strides, dtype) -- storage an int naming the memory the tensor is a view
 * of (tensors of different storages never overlap), byte_offset where its
 * element 0 lies in it, strides in elements.  None, or BufferError naming
 * both parameters exactly as eagerly. */
PyObject *dlb__fn_refuse_overlap_specs(PyObject *self, PyObject *specs) {
  fn_object *fn = (fn_object *)self;
  PyObject *result = NULL, *seq = NULL;
  PyObject *keys[FN_MAX_PARAMS];
  int64_t group[FN_MAX_PARAMS];
  DLTensor ts[FN_MAX_PARAMS];
  DLTensor *argv[FN_MAX_PARAMS];
  int64_t *dims = NULL;
  int nin = fn->nin;
  seq = specs_per_input(fn, specs, "_refuse_overlap() takes a sequence");
  if (seq == NULL) goto cleanup;
  dims = PyMem_Calloc((size_t)nin * 2 * DLB_MAX_NDIM + 1, sizeof *dims);
  if (dims == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  for (int i = 0; i < nin; i++) {
    PyObject *spec = PySequence_Fast_GET_ITEM(seq, i);
    int64_t *shape = dims + (size_t)i * 2 * DLB_MAX_NDIM;
    int64_t *strides = shape + DLB_MAX_NDIM;
    long long offset;
    PyObject *key, *shp, *str, *dtype;
    keys[i] = NULL;
    group[i] = -1;
    argv[i] = &ts[i];
    memset(&ts[i], 0, sizeof ts[i]);
    if (spec == Py_None) continue;
    if (!PyArg_ParseTuple(spec, "OLOOO;_refuse_overlap(): a spec is "
                          "(storage, byte_offset, shape, strides, dtype)",
                          &key, &offset, &shp, &str, &dtype))
      goto cleanup;
    if (dlb__dtype_converter(fn->st, dtype, &ts[i].dtype) < 0) goto cleanup;
    PyObject *tshape = PySequence_Tuple(shp);
    PyObject *tstrides = tshape ? PySequence_Tuple(str) : NULL;
    Py_ssize_t n = tshape ? PyTuple_GET_SIZE(tshape) : 0;
    int ok = tstrides != NULL && offset >= 0 && n <= DLB_MAX_NDIM &&
             PyTuple_GET_SIZE(tstrides) == n;
    for (Py_ssize_t a = 0; ok && a < n; a++) {
      shape[a] = PyLong_AsLongLong(PyTuple_GET_ITEM(tshape, a));
      strides[a] = PyLong_AsLongLong(PyTuple_GET_ITEM(tstrides, a));
      if (PyErr_Occurred() || shape[a] < 0) ok = 0;
    }
    Py_XDECREF(tshape);
    Py_XDECREF(tstrides);
    if (!ok) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError,
                     "%U()._refuse_overlap: the spec of argument '%U' is "
                     "not a layout (an offset >= 0, extents >= 0, a stride "
                     "per extent, at most %d)",
                     fn->name, pname(fn, i), DLB_MAX_NDIM);
      goto cleanup;
    }
    ts[i].ndim = (int32_t)n;
    ts[i].shape = shape;
    ts[i].strides = strides;
    ts[i].byte_offset = (uint64_t)offset;
    ts[i].device.device_type = kDLCPU;
    /* The first input of the same storage names the group. */
    keys[i] = key;
    group[i] = i;
    for (int j = 0; j < i; j++) {
      if (keys[j] == NULL) continue;
      int eq = PyObject_RichCompareBool(keys[j], key, Py_EQ);
      if (eq < 0) goto cleanup;
      if (eq) {
        group[i] = group[j];
        break;
      }
    }
  }
  if (dlb__fn_refuse_overlap(fn, argv, group) < 0) goto cleanup;
  result = Py_NewRef(Py_None);
cleanup:
  PyMem_Free(dims);
  Py_XDECREF(seq);
  return result;
}
