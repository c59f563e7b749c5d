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
  if (c->framework_stream == NULL) {
    PyObject *m = PyImport_ImportModule("dlbridge._streams");
    if (m == NULL) return -1;
    c->framework_stream = PyObject_GetAttrString(m, "framework_stream");
    Py_DECREF(m);
    if (c->framework_stream == NULL) return -1;
  }
  PyObject *fn = Py_NewRef(c->framework_stream); /* the call runs Python */
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

/* Raise the exception a SetError call named: a builtin exception class of
 * that name, else RuntimeError. */
static void raise_named(const alloc_error *e, PyTypeObject *type) {
  PyObject *exc = PyExc_RuntimeError;
  PyObject *builtins = PyEval_GetBuiltins(); /* borrowed */
  PyObject *cls = builtins ? PyDict_GetItemString(builtins, e->kind) : NULL;
  if (cls != NULL && PyType_Check(cls) &&
      PyType_IsSubtype((PyTypeObject *)cls, (PyTypeObject *)PyExc_BaseException))
    exc = cls;
  if (exc == PyExc_RuntimeError && strcmp(e->kind, "RuntimeError") != 0)
    PyErr_Format(exc, "allocation by '%.200s' failed (%s): %s", type->tp_name,
                 e->kind, e->message);
  else
    PyErr_SetString(exc, e->message);
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
        raise_named(&e, h->type);
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
    *out = m;
    return 0;
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
 * for a framework the registry does not know), borrowed from the cache.
 * The registry (python/dlbridge/_frameworks.py, _c_converter) is asked once
 * per framework name; C keeps no list of frameworks of its own. */
static PyObject *converter_for(struct dlb_handler_cache *c, PyObject *fw) {
  PyObject *conv = PyDict_GetItemWithError(c->converters, fw);
  if (conv != NULL) return conv;
  if (PyErr_Occurred()) return NULL;
  /* fw is borrowed from a handler and Python code runs below. */
  Py_INCREF(fw);
  PyObject *registry = PyImport_Import(c->str_registry);
  if (registry != NULL) {
    conv = PyObject_CallMethod(registry, "_c_converter", "O", fw);
    Py_DECREF(registry);
  }
  if (conv != NULL) {
    int rc = PyDict_SetItem(c->converters, fw, conv);
    Py_DECREF(conv); /* the dict keeps it */
    conv = rc < 0 ? NULL : PyDict_GetItemWithError(c->converters, fw);
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
  if (t == NULL) return -1;
  if (conv == Py_None) {
    *out = t;
    return 0;
  }
  Py_INCREF(conv); /* borrowed from the dict; the call below runs Python */
  void *prev = dlb__stream_swap(stream);
  PyObject *res = PyObject_CallOneArg(conv, t);
  dlb__stream_swap(prev);
  Py_DECREF(conv);
  Py_DECREF(t);
  if (res == NULL) return -1;
  *out = res;
  return 0;
}
