/* pickle.c -- Tensor.__reduce_ex__ and the function that rebuilds a tensor
 * from a pickle.
 *
 * Protocol 5 (PEP 574): the data leaves as one pickle.PickleBuffer, out of
 * band when the pickler has a buffer_callback (Dask, Ray, mpi4py.util.pkl5
 * use one), so the bytes are never copied by us; the receiver's buffer
 * becomes the tensor's memory.  Protocols 0-4 carry the data in-band as
 * bytes.  A shared-memory tensor pickles as a handle instead (share.c).
 *
 * What is sent: the byte span the elements occupy, with strides when the
 * tensor is a dense permutation of its span (Fortran order, transposes: no
 * copy); any other layout (gaps, negative or zero strides) is copied once to
 * row-major first.  dtype travels as (code, bits, lanes) so any DLPack type
 * goes, bfloat16, float8 and sub-byte ones included.
 *
 * The rebuild trusts nothing: a pickle may be hostile.  Shape, strides and
 * dtype are validated as any imported tensor is, and the span they describe
 * must lie inside the buffer received.  A read-only buffer (Ray's object
 * store, bytes) is never exposed as writable: the tensor is read-only then.
 */
#include <string.h>

#include "dlbridge_py.h"

/* ---- a 1-D uint8 Tensor over part of another object's memory --------------- */

static void release_owner(void *ctx) { dlb__release_ref((PyObject *)ctx, 0); }

/* A new uint8 tensor of nbytes at data whose memory owner keeps alive.
 * flags: READ_ONLY or 0. */
static PyObject *byte_view(dlb_module_state *st, PyObject *owner, void *data,
                           int64_t nbytes, uint64_t flags) {
  DLTensor view;
  int64_t shape[1] = {nbytes};
  int64_t strides[1] = {1};
  DLManagedTensorVersioned *m = NULL;
  dlb_error err;
  memset(&view, 0, sizeof view);
  view.data = data;
  view.device = (DLDevice){kDLCPU, 0};
  view.ndim = 1;
  view.dtype = (DLDataType){kDLUInt, 8, 1};
  view.shape = shape;
  view.strides = strides;
  if (dlb_managed_wrap(&view, flags, release_owner, owner, &m, &err) != DLB_OK)
    return dlb__raise(&err);
  Py_INCREF(owner); /* now owned by m's release */
  return dlb__tensor_from_managed(st, m);
}

/* ---- __reduce_ex__ ------------------------------------------------------------ */

/* A dtype as the (code, bits, lanes) tuple the rebuild takes. */
static PyObject *dtype_tuple(DLDataType d) {
  return Py_BuildValue("(iii)", (int)d.code, (int)d.bits, (int)d.lanes);
}

/* True when t's elements fill their byte span exactly with non-negative
 * strides: the span can be sent as is, strides alongside.  *span gets its
 * length. */
static bool dense_span(const DLTensor *t, bool padded, int64_t *span) {
  int64_t lo = 0, hi = 0, nbytes = 0;
  if (dlb_tensor_nbytes(t, padded, &nbytes, NULL) != DLB_OK) return false;
  if (dlb_tensor_is_contiguous(t)) {
    *span = nbytes;
    return true;
  }
  if (dlb_dtype_is_subbyte(t->dtype)) return false;
  if (dlb_tensor_byte_span(t, &lo, &hi, NULL) != DLB_OK) return false;
  if (lo != 0 || hi != nbytes) return false;
  for (int32_t i = 0; i < t->ndim; i++)
    if (t->strides[i] < 0 || (t->strides[i] == 0 && t->shape[i] > 1)) return false;
  *span = nbytes;
  return true;
}

PyObject *dlb__tensor_reduce_ex(PyObject *op, PyObject *arg) {
  dlb_TensorObject *self = (dlb_TensorObject *)op;
  dlb_module_state *st = dlb__state_from_type(Py_TYPE(op));
  PyObject *host = NULL, *module = NULL, *rebuild = NULL, *payload = NULL;
  PyObject *pickle = NULL, *pb_type = NULL, *bytes_view = NULL;
  PyObject *dtype = NULL, *shape = NULL, *strides = NULL, *res = NULL;
  int64_t span = 0;
  if (st == NULL) {
    PyErr_SetString(PyExc_TypeError, "not a dlbridge.Tensor");
    return NULL;
  }
  long protocol = PyLong_AsLong(arg);
  if (protocol == -1 && PyErr_Occurred()) return NULL;

  /* Device memory travels through the host: a host copy is pickled, and
   * the device goes along so the rebuild puts the data back there. */
  if (!dlb_device_is_host_accessible(self->t.device)) {
    DLManagedTensorVersioned *hm = NULL;
    DLDevice cpu = {kDLCPU, 0};
    if (dlb__copy_managed(&self->t, self->flags, cpu,
                          "pickling a device tensor", &hm) < 0)
      goto cleanup;
    host = dlb__tensor_from_managed(st, hm);
    if (host == NULL) goto cleanup;
    PyObject *inner = dlb__tensor_reduce_ex(host, arg);
    if (inner == NULL) goto cleanup;
    /* (rebuild, args) -> (rebuild, args + ((device_type, device_id),)) */
    PyObject *dev = Py_BuildValue("((ii))", (int)self->t.device.device_type,
                                  (int)self->t.device.device_id);
    PyObject *args = dev != NULL
                         ? PySequence_Concat(PyTuple_GET_ITEM(inner, 1), dev)
                         : NULL;
    if (args != NULL)
      res = PyTuple_Pack(2, PyTuple_GET_ITEM(inner, 0), args);
    Py_XDECREF(args);
    Py_XDECREF(dev);
    Py_DECREF(inner);
    goto cleanup;
  }
  bool padded = (self->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0;
  dlb_TensorObject *src = self;
  if (!dense_span(&self->t, padded, &span)) {
    /* Gaps, overlaps or negative strides: one copy to row-major. */
    host = PyObject_CallMethod(op, "copy", "()");
    if (host == NULL) goto cleanup;
    src = (dlb_TensorObject *)host;
    if (!dense_span(&src->t, padded, &span)) {
      PyErr_SetString(PyExc_BufferError, "cannot describe the tensor's copy");
      goto cleanup;
    }
  }
  uint64_t flags = self->flags & DLB_PICKLED_FLAGS;
  bool contiguous = dlb_tensor_is_contiguous(&src->t);
  void *data = dlb_tensor_data(&src->t);

  module = PyType_GetModule(st->TensorType);
  if (module == NULL) goto cleanup;
  rebuild = PyObject_GetAttrString(module, "_rebuild_tensor");
  if (rebuild == NULL) goto cleanup;
  if (protocol >= 5) {
    /* The C API's PyPickleBuffer_FromObject is not in the limited API;
     * the Python type is the same object. */
    pickle = PyImport_ImportModule("pickle");
    if (pickle == NULL) goto cleanup;
    pb_type = PyObject_GetAttrString(pickle, "PickleBuffer");
    if (pb_type == NULL) goto cleanup;
    bytes_view = byte_view(st, (PyObject *)src, data, span,
                           flags & DLPACK_FLAG_BITMASK_READ_ONLY);
    if (bytes_view == NULL) goto cleanup;
    payload = PyObject_CallOneArg(pb_type, bytes_view);
  } else {
    payload = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)span);
  }
  if (payload == NULL) goto cleanup;
  dtype = dtype_tuple(src->t.dtype);
  shape = dlb__int64_tuple(src->t.ndim, src->t.shape);
  if (dtype == NULL || shape == NULL) goto cleanup;
  if (contiguous) {
    strides = Py_NewRef(Py_None);
  } else {
    strides = dlb__int64_tuple(src->t.ndim, src->t.strides);
    if (strides == NULL) goto cleanup;
  }
  res = Py_BuildValue("(O(OOOOKO))", rebuild, payload, dtype, shape, strides,
                      (unsigned long long)flags,
                      protocol >= 5 ? Py_False : Py_True);

cleanup:
  Py_XDECREF(host);
  Py_XDECREF(rebuild);
  Py_XDECREF(payload);
  Py_XDECREF(pickle);
  Py_XDECREF(pb_type);
  Py_XDECREF(bytes_view);
  Py_XDECREF(dtype);
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  return res;
}

PyObject *dlb__tensor_deepcopy(PyObject *op, PyObject *memo) {
  (void)memo;
  /* Not the pickle route: a shared tensor pickles as a handle to the same
   * pages, and a deep copy must not alias. */
  return PyObject_CallMethod(op, "copy", "()");
}

/* ---- reading the layout of a pickle ---------------------------------------- */

static int parse_dtype_tuple(PyObject *obj, DLDataType *out) {
  long v[3];
  if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 3) {
    PyErr_SetString(PyExc_ValueError,
                    "pickled tensor: dtype must be a (code, bits, lanes) tuple");
    return -1;
  }
  for (int i = 0; i < 3; i++) {
    v[i] = PyLong_AsLong(PyTuple_GET_ITEM(obj, i));
    if (v[i] == -1 && PyErr_Occurred()) return -1;
  }
  if (v[0] < 0 || v[0] > 255 || v[1] < 0 || v[1] > 255 || v[2] < 0 || v[2] > 65535) {
    PyErr_SetString(PyExc_ValueError, "pickled tensor: dtype out of range");
    return -1;
  }
  out->code = (uint8_t)v[0];
  out->bits = (uint8_t)v[1];
  out->lanes = (uint16_t)v[2];
  dlb_error err;
  if (dlb_dtype_check(*out, &err) != DLB_OK) {
    dlb__raise_as(PyExc_ValueError, "pickled tensor", &err);
    return -1;
  }
  return 0;
}

/* A tuple of at most DLB_MAX_NDIM ints into v; its length in *n. */
static int parse_dims(PyObject *obj, const char *what, int32_t *n, int64_t *v) {
  if (!PyTuple_Check(obj)) {
    PyErr_Format(PyExc_ValueError, "pickled tensor: %s must be a tuple", what);
    return -1;
  }
  Py_ssize_t len = PyTuple_GET_SIZE(obj);
  if (len > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_ValueError, "pickled tensor: %zd dimensions, more than %d",
                 len, DLB_MAX_NDIM);
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, i));
    if (x == -1 && PyErr_Occurred()) {
      if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "pickled tensor: %s out of range", what);
      }
      return -1;
    }
    v[i] = (int64_t)x;
  }
  *n = (int32_t)len;
  return 0;
}

int dlb__parse_pickled_layout(PyObject *const *args, dlb_pickled_layout *out) {
  DLTensor *t = &out->t;
  int32_t ndim = 0, nstrides = 0;
  dlb_error err;
  memset(out, 0, sizeof *out);
  if (parse_dtype_tuple(args[0], &t->dtype) < 0) return -1;
  if (parse_dims(args[1], "shape", &ndim, out->shape) < 0) return -1;
  if (args[2] != Py_None) {
    if (parse_dims(args[2], "strides", &nstrides, out->strides) < 0) return -1;
    if (nstrides != ndim) {
      PyErr_SetString(PyExc_ValueError,
                      "pickled tensor: strides and shape differ in length");
      return -1;
    }
  }
  unsigned long long flags = PyLong_AsUnsignedLongLong(args[3]);
  if (flags == (unsigned long long)-1 && PyErr_Occurred()) return -1;
  out->flags = (uint64_t)flags & DLB_PICKLED_FLAGS;
  t->device = (DLDevice){kDLCPU, 0};
  t->ndim = ndim;
  t->shape = ndim > 0 ? out->shape : NULL;
  t->strides = ndim > 0 && args[2] != Py_None ? out->strides : NULL;
  /* Checked as any imported tensor is; data is not known yet, and only its
   * being non-NULL matters to the check. */
  t->data = out->shape;
  int rc = dlb_tensor_validate(t, 0, &err);
  t->data = NULL;
  if (rc != DLB_OK) {
    dlb__raise_as(PyExc_ValueError, "pickled tensor", &err);
    return -1;
  }
  /* A compact tensor reads exactly its nbytes (padded sub-byte elements
   * included, which a byte span cannot say); any other its byte span. */
  if (t->strides == NULL || dlb_tensor_is_contiguous(t)) {
    out->lo = 0;
    rc = dlb_tensor_nbytes(t, (out->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0,
                           &out->hi, &err);
  } else {
    rc = dlb_tensor_byte_span(t, &out->lo, &out->hi, &err);
  }
  if (rc != DLB_OK) {
    dlb__raise_as(PyExc_ValueError, "pickled tensor", &err);
    return -1;
  }
  return 0;
}

int dlb__place_pickled_layout(dlb_pickled_layout *l, char *base,
                              long long offset, int64_t size,
                              const char *what) {
  if (offset < 0 || offset > size) {
    PyErr_Format(PyExc_ValueError,
                 "pickled tensor: offset %lld outside the %lld-byte %s",
                 offset, (long long)size, what);
    return -1;
  }
  /* Element 0 sits offset bytes in; negative strides reach back from it
   * (a reversed view of a shared tensor), never before the area. */
  if (l->lo < -(int64_t)offset) {
    PyErr_Format(PyExc_ValueError,
                 "pickled tensor: negative strides reach %lld bytes before "
                 "element 0, which is %lld bytes into the %s",
                 (long long)-l->lo, offset, what);
    return -1;
  }
  if (l->hi > size - offset) {
    PyErr_Format(PyExc_ValueError,
                 "pickled tensor: the tensor needs %lld bytes from offset "
                 "%lld, the %s has %lld",
                 (long long)l->hi, offset, what, (long long)size);
    return -1;
  }
  if (base != NULL) l->t.data = base + offset;
  return 0;
}

/* ---- _rebuild_tensor ------------------------------------------------------------ */

/* _rebuild_tensor(buffer, dtype, shape, strides, flags, copy[, device]):
 * device, a (device_type, device_id) pair, is where a tensor that was on a
 * device goes back to (a copy from the rebuilt host tensor, cuda.c). */
static PyObject *py_rebuild_tensor(PyObject *module, PyObject *const *args,
                                   Py_ssize_t nargs) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  PyObject *mv = NULL, *flat = NULL, *base = NULL, *res = NULL;
  DLManagedTensorVersioned *m = NULL;
  dlb_pickled_layout l;
  dlb_error err;
  DLDevice target = {kDLCPU, 0};
  /* Where an empty buffer's tensor points: it has no elements to read. */
  static char no_bytes;
  if (nargs != 6 && nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "_rebuild_tensor takes 6 or 7 arguments");
    return NULL;
  }
  if (nargs == 7 && dlb__device_converter(st, args[6], &target) < 0)
    return NULL;
  if (dlb__parse_pickled_layout(args + 1, &l) < 0) return NULL;
  uint64_t flags = l.flags;
  int copy = PyObject_IsTrue(args[5]);
  if (copy < 0) return NULL;

  /* The bytes, whatever object carries them (PickleBuffer, memoryview,
   * bytes, bytearray, Ray's read-only views): flattened to one uint8 run. */
  mv = PyMemoryView_FromObject(args[0]);
  if (mv == NULL) goto cleanup;
  flat = PyObject_CallMethod(mv, "cast", "s", "B");
  if (flat == NULL) {
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError,
                    "pickled tensor: the data buffer is not one contiguous run");
    goto cleanup;
  }
  base = dlb__import(st, flat, NULL, 0);
  if (base == NULL) goto cleanup;
  dlb_TensorObject *b = (dlb_TensorObject *)base;
  int64_t have = b->t.ndim == 1 ? b->t.shape[0] : 0;
  if (b->flags & DLPACK_FLAG_BITMASK_READ_ONLY) flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  char *data = (char *)dlb_tensor_data(&b->t);
  if (dlb__place_pickled_layout(&l, data != NULL ? data : &no_bytes, 0, have,
                                "buffer") < 0)
    goto cleanup;
  DLTensor view = l.t;
  int64_t need = l.hi;
  /* An element must sit at an address its type can be read from; a buffer
   * that arrives misaligned (some transports pack frames) is copied. */
  int64_t align = dlb_dtype_itemsize(view.dtype);
  if (align > 16) align = 16;
  if (align < 1) align = 1;
  if ((uintptr_t)view.data % (uintptr_t)align != 0 && need > 0) copy = 1;

  if (copy) {
    /* In-band data (bytes, immutable) or misaligned: one copy into fresh
     * memory, which keeps the read-only flag the sender had. */
    uint64_t sender_flags = l.flags;
    if (dlb_managed_empty(view.ndim, view.shape, view.dtype, view.device,
                          (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0,
                          &m, &err) != DLB_OK) {
      dlb__raise(&err);
      goto cleanup;
    }
    if (dlb_copy(&m->dl_tensor, &view, &err) != DLB_OK) {
      dlb_managed_delete(m);
      m = NULL;
      dlb__raise(&err);
      goto cleanup;
    }
    m->flags |= sender_flags & DLPACK_FLAG_BITMASK_READ_ONLY;
  } else {
    if (dlb_managed_wrap(&view, flags, release_owner, base, &m, &err) != DLB_OK) {
      dlb__raise(&err);
      goto cleanup;
    }
    base = NULL; /* m's release owns it now */
  }
  if (target.device_type != kDLCPU) {
    DLManagedTensorVersioned *moved = NULL;
    int rc = dlb__copy_managed(&m->dl_tensor, m->flags, target,
                               "unpickling a device tensor", &moved);
    dlb__delete_keep_error(m); /* the host tensor: its owner goes too */
    m = NULL;
    if (rc < 0) goto cleanup;
    moved->flags |= flags & DLPACK_FLAG_BITMASK_READ_ONLY;
    m = moved;
  }
  res = dlb__tensor_from_managed(st, m);

cleanup:
  Py_XDECREF(mv);
  Py_XDECREF(flat);
  Py_XDECREF(base);
  return res;
}

static PyMethodDef pickle_methods[] = {
    {"_rebuild_tensor", (PyCFunction)(void (*)(void))py_rebuild_tensor, METH_FASTCALL,
     "_rebuild_tensor(buffer, dtype, shape, strides, flags, copy, device=cpu)\n--\n\n"
     "Rebuild a pickled Tensor (used by pickle; validates everything)."},
    {NULL, NULL, 0, NULL},
};

int dlb__pickle_init(PyObject *module, dlb_module_state *st) {
  (void)st;
  return PyModule_AddFunctions(module, pickle_methods);
}
