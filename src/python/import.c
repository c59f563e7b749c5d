/*
 * import.c -- dlbridge.from_dlpack: turn anything tensor-like into a Tensor.
 *
 * Producers are tried in this order (the first that applies wins):
 *   a. a dlbridge Tensor (found through the per-type handler, below):
 *      returned as it is (or copied when asked);
 *   b. through the per-type handler (exchange.c): a type publishing a
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
 *   h. __cuda_array_interface__ (imported as a kDLCUDA view; see below).
 * Anything else is a TypeError naming the type.
 *
 * Capsule ownership (known-bugs 1.1, 1.2): the capsule name decides the
 * struct type; a "used_*" name is a BufferError; the versioned header's major
 * is checked before anything else is read, and an unknown major is consumed
 * (renamed) and its deleter called exactly once, as the spec demands; the
 * DLTensor is then validated as untrusted input, and a tensor that fails
 * validation is LEFT UNCONSUMED (name unchanged, deleter not called) so its
 * capsule's own destructor frees it (known-bugs B78) -- no path here can
 * free it twice.  On success the capsule is renamed the moment ownership is
 * taken (B02), with SetName's result checked (B14).  Every later failure
 * deletes the managed tensor exactly once.  Python references are dropped
 * and deleters run with any pending exception saved and restored, so a
 * producer destructor can neither clobber nor see our error (B16).
 *
 * Decisions written down (known-bugs section 3):
 *   3.1 copy=False when a copy is needed (another device) -> BufferError.
 *   3.3 versioned capsules with NULL strides are accepted as row-major
 *       (lenient): the data is unambiguous and older NumPy sent exactly that.
 *   3.4 unknown flag bits are ignored; READ_ONLY is kept on the Tensor.
 *   3.6 legacy ("dltensor") capsules import as WRITABLE (DESIGN.md).
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
 *   - Streams: a CPU producer is never passed a stream.  A CUDA producer is
 *     passed stream=1 (the legacy default stream: the producer orders its
 *     work before it) and ROCm stream=0, until the device layer can give
 *     the consumer's current stream.  Other devices get no stream.
 */
#include "dlbridge_py.h"

#include <string.h>

/* ---- small helpers --------------------------------------------------------- */

/* Look up an attribute that may be missing: 1 found (*out new ref), 0
 * missing (no exception), -1 error.  AttributeError is the only exception
 * that means "missing". */
static int get_optional_attr(PyObject *obj, PyObject *name, PyObject **out) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyObject_GetOptionalAttr(obj, name, out);
#else
  /* The private 3.7-3.12 spelling of the same function: it avoids creating
   * an AttributeError for the common miss, which matters here because most
   * objects miss several of the attributes we probe. */
  return _PyObject_LookupAttr(obj, name, out);
#endif
}

static int get_optional_attr_str(PyObject *obj, const char *name,
                                 PyObject **out) {
  PyObject *n = PyUnicode_InternFromString(name);
  if (n == NULL) return -1;
  int rc = get_optional_attr(obj, n, out);
  Py_DECREF(n);
  return rc;
}

static void discard_error(dlb__saved_error *s) {
#if PY_VERSION_HEX >= 0x030C0000
  Py_XDECREF(s->exc);
#else
  Py_XDECREF(s->type);
  Py_XDECREF(s->value);
  Py_XDECREF(s->tb);
#endif
}

/* Make the saved exception prev the __context__ of the pending one, as
 * `except: raise ...` does in Python.  Consumes prev. */
static void chain_context(dlb__saved_error *prev) {
  if (!PyErr_Occurred()) {
    dlb__error_restore(prev);
    return;
  }
#if PY_VERSION_HEX >= 0x030C0000
  PyObject *exc = PyErr_GetRaisedException();
  if (prev->exc != NULL && prev->exc != exc)
    PyException_SetContext(exc, prev->exc); /* steals */
  else
    Py_XDECREF(prev->exc);
  PyErr_SetRaisedException(exc);
#else
  /* Fetch first: normalising calls the exception type, which must not
   * happen with an exception pending. */
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyErr_NormalizeException(&prev->type, &prev->value, &prev->tb);
  if (prev->tb != NULL && prev->value != NULL)
    PyException_SetTraceback(prev->value, prev->tb);
  if (value != NULL && prev->value != NULL && value != prev->value) {
    PyException_SetContext(value, prev->value); /* steals */
    prev->value = NULL;
  }
  PyErr_Restore(type, value, tb);
  discard_error(prev);
#endif
}

/* Drop a reference without letting the object's destructor see or clobber
 * the pending exception (B16). */
static void clear_keep_error(PyObject **slot) {
  if (*slot == NULL) return;
  dlb__saved_error e;
  dlb__error_save(&e);
  Py_CLEAR(*slot);
  dlb__error_restore(&e);
}

/* Run a managed tensor's deleter (which may run Python code through a
 * producer's release) with the pending exception saved. */
static void delete_keep_error(DLManagedTensorVersioned *m) {
  if (m == NULL) return;
  dlb__saved_error e;
  dlb__error_save(&e);
  dlb_managed_delete(m);
  dlb__error_restore(&e);
}

/* BufferError "from_dlpack: <what>: <core message>" for a failed core call;
 * MemoryError stays MemoryError. */
static PyObject *raise_core(const char *what, const dlb_error *err) {
  if (err->code == DLB_ENOMEM) return PyErr_NoMemory();
  PyErr_Format(PyExc_BufferError, "from_dlpack: %s: %s", what, err->message);
  return NULL;
}

static const char *device_name(DLDevice d, char *buf, size_t n) {
  const char *name = dlb_device_type_name((int32_t)d.device_type);
  if (name != NULL)
    PyOS_snprintf(buf, n, "%s:%d", name, (int)d.device_id);
  else
    PyOS_snprintf(buf, n, "device type %d:%d", (int)d.device_type,
                  (int)d.device_id);
  return buf;
}

static int same_device(DLDevice a, DLDevice b) {
  return a.device_type == b.device_type && a.device_id == b.device_id;
}

/* ---- keeping Python owners alive from a managed tensor -------------------- */

/* The release context of tensors that view memory a Python object owns: a
 * Py_buffer (buffer protocol) and/or a strong reference (array interface
 * owner).  Allocated with the raw allocator so it can be freed without the
 * GIL if it ever had to be. */
typedef struct py_keeper {
  PyObject *owner;   /* strong reference or NULL */
  int has_view;      /* view holds a buffer to release */
  Py_buffer view;
} py_keeper;

/* dlb_release_fn: may run on any thread, with or without the GIL, even
 * during interpreter shutdown (B15).  Once the interpreter is gone it leaks
 * rather than touch Python. */
static void release_py_keeper(void *ctx) {
  py_keeper *k = (py_keeper *)ctx;
  if (k == NULL) return;
  if (dlb__python_gone()) return;
  PyGILState_STATE g = PyGILState_Ensure();
  dlb__saved_error e;
  dlb__error_save(&e);
  if (k->has_view) PyBuffer_Release(&k->view);
  Py_XDECREF(k->owner);
  PyMem_RawFree(k);
  dlb__error_restore(&e);
  PyGILState_Release(g);
}

static py_keeper *keeper_new(void) {
  py_keeper *k = PyMem_RawCalloc(1, sizeof *k);
  if (k == NULL) PyErr_NoMemory();
  return k;
}

/* Free a keeper that never got attached to a managed tensor.  GIL held. */
static void keeper_free(py_keeper *k) {
  if (k == NULL) return;
  dlb__saved_error e;
  dlb__error_save(&e);
  if (k->has_view) PyBuffer_Release(&k->view);
  Py_XDECREF(k->owner);
  PyMem_RawFree(k);
  dlb__error_restore(&e);
}

/* Wrap view (CPU or CUDA memory a Python object owns) into a managed tensor
 * that releases k when deleted.  Steals k on success and on failure. */
static int wrap_keeper(const DLTensor *view, uint64_t flags, py_keeper *k,
                       DLManagedTensorVersioned **out) {
  dlb_error err;
  int rc = dlb_tensor_validate(view, 0, &err);
  if (rc != DLB_OK) {
    keeper_free(k);
    raise_core("the object's memory cannot be described", &err);
    return -1;
  }
  rc = dlb_managed_wrap(view, flags, release_py_keeper, k, out, &err);
  if (rc != DLB_OK) {
    keeper_free(k);
    raise_core("cannot wrap the object's memory", &err);
    return -1;
  }
  return 0;
}

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
                 device_name(src->device, dev, sizeof dev));
    return NULL;
  }
  bool padded = (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0;
  int rc = dlb_managed_empty(src->ndim, src->shape, src->dtype, cpu, padded,
                             &n, &err);
  if (rc != DLB_OK) return raise_core("cannot allocate the copy", &err);
  DLTensor s = *src, d = n->dl_tensor;
  s.dtype = copy_dtype(src->dtype, flags);
  d.dtype = copy_dtype(d.dtype, flags);
  rc = dlb_copy(&d, &s, &err);
  if (rc != DLB_OK) {
    dlb_managed_delete(n);
    return raise_core("cannot copy the tensor", &err);
  }
  return dlb__tensor_from_managed(st, n);
}

/* What the caller's device/copy request means for a tensor on `src` with
 * `flags`: 0 use as is, 1 copy to CPU, -1 error raised. */
static int plan(const DLDevice *target, int copy, DLDevice src,
                uint64_t flags) {
  char a[64], b[64];
  if (target != NULL && !same_device(*target, src)) {
    if (target->device_type != kDLCPU) {
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: cannot move data from %s to %s: dlbridge "
                   "has no device runtime yet, so only the CPU can be a "
                   "target; use device=None to keep the data where it is",
                   device_name(src, a, sizeof a),
                   device_name(*target, b, sizeof b));
      return -1;
    }
    if (copy == 0) {
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: moving data from %s to %s needs a copy, "
                   "but copy=False was given",
                   device_name(src, a, sizeof a),
                   device_name(*target, b, sizeof b));
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
    delete_keep_error(m);
    return NULL;
  }
  if (p == 0) return dlb__tensor_from_managed(st, m);
  PyObject *res = copy_to_cpu(st, &m->dl_tensor, m->flags);
  if (res == NULL)
    delete_keep_error(m);
  else
    dlb_managed_delete(m);
  return res;
}

/* ---- capsules ---------------------------------------------------------------- */

static const char NAME_VERSIONED[] = "dltensor_versioned";
static const char NAME_LEGACY[] = "dltensor";
/* PyCapsule_SetName keeps the pointer: these must be static storage. */
static const char NAME_USED_VERSIONED[] = "used_dltensor_versioned";
static const char NAME_USED_LEGACY[] = "used_dltensor";

/* Take ownership of the tensor in a DLPack capsule: 0 with *out owned
 * (always versioned; legacy tensors are wrapped), -1 with an exception.
 * See the header comment for the state machine. */
static int consume_capsule_locked(PyObject *cap, DLManagedTensorVersioned **out) {
  dlb_error err;
  const char *name = PyCapsule_GetName(cap);
  if (name == NULL && PyErr_Occurred()) return -1;
  if (name != NULL && strcmp(name, NAME_VERSIONED) == 0) {
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, NAME_VERSIONED);
    if (m == NULL) return -1;
    if (dlb_managed_check_version(m, &err) != DLB_OK) {
      /* A major we do not speak: the spec says call the deleter and read
       * nothing else.  Rename first so the capsule's destructor cannot
       * call it a second time. */
      if (PyCapsule_SetName(cap, NAME_USED_VERSIONED) < 0) return -1;
      dlb_managed_delete(m);
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: unsupported DLPack version: %s",
                   err.message);
      return -1;
    }
    /* Lenient about NULL strides (decision 3.3). */
    if (dlb_tensor_validate(&m->dl_tensor, 0, &err) != DLB_OK) {
      /* Left unconsumed: its own destructor frees it (B78). */
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: the producer's tensor cannot be imported "
                   "(the capsule is left unconsumed): %s",
                   err.message);
      return -1;
    }
    if (PyCapsule_SetName(cap, NAME_USED_VERSIONED) < 0) return -1;
    *out = m;
    return 0;
  }
  if (name != NULL && strcmp(name, NAME_LEGACY) == 0) {
    DLManagedTensor *lm = PyCapsule_GetPointer(cap, NAME_LEGACY);
    if (lm == NULL) return -1;
    if (dlb_tensor_validate(&lm->dl_tensor, 0, &err) != DLB_OK) {
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: the producer's tensor cannot be imported "
                   "(the capsule is left unconsumed): %s",
                   err.message);
      return -1;
    }
    /* Renamed BEFORE wrapping: from here on we own lm, so a failed wrap
     * below deletes it here, and the destructor never does (B02). */
    if (PyCapsule_SetName(cap, NAME_USED_LEGACY) < 0) return -1;
    DLManagedTensorVersioned *m = NULL;
    if (dlb_managed_from_legacy(lm, &m, &err) != DLB_OK) {
      dlb_managed_delete_legacy(lm);
      raise_core("cannot wrap the legacy tensor", &err);
      return -1;
    }
    *out = m; /* flags 0: legacy imports are writable (decision 3.6) */
    return 0;
  }
  if (name != NULL && (strcmp(name, NAME_USED_VERSIONED) == 0 ||
                       strcmp(name, NAME_USED_LEGACY) == 0)) {
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: the DLPack capsule was already consumed "
                 "(its name is '%s'); a capsule can be imported only once",
                 name);
    return -1;
  }
  PyErr_Format(PyExc_TypeError,
               "from_dlpack: a PyCapsule named %s%s%s is not a DLPack tensor "
               "(expected 'dltensor_versioned' or 'dltensor')",
               name ? "'" : "", name ? name : "NULL", name ? "'" : "");
  return -1;
}

static int consume_capsule(PyObject *cap, DLManagedTensorVersioned **out) {
  int rc;
  /* Check-then-rename must be atomic under free threading (B83). */
#ifdef Py_GIL_DISABLED
  Py_BEGIN_CRITICAL_SECTION(cap);
  rc = consume_capsule_locked(cap, out);
  Py_END_CRITICAL_SECTION();
#else
  rc = consume_capsule_locked(cap, out);
#endif
  return rc;
}

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
  if (consume_capsule(cap, &m) < 0) return NULL;
  return finish(st, m, target, copy);
}

/* ---- c. __dlpack__ ---------------------------------------------------------- */

/* Read a (device_type, device_id) pair from __dlpack_device__'s result. */
static int parse_device_pair(PyObject *r, DLDevice *out) {
  if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: __dlpack_device__() returned %.200s; expected "
                 "a (device_type, device_id) tuple",
                 Py_TYPE(r)->tp_name);
    return -1;
  }
  long type = PyLong_AsLong(PyTuple_GET_ITEM(r, 0));
  if (type == -1 && PyErr_Occurred()) return -1;
  long id = PyLong_AsLong(PyTuple_GET_ITEM(r, 1));
  if (id == -1 && PyErr_Occurred()) return -1;
  if (type < INT32_MIN || type > INT32_MAX || id < 0 || id > INT32_MAX) {
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: __dlpack_device__() returned (%ld, %ld), "
                 "which is not a valid device",
                 type, id);
    return -1;
  }
  out->device_type = (DLDeviceType)type;
  out->device_id = (int32_t)id;
  return 0;
}

/* Special methods are looked up on the type, as Python does for its own
 * protocols: no bound method is created and a miss raises nothing. */
static int type_has(PyObject *obj, PyObject *name) {
  return _PyType_Lookup(Py_TYPE(obj), name) != NULL;
}

/* Shared with exchange.c (DLB_KIND_DLPACK views): call __dlpack__ with the
 * negotiation below and take ownership of what it returns.  0 with *out
 * owned and validated, -1 with an exception. */
int dlb__dunder_dlpack_managed(dlb_module_state *st, PyObject *obj,
                               const DLDevice *target, int copy,
                               DLManagedTensorVersioned **out) {
  int result = -1;
  PyObject *cap = NULL, *dev_res = NULL;
  PyObject *kwnames = NULL, *stream = NULL, *dl_device = NULL;
  /* buf[0] is the spare slot PY_VECTORCALL_ARGUMENTS_OFFSET lets the
   * callee borrow; args[0] is self, then the keyword values. */
  PyObject *buf[6];
  PyObject **args = buf + 1;
  PyObject *names[4];
  DLDevice src = {kDLCPU, 0};
  int have_src = 0;
  Py_ssize_t nkw = 0;

  /* As the array API does: the device first, to choose stream and target.
   * Its errors (BufferError above all) propagate.  A producer without it
   * is tolerated and treated as "device unknown". */
  if (type_has(obj, st->str_dlpack_device)) {
    dev_res = PyObject_CallMethodNoArgs(obj, st->str_dlpack_device);
    if (dev_res == NULL) goto cleanup;
    if (parse_device_pair(dev_res, &src) < 0) goto cleanup;
    have_src = 1;
  }

  /* The stream: nothing for the CPU and stream-less devices. */
  if (have_src && src.device_type == kDLCUDA) {
    stream = PyLong_FromLong(1); /* legacy default stream */
  } else if (have_src && src.device_type == kDLROCM) {
    stream = PyLong_FromLong(0); /* ROCm's default stream */
  }
  if (have_src && (src.device_type == kDLCUDA || src.device_type == kDLROCM) &&
      stream == NULL)
    goto cleanup;

  args[0] = obj;
  args[1 + nkw] = st->max_version_tuple;
  names[nkw++] = st->str_max_version;
  if (stream != NULL) {
    args[1 + nkw] = stream;
    names[nkw++] = st->str_stream;
  }
  /* dl_device only when the data has to move: asking a producer for the
   * device it is already on gains nothing and trips old producers. */
  int asked_device = target != NULL && !(have_src && same_device(*target, src));
  if (asked_device) {
    dl_device = Py_BuildValue("(ii)", (int)target->device_type,
                              (int)target->device_id);
    if (dl_device == NULL) goto cleanup;
    args[1 + nkw] = dl_device;
    names[nkw++] = st->str_dl_device;
  }
  if (copy >= 0) {
    args[1 + nkw] = copy ? Py_True : Py_False;
    names[nkw++] = st->str_copy;
  }
  kwnames = PyTuple_New(nkw);
  if (kwnames == NULL) goto cleanup;
  for (Py_ssize_t i = 0; i < nkw; i++)
    PyTuple_SET_ITEM(kwnames, i, Py_NewRef(names[i]));

  cap = PyObject_VectorcallMethod(st->str_dlpack, args,
                                  1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
  if (cap == NULL) {
    /* Fall back to the pre-2023.12 signature only on TypeError and only
     * when nothing the caller asked for would be dropped (B57, B58). */
    if (!PyErr_ExceptionMatches(PyExc_TypeError) || asked_device || copy >= 0)
      goto cleanup;
    dlb__saved_error first;
    dlb__error_save(&first);
    if (stream != NULL) {
      /* stream was in the old signature too. */
      PyObject *kw = PyTuple_Pack(1, st->str_stream);
      if (kw != NULL) {
        args[1] = stream;
        cap = PyObject_VectorcallMethod(st->str_dlpack, args,
                                        1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kw);
        Py_DECREF(kw);
      }
    } else {
      cap = PyObject_CallMethodNoArgs(obj, st->str_dlpack);
    }
    if (cap == NULL) {
      chain_context(&first); /* the retry's error, with the first */
      goto cleanup;
    }
    discard_error(&first);
  }
  if (!PyCapsule_CheckExact(cap)) {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: __dlpack__() returned %.200s, not a DLPack "
                 "PyCapsule",
                 Py_TYPE(cap)->tp_name);
    goto cleanup;
  }
  if (consume_capsule(cap, out) < 0) goto cleanup;
  result = 0;

cleanup:
  if (result < 0) {
    /* The capsule's destructor runs here; keep our error intact. */
    clear_keep_error(&cap);
    clear_keep_error(&dev_res);
  } else {
    Py_XDECREF(cap);
    Py_XDECREF(dev_res);
  }
  Py_XDECREF(kwnames);
  Py_XDECREF(stream);
  Py_XDECREF(dl_device);
  return result;
}

static PyObject *import_dunder_dlpack(dlb_module_state *st, PyObject *obj,
                                      const DLDevice *target, int copy) {
  DLManagedTensorVersioned *m = NULL;
  if (dlb__dunder_dlpack_managed(st, obj, target, copy, &m) < 0) return NULL;
  return finish(st, m, target, copy);
}

/* ---- e. legacy producers ------------------------------------------------------ */

/* 1 with *cap set (new ref), 0 not a legacy producer, -1 error. */
static int legacy_producer_capsule(PyObject *obj, PyObject **cap) {
  PyObject *meth = NULL;
  int found = get_optional_attr_str(obj, "toDlpack", &meth);
  if (found < 0) return -1;
  if (found) {
    *cap = PyObject_CallNoArgs(meth);
    Py_DECREF(meth);
    return *cap == NULL ? -1 : 1;
  }
  /* TensorFlow is imported only for an object TensorFlow made. */
  PyObject *mod = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__module__");
  if (mod == NULL) {
    PyErr_Clear();
    return 0;
  }
  const char *modname = PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : NULL;
  int is_tf = modname != NULL && strncmp(modname, "tensorflow", 10) == 0 &&
              (modname[10] == '\0' || modname[10] == '.');
  PyErr_Clear(); /* a type without a str __module__ is simply not TF */
  Py_DECREF(mod);
  if (!is_tf) return 0;
  PyObject *tfdl = PyImport_ImportModule("tensorflow.experimental.dlpack");
  if (tfdl == NULL) return -1;
  *cap = PyObject_CallMethod(tfdl, "to_dlpack", "O", obj);
  Py_DECREF(tfdl);
  return *cap == NULL ? -1 : 1;
}

/* ---- f. buffer protocol --------------------------------------------------------- */

/* dtype of one struct-module format (native byte order only).  Shared with
 * exchange.c's buffer views. */
int dlb__buffer_format_dtype(const char *fmt, Py_ssize_t itemsize, DLDataType *out) {
  const char *f = fmt != NULL ? fmt : "B";
  char order = '@';
  if (*f == '@' || *f == '=' || *f == '<' || *f == '>' || *f == '!')
    order = *f++;
#if PY_LITTLE_ENDIAN
  int foreign = order == '>' || order == '!';
#else
  int foreign = order == '<';
#endif
  if (foreign) {
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: buffer format '%s' is not in native byte "
                 "order; DLPack only describes native byte order (byteswap "
                 "it first)",
                 fmt);
    return -1;
  }
  uint8_t code;
  int complex = 0;
  char c = *f;
  if (c == 'Z') {
    complex = 1;
    c = *++f;
  }
  if (c == '\0' || f[1] != '\0') goto unsupported;
  switch (c) {
    case '?': code = kDLBool; break;
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n':
      code = kDLInt; break;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N':
    case 'c': /* a 1-byte char: its bytes are uint8 exactly */
      code = kDLUInt; break;
    case 'e': case 'f': case 'd':
      code = complex ? kDLComplex : kDLFloat; break;
    default: goto unsupported;
  }
  if (complex && code != kDLComplex) goto unsupported;
  /* The exporter's itemsize is authoritative ('l' is 4 or 8 bytes
   * depending on the prefix and the platform). */
  if (itemsize <= 0 || itemsize > 32) goto unsupported;
  DLDataType dt = {code, (uint8_t)(itemsize * 8), 1};
  if (dlb_dtype_check(dt, NULL) != DLB_OK) goto unsupported;
  *out = dt;
  return 0;
unsupported:
  PyErr_Format(PyExc_BufferError,
               "from_dlpack: buffer format '%s' (itemsize %zd) has no DLPack "
               "dtype; supported: bool, signed/unsigned integers, float16/32/"
               "64 and complex64/128 in native byte order",
               fmt, itemsize);
  return -1;
}

/* Fill shape/strides (elements) from byte strides; BufferError when a byte
 * stride is not a multiple of the itemsize (B31). */
static int elem_strides(int ndim, const Py_ssize_t *bstrides, Py_ssize_t itemsize,
                        int64_t *strides, const char *what) {
  for (int i = 0; i < ndim; i++) {
    if (bstrides[i] % itemsize != 0) {
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: %s stride %zd of dimension %d is not a "
                   "multiple of the itemsize %zd; DLPack strides count "
                   "elements",
                   what, bstrides[i], i, itemsize);
      return -1;
    }
    strides[i] = bstrides[i] / itemsize;
  }
  return 0;
}

/* Get a buffer, writable when the exporter allows (to learn read-only-ness
 * without a second protocol), read-only otherwise. */
static int get_buffer_rw(PyObject *obj, Py_buffer *view) {
  if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS) == 0) return 0;
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
  PyErr_Clear();
  return PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO);
}

/* Build the DLTensor for a Py_buffer (CPU). */
static int view_from_buffer(const Py_buffer *b, DLTensor *t, int64_t *shape,
                            int64_t *strides) {
  memset(t, 0, sizeof *t);
  if (b->ndim < 0 || b->ndim > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_BufferError, "from_dlpack: buffer ndim %d is out of "
                 "range (at most %d)", b->ndim, DLB_MAX_NDIM);
    return -1;
  }
  if (b->suboffsets != NULL) {
    for (int i = 0; i < b->ndim; i++) {
      if (b->suboffsets[i] >= 0) {
        PyErr_SetString(PyExc_BufferError,
                        "from_dlpack: indirect (PIL-style) buffers with "
                        "suboffsets cannot be described by DLPack");
        return -1;
      }
    }
  }
  if (dlb__buffer_format_dtype(b->format, b->itemsize, &t->dtype) < 0) return -1;
  t->ndim = b->ndim;
  if (b->ndim > 0) {
    if (b->shape != NULL) {
      for (int i = 0; i < b->ndim; i++) shape[i] = b->shape[i];
    } else if (b->ndim == 1) {
      shape[0] = b->len / b->itemsize; /* the protocol's rule for NULL */
    } else {
      PyErr_SetString(PyExc_BufferError,
                      "from_dlpack: buffer has ndim > 1 but no shape");
      return -1;
    }
    t->shape = shape;
    if (b->strides != NULL) {
      if (elem_strides(b->ndim, b->strides, b->itemsize, strides, "buffer") < 0)
        return -1;
      t->strides = strides;
    } /* else: C-contiguous, which NULL strides mean */
  }
  t->data = b->buf;
  t->device.device_type = kDLCPU;
  t->device.device_id = 0;
  return 0;
}

static PyObject *import_buffer(dlb_module_state *st, PyObject *obj,
                               const DLDevice *target, int copy) {
  DLManagedTensorVersioned *m = NULL;
  int64_t shape[DLB_MAX_NDIM], strides[DLB_MAX_NDIM];
  DLTensor t;
  py_keeper *k = keeper_new();
  if (k == NULL) return NULL;
  if (get_buffer_rw(obj, &k->view) < 0) {
    keeper_free(k);
    return NULL;
  }
  k->has_view = 1;
  if (view_from_buffer(&k->view, &t, shape, strides) < 0) {
    keeper_free(k);
    return NULL;
  }
  uint64_t flags = k->view.readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
  if (wrap_keeper(&t, flags, k, &m) < 0) return NULL;
  return finish(st, m, target, copy);
}

/* ---- g./h. array interfaces -------------------------------------------------------- */

/* ai[key], borrowed, in *v (NULL when absent): 0, or -1 with an exception.
 * Not PyDict_GetItemString: it swallows a failure to make the key (a
 * MemoryError), which would then be reported as the key missing. */
static int ai_item(PyObject *ai, const char *key, PyObject **v) {
  PyObject *k = PyUnicode_FromString(key);
  if (k == NULL) return -1;
  *v = PyDict_GetItemWithError(ai, k); /* the dict keeps the value alive */
  Py_DECREF(k);
  return (*v == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* dtype from a typestr such as '<f4', '|b1', '=i8'. */
static int typestr_dtype(PyObject *ts, DLDataType *out) {
  const char *s = PyUnicode_Check(ts) ? PyUnicode_AsUTF8(ts) : NULL;
  if (s == NULL) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_TypeError,
                   "from_dlpack: array interface 'typestr' must be a str, "
                   "not %.200s",
                   Py_TYPE(ts)->tp_name);
    return -1;
  }
  size_t n = strlen(s);
  if (n < 3) goto bad;
  char order = s[0], kind = s[1];
  char *end = NULL;
  long size = strtol(s + 2, &end, 10);
  if (end == NULL || *end != '\0' || size <= 0 || size > 32) goto bad;
#if PY_LITTLE_ENDIAN
  int foreign = order == '>';
#else
  int foreign = order == '<';
#endif
  if (order != '<' && order != '>' && order != '|' && order != '=') goto bad;
  if (foreign && size > 1) {
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: typestr '%s' is not in native byte order; "
                 "DLPack only describes native byte order",
                 s);
    return -1;
  }
  uint8_t code;
  switch (kind) {
    case 'b': code = kDLBool; break;
    case 'i': code = kDLInt; break;
    case 'u': code = kDLUInt; break;
    case 'f': code = kDLFloat; break;
    case 'c': code = kDLComplex; break;
    default: goto unsupported;
  }
  DLDataType dt = {code, (uint8_t)(size * 8), 1};
  if (dlb_dtype_check(dt, NULL) != DLB_OK) goto unsupported;
  *out = dt;
  return 0;
unsupported:
  PyErr_Format(PyExc_BufferError,
               "from_dlpack: typestr '%s' has no DLPack dtype; supported "
               "kinds are b, i, u, f and c",
               s);
  return -1;
bad:
  PyErr_Format(PyExc_ValueError,
               "from_dlpack: malformed array interface typestr '%s'", s);
  return -1;
}

/* Read a tuple of ints into arr (at most DLB_MAX_NDIM); returns the length
 * or -1. */
static int int_tuple(PyObject *o, int64_t *arr, const char *key) {
  if (!PyTuple_Check(o)) {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: array interface '%s' must be a tuple, not "
                 "%.200s",
                 key, Py_TYPE(o)->tp_name);
    return -1;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(o);
  if (n > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: array interface '%s' has %zd entries; "
                 "dlbridge handles at most %d dimensions",
                 key, n, DLB_MAX_NDIM);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(o, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    arr[i] = (int64_t)v;
  }
  return (int)n;
}

/* Import a v3 __array_interface__ (cuda == 0) or __cuda_array_interface__
 * (cuda == 1) dictionary whose owner is obj. */
static int array_interface_managed(PyObject *obj, PyObject *ai, int cuda,
                                   DLManagedTensorVersioned **out) {
  const char *which = cuda ? "__cuda_array_interface__" : "__array_interface__";
  DLManagedTensorVersioned *m = NULL;
  int64_t shape[DLB_MAX_NDIM], strides[DLB_MAX_NDIM];
  DLTensor t;
  uint64_t flags = 0;
  py_keeper *k = NULL;
  PyObject *v;

  memset(&t, 0, sizeof t);
  if (!PyDict_Check(ai)) {
    PyErr_Format(PyExc_TypeError, "from_dlpack: %s must be a dict, not %.200s",
                 which, Py_TYPE(ai)->tp_name);
    goto error;
  }
  k = keeper_new();
  if (k == NULL) goto error;
  k->owner = Py_NewRef(obj); /* the memory lives as long as its owner */

  if (ai_item(ai, "version", &v) < 0) goto error;
  if (v != NULL) {
    long ver = PyLong_AsLong(v);
    if (ver == -1 && PyErr_Occurred()) goto error;
    if ((!cuda && ver != 3) || (cuda && (ver < 0 || ver > 3))) {
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: %s version %ld is not supported (%s)", which,
                   ver, cuda ? "0 to 3" : "3");
      goto error;
    }
  }
  if (ai_item(ai, "mask", &v) < 0) goto error;
  if (v != NULL && v != Py_None) {
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: masked arrays (%s with a 'mask') cannot be "
                 "described by DLPack",
                 which);
    goto error;
  }
  if (ai_item(ai, "typestr", &v) < 0) goto error;
  if (v == NULL) {
    PyErr_Format(PyExc_TypeError, "from_dlpack: %s has no 'typestr'", which);
    goto error;
  }
  if (typestr_dtype(v, &t.dtype) < 0) goto error;
  int64_t itemsize = dlb_dtype_itemsize(t.dtype);
  if (ai_item(ai, "shape", &v) < 0) goto error;
  if (v == NULL) {
    PyErr_Format(PyExc_TypeError, "from_dlpack: %s has no 'shape'", which);
    goto error;
  }
  int nd = int_tuple(v, shape, "shape");
  if (nd < 0) goto error;
  t.ndim = nd;
  t.shape = nd > 0 ? shape : NULL;
  if (ai_item(ai, "strides", &v) < 0) goto error;
  if (v != NULL && v != Py_None) {
    int64_t bstrides[DLB_MAX_NDIM];
    int ns = int_tuple(v, bstrides, "strides");
    if (ns < 0) goto error;
    if (ns != nd) {
      PyErr_Format(PyExc_ValueError,
                   "from_dlpack: %s has %d strides for %d dimensions", which,
                   ns, nd);
      goto error;
    }
    for (int i = 0; i < nd; i++) {
      if (bstrides[i] % itemsize != 0) {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: %s stride %lld of dimension %d is not a "
                     "multiple of the itemsize %lld; DLPack strides count "
                     "elements",
                     which, (long long)bstrides[i], i, (long long)itemsize);
        goto error;
      }
      strides[i] = bstrides[i] / itemsize;
    }
    t.strides = nd > 0 ? strides : NULL;
  }
  if (ai_item(ai, "data", &v) < 0) goto error;
  if (v != NULL && PyTuple_Check(v)) {
    if (PyTuple_GET_SIZE(v) != 2) {
      PyErr_Format(PyExc_TypeError,
                   "from_dlpack: %s 'data' must be (pointer, readonly)", which);
      goto error;
    }
    void *p = PyLong_AsVoidPtr(PyTuple_GET_ITEM(v, 0));
    if (p == NULL && PyErr_Occurred()) goto error;
    int ro = PyObject_IsTrue(PyTuple_GET_ITEM(v, 1));
    if (ro < 0) goto error;
    t.data = p;
    if (ro) flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    /* 'offset' applies only to buffer data (the protocol's rule). */
  } else if (!cuda) {
    /* data is a buffer object, or None/absent: the owner's own buffer. */
    PyObject *src = (v == NULL || v == Py_None) ? obj : v;
    if (get_buffer_rw(src, &k->view) < 0) goto error;
    k->has_view = 1;
    t.data = k->view.buf;
    if (k->view.readonly) flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    PyObject *off;
    if (ai_item(ai, "offset", &off) < 0) goto error;
    if (off != NULL && off != Py_None) {
      long long o = PyLong_AsLongLong(off);
      if (o == -1 && PyErr_Occurred()) goto error;
      if (o < 0 || o > (long long)k->view.len) {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: %s offset %lld is outside the %zd-byte "
                     "buffer",
                     which, o, k->view.len);
        goto error;
      }
      t.byte_offset = (uint64_t)o;
    }
  } else {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: %s 'data' must be a (pointer, readonly) tuple",
                 which);
    goto error;
  }
  if (cuda) {
    /* The owning device cannot be recovered from the pointer without the
     * CUDA runtime (cuPointerGetAttribute), which dlbridge does not load
     * yet: record device 0.  The interface's 'stream' (v3) asks the
     * consumer to synchronise before use; with no CUDA runtime we cannot,
     * and we never touch the memory ourselves -- the Tensor is a view whose
     * users must order their work themselves (device support is a later
     * issue). */
    t.device.device_type = kDLCUDA;
    t.device.device_id = 0;
  } else {
    t.device.device_type = kDLCPU;
    t.device.device_id = 0;
  }
  {
    py_keeper *kk = k;
    k = NULL;
    if (wrap_keeper(&t, flags, kk, &m) < 0) goto error;
  }
  *out = m;
  return 0;

error:
  keeper_free(k);
  return -1;
}

static PyObject *import_array_interface(dlb_module_state *st, PyObject *obj,
                                        PyObject *ai, int cuda,
                                        const DLDevice *target, int copy) {
  DLManagedTensorVersioned *m = NULL;
  if (array_interface_managed(obj, ai, cuda, &m) < 0) return NULL;
  return finish(st, m, target, copy);
}

/* Shared with exchange.c: an owning managed tensor for obj's
 * __array_interface__ (cuda == 0) or __cuda_array_interface__ (cuda == 1). */
int dlb__array_interface_managed(dlb_module_state *st, PyObject *obj, int cuda,
                                 DLManagedTensorVersioned **out) {
  PyObject *ai = NULL;
  PyObject *name = cuda ? st->str_cuda_array_interface : st->str_array_interface;
  int found = get_optional_attr(obj, name, &ai);
  if (found < 0) return -1;
  if (!found) {
    PyErr_Format(PyExc_TypeError, "an object of type '%.200s' has no %U",
                 Py_TYPE(obj)->tp_name, name);
    return -1;
  }
  int rc = array_interface_managed(obj, ai, cuda, out);
  if (rc < 0)
    clear_keep_error(&ai);
  else
    Py_DECREF(ai);
  return rc;
}

/* ---- b. the per-type handler: exchange tables and NumPy ---------------------- */

/* dlb_release_fn for a NumPy import: drops the array the Tensor views.  Any
 * thread, with or without the GIL, even at shutdown (then it leaks). */
static void release_pyobject(void *ctx) {
  if (ctx != NULL) dlb__release_ref((PyObject *)ctx, 0);
}

/* Objects whose type the handler cache (exchange.c) reads directly: types
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
    if (h->api->managed_tensor_from_py_object_no_sync(obj, &m) != 0 ||
        m == NULL) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: the exchange table of '%.200s' failed to "
                     "export the object without saying why",
                     Py_TYPE(obj)->tp_name);
      return -1;
    }
    if (dlb_managed_check_version(m, &err) != DLB_OK) {
      delete_keep_error(m); /* the spec: unknown major -> delete, read nothing */
      raise_core("unsupported DLPack version from the exchange table", &err);
      return -1;
    }
    if (dlb_tensor_validate(&m->dl_tensor, 0, &err) != DLB_OK) {
      delete_keep_error(m);
      raise_core("the exchange table's tensor cannot be imported", &err);
      return -1;
    }
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
      raise_core("cannot wrap the array", &err);
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
  if (type_has(obj, st->str_dlpack))
    return import_dunder_dlpack(st, obj, device, copy);

  /* d. raw capsules */
  if (PyCapsule_CheckExact(obj))
    return import_capsule(st, obj, device, copy, "the capsule");

  /* e. legacy producers */
  found = legacy_producer_capsule(obj, &attr);
  if (found < 0) return NULL;
  if (found) {
    result = import_capsule(st, attr, device, copy, "the legacy producer");
    if (result == NULL)
      clear_keep_error(&attr);
    else
      Py_DECREF(attr);
    return result;
  }

  /* f. buffer protocol */
  if (PyObject_CheckBuffer(obj)) return import_buffer(st, obj, device, copy);

  /* g. __array_interface__, h. __cuda_array_interface__ */
  found = get_optional_attr(obj, st->str_array_interface, &attr);
  if (found < 0) return NULL;
  if (found) {
    result = import_array_interface(st, obj, attr, 0, device, copy);
    Py_DECREF(attr);
    return result;
  }
  found = get_optional_attr(obj, st->str_cuda_array_interface, &attr);
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
