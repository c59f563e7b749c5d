/*
 * readers.c -- owning readers of foreign objects: each protocol a tensor
 * can arrive by is read here, in one place, into an owned, validated
 * DLManagedTensorVersioned (0, or -1 with an exception and nothing owned):
 *   - DLPack capsules, "dltensor_versioned" / "dltensor" (dlb__consume_capsule);
 *   - __dlpack__ / __dlpack_device__, versioned first, then without
 *     dl_device= and copy=True when the producer cannot honour them, then
 *     without the 2023.12 keywords on TypeError; what copy= and dl_device=
 *     asked is then done by import.c (dlb__dunder_dlpack_managed);
 *   - TensorFlow's eager tensors through TF's own capsule export, which
 *     their __dlpack__ wraps (dlb__tf_eager_managed);
 *   - legacy producers: obj.toDlpack() (old CuPy), obj.to_dlpack() (cuDF),
 *     MXNet's obj.to_dlpack_for_write() / to_dlpack_for_read() (the latter
 *     imported read-only), and tensorflow.experimental.dlpack.to_dlpack(obj)
 *     for TensorFlow objects -- of v.value() for a tf.Variable
 *     (tf_variable_value) -- (dlb__legacy_producer_capsule gives the
 *     capsule, dlb__legacy_producer_managed the tensor);
 *   - the buffer protocol (dlb__buffer_managed);
 *   - __array_interface__ (version 3) and __cuda_array_interface__
 *     (dlb__array_interface_managed, dlb__array_interface_dict_managed).
 * import.c decides which reader applies and what to do with the result;
 * views.c uses the __dlpack__ and array-interface readers for kinds that
 * have no borrowed form.
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
 *   3.3 versioned capsules with NULL strides are accepted as row-major
 *       (lenient): the data is unambiguous and older NumPy sent exactly that.
 *   3.6 legacy ("dltensor") capsules import as WRITABLE (DESIGN.md).
 * Streams: a CPU producer is never passed a stream.  A CUDA producer is
 * passed dlbridge's current stream (cuda.c: dlb.stream, else 1, the legacy
 * default stream), before which it orders its work; ROCm gets stream=0.
 * Other devices get no stream.  A __cuda_array_interface__ v3 'stream' is
 * ordered before dlbridge's current stream on the GPU (never a host wait),
 * and its pointer is asked of the driver: the device is the pointer's own,
 * and host memory claimed as CUDA memory is a BufferError.
 */
#include "dlbridge_py.h"

#include <string.h>

/* ---- optional attributes ------------------------------------------------------ */

/* Look up an attribute that may be missing: 1 found (*out new ref), 0
 * missing (no exception), -1 error.  AttributeError is the only exception
 * that means "missing". */
int dlb__get_optional_attr(PyObject *obj, PyObject *name, PyObject **out) {
  return dlb__py_get_optional_attr(obj, name, out);
}

/* ---- keeping Python owners alive from a managed tensor -------------------- */

/* The release context of tensors that view memory a Python object owns is
 * a dlb_py_keeper (tensor.c): a Py_buffer (buffer protocol) and/or a strong
 * reference (array interface owner), which the Tensor's GC traversal can
 * see. */

/* Wrap view (CPU or CUDA memory a Python object owns) into a managed tensor
 * that releases k when deleted.  Steals k on success and on failure. */
static int wrap_keeper(const DLTensor *view, uint64_t flags, dlb_py_keeper *k,
                       DLManagedTensorVersioned **out) {
  dlb_error err;
  int rc = dlb_tensor_validate(view, 0, &err);
  if (rc != DLB_OK) {
    dlb__keeper_free(k);
    dlb__raise_import("the object's memory cannot be described", &err);
    return -1;
  }
  rc = dlb_managed_wrap(view, flags, dlb__keeper_release, k, out, &err);
  if (rc != DLB_OK) {
    dlb__keeper_free(k);
    dlb__raise_import("cannot wrap the object's memory", &err);
    return -1;
  }
  return 0;
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
    PyObject *src = dlb__export_source_legacy(lm);
    if (src != NULL &&
        dlb__tensor_export_managed((dlb_TensorObject *)src, &m, &err) ==
            DLB_OK) {
      /* A legacy export of a dlb.Tensor: the same export, versioned, which
       * import.c recognises and answers with the Tensor itself instead of
       * a wrapper around a wrapper (the Tensor is writable: a legacy export
       * of a read-only one is refused, decision 3.6 holds). */
      dlb_managed_delete_legacy(lm);
      *out = m;
      return 0;
    }
    if (dlb_managed_from_legacy(lm, &m, &err) != DLB_OK) {
      dlb_managed_delete_legacy(lm);
      dlb__raise_import("cannot wrap the legacy tensor", &err);
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

int dlb__consume_capsule(PyObject *cap, DLManagedTensorVersioned **out) {
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

/* ---- c. __dlpack__ ---------------------------------------------------------- */

/* Device types whose memory is the host's own, one space per process:
 * there a device id says nothing, and a producer that gives None for it
 * (PaddlePaddle 3.3: (kDLCPU, None)) means 0. */
static int is_host_device_type(int64_t type) {
  return type == kDLCPU || type == kDLCUDAHost || type == kDLROCMHost;
}

/* Read a (device_type, device_id) pair from __dlpack_device__'s result:
 * the type as dlb__device_type_int reads it (an int, an IntEnum, a plain
 * Enum with an int value), the id an int, or None on a host device. */
static int parse_device_pair(PyObject *r, DLDevice *out) {
  if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: __dlpack_device__() returned %.200s; expected "
                 "a (device_type, device_id) tuple",
                 Py_TYPE(r)->tp_name);
    return -1;
  }
  PyObject *ot = PyTuple_GET_ITEM(r, 0), *oi = PyTuple_GET_ITEM(r, 1);
  int64_t type, id = 0;
  PyObject *tv = dlb__device_type_int(ot);
  if (tv == NULL) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_TypeError,
                   "from_dlpack: __dlpack_device__() returned %R: the device "
                   "type must be an int or an enum.Enum member with an int "
                   "value, not %.200s",
                   r, Py_TYPE(ot)->tp_name);
    return -1;
  }
  int rc = dlb__read_int64(tv, "from_dlpack: __dlpack_device__() device type",
                           &type);
  Py_DECREF(tv);
  if (rc < 0) return -1;
  if (oi == Py_None) {
    if (!is_host_device_type(type)) {
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: __dlpack_device__() returned %R: a device "
                   "id of None is read as 0 only for host memory (CPU, "
                   "CUDA host, ROCm host); device type %lld needs an id",
                   r, (long long)type);
      return -1;
    }
  } else if (!PyLong_Check(oi) && !PyIndex_Check(oi)) {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: __dlpack_device__() returned %R: the device id "
                 "must be an int, not %.200s",
                 r, Py_TYPE(oi)->tp_name);
    return -1;
  } else if (dlb__read_int64(oi, "from_dlpack: __dlpack_device__() device id",
                             &id) < 0) {
    return -1;
  }
  if (type < INT32_MIN || type > INT32_MAX || id < 0 || id > INT32_MAX) {
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: __dlpack_device__() returned (%lld, %lld), "
                 "which is not a valid device",
                 (long long)type, (long long)id);
    return -1;
  }
  out->device_type = (DLDeviceType)type;
  out->device_id = (int32_t)id;
  return 0;
}

/* The keywords a __dlpack__ call may carry, as a mask. */
enum {
  KW_MAX_VERSION = 1u << 0,
  KW_STREAM = 1u << 1,
  KW_DL_DEVICE = 1u << 2,
  KW_COPY = 1u << 3,
};

/* obj.__dlpack__() with the keywords in mask (values: stream, dl_device,
 * copy 0/1); a new reference, or NULL with the producer's exception. */
static PyObject *call_dunder(dlb_module_state *st, PyObject *obj,
                             unsigned mask, PyObject *stream,
                             PyObject *dl_device, int copy) {
  /* buf[0] is the spare slot PY_VECTORCALL_ARGUMENTS_OFFSET lets the
   * callee borrow; args[0] is self, then the keyword values. */
  PyObject *buf[6];
  PyObject **args = buf + 1;
  PyObject *names[4];
  Py_ssize_t nkw = 0;
  args[0] = obj;
  if (mask & KW_MAX_VERSION) {
    args[1 + nkw] = st->max_version_tuple;
    names[nkw++] = st->str_max_version;
  }
  if (mask & KW_STREAM) {
    args[1 + nkw] = stream;
    names[nkw++] = st->str_stream;
  }
  if (mask & KW_DL_DEVICE) {
    args[1 + nkw] = dl_device;
    names[nkw++] = st->str_dl_device;
  }
  if (mask & KW_COPY) {
    args[1 + nkw] = copy ? Py_True : Py_False;
    names[nkw++] = st->str_copy;
  }
  if (nkw == 0) return PyObject_CallMethodNoArgs(obj, st->str_dlpack);
  PyObject *kwnames = PyTuple_New(nkw);
  if (kwnames == NULL) return NULL;
  for (Py_ssize_t i = 0; i < nkw; i++)
    PyTuple_SET_ITEM(kwnames, i, Py_NewRef(names[i]));
  PyObject *cap = PyObject_VectorcallMethod(
      st->str_dlpack, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
  Py_DECREF(kwnames);
  return cap;
}

/* After a failed call with `mask`, ask again with `retry` (a subset), the
 * retry's error (if any) carrying the first as its __context__. */
static PyObject *call_dunder_again(dlb_module_state *st, PyObject *obj,
                                   unsigned retry, PyObject *stream,
                                   PyObject *dl_device, int copy) {
  dlb__saved_error first;
  dlb__error_save(&first);
  PyObject *cap = call_dunder(st, obj, retry, stream, dl_device, copy);
  if (cap == NULL)
    dlb__error_chain_context(&first);
  else
    dlb__error_discard(&first);
  return cap;
}

/* Shared with views.c (DLB_KIND_DLPACK views): call __dlpack__ with the
 * negotiation below and take ownership of what it returns.  0 with *out
 * owned and validated, -1 with an exception.
 *
 * The ladder (docs/decisions.md, "Keywords producers refuse"): first every
 * keyword that applies (max_version, the stream, dl_device, copy).  A
 * producer that cannot honour dl_device= or copy=True -- any exception
 * but MemoryError: TensorFlow 2.21 raises RuntimeError for copy=True -- is
 * asked again without those two, since dlbridge then moves or copies the
 * data itself (import.c's plan()) and nothing asked for is lost; copy=False
 * is never dropped this way (a producer that cannot share must say so).  A
 * TypeError (a producer older than the 2023.12 keywords) is then asked once
 * more with the stream alone, which the old signature had. */
int dlb__dunder_dlpack_managed(dlb_module_state *st, PyObject *obj,
                               const DLDevice *target, int copy,
                               DLManagedTensorVersioned **out) {
  int result = -1;
  PyObject *cap = NULL, *dev_res = NULL;
  PyObject *stream = NULL, *dl_device = NULL;
  DLDevice src = {kDLCPU, 0};
  int have_src = 0;
  unsigned mask = KW_MAX_VERSION;

  /* As the array API does: the device first, to choose stream and target.
   * Its errors (BufferError above all) propagate.  A producer without it
   * is tolerated and treated as "device unknown". */
  if (dlb__type_has(Py_TYPE(obj), st->str_dlpack_device)) {
    dev_res = PyObject_CallMethodNoArgs(obj, st->str_dlpack_device);
    if (dev_res == NULL) goto cleanup;
    if (parse_device_pair(dev_res, &src) < 0) goto cleanup;
    /* A type that is no device (< 1) would be refused in the capsule
     * anyway: say so before the producer exports (or copies) anything.  A
     * type without a name is a foreign device, held like any other. */
    if (!dlb_device_type_valid((int32_t)src.device_type)) {
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: __dlpack_device__() returned %R: device "
                   "type %d is not a DLPack device type",
                   dev_res, (int)src.device_type);
      goto cleanup;
    }
    have_src = 1;
  }

  /* The stream: nothing for the CPU and stream-less devices. */
  if (have_src && (src.device_type == kDLCUDA ||
                   src.device_type == kDLCUDAManaged)) {
    /* dlbridge's current stream (dlb.stream; 1, the legacy stream, by
     * default): the producer orders its work before it. */
    stream = dlb__stream_current_object();
    if (stream == NULL) goto cleanup;
  } else if (have_src && src.device_type == kDLROCM) {
    stream = PyLong_FromLong(0); /* ROCm's default stream */
    if (stream == NULL) goto cleanup;
  }
  if (stream != NULL) mask |= KW_STREAM;

  /* dl_device only when the data has to move: asking a producer for the
   * device it is already on gains nothing and trips old producers.  Moves
   * from or to CUDA memory, and copies of it, are dlbridge's own (import.c
   * finishes them on its current stream): such a producer is asked for a
   * view where its data is. */
  int we_copy = (have_src && dlb__is_cuda_device(src)) ||
                (target != NULL && dlb__is_cuda_device(*target));
  if (we_copy && copy == 1) copy = -1;
  if (!we_copy && target != NULL &&
      !(have_src && dlb__same_device(*target, src))) {
    dl_device = Py_BuildValue("(ii)", (int)target->device_type,
                              (int)target->device_id);
    if (dl_device == NULL) goto cleanup;
    mask |= KW_DL_DEVICE;
  }
  if (copy >= 0) mask |= KW_COPY;

  cap = call_dunder(st, obj, mask, stream, dl_device, copy);
  if (cap == NULL && ((mask & KW_DL_DEVICE) || copy == 1) && copy != 0 &&
      !PyErr_ExceptionMatches(PyExc_TypeError) &&
      PyErr_ExceptionMatches(PyExc_Exception) &&
      !PyErr_ExceptionMatches(PyExc_MemoryError)) {
    /* A request the producer cannot carry out, which dlbridge can. */
    mask &= ~(unsigned)(KW_DL_DEVICE | KW_COPY);
    cap = call_dunder_again(st, obj, mask, stream, dl_device, copy);
  }
  if (cap == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
    /* The pre-2023.12 signature.  Nothing the caller asked for is lost by
     * it (B57, B58): the old protocol exports without copying and where
     * the data is, so import.c's plan() then does what copy= and dl_device=
     * asked -- copies for copy=True or another device (a legacy capsule
     * never says IS_COPIED), and refuses copy=False only when the capsule
     * says it was copied. */
    cap = call_dunder_again(st, obj, mask & KW_STREAM, stream, dl_device,
                            copy);
  }
  if (cap == NULL) goto cleanup;
  if (!PyCapsule_CheckExact(cap)) {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: __dlpack__() returned %.200s, not a DLPack "
                 "PyCapsule",
                 Py_TYPE(cap)->tp_name);
    goto cleanup;
  }
  if (dlb__consume_capsule(cap, out) < 0) goto cleanup;
  result = 0;

cleanup:
  if (result < 0) {
    /* The capsule's destructor runs here; keep our error intact. */
    dlb__clear_keep_error(&cap);
    dlb__clear_keep_error(&dev_res);
  } else {
    Py_XDECREF(cap);
    Py_XDECREF(dev_res);
  }
  Py_XDECREF(stream);
  Py_XDECREF(dl_device);
  return result;
}

/* ---- c'. TensorFlow's eager tensors -------------------------------------------- */

/* TensorFlow's DT_STRING, DT_RESOURCE and DT_VARIANT: not plain memory,
 * and TFE_ToDlpackCapsule fails a CHECK (abort) on them. */
static int tf_dtype_aborts(long dt) { return dt == 7 || dt == 20 || dt == 21; }

int dlb__tf_eager_managed(const dlb_handler *h, PyObject *obj,
                          DLManagedTensorVersioned **out) {
  /* Held: the calls run Python code, and h is only borrowed. */
  PyObject *fn = Py_NewRef(h->to_capsule);
  PyObject *dtype_enum = Py_NewRef(h->dtype_enum);
  PyObject *cap = NULL, *e = PyObject_CallOneArg(dtype_enum, obj);
  Py_DECREF(dtype_enum);
  long dt = e != NULL ? PyLong_AsLong(e) : -1;
  Py_XDECREF(e);
  if (dt == -1 && PyErr_Occurred()) {
    Py_DECREF(fn);
    return -1;
  }
  if (tf_dtype_aborts(dt)) {
    Py_DECREF(fn);
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: a TensorFlow tensor of dtype %s has no "
                 "DLPack form (TensorFlow would abort the process exporting "
                 "it)",
                 dt == 7 ? "string" : dt == 20 ? "resource" : "variant");
    return -1;
  }
  cap = PyObject_CallOneArg(fn, obj);
  Py_DECREF(fn);
  if (cap == NULL) return -1;
  int rc = -1;
  if (!PyCapsule_CheckExact(cap))
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: TensorFlow's TFE_ToDlpackCapsule returned "
                 "%.200s, not a DLPack PyCapsule",
                 Py_TYPE(cap)->tp_name);
  else
    rc = dlb__consume_capsule(cap, out);
  if (rc < 0)
    dlb__clear_keep_error(&cap);
  else
    Py_DECREF(cap);
  return rc;
}

/* A tf.Variable's current value as TensorFlow's own ops read it: v.value()
 * -- eagerly a ReadVariableOp, which every recording tape sees (and which
 * makes a tape watch a trainable variable), and whose tensor shares the
 * variable's buffer (TF copies the buffer on a later assignment while it
 * is shared) -- never through its resource handle, which no tape watches
 * and which to_dlpack refuses.  1 with *value set (a new reference), 0
 * when obj is no Variable (of any kind: tf.Variable is the base of the
 * resource and distributed ones), -1 with an exception. */
static int tf_variable_value(PyObject *obj, PyObject **value) {
  *value = NULL;
  PyObject *tf = PyImport_ImportModule("tensorflow");
  if (tf == NULL) return -1;
  PyObject *variable = PyObject_GetAttrString(tf, "Variable");
  Py_DECREF(tf);
  if (variable == NULL) return -1;
  int is = PyObject_IsInstance(obj, variable);
  Py_DECREF(variable);
  if (is <= 0) return is;
  *value = PyObject_CallMethod(obj, "value", NULL);
  if (*value == NULL) return -1;
  /* to_dlpack aborts the process on these dtypes (tf_dtype_aborts) */
  PyObject *e = PyObject_CallMethod(*value, "_datatype_enum", NULL);
  long dt = e != NULL ? PyLong_AsLong(e) : -1;
  Py_XDECREF(e);
  if (dt == -1 && PyErr_Occurred()) {
    Py_CLEAR(*value);
    return -1;
  }
  if (tf_dtype_aborts(dt)) {
    Py_CLEAR(*value);
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: a tf.Variable of dtype %s has no DLPack form",
                 dt == 7 ? "string" : dt == 20 ? "resource" : "variant");
    return -1;
  }
  return 1;
}

/* ---- e. legacy producers ------------------------------------------------------ */

/* The methods of legacy producers (DLB_LEGACY_METHOD_NAMES), tried in
 * order: old CuPy's toDlpack(), cuDF's to_dlpack(), and MXNet's pair --
 * to_dlpack_for_write() first, since from_dlpack's result may be written
 * (MXNet then orders the export after pending reads and writes),
 * to_dlpack_for_read() when it is the only one (MXNet orders only after
 * pending writes, so that capsule is imported READ-ONLY).  Looked up on the
 * type, as methods (a cached lookup: this ladder runs before the buffer
 * protocol for every bytes-like object). */

/* 1 with *cap set (new ref) and *read_only, 0 not a legacy producer, -1
 * error. */
static int legacy_capsule(dlb_module_state *st, PyObject *obj, PyObject **cap,
                          int *read_only) {
  *read_only = 0;
  for (int i = 0; i < DLB_N_LEGACY_METHODS; i++) {
    if (!dlb__type_has(Py_TYPE(obj), st->str_legacy[i])) continue;
    *cap = PyObject_CallMethodNoArgs(obj, st->str_legacy[i]);
    *read_only = i == DLB_LEGACY_FOR_READ;
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
  PyObject *value = NULL;
  if (tf_variable_value(obj, &value) < 0) return -1;
  PyObject *tfdl = PyImport_ImportModule("tensorflow.experimental.dlpack");
  if (tfdl == NULL) {
    Py_XDECREF(value);
    return -1;
  }
  *cap = PyObject_CallMethod(tfdl, "to_dlpack", "O",
                             value != NULL ? value : obj);
  Py_DECREF(tfdl);
  Py_XDECREF(value); /* the capsule holds the tensor's buffer */
  if (*cap == NULL && !PyErr_ExceptionMatches(PyExc_BufferError)) {
    /* Its eager tensors have __dlpack__ and never get here: what does is
     * no tensor TF exports (a TensorShape, a DType, a Dataset, a ragged
     * or sparse tensor), which TF says with InvalidArgumentError. */
    dlb__saved_error e;
    dlb__error_save(&e); /* the message is made with none pending */
    PyObject *prefix = PyUnicode_FromFormat(
        "'%.200s' is no tensor dlbridge can read: TensorFlow exports "
        "only its eager tensors through DLPack "
        "(tf.experimental.dlpack.to_dlpack refused it)",
        Py_TYPE(obj)->tp_name);
    if (prefix != NULL) {
      dlb__error_restore(&e);
      dlb__error_reraise(PyExc_TypeError, PyExc_Exception, prefix);
      Py_DECREF(prefix);
    } else {
      dlb__error_discard(&e); /* a MemoryError says more now */
    }
  }
  return *cap == NULL ? -1 : 1;
}

int dlb__legacy_producer_capsule(dlb_module_state *st, PyObject *obj,
                                 PyObject **cap) {
  int read_only;
  return legacy_capsule(st, obj, cap, &read_only);
}

int dlb__legacy_producer_managed(dlb_module_state *st, PyObject *obj,
                                 DLManagedTensorVersioned **out) {
  PyObject *cap = NULL;
  int read_only;
  int found = legacy_capsule(st, obj, &cap, &read_only);
  if (found <= 0) return found;
  int rc = -1;
  if (!PyCapsule_CheckExact(cap)) {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: the legacy producer returned %.200s, not a "
                 "DLPack PyCapsule",
                 Py_TYPE(cap)->tp_name);
  } else if (dlb__consume_capsule(cap, out) == 0) {
    if (read_only) (*out)->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    rc = 1;
  }
  if (rc < 0)
    dlb__clear_keep_error(&cap);
  else
    Py_DECREF(cap);
  return rc;
}

/* ---- buffer protocol ------------------------------------------------------------ */

/* Get a buffer, writable when the exporter allows (to learn read-only-ness
 * without a second protocol), read-only otherwise. */
static int get_buffer_rw(PyObject *obj, Py_buffer *view) {
  if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS) == 0) return 0;
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
  PyErr_Clear();
  return PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO);
}

/* An owning managed tensor viewing obj's buffer (CPU); the buffer is held
 * until the tensor is deleted. */
int dlb__buffer_managed(PyObject *obj, DLManagedTensorVersioned **out) {
  int64_t shape[DLB_MAX_NDIM], strides[DLB_MAX_NDIM];
  DLTensor t;
  dlb_py_keeper *k = dlb__keeper_new();
  if (k == NULL) return -1;
  if (get_buffer_rw(obj, &k->view) < 0) {
    dlb__keeper_free(k);
    return -1;
  }
  k->has_view = 1;
  if (dlb__dltensor_from_buffer(&k->view, &t, shape, strides) < 0) {
    dlb__keeper_free(k);
    return -1;
  }
  uint64_t flags = k->view.readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
  return wrap_keeper(&t, flags, k, out);
}

/* ---- g./h. array interfaces -------------------------------------------------------- */

/* ai[key], borrowed, in *v (NULL when absent): 0, or -1 with an exception.
 * Not PyDict_GetItemString: it swallows a failure to make the key (a
 * MemoryError), which would then be reported as the key missing.  ai must
 * be a dict nobody else can reach (the reader's private copy): reading a
 * value can run Python code (__index__ of a shape entry), which could
 * otherwise mutate the dict and free the values still in use. */
static int ai_item(PyObject *ai, const char *key, PyObject **v) {
  PyObject *k = PyUnicode_FromString(key);
  if (k == NULL) return -1;
  *v = PyDict_GetItemWithError(ai, k); /* the dict keeps the value alive */
  Py_DECREF(k);
  return (*v == NULL && PyErr_Occurred()) ? -1 : 0;
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
    if (dlb__read_int64(PyTuple_GET_ITEM(o, i), "from_dlpack: array interface entry",
                        &arr[i]) < 0)
      return -1;
  }
  return (int)n;
}

/* The device of a __cuda_array_interface__ pointer, from the driver
 * (cuPointerGetAttributes: the owning GPU's ordinal, or managed / pinned
 * memory; host memory claimed as CUDA is a BufferError), and the ordering
 * its v3 'stream' asks for: the producer's stream before dlbridge's current
 * one, on the GPU.  A NULL pointer (an empty array) is taken as cuda:0
 * without asking.  0, or -1 with an exception. */
static int cai_device_and_order(PyObject *ai, void *data, DLDevice *device) {
  dlb_error err;
  PyObject *v;
  int64_t value;
  void *producer = NULL;
  bool order = false;
  device->device_type = kDLCUDA;
  device->device_id = 0;
  if (data != NULL &&
      dlb_cuda_device_of_pointer(data, device, &err) != DLB_OK) {
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: __cuda_array_interface__ data %p is not CUDA "
                 "memory: %s",
                 data, err.message);
    return -1;
  }
  if (ai_item(ai, "stream", &v) < 0) return -1;
  if (v != NULL && v != Py_None &&
      dlb__read_int64(v, "from_dlpack: __cuda_array_interface__ stream",
                      &value) < 0)
    return -1;
  if (dlb_cuda_stream_from_cai(v != NULL && v != Py_None ? &value : NULL,
                               &producer, &order, &err) != DLB_OK) {
    PyErr_Format(PyExc_BufferError, "from_dlpack: %s", err.message);
    return -1;
  }
  if (order && device->device_type != kDLCUDAHost)
    return dlb__stream_order_before_current(*device, producer);
  return 0;
}

/* The raw bytes of an __array_interface__ 'data' buffer (or of the owner's
 * own buffer): writable when the exporter allows, read-only otherwise.  A
 * SIMPLE request, since the interface lays its own shape and strides over
 * the bytes from buf on: an exporter whose memory is not one contiguous
 * block (a strided memoryview) refuses it, and must not be read as if it
 * were. */
static int get_bytes_rw(PyObject *src, const char *which, Py_buffer *view) {
  if (PyObject_GetBuffer(src, view, PyBUF_WRITABLE) == 0) return 0;
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
  PyErr_Clear();
  if (PyObject_GetBuffer(src, view, PyBUF_SIMPLE) == 0) return 0;
  if (!PyErr_ExceptionMatches(PyExc_BufferError)) return -1;
  dlb__saved_error first;
  dlb__error_save(&first);
  PyErr_Format(PyExc_BufferError,
               "from_dlpack: the %s data buffer of type '%.200s' is not one "
               "contiguous block of bytes",
               which, Py_TYPE(src)->tp_name);
  dlb__error_chain_context(&first);
  return -1;
}

/* Check that the bytes t's elements touch lie inside the len-byte buffer
 * at t->data (t->byte_offset is from that buffer's start): the interface
 * is untrusted, and nothing else ever compares its shape, strides and
 * offset with the length of the memory it names. */
static int check_inside_buffer(const DLTensor *t, Py_ssize_t len,
                               const char *which) {
  dlb_error err;
  int64_t lo, hi;
  if (dlb_tensor_validate(t, 0, &err) != DLB_OK) {
    dlb__raise_import("the array interface cannot be described", &err);
    return -1;
  }
  if (dlb_tensor_byte_span(t, &lo, &hi, &err) != DLB_OK) {
    dlb__raise_import("the array interface cannot be described", &err);
    return -1;
  }
  if (lo == hi) return 0; /* no elements: no byte is read */
  /* byte_offset <= len (checked by the caller), so neither sum overflows. */
  int64_t off = (int64_t)t->byte_offset;
  if (off + lo < 0 || hi > (int64_t)len - off) {
    PyErr_Format(PyExc_BufferError,
                 "from_dlpack: %s describes bytes [%lld, %lld) of its data "
                 "buffer, which holds %zd bytes",
                 which, (long long)(off + lo), (long long)(off + hi), len);
    return -1;
  }
  return 0;
}

/* Import a v3 __array_interface__ (cuda == 0) or __cuda_array_interface__
 * (cuda == 1) dictionary whose owner is obj. */
int dlb__array_interface_dict_managed(PyObject *obj, PyObject *ai, int cuda,
                                     DLManagedTensorVersioned **out) {
  const char *which = cuda ? "__cuda_array_interface__" : "__array_interface__";
  DLManagedTensorVersioned *m = NULL;
  int64_t shape[DLB_MAX_NDIM], strides[DLB_MAX_NDIM];
  DLTensor t;
  uint64_t flags = 0;
  dlb_py_keeper *k = NULL;
  PyObject *v, *d = NULL;

  memset(&t, 0, sizeof t);
  if (!PyDict_Check(ai)) {
    PyErr_Format(PyExc_TypeError, "from_dlpack: %s must be a dict, not %.200s",
                 which, Py_TYPE(ai)->tp_name);
    goto error;
  }
  /* Read a private shallow copy: it holds strong references to every value
   * (and the tuples to their items) whatever Python code run by the reads
   * below does to the producer's dict (ai_item). */
  d = PyDict_Copy(ai);
  if (d == NULL) goto error;
  ai = d;
  k = dlb__keeper_new();
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
  if (dlb__typestr_dtype(v, &t.dtype) < 0) goto error;
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
    int bad = dlb__elem_strides(nd, shape, bstrides, itemsize, strides);
    if (bad >= 0) {
      dlb__raise_stride_not_multiple(
          cuda ? "from_dlpack: __cuda_array_interface__"
               : "from_dlpack: __array_interface__",
          bstrides, bad, itemsize);
      goto error;
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
    if (p == NULL && PyErr_Occurred()) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) goto error;
      PyErr_Clear();
      PyErr_Format(PyExc_BufferError,
                   "from_dlpack: %s data address %R is not an address", which,
                   PyTuple_GET_ITEM(v, 0));
      goto error;
    }
    int ro = PyObject_IsTrue(PyTuple_GET_ITEM(v, 1));
    if (ro < 0) goto error;
    t.data = p;
    if (ro) flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    /* 'offset' applies only to buffer data (the protocol's rule). */
  } else if (!cuda) {
    /* data is a buffer object, or None/absent: the owner's own buffer. */
    PyObject *src = (v == NULL || v == Py_None) ? obj : v;
    if (get_bytes_rw(src, which, &k->view) < 0) goto error;
    k->has_view = 1;
    t.data = k->view.buf;
    if (k->view.readonly) flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    PyObject *off;
    if (ai_item(ai, "offset", &off) < 0) goto error;
    if (off != NULL && off != Py_None) {
      int64_t o;
      if (dlb__read_int64(off, "from_dlpack: array interface offset", &o) < 0)
        goto error;
      if (o < 0 || o > (long long)k->view.len) {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: %s offset %lld is outside the %zd-byte "
                     "buffer",
                     which, (long long)o, k->view.len);
        goto error;
      }
      t.byte_offset = (uint64_t)o;
    }
    t.device.device_type = kDLCPU;
    if (check_inside_buffer(&t, k->view.len, which) < 0) goto error;
  } else {
    PyErr_Format(PyExc_TypeError,
                 "from_dlpack: %s 'data' must be a (pointer, readonly) tuple",
                 which);
    goto error;
  }
  if (cuda) {
    if (cai_device_and_order(d, t.data, &t.device) < 0) goto error;
  } else {
    t.device.device_type = kDLCPU;
    t.device.device_id = 0;
  }
  {
    dlb_py_keeper *kk = k;
    k = NULL;
    if (wrap_keeper(&t, flags, kk, &m) < 0) goto error;
  }
  Py_DECREF(d);
  *out = m;
  return 0;

error:
  dlb__keeper_free(k);
  dlb__clear_keep_error(&d);
  return -1;
}

/* Shared with views.c: an owning managed tensor for obj's
 * __array_interface__ (cuda == 0) or __cuda_array_interface__ (cuda == 1). */
int dlb__array_interface_managed(dlb_module_state *st, PyObject *obj, int cuda,
                                 DLManagedTensorVersioned **out) {
  PyObject *ai = NULL;
  PyObject *name = cuda ? st->str_cuda_array_interface : st->str_array_interface;
  int found = dlb__get_optional_attr(obj, name, &ai);
  if (found < 0) return -1;
  if (!found) {
    PyErr_Format(PyExc_TypeError, "an object of type '%.200s' has no %U",
                 Py_TYPE(obj)->tp_name, name);
    return -1;
  }
  int rc = dlb__array_interface_dict_managed(obj, ai, cuda, out);
  if (rc < 0)
    dlb__clear_keep_error(&ai);
  else
    Py_DECREF(ai);
  if (rc < 0 && cuda && PyErr_ExceptionMatches(PyExc_BufferError) &&
      dlb__type_has(Py_TYPE(obj), st->str_dlpack)) {
    /* A DLPack producer read through its CAI (handlers.c: CuPy) whose
     * interface cannot say what its DLPack export can -- bfloat16 is a
     * bare "<V2" there -- is asked through __dlpack__ after all. */
    dlb__saved_error first;
    dlb__error_save(&first);
    rc = dlb__dunder_dlpack_managed(st, obj, NULL, -1, out);
    if (rc < 0)
      dlb__error_chain_context(&first);
    else
      dlb__error_discard(&first);
  }
  return rc;
}

/* ---- the ladder --------------------------------------------------------------- */

/* The owning rungs of the one tensor-like ladder (declared in
 * dlbridge_py.h), for objects whose type has no fast path: from_dlpack,
 * Function and the C API all read such objects here, so what one accepts
 * the others accept. */
int dlb__read_owned(dlb_module_state *st, PyObject *obj, const DLDevice *target,
                    int copy, DLManagedTensorVersioned **out) {
  int found;

  if (dlb__type_has(Py_TYPE(obj), st->str_dlpack)) {
    /* TensorFlow's eager tensors: its own export, which __dlpack__() would
     * call (handlers.c checked that); what copy= and device= ask is done by
     * the caller, as for any producer that shares without copying. */
    PyTypeObject *type = NULL; /* held while h is used */
    const dlb_handler *h = dlb__handler_held(st, obj, &type);
    if (h == NULL) return -1;
    int rc = h->kind == DLB_KIND_TF_EAGER
                 ? dlb__tf_eager_managed(h, obj, out)
                 : dlb__dunder_dlpack_managed(st, obj, target, copy, out);
    dlb__clear_keep_error((PyObject **)&type);
    return rc < 0 ? -1 : 1;
  }
  if (PyCapsule_CheckExact(obj))
    return dlb__consume_capsule(obj, out) < 0 ? -1 : 1;
  found = dlb__legacy_producer_managed(st, obj, out);
  if (found != 0) return found;
  if (PyObject_CheckBuffer(obj)) return dlb__buffer_managed(obj, out) < 0 ? -1 : 1;
  for (int cuda = 0; cuda <= 1; cuda++) {
    PyObject *name = cuda ? st->str_cuda_array_interface : st->str_array_interface;
    PyObject *ai = NULL;
    found = dlb__get_optional_attr(obj, name, &ai);
    if (found < 0) return -1;
    if (found) {
      int rc = dlb__array_interface_dict_managed(obj, ai, cuda, out);
      if (rc < 0)
        dlb__clear_keep_error(&ai);
      else
        Py_DECREF(ai);
      return rc < 0 ? -1 : 1;
    }
  }
  return 0;
}
