/*
 * function_grad.c -- a Function's derivatives: the vjp and jvp Functions
 * declared with it (Function(..., vjp=, jvp=), load(..., vjp=, jvp=)),
 * bound to its signature by name, and what each of their parameters
 * receives.
 *
 * The rules are the core's (src/core/signature_grad.c: the derived
 * signatures, the binding by name and every refusal); this file turns them
 * into what the frameworks' routes read (python/dlbridge/_autodiff.py and
 * the _ops_*.py modules): tuples of (kind, index) per derivative
 * parameter and of primal indices per derivative result.  Construction
 * only: nothing here runs in a call.
 *
 * Decisions:
 *  - a derivative is a Function of its own, with its own checks: the
 *    cotangents a vjp returns always have the shapes its signature gives,
 *    which the binding made its primal's (TensorFlow would accept a wrong
 *    shape silently, torch would sum it down);
 *  - a refusal is a ValueError "<name>: vjp=: <the core's message>": the
 *    declaration is a bad value, whichever part of it is wrong.
 */
#include "dlbridge_py.h"
#include "function.h"

static const char *kind_name(int kind) {
  return kind == DLB_DERIVATIVE_VJP ? "vjp" : "jvp";
}

PyObject *dlb__fn_derived_signature(const fn_object *fn, int kind) {
  PyObject *result = NULL;
  char *buf = NULL;
  dlb_error err;
  dlb_signature *p = dlb__fn_parse(fn->signature);
  if (p == NULL) goto cleanup;
  /* Each input is spelled once more and each derivative once: four times
   * the forward's text is more than enough, the margin covers the added
   * names of a short one. */
  size_t cap = 4 * p->length + 256, len = 0;
  buf = (char *)PyMem_Malloc(cap);
  if (buf == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  if (dlb_signature_derive(p, kind, buf, cap, &len, &err) != DLB_OK) {
    err.message[DLB_ERROR_MESSAGE_SIZE - 1] = '\0';
    PyErr_Format(PyExc_ValueError, "%U: %s=: %s", fn->name, kind_name(kind),
                 err.message);
    goto cleanup;
  }
  result = PyUnicode_FromStringAndSize(buf, (Py_ssize_t)len);
cleanup:
  PyMem_Free(buf);
  PyMem_Free(p);
  return result;
}

/* What a derivative parameter bound as (kind, index) receives, as the
 * routes name it. */
static const char *arg_kind(int deriv_kind, int bind_kind) {
  switch (bind_kind) {
    case DLB_BIND_INPUT: return "input";
    case DLB_BIND_RESULT: return "result";
    default:
      return deriv_kind == DLB_DERIVATIVE_VJP ? "cotangent" : "tangent";
  }
}

int dlb__fn_bind_derivative(fn_object *fn, int kind, PyObject *deriv) {
  int rc = -1;
  dlb_signature *primal = NULL, *d = NULL;
  dlb_signature_binding *b = NULL;
  PyObject *args = NULL, *results = NULL;
  dlb_error err;
  if (!dlb__function_check(deriv)) {
    PyErr_Format(PyExc_TypeError,
                 "%U: %s= must be a Function here, not %.100s", fn->name,
                 kind_name(kind), Py_TYPE(deriv)->tp_name);
    goto cleanup;
  }
  const fn_object *dfn = (const fn_object *)deriv;
  primal = dlb__fn_parse(fn->signature);
  if (primal == NULL) goto cleanup;
  d = dlb__fn_parse(dfn->signature);
  if (d == NULL) goto cleanup;
  b = (dlb_signature_binding *)PyMem_Calloc(1, sizeof *b);
  if (b == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  if (dlb_signature_bind(primal, d, kind, b, &err) != DLB_OK) {
    err.message[DLB_ERROR_MESSAGE_SIZE - 1] = '\0';
    PyErr_Format(PyExc_ValueError, "%U: %s=: %s", fn->name, kind_name(kind),
                 err.message);
    goto cleanup;
  }
  args = PyTuple_New(b->nargs);
  if (args == NULL) goto cleanup;
  for (int k = 0; k < b->nargs; k++) {
    PyObject *item = Py_BuildValue("(si)", arg_kind(kind, b->arg[k].kind),
                                   (int)b->arg[k].index);
    if (item == NULL) goto cleanup;
    PyTuple_SET_ITEM(args, k, item);
  }
  results = PyTuple_New(b->nresults);
  if (results == NULL) goto cleanup;
  for (int k = 0; k < b->nresults; k++) {
    PyObject *item = PyLong_FromLong(b->result[k]);
    if (item == NULL) goto cleanup;
    PyTuple_SET_ITEM(results, k, item);
  }
  if (kind == DLB_DERIVATIVE_VJP) {
    fn->vjp = Py_NewRef(deriv);
    fn->vjp_args = args;
    fn->vjp_results = results;
  } else {
    fn->jvp = Py_NewRef(deriv);
    fn->jvp_args = args;
    fn->jvp_results = results;
  }
  args = results = NULL;
  rc = 0;
cleanup:
  Py_XDECREF(args);
  Py_XDECREF(results);
  PyMem_Free(b);
  PyMem_Free(d);
  PyMem_Free(primal);
  return rc;
}
