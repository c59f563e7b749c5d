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
 *      export; numpy.ndarray has its fields read directly
 *      (try_handler_held());
 *   c. __dlpack__ / __dlpack_device__, versioned first, then without the
 *      2023.12 keywords on TypeError (the device and copy requests are then
 *      carried out here, by plan());
 *   d. raw PyCapsules named "dltensor_versioned" / "dltensor";
 *   e. legacy producers: obj.toDlpack() (old CuPy), obj.to_dlpack() (cuDF),
 *      MXNet's to_dlpack_for_write() / to_dlpack_for_read() (read-only),
 *      and tensorflow.experimental.dlpack.to_dlpack(obj) for TensorFlow
 *      objects;
 *   f. the buffer protocol;
 *   g. __array_interface__ (version 3);
 *   h. __cuda_array_interface__ (imported as a kDLCUDA view; see readers.c).
 * Anything else is a TypeError naming the type.  c. to h. are the owning
 * rungs of the one ladder (dlb__read_owned, readers.c) that Function and
 * the C API use too, so an object one accepts the others accept.  Capsule ownership and the
 * stream passed to producers are written down in readers.c.
 *
 * Decisions written down (known-bugs section 3):
 *   3.1 copy=False when a copy is needed (another device) -> BufferError.
 *   3.3 versioned capsules with NULL strides are accepted (readers.c).
 *   3.4 unknown flag bits are ignored; READ_ONLY is kept on the Tensor.
 *   3.6 legacy ("dltensor") capsules import as WRITABLE (readers.c).
 *   3.7 raw capsules are accepted by from_dlpack.
 * Other choices:
 *   - device=: None or the object's own device keeps the data where it
 *     is.  Another device -- the CPU, 'cuda:N', 'cuda_host' -- is a copy
 *     (BufferError with copy=False), made by dlbridge (cuda.c) on its
 *     current stream: producers of CUDA data are asked for a view, never
 *     for dl_device or copy=True, so every framework's data moves the same
 *     way.  Devices dlbridge cannot copy between are a BufferError.
 *   - copy=True gives a new, writable tensor owned by dlbridge, on the
 *     CUDA device for CUDA data, else on the CPU (or on device=).  A host
 *     producer is asked to copy too (copy=True is passed on); when the
 *     capsule it returns carries IS_COPIED and not READ_ONLY we keep it as
 *     the copy, otherwise we copy again, because some producers copy
 *     without saying so and a copy that might alias is worse than two.
 *   - Streams: a CUDA tensor imported through an exchange table (which
 *     exports without synchronising) has the producer's current_work_stream
 *     ordered before dlbridge's current stream; __dlpack__ producers are
 *     given that stream (readers.c).
 */
#include "dlbridge_py.h"

#include <string.h>

/* ---- finishing: device and copy requests ----------------------------------- */

/* Where a copy of data on src goes when the caller named no device: CUDA
 * device memory stays on its device, everything else lands on the CPU. */
static DLDevice copy_target(const DLDevice *target, DLDevice src) {
  if (target != NULL) return *target;
  if (src.device_type == kDLCUDA) return src;
  DLDevice cpu = {kDLCPU, 0};
  return cpu;
}

/* A new writable Tensor on target holding a copy of src (cuda.c copies
 * between host and CUDA memory on dlbridge's current stream). */
static PyObject *copy_to(dlb_module_state *st, const DLTensor *src,
                         uint64_t flags, DLDevice target) {
  DLManagedTensorVersioned *n = NULL;
  if (dlb__copy_managed(src, flags, target, "from_dlpack", &n) < 0)
    return NULL;
  return dlb__tensor_from_managed(st, n);
}

/* What the caller's device/copy request means for a tensor on `src` with
 * `flags`: 0 use as is, 1 copy (to copy_target), -1 error raised. */
static int plan(const DLDevice *target, int copy, DLDevice src,
                uint64_t flags) {
  char a[64], b[64];
  if (target != NULL && !dlb__same_device(*target, src)) {
    if (copy == 0) {
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: moving data from %s to %s needs a copy, "
                   "but copy=False was given",
                   dlb__device_str(src, a, sizeof a),
                   dlb__device_str(*target, b, sizeof b));
      return -1;
    }
    return 1; /* dlb__copy_managed reports devices it cannot copy between */
  }
  if (copy == 0 && (flags & DLPACK_FLAG_BITMASK_IS_COPIED)) {
    /* A producer asked without copy= (too old for the keyword, readers.c)
     * may still copy, and says so only through this flag. */
    PyErr_SetString(PyExc_BufferError,
                    "from_dlpack: copy=False was given, but the producer "
                    "returned a copy (its capsule says IS_COPIED)");
    return -1;
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

/* Our own Tensor obj: returned as it is, or copied when asked. */
static PyObject *import_own(dlb_module_state *st, PyObject *obj,
                            const DLDevice *target, int copy) {
  dlb_TensorObject *self = (dlb_TensorObject *)obj;
  int p = plan(target, copy, self->t.device, 0);
  if (p < 0) return NULL;
  return p == 0 ? Py_NewRef(obj)
                : copy_to(st, &self->t, self->flags,
                          copy_target(target, self->t.device));
}

/* Turn an owned, validated managed tensor into the Tensor the caller asked
 * for.  Steals m on every path. */
static PyObject *finish(dlb_module_state *st, DLManagedTensorVersioned *m,
                        const DLDevice *target, int copy) {
  PyObject *src = dlb__export_source(m);
  /* An export carries its Tensor's flags unless a reader added READ_ONLY
   * since (MXNet's to_dlpack_for_read): then it is not the Tensor's view. */
  if (src != NULL && ((m->flags ^ ((dlb_TensorObject *)src)->flags) &
                      DLPACK_FLAG_BITMASK_READ_ONLY))
    src = NULL;
  if (src == NULL) src = dlb__tensor_find_exported(&m->dl_tensor, m->flags);
  if (src != NULL) {
    /* One of our own zero-copy exports come back (a capsule from
     * Tensor.__dlpack__, directly or through a producer that forwards it),
     * or another framework's tensor over exactly an exported Tensor's
     * memory (tensor.c): the Tensor itself, with the same view and flags,
     * rather than a new Tensor wrapping the export -- round trips in a loop
     * must not build a chain of objects each keeping the last alive. */
    Py_INCREF(src);
    dlb__delete_keep_error(m);
    PyObject *res = import_own(st, src, target, copy);
    Py_DECREF(src);
    return res;
  }
  int p = plan(target, copy, m->dl_tensor.device, m->flags);
  if (p < 0) {
    dlb__delete_keep_error(m);
    return NULL;
  }
  if (p == 0) return dlb__tensor_from_managed(st, m);
  PyObject *res = copy_to(st, &m->dl_tensor, m->flags,
                          copy_target(target, m->dl_tensor.device));
  if (res == NULL)
    dlb__delete_keep_error(m);
  else
    dlb_managed_delete(m);
  return res;
}

/* ---- b. the per-type handler: exchange tables and NumPy ---------------------- */

/* Objects whose type the handler cache (handlers.c) reads directly: types
 * publishing a DLPack C exchange table, imported through the table's
 * managed_tensor_from_py_object_no_sync (an owning export, so the Tensor
 * may outlive any Python code), and numpy.ndarray, whose fields are read
 * without a Python call and wrapped with a reference to the array -- no
 * capsule, no __dlpack__ call.  1 with *out set when handled, 0 when
 * another path must handle obj, -1 on error.  h lives as long as its type,
 * which dlb__import holds: torch's checks and the conversions may run
 * Python code that reassigns obj's class. */
static int try_handler_held(dlb_module_state *st, PyObject *obj,
                            const dlb_handler *h, const DLDevice *target,
                            int copy, PyObject **out) {
  DLManagedTensorVersioned *m = NULL;
  dlb_error err;
  if (h->kind == DLB_KIND_TENSOR) {
    *out = import_own(st, obj, target, copy);
    return *out != NULL ? 1 : -1;
  }
  if (h->kind == DLB_KIND_EXCHANGE) {
    int readonly = 0, ran_python = 0;
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
    /* What the table cannot say: lazy conj/neg bits are refused, a tensor
     * that requires grad is imported read-only (views.c). */
    if (dlb__check_bits(st, obj, 0, m->dl_tensor.dtype, &readonly,
                        &ran_python) < 0) {
      dlb__delete_keep_error(m);
      return -1;
    }
    if (readonly) m->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    /* The table exports without synchronising: order the producer's
     * current stream before dlbridge's, as __dlpack__ would have. */
    if (dlb__is_cuda_device(m->dl_tensor.device)) {
      void *producer = NULL;
      if (dlb__current_stream(st, h, m->dl_tensor.device, &producer) < 0 ||
          dlb__stream_order_before_current(m->dl_tensor.device,
                                           producer) < 0) {
        dlb__delete_keep_error(m);
        return -1;
      }
    }
    *out = finish(st, m, target, copy);
    return *out != NULL ? 1 : -1;
  }
  if (h->kind == DLB_KIND_CUDA_ARRAY_INTERFACE &&
      dlb__type_has(Py_TYPE(obj), st->str_dlpack)) {
    /* A DLPack producer read through its CAI instead (handlers.c: CuPy). */
    if (dlb__array_interface_managed(st, obj, 1, &m) < 0) return -1;
    *out = finish(st, m, target, copy);
    return *out != NULL ? 1 : -1;
  }
  if (h->kind == DLB_KIND_NUMPY) {
    dlb_view v;
    if (dlb__view_get_with(st, h, obj, 0, &v) < 0) return -1;
    /* NUMPY views own nothing, so v needs no release; the managed tensor
     * keeps the array (and so its memory) alive instead. */
    Py_INCREF(obj);
    if (dlb_managed_wrap(&v.t, v.flags, dlb__owner_release, obj, &m, &err) !=
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

/* One reading of obj, routed by h, the handler of its class type (held). */
static PyObject *import_routed(dlb_module_state *st, PyObject *obj,
                               const dlb_handler *h, const DLDevice *device,
                               int copy) {
  PyObject *result = NULL;
  DLManagedTensorVersioned *m = NULL;
  int found;

  /* a. our own Tensor, b. exchange tables and NumPy: through the per-type
   * handler, which costs one cached pointer compare per type */
  found = try_handler_held(st, obj, h, device, copy, &result);
  if (found != 0) return found > 0 ? result : NULL;

  /* c.-h.: the ladder's owning rungs, shared with Function and the C API */
  found = dlb__read_owned(st, obj, device, copy, &m);
  if (found < 0) return NULL;
  if (found) return finish(st, m, device, copy);

  PyErr_Format(PyExc_TypeError,
               "from_dlpack: an object of type '%.200s' is not tensor-like: "
               "it has no __dlpack__, is not a DLPack capsule, exposes no "
               "buffer protocol and no __array_interface__ or "
               "__cuda_array_interface__",
               Py_TYPE(obj)->tp_name);
  return NULL;
}

/* The route (the handler, then the ladder) is chosen from obj's class,
 * held meanwhile; when Python code on the way (__dlpack_device__, a
 * property, another thread) gave obj another class and the reading failed
 * -- the old class's __dlpack__ gone, say -- obj is read again by its new
 * class (dlb__reread), so the answer is one of the classes' own. */
PyObject *dlb__import(dlb_module_state *st, PyObject *obj,
                      const DLDevice *device, int copy) {
  int tries = 0;
  for (;;) {
    PyTypeObject *type = NULL;
    const dlb_handler *h = dlb__handler_held(st, obj, &type);
    if (h == NULL) return NULL;
    PyObject *result = import_routed(st, obj, h, device, copy);
    if (result == NULL && dlb__reread(obj, type, &tries)) {
      Py_DECREF(type);
      continue;
    }
    dlb__clear_keep_error((PyObject **)&type);
    return result;
  }
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
  if (dlb__copy_converter(copy_obj, "from_dlpack", &copy) < 0) return NULL;
  if (device_obj != Py_None) {
    if (dlb__device_converter(st, device_obj, &device) < 0) return NULL;
    return dlb__import(st, args[0], &device, copy);
  }
  return dlb__import(st, args[0], NULL, copy);
}
