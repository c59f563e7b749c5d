/*
 * _dlb_torchlike -- a stand-in for the two torch C types whose method
 * descriptors dlbridge calls directly (src/python/torchbits.c through
 * pycompat.h's dlb__py_c_descr_usable / dlb__py_c_descr_call), so that
 * code path runs on every interpreter the suite runs on; torch itself is
 * installed for one (3.11).  Used only by tests/python/test_pycompat.py.
 *
 *   TensorBase: a static type named "torch._C.TensorBase" (what
 *     torchbits.c looks for on a type's MRO) whose instances are 1-d
 *     tensors of 4 float32 or complex64 elements over their own memory,
 *     published through a DLPack exchange table (dlbridge checks the bits
 *     only on that route).  is_neg() and is_conj() are METH_NOARGS methods
 *     and requires_grad a getter, as in torch; _set(neg, conj, grad, fail)
 *     sets their answers (fail: each question raises RuntimeError).
 *   DisableTorchFunction: a static type named "torch._C.DisableTorchFunction"
 *     with a METH_NOARGS __enter__ and a METH_VARARGS __exit__, as torch's.
 *
 * Every question and switch is counted (counts(), reset()), with whether a
 * question came while the switch was off (torch's __torch_function__
 * handling on) and the most arguments __exit__ was given -- what the tests
 * check dlbridge did.  The test puts these types into a fake `torch` /
 * `torch._C` in sys.modules, in a child interpreter.
 *
 * Like _dlb_testproducer it includes nothing of dlbridge but the DLPack
 * header.  Its counters are plain globals: the tests drive it from one
 * thread.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dlpack/dlpack.h"

enum { C_NEG, C_CONJ, C_GRAD, C_ENTER, C_EXIT, C_ENABLED, C_EXPORT,
       C_DELETER, C_N };
static const char *const count_names[C_N] = {
    "is_neg", "is_conj", "requires_grad", "enter", "exit",
    "asked_while_enabled", "export", "deleter"};
static long long counts[C_N];
static Py_ssize_t exit_args_max; /* most arguments one __exit__ got */
static int disabled;             /* __enter__ calls minus __exit__ calls */

typedef struct {
  PyObject_HEAD
  float data[8]; /* 4 float32, or 4 complex64 */
  int64_t shape, stride;
  int complex_, neg, conj, grad, fail;
} TensorBaseObject;

static PyTypeObject TensorBase_Type;

/* ---- the questions torchbits.c asks ------------------------------------ */

static PyObject *question(PyObject *self, int which, int answer) {
  counts[which]++;
  if (disabled <= 0) counts[C_ENABLED]++;
  if (((TensorBaseObject *)self)->fail) {
    PyErr_SetString(PyExc_RuntimeError, "torchlike: told to fail");
    return NULL;
  }
  return PyBool_FromLong(answer);
}

static PyObject *tb_is_neg(PyObject *self, PyObject *unused) {
  (void)unused;
  return question(self, C_NEG, ((TensorBaseObject *)self)->neg);
}

static PyObject *tb_is_conj(PyObject *self, PyObject *unused) {
  (void)unused;
  return question(self, C_CONJ, ((TensorBaseObject *)self)->conj);
}

static PyObject *tb_requires_grad(PyObject *self, void *closure) {
  (void)closure;
  return question(self, C_GRAD, ((TensorBaseObject *)self)->grad);
}

/* _set(neg, conj, grad, fail) */
static PyObject *tb_set(PyObject *self, PyObject *args) {
  TensorBaseObject *t = (TensorBaseObject *)self;
  if (!PyArg_ParseTuple(args, "pppp", &t->neg, &t->conj, &t->grad, &t->fail))
    return NULL;
  Py_RETURN_NONE;
}

/* ---- the exchange table: how dlbridge reads it ------------------------- */

static void tb_view(TensorBaseObject *t, DLTensor *out) {
  memset(out, 0, sizeof *out);
  out->data = t->data;
  out->device.device_type = kDLCPU;
  out->ndim = 1;
  out->dtype.code = t->complex_ ? kDLComplex : kDLFloat;
  out->dtype.bits = t->complex_ ? 64 : 32;
  out->dtype.lanes = 1;
  out->shape = &t->shape;
  out->strides = &t->stride;
}

static int tb_check(void *obj) {
  if (obj != NULL && PyObject_TypeCheck((PyObject *)obj, &TensorBase_Type))
    return 0;
  PyErr_SetString(PyExc_TypeError, "torchlike: not a TensorBase");
  return -1;
}

typedef struct {
  DLManagedTensorVersioned m;
  PyObject *owner; /* strong */
} tb_export;

static void tb_deleter(DLManagedTensorVersioned *m) {
  tb_export *e = (tb_export *)m->manager_ctx;
  counts[C_DELETER]++;
  if (!Py_IsInitialized()) {
    free(e); /* the owner is leaked: Python is gone */
    return;
  }
  PyGILState_STATE g = PyGILState_Ensure();
  Py_XDECREF(e->owner);
  PyGILState_Release(g);
  free(e);
}

static int tb_from_py(void *obj, DLManagedTensorVersioned **out) {
  if (tb_check(obj) < 0) return -1;
  tb_export *e = calloc(1, sizeof *e);
  if (e == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  counts[C_EXPORT]++;
  e->m.version.major = 1;
  e->m.version.minor = 3;
  e->m.manager_ctx = e;
  e->m.deleter = tb_deleter;
  tb_view((TensorBaseObject *)obj, &e->m.dl_tensor);
  e->owner = Py_NewRef((PyObject *)obj);
  *out = &e->m;
  return 0;
}

static int tb_dltensor(void *obj, DLTensor *out) {
  if (tb_check(obj) < 0) return -1;
  tb_view((TensorBaseObject *)obj, out);
  return 0;
}

static int tb_to_py(DLManagedTensorVersioned *m, void **out) {
  (void)out;
  if (m->deleter != NULL) m->deleter(m); /* stolen on failure too */
  PyErr_SetString(PyExc_TypeError, "torchlike: cannot import tensors");
  return -1;
}

static int tb_allocator(DLTensor *proto, DLManagedTensorVersioned **out,
                        void *ctx,
                        void (*SetError)(void *, const char *, const char *)) {
  (void)proto;
  (void)out;
  SetError(ctx, "TypeError", "torchlike: cannot allocate tensors");
  return -1;
}

static int tb_stream(DLDeviceType type, int32_t id, void **out) {
  (void)type;
  (void)id;
  *out = NULL;
  return 0;
}

static const DLPackExchangeAPI tb_table = {
    {{1, 3}, NULL}, tb_allocator, tb_from_py, tb_to_py, tb_dltensor, tb_stream};

/* ---- TensorBase -------------------------------------------------------- */

/* TensorBase(complex=False): elements 0, 1, 2, 3 (real parts). */
static PyObject *tb_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"complex", NULL};
  int complex_ = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p", kwlist, &complex_))
    return NULL;
  TensorBaseObject *t = (TensorBaseObject *)type->tp_alloc(type, 0);
  if (t == NULL) return NULL;
  t->complex_ = complex_;
  for (int i = 0; i < 4; i++) t->data[complex_ ? 2 * i : i] = (float)i;
  t->shape = 4;
  t->stride = 1;
  return (PyObject *)t;
}

static void tb_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  tp->tp_free(self);
  /* A Python subclass's instances own a reference to it; the static base
   * is not reference counted by its instances. */
  if (tp->tp_flags & Py_TPFLAGS_HEAPTYPE) Py_DECREF(tp);
}

static PyMethodDef tb_methods[] = {
    {"is_neg", tb_is_neg, METH_NOARGS, "The lazy negative bit (counted)."},
    {"is_conj", tb_is_conj, METH_NOARGS, "The lazy conjugate bit (counted)."},
    {"_set", tb_set, METH_VARARGS, "_set(neg, conj, grad, fail)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tb_getset[] = {
    {"requires_grad", tb_requires_grad, NULL, "Whether it requires grad (counted).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TensorBase_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torch._C.TensorBase",
    .tp_basicsize = sizeof(TensorBaseObject),
    .tp_dealloc = tb_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A stand-in for torch's tensor base type (tests only).",
    .tp_methods = tb_methods,
    .tp_getset = tb_getset,
    .tp_new = tb_new,
};

/* ---- DisableTorchFunction ---------------------------------------------- */

static PyObject *dtf_enter(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  counts[C_ENTER]++;
  disabled++;
  Py_RETURN_NONE;
}

static PyObject *dtf_exit(PyObject *self, PyObject *args) {
  (void)self;
  counts[C_EXIT]++;
  disabled--;
  Py_ssize_t n = args != NULL && PyTuple_Check(args) ? PyTuple_GET_SIZE(args) : 0;
  if (n > exit_args_max) exit_args_max = n;
  Py_RETURN_NONE;
}

static PyMethodDef dtf_methods[] = {
    {"__enter__", dtf_enter, METH_NOARGS, NULL},
    {"__exit__", dtf_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DisableTorchFunction_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torch._C.DisableTorchFunction",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A stand-in for torch's __torch_function__ switch (tests only).",
    .tp_methods = dtf_methods,
    .tp_new = PyType_GenericNew,
};

/* ---- the module -------------------------------------------------------- */

static PyObject *mod_counts(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  PyObject *d = PyDict_New();
  for (int i = 0; d != NULL && i < C_N; i++) {
    PyObject *v = PyLong_FromLongLong(counts[i]);
    if (v == NULL || PyDict_SetItemString(d, count_names[i], v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  PyObject *v = d ? PyLong_FromSsize_t(exit_args_max) : NULL;
  if (v == NULL || PyDict_SetItemString(d, "exit_args_max", v) < 0) Py_CLEAR(d);
  Py_XDECREF(v);
  return d;
}

static PyObject *mod_reset(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  memset(counts, 0, sizeof counts);
  exit_args_max = 0;
  disabled = 0;
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"counts", mod_counts, METH_NOARGS,
     "counts(): {question or switch: calls}, with asked_while_enabled and "
     "exit_args_max."},
    {"reset", mod_reset, METH_NOARGS, "reset(): every count back to 0."},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module) {
  if (!(TensorBase_Type.tp_flags & Py_TPFLAGS_READY)) {
    if (PyType_Ready(&TensorBase_Type) < 0 ||
        PyType_Ready(&DisableTorchFunction_Type) < 0)
      return -1;
    /* The table on the type, as torch publishes its own. */
    PyObject *cap =
        PyCapsule_New((void *)&tb_table, "dlpack_exchange_api", NULL);
    int rc = cap ? PyDict_SetItemString(TensorBase_Type.tp_dict,
                                        "__dlpack_c_exchange_api__", cap)
                 : -1;
    Py_XDECREF(cap);
    PyType_Modified(&TensorBase_Type);
    if (rc < 0) return -1;
  }
  if (PyModule_AddObjectRef(module, "TensorBase", (PyObject *)&TensorBase_Type) < 0 ||
      PyModule_AddObjectRef(module, "DisableTorchFunction",
                            (PyObject *)&DisableTorchFunction_Type) < 0)
    return -1;
  return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_GIL_DISABLED
    {Py_mod_gil, Py_MOD_GIL_NOT_USED}, /* the suite runs with the GIL off */
#endif
    {0, NULL},
};

static struct PyModuleDef torchlike_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_dlb_torchlike",
    .m_doc = "Stand-ins for torch's TensorBase and DisableTorchFunction C "
             "types, for dlbridge's tests.",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__dlb_torchlike(void) {
  return PyModuleDef_Init(&torchlike_module);
}
