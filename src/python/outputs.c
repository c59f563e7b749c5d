/*
 * outputs.c -- giving results back in the caller's framework: the
 * framework's current work stream, allocating an output like an argument
 * (through the type's exchange-table allocator when it has one), and
 * handing a finished managed tensor to the framework as its own object.
 * Used by Function and the C API.
 *
 * Ownership follows decision 3.8 (export.c): a table's
 * managed_tensor_to_py_object_no_sync steals the tensor on success and on
 * failure, so nothing is deleted after a failed call.
 */
#include "dlbridge_py.h"

#include <string.h>


/* framework_stream(h->framework, device_id) as a stream. */
static int python_framework_stream(dlb_module_state *st, const dlb_handler *h,
                                   DLDevice device, void **stream) {
  struct dlb_handler_cache *c = st->handlers;
  int64_t v;
  PyObject *fn = DLB_FT_LOAD_PTR(&c->framework_stream);
  if (fn == NULL) {
    PyObject *m = PyImport_ImportModule("dlbridge._streams");
    if (m == NULL) return -1;
    fn = PyObject_GetAttrString(m, "framework_stream");
    Py_DECREF(m);
    if (fn == NULL) return -1;
    /* The first thread's is kept (two that race made the same one). */
    if (!dlb__ft_set_once(&c->framework_stream, fn)) {
      Py_DECREF(fn);
      fn = DLB_FT_LOAD_PTR(&c->framework_stream);
    }
  }
  Py_INCREF(fn); /* the call runs Python */
  PyObject *r = PyObject_CallFunction(fn, "Oi",
                                      h->framework ? h->framework : Py_None,
                                      (int)device.device_id);
  Py_DECREF(fn);
  if (r == NULL) return -1;
  int rc = dlb__read_int64(r, "the framework's current stream", &v);
  Py_DECREF(r);
  if (rc < 0) return -1;
  *stream = v == 1 ? NULL : (void *)(uintptr_t)(uint64_t)v;
  return 0;
}

int dlb__current_stream(dlb_module_state *st, const dlb_handler *h,
                        DLDevice device, void **stream) {
  *stream = NULL;
  if (device.device_type == kDLCPU || device.device_type == kDLCUDAHost ||
      device.device_type == kDLROCMHost)
    return 0;
  if (h->kind == DLB_KIND_TENSOR) {
    void *s = dlb__stream_current();
    *stream = dlb__cuda_stream_value(s) == 1 ? NULL : s;
    return 0;
  }
  if (h->kind == DLB_KIND_EXCHANGE && h->api->current_work_stream != NULL) {
    void *s = NULL;
    if (h->api->current_work_stream(device.device_type, device.device_id,
                                    &s) != 0) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError,
                     "the exchange table of '%.200s' could not give its "
                     "current stream",
                     h->type->tp_name);
      return -1;
    }
    *stream = s;
    return 0;
  }
  if (!dlb__is_cuda_device(device)) return 0;
  return python_framework_stream(st, h, device, stream);
}

/* What a producer's allocator told SetError. */
typedef struct {
  int calls;
  char kind[64];
  char message[512];
} alloc_error;

static void collect_error(void *ctx, const char *kind, const char *message) {
  alloc_error *e = (alloc_error *)ctx;
  /* Copied, not kept: the producer's strings may be temporaries.  Called
   * with the GIL held (we hold it around the allocator), but it touches no
   * Python anyway. */
  if (e->calls++ > 0) return; /* the first report wins */
  PyOS_snprintf(e->kind, sizeof e->kind, "%s", kind ? kind : "RuntimeError");
  PyOS_snprintf(e->message, sizeof e->message, "%s",
                message ? message : "allocation failed");
}

/* Whether text (lower-cased on the fly) contains needle (lower case). */
static int mentions(const char *text, const char *needle) {
  size_t n = strlen(needle);
  for (; *text; text++) {
    size_t i = 0;
    while (i < n && text[i] &&
           (text[i] >= 'A' && text[i] <= 'Z' ? text[i] - 'A' + 'a'
                                             : text[i]) == needle[i])
      i++;
    if (i == n) return 1;
  }
  return 0;
}

/* Raise the exception a SetError call named: a builtin exception class of
 * that name, else RuntimeError.  The message is cut at its first newline
 * (torch appends a C++ backtrace there).  torch 2.13 reports every
 * allocator failure as "MemoryError", a dtype it cannot hold (float32x4,
 * int4) included: from torch, a "MemoryError" whose message does not
 * mention memory is a BufferError -- the framework cannot hold the
 * result. */
static void raise_named(alloc_error *e, const dlb_handler *h) {
  PyTypeObject *type = h->type;
  char *nl = strchr(e->message, '\n');
  if (nl != NULL) *nl = '\0';
  if (strcmp(e->kind, "MemoryError") == 0 &&
      PyUnicode_CompareWithASCIIString(h->framework, "torch") == 0 &&
      !mentions(e->message, "memory")) {
    PyErr_Format(PyExc_BufferError,
                 "'%.200s' cannot allocate this result: %s", type->tp_name,
                 e->message);
    return;
  }
  PyObject *exc = PyExc_RuntimeError;
  PyObject *builtins = PyEval_GetBuiltins(); /* borrowed */
  /* A strong reference: builtins is shared by every thread. */
  PyObject *cls = NULL;
  if (builtins == NULL || dlb__dict_get_string_ref(builtins, e->kind, &cls) < 0)
    PyErr_Clear();
  if (cls != NULL && PyType_Check(cls) &&
      PyType_IsSubtype((PyTypeObject *)cls, (PyTypeObject *)PyExc_BaseException))
    exc = cls;
  if (exc == PyExc_RuntimeError && strcmp(e->kind, "RuntimeError") != 0)
    PyErr_Format(exc, "allocation by '%.200s' failed (%s): %s", type->tp_name,
                 e->kind, e->message);
  else
    PyErr_SetString(exc, e->message);
  Py_XDECREF(cls);
}

/* A framework's allocator result must be what was asked for: the kernel
 * writes prototype's extents into it, so a smaller tensor (a wrong shape,
 * a narrower dtype, another device, a strided layout) would be written out
 * of bounds.  On mismatch m is deleted and BufferError set.  0 or -1. */
static int check_allocated(const dlb_handler *h, const DLTensor *prototype,
                           DLManagedTensorVersioned *m) {
  const DLTensor *t = &m->dl_tensor;
  const char *what = NULL;
  if (t->ndim != prototype->ndim)
    what = "ndim";
  else if (t->dtype.code != prototype->dtype.code ||
           t->dtype.bits != prototype->dtype.bits ||
           t->dtype.lanes != prototype->dtype.lanes)
    what = "dtype";
  else if (!dlb__same_device(t->device, prototype->device))
    what = "device";
  else if (t->ndim > 0 &&
           memcmp(t->shape, prototype->shape,
                  (size_t)t->ndim * sizeof *t->shape) != 0)
    what = "shape";
  else if (!dlb_tensor_is_contiguous(t))
    what = "layout (it is not contiguous)";
  if (what == NULL) return 0;
  dlb__delete_keep_error(m);
  PyErr_Format(PyExc_BufferError,
               "the allocator of '%.200s' returned a tensor whose %s differs "
               "from the one asked for; refusing to let a kernel write into it",
               h->type->tp_name, what);
  return -1;
}

int dlb__alloc_like(dlb_module_state *st, const dlb_handler *h,
                    const DLTensor *prototype, DLManagedTensorVersioned **out) {
  if ((h->kind == DLB_KIND_EXCHANGE || h->kind == DLB_KIND_TENSOR) &&
      h->api->managed_tensor_allocator != NULL) {
    alloc_error e = {0, "", ""};
    DLManagedTensorVersioned *m = NULL;
    DLTensor proto = *prototype;
    int rc = h->api->managed_tensor_allocator(&proto, &m, &e, collect_error);
    if (rc != 0) {
      if (e.calls > 0) {
        PyErr_Clear();
        raise_named(&e, h);
      } else if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_RuntimeError,
                     "the allocator of '%.200s' failed without saying why",
                     h->type->tp_name);
      }
      return -1;
    }
    if (m == NULL) {
      PyErr_Format(PyExc_RuntimeError,
                   "the allocator of '%.200s' returned success but no tensor",
                   h->type->tp_name);
      return -1;
    }
    if (dlb__check_owned(m, "exchange API allocator") < 0) return -1;
    if (check_allocated(h, prototype, m) < 0) return -1;
    *out = m;
    return 0;
  }
  /* The result goes to h's framework after the kernel ran (dlb__to_framework):
   * refuse here, before the kernel, what that framework cannot hold.  NumPy
   * holds exactly the dtypes it has a typestr for (no bfloat16, fp8,
   * complex32, sub-byte or multi-lane types). */
  if (PyUnicode_CompareWithASCIIString(h->framework, "numpy") == 0 &&
      dlb__array_typestr(dlb__scalar_kind(prototype->dtype)) == NULL) {
    char dt[48];
    dlb__dtype_str(prototype->dtype, dt, sizeof dt);
    PyErr_Format(PyExc_BufferError,
                 "numpy cannot hold a %s result; pass a dlbridge.Tensor (or "
                 "a framework with that dtype) as the first tensor argument",
                 dt);
    return -1;
  }
  /* No allocator of the framework's: dlbridge's own, on the stream the
   * framework works on (a CUDA output is then ordered like its work). */
  void *stream = NULL;
  if (dlb__current_stream(st, h, prototype->device, &stream) < 0) return -1;
  void *prev = dlb__stream_swap(stream);
  int rc = dlb__empty_managed(prototype->ndim, prototype->shape,
                              prototype->dtype, prototype->device, false,
                              "allocating an output", out);
  dlb__stream_swap(prev);
  return rc;
}

/* The callable that turns a dlb.Tensor into framework fw's type (Py_None
 * for a framework the registry does not know), a new reference from the
 * cache.  The registry (python/dlbridge/_frameworks.py, _c_converter) is
 * asked once per framework name; C keeps no list of frameworks of its own.
 * Strong references throughout: the dict is shared by every thread. */
static PyObject *converter_for(struct dlb_handler_cache *c, PyObject *fw) {
  PyObject *conv = NULL;
  int found = dlb__dict_get_ref(c->converters, fw, &conv);
  if (found != 0) return found > 0 ? conv : NULL;
  /* fw is borrowed from a handler and Python code runs below. */
  Py_INCREF(fw);
  PyObject *registry = PyImport_Import(c->str_registry);
  if (registry != NULL) {
    conv = PyObject_CallMethod(registry, "_c_converter", "O", fw);
    Py_DECREF(registry);
  }
  if (conv != NULL) {
    /* What is in the dict now: conv, or another thread's answer. */
    PyObject *kept = NULL;
    int rc = dlb__dict_setdefault_ref(c->converters, fw, conv, &kept);
    Py_DECREF(conv);
    conv = rc < 0 ? NULL : kept;
  }
  Py_DECREF(fw);
  return conv;
}

int dlb__to_framework(dlb_module_state *st, const dlb_handler *h,
                      DLManagedTensorVersioned *m, PyObject **out) {
  if (h->kind == DLB_KIND_EXCHANGE || h->kind == DLB_KIND_TENSOR) {
    void *obj = NULL;
    /* Steals m on success and failure (decision 3.8). */
    if (h->api->managed_tensor_to_py_object_no_sync(m, &obj) != 0 || obj == NULL) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError,
                     "the exchange table of '%.200s' could not import a "
                     "tensor without saying why",
                     h->type->tp_name);
      return -1;
    }
    *out = (PyObject *)obj;
    return 0;
  }
  /* m's pending work (a kernel's writes) is on the framework's stream:
   * make that dlbridge's current stream while the framework imports it, so
   * the export orders it before whatever stream the importer names. */
  void *stream = NULL;
  if (dlb__current_stream(st, h, m->dl_tensor.device, &stream) < 0) {
    dlb__delete_keep_error(m);
    return -1;
  }
  PyObject *conv = converter_for(st->handlers, h->framework);
  if (conv == NULL) {
    dlb__delete_keep_error(m);
    return -1;
  }
  PyObject *t = dlb__tensor_from_managed(st, m); /* steals m */
  if (t == NULL) {
    Py_DECREF(conv);
    return -1;
  }
  if (conv == Py_None) {
    Py_DECREF(conv);
    *out = t;
    return 0;
  }
  void *prev = dlb__stream_swap(stream);
  PyObject *res = PyObject_CallOneArg(conv, t);
  dlb__stream_swap(prev);
  Py_DECREF(conv);
  Py_DECREF(t);
  if (res == NULL) return -1;
  *out = res;
  return 0;
}
