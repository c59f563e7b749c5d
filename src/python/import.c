/*
 * import.c -- dlbridge.from_dlpack: turn anything tensor-like into a Tensor.
 * Only the policy lives here: which reader applies (readers.c), and what
 * the caller's device= and copy= ask of the result (plan, finish).
 *
 * Producers are tried in this order (the first that applies wins):
 *   a. a dlbridge Tensor (found through the per-type handler, below):
 *      returned as it is (or copied when asked);
 *   b. through the per-type handler (handlers.c): a type publishing a
 *      DLPack C exchange table (__dlpack_c_exchange_api__, or the 1.2
 *      __c_dlpack_exchange_api__) is imported through the table's owning
 *      export; numpy.ndarray has its fields read directly (try_handler());
 *   c. __dlpack__ / __dlpack_device__, versioned first, legacy on TypeError
 *      only when that loses nothing the caller asked for;
 *   d. raw PyCapsules named "dltensor_versioned" / "dltensor";
 *   e. legacy producers: obj.toDlpack() (old CuPy), and
 *      tensorflow.experimental.dlpack.to_dlpack(obj) for TensorFlow objects;
 *   f. the buffer protocol;
 *   g. __array_interface__ (version 3);
 *   h. __cuda_array_interface__ (imported as a kDLCUDA view; see readers.c).
 * Anything else is a TypeError naming the type.  Capsule ownership and the
 * stream passed to producers are written down in readers.c.
 *
 * Decisions written down (known-bugs section 3):
 *   3.1 copy=False when a copy is needed (another device) -> BufferError.
 *   3.3 versioned capsules with NULL strides are accepted (readers.c).
 *   3.4 unknown flag bits are ignored; READ_ONLY is kept on the Tensor.
 *   3.6 legacy ("dltensor") capsules import as WRITABLE (readers.c).
 *   3.7 raw capsules are accepted by from_dlpack.
 * Other choices:
 *   - device=: only the CPU can be a target today.  device=None or the
 *     object's own device keeps the data where it is.  CPU from pinned or
 *     managed host memory is a copy (BufferError with copy=False).  Any
 *     other move is a BufferError saying no device runtime is available.
 *   - copy=True gives a new, writable, CPU tensor owned by dlbridge.  The
 *     producer is asked to copy too (copy=True is passed on); when the
 *     capsule it returns carries IS_COPIED and not READ_ONLY we keep it as
 *     the copy, otherwise we copy again, because some producers copy
 *     without saying so and a copy that might alias is worse than two.
 */
#include "dlbridge_py.h"

#include <string.h>

/* ---- finishing: device and copy requests ----------------------------------- */

/* dtype used to copy src's elements: padded sub-byte elements are whole
 * bytes each, which dlb_copy handles only when told they are bytes. */
static DLDataType copy_dtype(DLDataType dt, uint64_t flags) {
  if ((flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) &&
      dlb_dtype_is_subbyte(dt)) {
    DLDataType u = {kDLUInt, 8, (uint16_t)dlb_dtype_itemsize(dt)};
    return u;
  }
  return dt;
}

/* A new writable CPU Tensor holding a copy of src (host-accessible). */
static PyObject *copy_to_cpu(dlb_module_state *st, const DLTensor *src,
                             uint64_t flags) {
  DLManagedTensorVersioned *n = NULL;
  dlb_error err;
  DLDevice cpu = {kDLCPU, 0};
  char dev[64];
  if (!dlb_device_is_host_accessible(src->device)) {
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: cannot copy from %s: no device runtime is "
                 "available to dlbridge yet (device memory support is not "
                 "implemented); copy it to the CPU in its own framework first",
                 dlb__device_str(src->device, dev, sizeof dev));
    return NULL;
  }
  bool padded = (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0;
  int rc = dlb_managed_empty(src->ndim, src->shape, src->dtype, cpu, padded,
                             &n, &err);
  if (rc != DLB_OK) return dlb__raise_import("cannot allocate the copy", &err);
  DLTensor s = *src, d = n->dl_tensor;
  s.dtype = copy_dtype(src->dtype, flags);
  d.dtype = copy_dtype(d.dtype, flags);
  rc = dlb_copy(&d, &s, &err);
  if (rc != DLB_OK) {
    dlb_managed_delete(n);
    return dlb__raise_import("cannot copy the tensor", &err);
  }
  return dlb__tensor_from_managed(st, n);
}

/* What the caller's device/copy request means for a tensor on `src` with
 * `flags`: 0 use as is, 1 copy to CPU, -1 error raised. */
static int plan(const DLDevice *target, int copy, DLDevice src,
                uint64_t flags) {
  char a[64], b[64];
  if (target != NULL && !dlb__same_device(*target, src)) {
    if (target->device_type != kDLCPU) {
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: cannot move data from %s to %s: dlbridge "
                   "has no device runtime yet, so only the CPU can be a "
                   "target; use device=None to keep the data where it is",
                   dlb__device_str(src, a, sizeof a),
                   dlb__device_str(*target, b, sizeof b));
      return -1;
    }
    if (copy == 0) {
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: moving data from %s to %s needs a copy, "
                   "but copy=False was given",
                   dlb__device_str(src, a, sizeof a),
                   dlb__device_str(*target, b, sizeof b));
      return -1;
    }
    return 1; /* copy_to_cpu reports non-host memory */
  }
  if (copy == 1) {
    /* A producer's own fresh, writable copy is as good as ours. */
    if ((flags & DLPACK_FLAG_BITMASK_IS_COPIED) &&
        !(flags & DLPACK_FLAG_BITMASK_READ_ONLY))
      return 0;
    return 1;
  }
  return 0;
}

/* Turn an owned, validated managed tensor into the Tensor the caller asked
 * for.  Steals m on every path. */
static PyObject *finish(dlb_module_state *st, DLManagedTensorVersioned *m,
                        const DLDevice *target, int copy) {
  int p = plan(target, copy, m->dl_tensor.device, m->flags);
  if (p < 0) {
    dlb__delete_keep_error(m);
    return NULL;
  }
  if (p == 0) return dlb__tensor_from_managed(st, m);
  PyObject *res = copy_to_cpu(st, &m->dl_tensor, m->flags);
  if (res == NULL)
    dlb__delete_keep_error(m);
  else
    dlb_managed_delete(m);
  return res;
}

/* ---- d. capsules, c. __dlpack__, f. buffers, g./h. array interfaces ---------- */

/* Import a capsule object that a producer returned or the user passed.
 * Does not steal cap. */
static PyObject *import_capsule(dlb_module_state *st, PyObject *cap,
                                const DLDevice *target, int copy,
                                const char *source) {
  DLManagedTensorVersioned *m = NULL;
  if (!PyCapsule_CheckExact(cap)) {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: %s returned %.200s, not a DLPack PyCapsule",
                 source, Py_TYPE(cap)->tp_name);
    return NULL;
  }
  if (dlb__consume_capsule(cap, &m) < 0) return NULL;
  return finish(st, m, target, copy);
}

static PyObject *import_dunder_dlpack(dlb_module_state *st, PyObject *obj,
                                      const DLDevice *target, int copy) {
  DLManagedTensorVersioned *m = NULL;
  if (dlb__dunder_dlpack_managed(st, obj, target, copy, &m) < 0) return NULL;
  return finish(st, m, target, copy);
}

static PyObject *import_buffer(dlb_module_state *st, PyObject *obj,
                               const DLDevice *target, int copy) {
  DLManagedTensorVersioned *m = NULL;
  if (dlb__buffer_managed(obj, &m) < 0) return NULL;
  return finish(st, m, target, copy);
}

static PyObject *import_array_interface(dlb_module_state *st, PyObject *obj,
                                        PyObject *ai, int cuda,
                                        const DLDevice *target, int copy) {
  DLManagedTensorVersioned *m = NULL;
  if (dlb__array_interface_dict_managed(obj, ai, cuda, &m) < 0) return NULL;
  return finish(st, m, target, copy);
}

/* ---- b. the per-type handler: exchange tables and NumPy ---------------------- */

/* dlb_release_fn for a NumPy import: drops the array the Tensor views.  Any
 * thread, with or without the GIL, even at shutdown (then it leaks). */
static void release_pyobject(void *ctx) {
  if (ctx != NULL) dlb__release_ref((PyObject *)ctx, 0);
}

/* Objects whose type the handler cache (handlers.c) reads directly: types
 * publishing a DLPack C exchange table, imported through the table's
 * managed_tensor_from_py_object_no_sync (an owning export, so the Tensor
 * may outlive any Python code), and numpy.ndarray, whose fields are read
 * without a Python call and wrapped with a reference to the array -- no
 * capsule, no __dlpack__ call.  1 with *out set when handled, 0 when
 * another path must handle obj, -1 on error. */
static int try_handler(dlb_module_state *st, PyObject *obj,
                       const DLDevice *target, int copy, PyObject **out) {
  const dlb_handler *h = dlb__handler_for(st, Py_TYPE(obj));
  if (h == NULL) return -1;
  DLManagedTensorVersioned *m = NULL;
  dlb_error err;
  if (h->kind == DLB_KIND_TENSOR) {
    /* Our own Tensor: returned as it is, or copied when asked. */
    dlb_TensorObject *self = (dlb_TensorObject *)obj;
    int p = plan(target, copy, self->t.device, 0);
    if (p < 0) return -1;
    *out = p == 0 ? Py_NewRef(obj) : copy_to_cpu(st, &self->t, self->flags);
    return *out != NULL ? 1 : -1;
  }
  if (h->kind == DLB_KIND_EXCHANGE) {
    /* What the table cannot say: lazy conj/neg bits are refused, a tensor
     * that requires grad is imported read-only (views.c). */
    int readonly = 0, ran_python = 0;
    if (dlb__check_bits(st, obj, 0, &readonly, &ran_python) < 0)
      return -1;
    if (h->api->managed_tensor_from_py_object_no_sync(obj, &m) != 0 ||
        m == NULL) {
      dlb__error_exchange_refusal(Py_TYPE(obj), "export");
      return -1;
    }
    if (dlb_managed_check_version(m, &err) != DLB_OK) {
      dlb__delete_keep_error(m); /* the spec: unknown major -> delete, read nothing */
      dlb__raise_import("unsupported DLPack version from the exchange table", &err);
      return -1;
    }
    if (dlb_tensor_validate(&m->dl_tensor, 0, &err) != DLB_OK) {
      dlb__delete_keep_error(m);
      dlb__raise_import("the exchange table's tensor cannot be imported", &err);
      return -1;
    }
    if (readonly) m->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    *out = finish(st, m, target, copy);
    return *out != NULL ? 1 : -1;
  }
  if (h->kind == DLB_KIND_NUMPY) {
    dlb_view v;
    if (dlb__view_get_with(st, h, obj, 0, &v) < 0) return -1;
    /* NUMPY views own nothing, so v needs no release; the managed tensor
     * keeps the array (and so its memory) alive instead. */
    Py_INCREF(obj);
    if (dlb_managed_wrap(&v.t, v.flags, release_pyobject, obj, &m, &err) !=
        DLB_OK) {
      Py_DECREF(obj); /* release is not called on failure */
      dlb__raise_import("cannot wrap the array", &err);
      return -1;
    }
    *out = finish(st, m, target, copy);
    return *out != NULL ? 1 : -1;
  }
  return 0;
}

/* ---- the entry points ---------------------------------------------------------- */

PyObject *dlb__import(dlb_module_state *st, PyObject *obj,
                      const DLDevice *device, int copy) {
  PyObject *attr = NULL, *result = NULL;
  int found;

  /* a. our own Tensor, b. exchange tables and NumPy: through the per-type
   * handler, which costs one cached pointer compare per type */
  found = try_handler(st, obj, device, copy, &result);
  if (found != 0) return found > 0 ? result : NULL;

  /* c. __dlpack__ */
  if (dlb__type_has(Py_TYPE(obj), st->str_dlpack))
    return import_dunder_dlpack(st, obj, device, copy);

  /* d. raw capsules */
  if (PyCapsule_CheckExact(obj))
    return import_capsule(st, obj, device, copy, "the capsule");

  /* e. legacy producers */
  found = dlb__legacy_producer_capsule(obj, &attr);
  if (found < 0) return NULL;
  if (found) {
    result = import_capsule(st, attr, device, copy, "the legacy producer");
    if (result == NULL)
      dlb__clear_keep_error(&attr);
    else
      Py_DECREF(attr);
    return result;
  }

  /* f. buffer protocol */
  if (PyObject_CheckBuffer(obj)) return import_buffer(st, obj, device, copy);

  /* g. __array_interface__, h. __cuda_array_interface__ */
  found = dlb__get_optional_attr(obj, st->str_array_interface, &attr);
  if (found < 0) return NULL;
  if (found) {
    result = import_array_interface(st, obj, attr, 0, device, copy);
    Py_DECREF(attr);
    return result;
  }
  found = dlb__get_optional_attr(obj, st->str_cuda_array_interface, &attr);
  if (found < 0) return NULL;
  if (found) {
    result = import_array_interface(st, obj, attr, 1, device, copy);
    Py_DECREF(attr);
    return result;
  }

  PyErr_Format(PyExc_TypeError,
               "from_dlpack: an object of type '%.200s' is not tensor-like: "
               "it has no __dlpack__, is not a DLPack capsule, exposes no "
               "buffer protocol and no __array_interface__ or "
               "__cuda_array_interface__",
               Py_TYPE(obj)->tp_name);
  return NULL;
}

PyObject *dlb__py_from_dlpack(PyObject *module, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  PyObject *device_obj = Py_None, *copy_obj = Py_None;
  DLDevice device;
  int copy = -1;

  if (nargs != 1) {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack() takes exactly 1 positional argument (%zd "
                 "given)",
                 nargs);
    return NULL;
  }
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; i++) {
    PyObject *name = PyTuple_GET_ITEM(kwnames, i);
    PyObject *value = args[nargs + i];
    if (name == st->str_copy || PyUnicode_CompareWithASCIIString(name, "copy") == 0) {
      copy_obj = value;
    } else if (PyUnicode_CompareWithASCIIString(name, "device") == 0) {
      device_obj = value;
    } else {
      PyErr_Format(PyExc_TypeError,
                   "from_dlpack() got an unexpected keyword argument '%U' "
                   "(it takes obj positionally, and device= and copy=)",
                   name);
      return NULL;
    }
  }
  if (copy_obj == Py_True) {
    copy = 1;
  } else if (copy_obj == Py_False) {
    copy = 0;
  } else if (copy_obj != Py_None) {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack(): copy must be True, False or None, not %.200s",
                 Py_TYPE(copy_obj)->tp_name);
    return NULL;
  }
  if (device_obj != Py_None) {
    if (dlb__device_converter(st, device_obj, &device) < 0) return NULL;
    return dlb__import(st, args[0], &device, copy);
  }
  return dlb__import(st, args[0], NULL, copy);
}
