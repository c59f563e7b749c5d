/*
 * function_ops.c -- what graph compilers ask of a Function (src/ops,
 * python/dlbridge/_ops_*.py): its records and name, its kernel run on
 * tensors a compiler allocated (no Python, no GIL), and the shape function
 * of every compiled route (Function._result_specs), which checks a traced
 * call with the eager call's rules and messages.
 */
#include "dlbridge_py.h"
#include "function.h"

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

int dlb__function_run(PyObject *self, DLTensor *const *argv, int32_t nargs,
                      void *stream, dlb_error *err) {
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
          "says %s with %d",
          fn->cname, i < fn->nin ? "argument" : "result",
          (int)(i < fn->nin ? i : i - fn->nin), got, (int)t->ndim,
          axis >= 0 ? " with another extent" : "", want, (int)p->ndim);
    }
  }
  if (fn->nbatch > 0) {
    int i = first_with_batch_dims(fn, argv, nargs);
    if (i >= 0)
      return dlb_error_set(
          err, DLB_EUNSUPPORTED,
          "%s(): %s %d has batch dimensions; calls with batch dimensions "
          "('...') are not implemented yet",
          fn->cname, i < fn->nin ? "argument" : "result",
          (int)(i < fn->nin ? i : i - fn->nin));
  }
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

void dlb__function_result_shape(PyObject *self, DLTensor *const *argv,
                                int32_t o, int64_t *shape) {
  const fn_object *fn = (const fn_object *)self;
  result_shape(fn, &fn->params[fn->nin + o], argv, shape);
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
