/*
 * capi.c -- the dlbridge._C_API capsule: the table of include/dlbridge/python.h
 * that C extensions import (NumPy's import_array() pattern).
 *
 * Every entry is a thin shell over the functions dlbridge itself uses
 * (views.c, handlers.c, outputs.c, import.c, convert.c, export.c), so
 * extensions read
 * each framework exactly the way dlbridge itself does.
 *
 * One table per module instance (sub-interpreters, re-created modules): it is
 * allocated in exec together with the module state it serves, and entries
 * find that state through the table pointer they are given.  The capsule
 * holds a strong reference to the module, so the state outlives every
 * extension still holding the table even when dlbridge._core leaves
 * sys.modules; the cycle module -> dict -> capsule -> module is broken when
 * the interpreter clears module dicts at shutdown, which frees both.
 */
#include <stddef.h>
#include <string.h>

#include "dlbridge_py.h"
#include "dlbridge/python.h"

/* The public view must hold the internal one, with the public fields at the
 * same places, for every build of this major version. */
_Static_assert(sizeof(dlb_view) <= sizeof(dlb_py_view),
               "dlb_view outgrew dlb_py_view: bump DLB_CAPI_MAJOR");
_Static_assert(_Alignof(dlb_view) <= _Alignof(dlb_py_view),
               "dlb_view needs more alignment than dlb_py_view gives");
_Static_assert(offsetof(dlb_view, t) == offsetof(dlb_py_view, tensor),
               "dlb_view.t must overlay dlb_py_view.tensor");
_Static_assert(offsetof(dlb_view, flags) == offsetof(dlb_py_view, flags),
               "dlb_view.flags must overlay dlb_py_view.flags");
_Static_assert(offsetof(dlb_capi, abi_version) == 0 &&
                   offsetof(dlb_capi, size) == 4,
               "the version fields of dlb_capi never move");

typedef struct {
  dlb_capi api;           /* first: entries receive &instance->api */
  dlb_module_state *st;   /* the module this table serves */
  PyObject *module;       /* strong: keeps st alive, see header comment */
} capi_instance;

static inline dlb_module_state *state_of(const dlb_capi *api) {
  return ((const capi_instance *)api)->st;
}

/* ---- views ------------------------------------------------------------------ */

static int capi_view_get(const dlb_capi *api, PyObject *obj, unsigned flags,
                         dlb_py_view *view) {
  unsigned options = 0;
  dlb_view *v;
  if (obj == NULL || view == NULL) {
    PyErr_SetString(PyExc_ValueError,
                    "dlb_py_view_get: obj and view must not be NULL");
    return -1;
  }
  /* Unknown bits may mean something in a later minor version; refusing them
   * keeps an extension from silently losing the guarantee it asked for. */
  if (flags & ~(unsigned)DLB_PY_VIEW_WRITABLE) {
    PyErr_Format(PyExc_ValueError, "dlb_py_view_get: unknown flags 0x%x",
                 flags & ~(unsigned)DLB_PY_VIEW_WRITABLE);
    return -1;
  }
  if (flags & DLB_PY_VIEW_WRITABLE) options |= DLB_VIEW_WRITABLE;
  v = (dlb_view *)(void *)view;
  if (dlb__view_get(state_of(api), obj, options, v) < 0) return -1;
  /* Producers older than DLPack 1.2 may send NULL strides for compact
   * tensors; the C API promises strides, so extension loops need no special
   * case.  The view's own scratch holds them (unless the shape lives there,
   * which views.c does only for 1-d buffers, whose strides are set). */
  if (v->t.ndim > 0 && v->t.strides == NULL) {
    dlb_error err;
    uintptr_t sh = (uintptr_t)v->t.shape, lo = (uintptr_t)v->strides_storage;
    if ((sh >= lo && sh < lo + (uintptr_t)v->t.ndim * sizeof(int64_t)) ||
        dlb_strides_row_major(v->t.ndim, v->t.shape, v->strides_storage,
                              &err) < 0) {
      dlb__view_release(v);
      PyErr_SetString(PyExc_BufferError,
                      "dlb_py_view_get: cannot synthesise the strides of a "
                      "tensor sent without them");
      return -1;
    }
    v->t.strides = v->strides_storage;
  }
  return 0;
}

static void capi_view_release(const dlb_capi *api, dlb_py_view *view) {
  (void)api;
  if (view != NULL) dlb__view_release((dlb_view *)(void *)view);
}

/* ---- import / export ---------------------------------------------------------- */

static int capi_import_managed(const dlb_capi *api, PyObject *obj,
                               DLManagedTensorVersioned **out) {
  dlb_module_state *st = state_of(api);
  PyObject *tensor = NULL;
  dlb_error err;
  int rc = -1;

  if (obj == NULL || out == NULL) {
    PyErr_SetString(PyExc_ValueError,
                    "dlb_py_import: obj and out must not be NULL");
    goto done;
  }
  /* from_dlpack's full import (validation, read-only kept, every producer
   * path), then an export of that Tensor: the managed tensor holds the
   * Tensor, which holds the producer's memory. */
  tensor = dlb__import(st, obj, NULL, -1);
  if (tensor == NULL) goto done;
  if (dlb__tensor_export_managed((dlb_TensorObject *)tensor, out, &err) < 0) {
    dlb__raise(&err);
    goto done;
  }
  rc = 0;
done:
  Py_XDECREF(tensor);
  return rc;
}

static int capi_export_managed(const dlb_capi *api, DLManagedTensorVersioned *m,
                               const char *framework, PyObject *like,
                               PyObject **out) {
  dlb_module_state *st = state_of(api);
  const dlb_handler *h = NULL;
  /* like's type, held while its handler is used: the handler lives as long
   * as the type, and handing the result over runs Python code. */
  PyObject *like_type = NULL;
  PyObject *name = NULL, *tensor = NULL, *result = NULL;
  dlb_error err;
  int rc = -1;

  if (m == NULL || out == NULL) {
    PyErr_SetString(PyExc_ValueError,
                    "dlb_py_export: m and out must not be NULL");
    goto done;
  }
  if (framework != NULL && like != NULL) {
    PyErr_SetString(PyExc_ValueError,
                    "dlb_py_export: give a framework name or a like object, "
                    "not both");
    goto done;
  }
  /* The tensor came from C code we do not control: check it before any
   * framework reads it, so a bad one is an exception, not a crash. */
  if (dlb_managed_check_version(m, &err) < 0 ||
      dlb_tensor_validate(&m->dl_tensor, 0, &err) < 0) {
    PyErr_Format(PyExc_BufferError,
                 "dlb_py_export: the managed tensor cannot be exported: %s",
                 err.message);
    goto done;
  }

  if (like != NULL) {
    /* like's class held while its handler is read: classifying it runs
     * Python code, which may give like another class and free this one. */
    h = dlb__handler_held(st, like, (PyTypeObject **)&like_type);
    if (h == NULL) goto done;
    if (h->kind == DLB_KIND_NONE) {
      PyErr_Format(PyExc_TypeError,
                   "dlb_py_export: like must be tensor-like, not %.200s",
                   Py_TYPE(like)->tp_name);
      goto done;
    }
    /* Held: the handler is not used once Python code has run below. */
    name = Py_NewRef(h->framework);
    h = NULL;
    Py_CLEAR(like_type);
  } else if (framework == NULL || strcmp(framework, "dlbridge") == 0) {
    rc = 0;
    result = dlb__tensor_from_managed(st, m);
    m = NULL; /* stolen, on failure too */
    if (result == NULL) rc = -1;
    goto done;
  } else {
    name = PyUnicode_DecodeUTF8(framework, (Py_ssize_t)strlen(framework),
                                "strict");
    if (name == NULL) {
      /* Not a name the registry could know: a bad value, not a codec
       * problem of the caller's. */
      if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError,
                        "dlb_py_export: the framework name is not UTF-8");
      }
      goto done;
    }
  }

  /* Every target, by name or like=, goes through convert's rules (read-only
   * data into torch is copied whichever way torch is named), so an
   * extension's results are what dlbridge.convert would give.  A like= of a
   * framework that is no convert target is handed to it the way Function
   * hands results back (dlb__to_framework: a dlbridge.Tensor when the
   * registry does not know it); an unknown name is the registry's
   * ValueError. */
  tensor = dlb__tensor_from_managed(st, m);
  m = NULL; /* stolen, on failure too */
  if (tensor == NULL) goto done;
  if (like != NULL) {
    int known = dlb__convert_is_target(st, name);
    if (known < 0) goto done;
    if (!known) {
      /* The handler is looked up only now, after the Python code above. */
      h = dlb__handler_held(st, like, (PyTypeObject **)&like_type);
      if (h == NULL) goto done;
      DLManagedTensorVersioned *e = NULL;
      if (dlb__tensor_export_managed((dlb_TensorObject *)tensor, &e, &err) <
          0) {
        dlb__raise(&err);
        goto done;
      }
      rc = dlb__to_framework(st, h, e, &result); /* steals e */
      if (rc < 0) result = NULL;
      goto done;
    }
  }
  result = dlb__convert(st, tensor, like != NULL ? like : name, NULL, -1);
  if (result != NULL) rc = 0;
done:
  if (m != NULL) {
    /* The deleter may run Python code (a DECREF reaching __del__, a ctypes
     * callback): it must not see the exception we are about to return. */
    dlb__delete_keep_error(m);
  }
  Py_XDECREF(name);
  Py_XDECREF(tensor);
  if (like_type != NULL) dlb__clear_keep_error(&like_type);
  if (rc == 0)
    *out = result;
  else
    Py_XDECREF(result);
  return rc;
}

/* ---- allocation and streams ------------------------------------------------- */

static int capi_alloc_like(const dlb_capi *api, PyObject *like, int32_t ndim,
                           const int64_t *shape, DLDataType dtype,
                           DLManagedTensorVersioned **out) {
  dlb_module_state *st = state_of(api);
  dlb_view view;
  DLTensor prototype;
  dlb_error err;
  int32_t i;

  if (like == NULL || out == NULL || (ndim > 0 && shape == NULL)) {
    PyErr_SetString(PyExc_ValueError,
                    "dlb_py_alloc_like: like, out and shape must not be NULL");
    return -1;
  }
  if (ndim < 0 || ndim > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_ValueError,
                 "dlb_py_alloc_like: ndim %d is outside [0, %d]", (int)ndim,
                 DLB_MAX_NDIM);
    return -1;
  }
  for (i = 0; i < ndim; i++) {
    if (shape[i] < 0) {
      PyErr_Format(PyExc_ValueError,
                   "dlb_py_alloc_like: shape[%d] is negative (%lld)", (int)i,
                   (long long)shape[i]);
      return -1;
    }
  }
  if (dlb_dtype_check(dtype, &err) < 0) {
    PyErr_Format(PyExc_ValueError, "dlb_py_alloc_like: %s", err.message);
    return -1;
  }
  /* A borrowed view is the cheapest way to learn like's device.  Its
   * handler is not kept: releasing the view may run Python code (a
   * producer's deleter) that reassigns like's class and frees the old type
   * with its handler, so the handler is looked up again afterwards. */
  if (dlb__view_get(st, like, 0, &view) < 0) return -1;
  memset(&prototype, 0, sizeof prototype);
  prototype.device = view.t.device;
  prototype.ndim = ndim;
  prototype.dtype = dtype;
  prototype.shape = (int64_t *)(uintptr_t)shape;
  dlb__view_release(&view);
  {
    /* Held while h is used: allocating runs the framework's Python code. */
    PyTypeObject *type = NULL;
    const dlb_handler *h = dlb__handler_held(st, like, &type);
    if (h == NULL) return -1;
    int rc = dlb__alloc_like(st, h, &prototype, out);
    dlb__clear_keep_error((PyObject **)&type);
    return rc;
  }
}

static int capi_current_stream(const dlb_capi *api, PyObject *obj,
                               void **stream) {
  dlb_module_state *st = state_of(api);
  dlb_view view;
  int rc;
  if (obj == NULL || stream == NULL) {
    PyErr_SetString(PyExc_ValueError,
                    "dlb_py_current_stream: obj and stream must not be NULL");
    return -1;
  }
  /* The device from a view; the handler looked up again after it is
   * released (which may run Python code: a producer's deleter), with
   * obj's class held while the framework is asked (Python code again). */
  if (dlb__view_get(st, obj, 0, &view) < 0) return -1;
  DLDevice device = view.t.device;
  dlb__view_release(&view);
  PyTypeObject *type = NULL;
  const dlb_handler *h = dlb__handler_held(st, obj, &type);
  if (h == NULL) return -1;
  rc = dlb__current_stream(st, h, device, stream);
  dlb__clear_keep_error((PyObject **)&type);
  return rc;
}

static PyObject *capi_raise_error(const dlb_capi *api, const dlb_error *err) {
  (void)api;
  if (err == NULL) {
    PyErr_SetString(PyExc_ValueError, "dlb_py_raise: err must not be NULL");
    return NULL;
  }
  if (err->code == DLB_OK) {
    /* A caller raising "success" has lost track of its error; say so rather
     * than returning NULL with no exception set (a SystemError later). */
    PyErr_SetString(PyExc_RuntimeError,
                    "dlb_py_raise called with DLB_OK (no error recorded)");
    return NULL;
  }
  return dlb__raise(err);
}

/* ---- the capsule -------------------------------------------------------------- */

static void capsule_destructor(PyObject *capsule) {
  capi_instance *inst =
      (capi_instance *)PyCapsule_GetPointer(capsule, DLB_CAPI_CAPSULE_NAME);
  if (inst == NULL) {
    PyErr_Clear();
    return;
  }
  Py_CLEAR(inst->module);
  PyMem_RawFree(inst);
}

int dlb__capi_init(PyObject *module, dlb_module_state *st) {
  capi_instance *inst;
  PyObject *capsule;

  /* Raw allocator: the destructor may run late in interpreter shutdown. */
  inst = (capi_instance *)PyMem_RawCalloc(1, sizeof *inst);
  if (inst == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  inst->api.abi_version = DLB_CAPI_VERSION;
  inst->api.size = (uint32_t)sizeof(dlb_capi);
  inst->api.view_size = (uint32_t)sizeof(dlb_view);
  inst->api.view_get = capi_view_get;
  inst->api.view_release = capi_view_release;
  inst->api.import_managed = capi_import_managed;
  inst->api.export_managed = capi_export_managed;
  inst->api.alloc_like = capi_alloc_like;
  inst->api.current_stream = capi_current_stream;
  inst->api.raise_error = capi_raise_error;
  inst->st = st;

  capsule = PyCapsule_New(inst, DLB_CAPI_CAPSULE_NAME, capsule_destructor);
  if (capsule == NULL) {
    PyMem_RawFree(inst);
    return -1;
  }
  /* From here the capsule owns inst (and, below, the module reference). */
  Py_INCREF(module);
  inst->module = module;
  if (PyCapsule_SetContext(capsule, st) < 0 ||
      PyModule_AddObjectRef(module, DLB_CAPI_ATTRIBUTE, capsule) < 0) {
    Py_DECREF(capsule);
    return -1;
  }
  Py_DECREF(capsule);
  return 0;
}
