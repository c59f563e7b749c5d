/*
 * _noop.c -- the floors the call benchmarks are measured against.
 *
 *   noop(a, b, c)            METH_FASTCALL, checks the count, returns None:
 *                            the cheapest possible C call with 3 arguments.
 *   exchange3(a, b, c)       what any consumer of torch tensors must do at
 *                            the least: read the exchange table once (cached
 *                            per type), fill 3 stack DLTensors with
 *                            dltensor_from_py_object_no_sync and ask
 *                            current_work_stream once.  Returns None.
 *   exchange_loop(a, b, c, n) the same work n times inside C, timed with
 *                            CLOCK_MONOTONIC; returns ns per iteration, so
 *                            the raw cost is seen without any call overhead.
 *
 * Only used by bench/bench_calls.py; built by bench/build_peers.sh.  It
 * includes dlpack.h from the tree so the table layout is the project's own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <time.h>

#include "dlpack/dlpack.h"

static PyObject *noop(PyObject *self, PyObject *const *args,
                      Py_ssize_t nargs) {
  (void)self;
  (void)args;
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "noop() takes 3 arguments");
    return NULL;
  }
  Py_RETURN_NONE;
}

/* One cached (type, table) pair: the benchmark feeds one type at a time, and
 * a real consumer would cache per type just the same, so the lookup by
 * string is not part of the per-call cost.  The type is held so its address
 * cannot be reused by another type while cached. */
static PyTypeObject *cached_type;
static const DLPackExchangeAPI *cached_api;

static const DLPackExchangeAPI *table_for(PyObject *obj) {
  PyTypeObject *tp = Py_TYPE(obj);
  if (tp == cached_type)
    return cached_api;
  PyObject *cap = PyObject_GetAttrString((PyObject *)tp,
                                         "__dlpack_c_exchange_api__");
  if (cap == NULL)
    return NULL;
  const DLPackExchangeAPI *api =
      PyCapsule_GetPointer(cap, "dlpack_exchange_api");
  Py_DECREF(cap); /* the table is static in its producer; the capsule
                     only carries the pointer */
  if (api == NULL)
    return NULL;
  if (api->header.version.major != DLPACK_MAJOR_VERSION ||
      api->dltensor_from_py_object_no_sync == NULL ||
      api->current_work_stream == NULL) {
    PyErr_SetString(PyExc_TypeError,
                    "exchange table lacks the borrowed-view entry");
    return NULL;
  }
  Py_INCREF(tp);
  Py_XSETREF(cached_type, tp);
  cached_api = api;
  return api;
}

/* The measured unit: 3 borrowed views + 1 stream query.  Each DLTensor is
 * read once (device of the first decides the stream) so nothing can be
 * skipped by the compiler; the calls are through pointers anyway. */
static int exchange_once(const DLPackExchangeAPI *api, PyObject *const *objs) {
  DLTensor t[3];
  for (int i = 0; i < 3; i++) {
    if (api->dltensor_from_py_object_no_sync(objs[i], &t[i]) != 0)
      return -1;
  }
  void *stream = NULL;
  if (api->current_work_stream(t[0].device.device_type, t[0].device.device_id,
                               &stream) != 0)
    return -1;
  return 0;
}

static PyObject *exchange3(PyObject *self, PyObject *const *args,
                           Py_ssize_t nargs) {
  (void)self;
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "exchange3() takes 3 arguments");
    return NULL;
  }
  const DLPackExchangeAPI *api = table_for(args[0]);
  if (api == NULL || exchange_once(api, args) != 0)
    return NULL;
  Py_RETURN_NONE;
}

static PyObject *exchange_loop(PyObject *self, PyObject *const *args,
                               Py_ssize_t nargs) {
  (void)self;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "exchange_loop() takes 4 arguments");
    return NULL;
  }
  long long n = PyLong_AsLongLong(args[3]);
  if (n == -1 && PyErr_Occurred())
    return NULL;
  if (n <= 0) {
    PyErr_SetString(PyExc_ValueError, "n must be positive");
    return NULL;
  }
  const DLPackExchangeAPI *api = table_for(args[0]);
  if (api == NULL)
    return NULL;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long long i = 0; i < n; i++) {
    if (exchange_once(api, args) != 0)
      return NULL;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 +
              (double)(t1.tv_nsec - t0.tv_nsec);
  return PyFloat_FromDouble(ns / (double)n);
}

static PyMethodDef methods[] = {
    {"noop", (PyCFunction)(void (*)(void))noop, METH_FASTCALL,
     "noop(a, b, c): returns None"},
    {"exchange3", (PyCFunction)(void (*)(void))exchange3, METH_FASTCALL,
     "exchange3(a, b, c): 3 borrowed views + 1 stream query"},
    {"exchange_loop", (PyCFunction)(void (*)(void))exchange_loop,
     METH_FASTCALL, "exchange_loop(a, b, c, n): ns per exchange3 in C"},
    {NULL, NULL, 0, NULL}};

static void module_free(void *m) {
  (void)m;
  Py_CLEAR(cached_type);
}

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_noop", "benchmark floors", -1, methods,
    NULL, NULL, NULL, module_free};

PyMODINIT_FUNC PyInit__noop(void) { return PyModule_Create(&moduledef); }
