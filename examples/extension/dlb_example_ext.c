/*
 * dlb_example_ext.c -- a C extension that takes NumPy, PyTorch, dlbridge (and
 * any other DLPack) tensors through dlbridge's C API, and hands results back
 * in the caller's framework.  It links nothing from dlbridge: only the header.
 *
 *   scale_add(x, y, alpha) -> alpha * x + y, in x's framework and on x's device
 *   fill_(x, value)        -> writes value into every element of x (in place)
 *   sum(x)                 -> float
 *   convert(x, framework)  -> x as a tensor of framework ("numpy", "torch", ...)
 *   stream(x)              -> x's framework's current stream (int), or None
 *
 * float32 and float64 only, CPU only, any strides.
 */
#include <dlbridge/python.h>

/* Visit every element of t in row-major order, honouring strides (which
 * dlbridge guarantees non-NULL): fn gets each element's address. */
typedef void (*visit_fn)(char *elem, DLDataType dt, void *ctx);

static void visit(const DLTensor *t, visit_fn fn, void *ctx) {
  int64_t idx[DLB_MAX_NDIM] = {0};
  int64_t isz = (t->dtype.bits * t->dtype.lanes + 7) / 8, n = 1, k;
  int32_t d;
  for (d = 0; d < t->ndim; d++) n *= t->shape[d];
  for (k = 0; k < n; k++) {
    char *p = (char *)t->data + t->byte_offset;
    for (d = 0; d < t->ndim; d++) p += idx[d] * t->strides[d] * isz;
    fn(p, t->dtype, ctx);
    for (d = t->ndim - 1; d >= 0 && ++idx[d] == t->shape[d]; d--) idx[d] = 0;
  }
}

static double load(const char *p, DLDataType dt) {
  return dt.bits == 32 ? (double)*(const float *)p : *(const double *)p;
}
static void store(char *p, DLDataType dt, double v) {
  if (dt.bits == 32) *(float *)p = (float)v; else *(double *)p = v;
}

/* BufferError (via dlbridge's mapping of DLB_EUNSUPPORTED) unless t is a
 * float32/float64 CPU tensor. */
static int check_float_cpu(const DLTensor *t, const char *what) {
  dlb_error err = {DLB_EUNSUPPORTED, ""};
  if (t->device.device_type == kDLCPU && t->dtype.code == kDLFloat &&
      t->dtype.lanes == 1 && (t->dtype.bits == 32 || t->dtype.bits == 64))
    return 0;
  PyOS_snprintf(err.message, sizeof err.message,
                "%s must be a float32 or float64 CPU tensor", what);
  dlb_py_raise(&err);
  return -1;
}

static void add_sum(char *p, DLDataType dt, void *ctx) { *(double *)ctx += load(p, dt); }
static void set_value(char *p, DLDataType dt, void *ctx) { store(p, dt, *(double *)ctx); }

typedef struct { const DLTensor *x, *y; double alpha; int64_t k; char *out; } saxpy_ctx;
/* Walks out (contiguous) in order while x and y are read at the same logical
 * index, so their strides can be anything. */
static void saxpy_x(char *px, DLDataType dt, void *c) {
  saxpy_ctx *s = (saxpy_ctx *)c;
  store(s->out + s->k++ * (dt.bits / 8), dt, s->alpha * load(px, dt));
}
static void saxpy_y(char *py, DLDataType dt, void *c) {
  saxpy_ctx *s = (saxpy_ctx *)c;
  char *po = s->out + s->k++ * (dt.bits / 8);
  store(po, dt, load(po, dt) + load(py, dt));
}

static PyObject *scale_add(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  dlb_py_view x, y;
  DLManagedTensorVersioned *out = NULL;
  PyObject *result = NULL;
  saxpy_ctx s = {0};
  int32_t d;
  (void)self;
  if (n != 3) return PyErr_Format(PyExc_TypeError, "scale_add(x, y, alpha) takes 3 arguments");
  s.alpha = PyFloat_AsDouble(args[2]);
  if (s.alpha == -1.0 && PyErr_Occurred()) return NULL;
  if (dlb_py_view_get(args[0], 0, &x) < 0) return NULL;
  if (dlb_py_view_get(args[1], 0, &y) < 0) { dlb_py_view_release(&x); return NULL; }
  if (check_float_cpu(&x.tensor, "x") < 0 || check_float_cpu(&y.tensor, "y") < 0) goto done;
  if (x.tensor.ndim != y.tensor.ndim || x.tensor.dtype.bits != y.tensor.dtype.bits) goto mismatch;
  for (d = 0; d < x.tensor.ndim; d++)
    if (x.tensor.shape[d] != y.tensor.shape[d]) goto mismatch;
  /* The result: x's framework and device, contiguous, uninitialised. */
  if (dlb_py_alloc_like(args[0], x.tensor.ndim, x.tensor.shape, x.tensor.dtype, &out) < 0) goto done;
  s.x = &x.tensor; s.y = &y.tensor;
  s.out = (char *)out->dl_tensor.data + out->dl_tensor.byte_offset;
  visit(&x.tensor, saxpy_x, &s);
  s.k = 0;
  visit(&y.tensor, saxpy_y, &s);
  /* Hand it over in x's framework; out is stolen whatever happens. */
  dlb_py_export(out, NULL, args[0], &result);
  goto done;
mismatch:
  PyErr_SetString(PyExc_ValueError, "scale_add: x and y must have the same shape and dtype");
done:
  dlb_py_view_release(&y);
  dlb_py_view_release(&x);
  return result;
}

static PyObject *fill_(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  dlb_py_view x;
  double v;
  int bad;
  (void)self;
  if (n != 2) return PyErr_Format(PyExc_TypeError, "fill_(x, value) takes 2 arguments");
  v = PyFloat_AsDouble(args[1]);
  if (v == -1.0 && PyErr_Occurred()) return NULL;
  /* WRITABLE: a read-only array is a BufferError here, before any write. */
  if (dlb_py_view_get(args[0], DLB_PY_VIEW_WRITABLE, &x) < 0) return NULL;
  bad = check_float_cpu(&x.tensor, "x");
  if (!bad) visit(&x.tensor, set_value, &v);
  dlb_py_view_release(&x);
  if (bad) return NULL;
  Py_RETURN_NONE;
}

static PyObject *sum(PyObject *self, PyObject *x_obj) {
  dlb_py_view x;
  double total = 0.0;
  int bad;
  (void)self;
  if (dlb_py_view_get(x_obj, 0, &x) < 0) return NULL;
  bad = check_float_cpu(&x.tensor, "x");
  if (!bad) visit(&x.tensor, add_sum, &total);
  dlb_py_view_release(&x);
  return bad ? NULL : PyFloat_FromDouble(total);
}

static PyObject *convert(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  DLManagedTensorVersioned *m;
  PyObject *result = NULL;
  const char *fw;
  (void)self;
  if (n != 2) return PyErr_Format(PyExc_TypeError, "convert(x, framework) takes 2 arguments");
  if (args[1] == Py_None) fw = NULL;
  else if ((fw = PyUnicode_AsUTF8(args[1])) == NULL) return NULL;
  if (dlb_py_import(args[0], &m) < 0) return NULL; /* m is ours now */
  dlb_py_export(m, fw, NULL, &result);            /* ... and now export's */
  return result;
}

static PyObject *stream(PyObject *self, PyObject *x) {
  void *s;
  (void)self;
  if (dlb_py_current_stream(x, &s) < 0) return NULL;
  if (s == NULL) Py_RETURN_NONE;
  return PyLong_FromVoidPtr(s);
}

static PyMethodDef methods[] = {
    {"scale_add", (PyCFunction)(void (*)(void))scale_add, METH_FASTCALL, "alpha * x + y"},
    {"fill_", (PyCFunction)(void (*)(void))fill_, METH_FASTCALL, "x[...] = value"},
    {"sum", sum, METH_O, "sum of the elements of x"},
    {"convert", (PyCFunction)(void (*)(void))convert, METH_FASTCALL, "x as framework's tensor"},
    {"stream", stream, METH_O, "current stream of x's framework"},
    {NULL, NULL, 0, NULL},
};

/* Multi-phase init: the table is looked up (and its version checked) each
 * time the module is executed. */
static int exec_module(PyObject *m) {
  (void)m;
  return dlb_import_capi();
}

/* This module keeps no state of its own and dlbridge's C API is safe to
 * call from several threads (docs/python-versions.md), so it says it can
 * run without the GIL: a free-threaded Python would otherwise turn the GIL
 * back on for the whole process when it is imported. */
static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
#ifdef Py_GIL_DISABLED
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "dlb_example_ext",
    "An example C extension using dlbridge's C API.", 0, methods, slots,
    NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_dlb_example_ext(void) { return PyModuleDef_Init(&moduledef); }
