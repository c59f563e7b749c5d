/*
 * export.c -- Tensor.__dlpack__ and Tensor.__dlpack_device__: capsule
 * creation, keyword negotiation and the managed tensor that keeps a Tensor
 * alive while a consumer holds its memory.
 *
 * Ownership: every export is ONE allocation (dlb_managed_wrap: struct, shape
 * and strides together) holding a strong reference to the Tensor, dropped by
 * release_tensor() when the consumer calls the deleter.  A copy (copy=True,
 * or a different dl_device) is an owning tensor of its own (dlb_managed_empty)
 * and holds no Python reference at all.
 *
 * Decisions recorded here (known-bugs.md section 3, DESIGN.md):
 *
 *  - Version.  A versioned capsule reports {1, 3} (what dlb_managed_wrap and
 *    dlb_managed_empty write): strides are always filled for ndim > 0 (the
 *    1.2 rule), flags are exact (READ_ONLY, IS_COPIED, IS_SUBBYTE_TYPE_PADDED)
 *    and no 1.3 rule concerns a tensor beyond those.  Any max_version with
 *    major >= 1 gets it (same major, so a (1, 0) consumer can read it, as
 *    PyTorch does); max_version None or major 0 gets the legacy "dltensor".
 *  - Legacy export of a READ_ONLY tensor is a BufferError (the legacy struct
 *    cannot say read-only), raised before anything is allocated.  With
 *    copy=True the copy is writable, so a legacy export succeeds.
 *  - stream on stream-less devices (CPU and host memory): None and -1 ("no
 *    synchronisation") are accepted as no-ops; any other int is a ValueError
 *    (NumPy raises ValueError for stream=1 on CPU).  A non-int stream is a
 *    TypeError.  On CUDA: 0 is a ValueError (disallowed by the spec), other
 *    values >= -1 are accepted; on ROCm 1 and 2 are ValueError.  A dlbridge
 *    Tensor has no work of its own in flight (its producer's work was
 *    ordered when it was imported), so no event is ever recorded and
 *    nothing here can break CUDA graph capture.
 *  - dl_device equal to the tensor's device: no copy.  (1, 0) for a tensor
 *    in other host-accessible memory: a copy to the CPU (BufferError with
 *    copy=False).  Any other device: BufferError naming it.
 *  - copy=True always copies into a new contiguous CPU tensor (IS_COPIED set,
 *    writable); copy=False never copies.  copy must be a bool or None.
 *  - byte_offset is folded into data for CPU, CUDA and ROCm memory kinds
 *    (their data pointers are plain addresses); for other devices (OpenCL
 *    handles and the like) it is passed on unchanged.
 */
#include "dlbridge_py.h"

#include <string.h>

static const char kVersionedName[] = "dltensor_versioned";
static const char kLegacyName[] = "dltensor";

#define AS_TENSOR(o) ((dlb_TensorObject *)(o))

/* ---- error-indicator preservation --------------------------------------------- */

typedef struct {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject *exc;
#else
  PyObject *type, *value, *tb;
#endif
} saved_error;

static void save_error(saved_error *s) {
#if PY_VERSION_HEX >= 0x030C0000
  s->exc = PyErr_GetRaisedException();
#else
  PyErr_Fetch(&s->type, &s->value, &s->tb);
#endif
}

static void restore_error(saved_error *s) {
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(s->exc);
#else
  PyErr_Restore(s->type, s->value, s->tb);
#endif
}

static int interpreter_finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

/* ---- the exported managed tensor ------------------------------------------------ */

/* release of every zero-copy export: drop the reference to the Tensor.  The
 * deleter may run on any thread, with or without the GIL, from non-Python
 * code, and after the interpreter is gone: leak rather than touch a dead
 * or dying interpreter; otherwise take the GIL ourselves and leave any
 * in-flight exception as we found it. */
static void release_tensor(void *ctx) {
  if (ctx == NULL) return;
  if (!Py_IsInitialized() || interpreter_finalizing()) return;
  PyGILState_STATE g = PyGILState_Ensure();
  if (PyErr_Occurred()) {
    /* e.g. a consumer dropping our tensor while an error propagates */
    saved_error s;
    save_error(&s);
    Py_DECREF((PyObject *)ctx);
    restore_error(&s);
  } else {
    Py_DECREF((PyObject *)ctx);
  }
  PyGILState_Release(g);
}

/* Memory kinds whose data pointer is a plain address, so that data +
 * byte_offset is meaningful to compute on the host. */
static int address_device(DLDeviceType t) {
  switch (t) {
    case kDLCPU:
    case kDLCUDA:
    case kDLCUDAHost:
    case kDLCUDAManaged:
    case kDLROCM:
    case kDLROCMHost:
      return 1;
    default:
      return 0;
  }
}

int dlb__tensor_export_managed(dlb_TensorObject *self,
                               DLManagedTensorVersioned **out,
                               dlb_error *err) {
  DLTensor view = self->t;
  if (address_device(view.device.device_type) && view.data != NULL) {
    view.data = (char *)view.data + view.byte_offset;
    view.byte_offset = 0;
  }
  /* IS_COPIED describes the export, not the tensor: sharing our memory is
   * never a copy made for this consumer. */
  uint64_t flags = self->flags & ~(uint64_t)DLPACK_FLAG_BITMASK_IS_COPIED;
  Py_INCREF(self);
  int rc = dlb_managed_wrap(&view, flags, release_tensor, self, out, err);
  if (rc != DLB_OK) Py_DECREF(self); /* release is not called on failure */
  return rc;
}

/* A new contiguous owning CPU copy of self, IS_COPIED and writable. */
static int export_copy(dlb_TensorObject *self, DLManagedTensorVersioned **out,
                       dlb_error *err) {
  DLManagedTensorVersioned *m = NULL;
  DLDevice cpu = {kDLCPU, 0};
  bool padded = (self->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0;
  int rc = dlb_managed_empty(self->t.ndim, self->t.shape, self->t.dtype, cpu,
                             padded, &m, err);
  if (rc != DLB_OK) return rc;
  rc = dlb_copy(&m->dl_tensor, &self->t, err);
  if (rc != DLB_OK) {
    dlb_managed_delete(m); /* owns its data, touches no Python */
    return rc;
  }
  m->flags |= DLPACK_FLAG_BITMASK_IS_COPIED;
  *out = m;
  return DLB_OK;
}

/* ---- capsules ------------------------------------------------------------------------ */

/* Capsule destructors act only on a capsule nobody consumed (a consumer
 * renames it to "used_..." when it takes ownership).  PyCapsule_IsValid
 * never sets an error, and the error indicator is saved around the deleter
 * because a capsule is often dropped while an exception is propagating. */
static void versioned_capsule_destructor(PyObject *capsule) {
  if (!PyCapsule_IsValid(capsule, kVersionedName)) return;
  saved_error s;
  save_error(&s);
  DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, kVersionedName);
  if (m == NULL)
    PyErr_WriteUnraisable(capsule);
  else
    dlb_managed_delete(m);
  restore_error(&s);
}

static void legacy_capsule_destructor(PyObject *capsule) {
  if (!PyCapsule_IsValid(capsule, kLegacyName)) return;
  saved_error s;
  save_error(&s);
  DLManagedTensor *m = PyCapsule_GetPointer(capsule, kLegacyName);
  if (m == NULL)
    PyErr_WriteUnraisable(capsule);
  else
    dlb_managed_delete_legacy(m);
  restore_error(&s);
}

/* Wrap m in a capsule of the right kind; m is consumed on every path. */
static PyObject *make_capsule(DLManagedTensorVersioned *m, int versioned) {
  PyObject *cap = NULL;
  if (versioned) {
    cap = PyCapsule_New(m, kVersionedName, versioned_capsule_destructor);
    if (cap == NULL) {
      saved_error s;
      save_error(&s);
      dlb_managed_delete(m);
      restore_error(&s);
    }
    return cap;
  }
  DLManagedTensor *legacy = NULL;
  dlb_error err;
  if (dlb_managed_to_legacy(m, &legacy, &err) != DLB_OK) {
    dlb_managed_delete(m); /* still ours on failure */
    return dlb__raise(&err);
  }
  cap = PyCapsule_New(legacy, kLegacyName, legacy_capsule_destructor);
  if (cap == NULL) {
    saved_error s;
    save_error(&s);
    dlb_managed_delete_legacy(legacy); /* runs m's deleter too */
    restore_error(&s);
  }
  return cap;
}

/* ---- __dlpack__ ------------------------------------------------------------------------ */

/* Where the value of keyword key goes; NULL for an unknown keyword.
 * Interned names (the usual case from Python call sites) match by pointer
 * in the first pass; only then are values compared. */
static PyObject **kw_slot(dlb_module_state *st, PyObject *key,
                          PyObject **stream, PyObject **max_version,
                          PyObject **dl_device, PyObject **copy) {
  PyObject *names[4] = {st->str_stream, st->str_max_version, st->str_dl_device,
                        st->str_copy};
  PyObject **slots[4] = {stream, max_version, dl_device, copy};
  for (int i = 0; i < 4; i++)
    if (key == names[i]) return slots[i];
  for (int i = 0; i < 4; i++)
    if (PyUnicode_Compare(key, names[i]) == 0) return slots[i];
  return NULL;
}

static PyObject *device_text(DLDevice d) {
  const char *name = dlb_device_type_name((int32_t)d.device_type);
  if (d.device_type == kDLCPU && d.device_id == 0)
    return PyUnicode_FromString("cpu");
  if (name == NULL)
    return PyUnicode_FromFormat("device_type_%d:%d", (int)d.device_type,
                                (int)d.device_id);
  return PyUnicode_FromFormat("%s:%d", name, (int)d.device_id);
}

/* Read a (device_type, device_id) tuple.  TypeError for the wrong shape of
 * argument; the values themselves are judged by the caller. */
static int parse_dl_device(PyObject *o, DLDevice *out) {
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2 ||
      !PyLong_Check(PyTuple_GET_ITEM(o, 0)) ||
      !PyLong_Check(PyTuple_GET_ITEM(o, 1))) {
    PyErr_Format(PyExc_TypeError,
                 "dl_device must be None or a (device_type, device_id) tuple "
                 "of ints, not %R",
                 o);
    return -1;
  }
  int overflow = 0;
  long long t = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(o, 0), &overflow);
  if (t == -1 && PyErr_Occurred()) return -1;
  int overflow2 = 0;
  long long i = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(o, 1),
                                             &overflow2);
  if (i == -1 && PyErr_Occurred()) return -1;
  if (overflow || overflow2 || t < INT32_MIN || t > INT32_MAX ||
      i < INT32_MIN || i > INT32_MAX) {
    PyErr_Format(PyExc_BufferError, "cannot export to device %R", o);
    return -1;
  }
  out->device_type = (DLDeviceType)t;
  out->device_id = (int32_t)i;
  return 0;
}

/* Validate stream for a tensor exported on device d (see the header
 * comment for the rules). */
static int check_stream(PyObject *stream, DLDevice d) {
  if (stream == Py_None) return 0;
  if (!PyLong_Check(stream) || PyBool_Check(stream)) {
    PyErr_Format(PyExc_TypeError,
                 "stream must be None or an int, not %.200s",
                 Py_TYPE(stream)->tp_name);
    return -1;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(stream, &overflow);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (v == -1 && overflow == 0) return 0; /* "no synchronisation" */
  switch ((int32_t)d.device_type) {
    case kDLCUDA:
    case kDLCUDAManaged:
      if (overflow < 0 || (overflow == 0 && v < -1)) break;
      if (overflow == 0 && v == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "stream=0 is ambiguous on CUDA and disallowed by the "
                        "DLPack spec; pass 1 for the legacy default stream, "
                        "2 for the per-thread one");
        return -1;
      }
      return 0;
    case kDLROCM:
      if (overflow < 0 || (overflow == 0 && v < -1)) break;
      if (overflow == 0 && (v == 1 || v == 2)) {
        PyErr_Format(PyExc_ValueError,
                     "stream=%lld is not supported on ROCm (use 0 for the "
                     "default stream)",
                     v);
        return -1;
      }
      return 0;
    default: {
      PyObject *dev = device_text(d);
      if (dev == NULL) return -1;
      PyErr_Format(PyExc_ValueError,
                   "stream must be None (or -1) when exporting from %U, which "
                   "has no streams; got %R",
                   dev, stream);
      Py_DECREF(dev);
      return -1;
    }
  }
  PyErr_Format(PyExc_ValueError, "stream must be >= -1, got %R", stream);
  return -1;
}

PyObject *dlb__tensor_dlpack(PyObject *op, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames) {
  dlb_TensorObject *self = AS_TENSOR(op);
  PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None,
           *copy = Py_None;
  DLManagedTensorVersioned *m = NULL;
  dlb_error err;

  if (nargs != 0) {
    PyErr_Format(PyExc_TypeError,
                 "__dlpack__() takes no positional arguments (%zd given)",
                 nargs);
    return NULL;
  }
  if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
    dlb_module_state *st = dlb__state_from_type(Py_TYPE(op));
    if (st == NULL) {
      PyErr_SetString(PyExc_RuntimeError, "dlbridge module state is gone");
      return NULL;
    }
    Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < nkw; j++) {
      PyObject *key = PyTuple_GET_ITEM(kwnames, j);
      PyObject **slot = kw_slot(st, key, &stream, &max_version, &dl_device,
                                &copy);
      if (slot == NULL) {
        if (!PyErr_Occurred())
          PyErr_Format(PyExc_TypeError,
                       "__dlpack__() got an unexpected keyword argument '%U'",
                       key);
        return NULL;
      }
      *slot = args[j];
    }
  }

  /* max_version: None or (major, minor). */
  int versioned = 0;
  if (max_version != Py_None) {
    if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) != 2 ||
        !PyLong_Check(PyTuple_GET_ITEM(max_version, 0)) ||
        !PyLong_Check(PyTuple_GET_ITEM(max_version, 1))) {
      PyErr_Format(PyExc_TypeError,
                   "max_version must be None or a (major, minor) tuple of "
                   "ints, not %R",
                   max_version);
      return NULL;
    }
    int overflow = 0;
    long long major = PyLong_AsLongLongAndOverflow(
        PyTuple_GET_ITEM(max_version, 0), &overflow);
    if (major == -1 && PyErr_Occurred()) return NULL;
    versioned = overflow > 0 || major >= 1;
  }

  /* copy: None / True / False. */
  int want_copy = -1;
  if (copy == Py_True)
    want_copy = 1;
  else if (copy == Py_False)
    want_copy = 0;
  else if (copy != Py_None) {
    PyErr_Format(PyExc_TypeError, "copy must be None, True or False, not %R",
                 copy);
    return NULL;
  }

  /* dl_device: where the consumer wants the data. */
  DLDevice target = self->t.device;
  int cross_device = 0;
  if (dl_device != Py_None) {
    if (parse_dl_device(dl_device, &target) < 0) return NULL;
    cross_device = target.device_type != self->t.device.device_type ||
                   target.device_id != self->t.device.device_id;
    if (cross_device) {
      /* The only other place we can put data is the CPU, by a host copy. */
      int reachable = target.device_type == kDLCPU && target.device_id == 0 &&
                      dlb_device_is_host_accessible(self->t.device);
      if (!reachable) {
        PyObject *to = device_text(target), *from = device_text(self->t.device);
        if (to != NULL && from != NULL)
          PyErr_Format(PyExc_BufferError,
                       "cannot export a tensor on %U to device %U "
                       "(dl_device=%R): dlbridge only copies host-accessible "
                       "memory to the CPU",
                       from, to, dl_device);
        Py_XDECREF(to);
        Py_XDECREF(from);
        return NULL;
      }
      if (want_copy == 0) {
        PyErr_Format(PyExc_BufferError,
                     "dl_device=%R needs a copy but copy=False", dl_device);
        return NULL;
      }
    }
  }
  if (check_stream(stream, target) < 0) return NULL;

  int do_copy = want_copy == 1 || cross_device;
  if (do_copy && !dlb_device_is_host_accessible(self->t.device)) {
    PyObject *from = device_text(self->t.device);
    if (from != NULL)
      PyErr_Format(PyExc_BufferError,
                   "copy=True on %U is not supported yet: dlbridge copies "
                   "only host-accessible memory",
                   from);
    Py_XDECREF(from);
    return NULL;
  }
  if (!versioned && !do_copy &&
      (self->flags & DLPACK_FLAG_BITMASK_READ_ONLY)) {
    PyErr_SetString(PyExc_BufferError,
                    "cannot export a read-only tensor as a legacy "
                    "(unversioned) DLPack capsule, which cannot say "
                    "read-only; pass max_version=(1, 0) or higher, or "
                    "copy=True");
    return NULL;
  }

  int rc = do_copy ? export_copy(self, &m, &err)
                   : dlb__tensor_export_managed(self, &m, &err);
  if (rc != DLB_OK) return dlb__raise(&err);
  return make_capsule(m, versioned);
}

PyObject *dlb__tensor_dlpack_device(PyObject *op, PyObject *unused) {
  (void)unused;
  DLDevice d = AS_TENSOR(op)->t.device;
  return Py_BuildValue("(ii)", (int)d.device_type, (int)d.device_id);
}
