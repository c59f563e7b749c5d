/* share.c -- dlbridge.share(): tensors in POSIX shared memory, and the
 * handles they pickle as.
 *
 * A shared tensor owns one mapping of a segment (src/core/shm.c).  Every
 * live mapping of this process is listed in a registry, so "is this memory
 * shared?" is a lookup by address: a Tensor -- or any framework's tensor
 * made from one through convert() -- whose elements lie inside a mapping is
 * shared, share() returns it without copying, and pickling it sends the
 * segment's name and the offset instead of the bytes.
 *
 * The registry is guarded by a mutex, not the GIL: a deleter may unmap
 * from any thread, with or without the GIL (dlbridge_py.h).
 *
 * Handles in flight: pickling counts one handle in the segment's header
 * before the name leaves, so the segment outlives its sender's mapping
 * until the receiver opens it (the count moves to the receiver's mapping).
 * Rules and crash cleanup: docs/scale-out.md.
 */
#include "dlbridge_py.h" /* Python.h first: it sets the feature macros */

#include <pthread.h>
#include <string.h>
#include <time.h>

/* A shared tensor's managed struct, with its shape and strides after it. */
typedef struct shared_block {
  DLManagedTensorVersioned managed;
  dlb_allocator allocator;
  dlb_shm *shm;                     /* this block's mapping, owned */
  struct shared_block *prev, *next; /* the registry */
  int64_t dims[];                   /* shape, then strides */
} shared_block;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static shared_block *registry;

static void registry_add(shared_block *b) {
  pthread_mutex_lock(&registry_lock);
  b->prev = NULL;
  b->next = registry;
  if (registry != NULL) registry->prev = b;
  registry = b;
  pthread_mutex_unlock(&registry_lock);
}

static void registry_remove(shared_block *b) {
  pthread_mutex_lock(&registry_lock);
  if (b->prev != NULL) b->prev->next = b->next;
  else registry = b->next;
  if (b->next != NULL) b->next->prev = b->prev;
  pthread_mutex_unlock(&registry_lock);
}

/* The mapping whose data holds [lo, hi), or NULL.  The caller must hold an
 * object that keeps that memory alive, so the mapping found outlives the
 * call. */
static dlb_shm *registry_find(const char *lo, const char *hi) {
  dlb_shm *found = NULL;
  pthread_mutex_lock(&registry_lock);
  for (shared_block *b = registry; b != NULL; b = b->next) {
    const char *start = (const char *)dlb_shm_data(b->shm);
    const char *end = start + dlb_shm_size(b->shm);
    if (lo >= start && hi <= end && (lo < end || lo == start)) {
      found = b->shm;
      break;
    }
  }
  pthread_mutex_unlock(&registry_lock);
  return found;
}

static void shared_deleter(DLManagedTensorVersioned *self) {
  if (self == NULL) return;
  shared_block *b = (shared_block *)self->manager_ctx;
  registry_remove(b);
  dlb_shm_close(b->shm);
  dlb_allocator a = b->allocator;
  a.release(b, a.ctx);
}

/* The byte range [*lo, *hi) of t's elements.  0, or -1 with an exception. */
static int element_range(const DLTensor *t, const char **lo, const char **hi) {
  int64_t a = 0, z = 0;
  dlb_error err;
  if (dlb_tensor_byte_span(t, &a, &z, &err) != DLB_OK) {
    dlb__raise(&err);
    return -1;
  }
  const char *base = (const char *)dlb_tensor_data(t);
  *lo = base + a;
  *hi = base + z;
  return 0;
}

int dlb__tensor_is_shared(const dlb_TensorObject *self) {
  const char *lo = NULL, *hi = NULL;
  if (!dlb_device_is_host_accessible(self->t.device) || self->t.data == NULL) return 0;
  if (element_range(&self->t, &lo, &hi) < 0) {
    PyErr_Clear();
    return 0;
  }
  return registry_find(lo, hi) != NULL;
}

PyObject *dlb__tensor_get_is_shared(PyObject *op, void *closure) {
  (void)closure;
  return PyBool_FromLong(dlb__tensor_is_shared((dlb_TensorObject *)op));
}

/* A new Tensor over layout (whose data points into shm's mapping) that owns
 * shm.  Takes shm on success and failure. */
static PyObject *shared_tensor(dlb_module_state *st, dlb_shm *shm,
                               const DLTensor *layout, uint64_t flags) {
  const dlb_allocator *a = dlb_get_allocator();
  size_t bytes = sizeof(shared_block) + 2u * (size_t)layout->ndim * sizeof(int64_t);
  shared_block *b = (shared_block *)a->alloc(bytes, a->ctx);
  if (b == NULL) {
    dlb_shm_close(shm);
    return PyErr_NoMemory();
  }
  memset(b, 0, sizeof *b);
  b->allocator = *a;
  b->shm = shm;
  DLManagedTensorVersioned *m = &b->managed;
  m->version.major = DLPACK_MAJOR_VERSION;
  m->version.minor = DLPACK_MINOR_VERSION;
  m->manager_ctx = b;
  m->deleter = shared_deleter;
  m->flags = flags;
  m->dl_tensor = *layout;
  if (layout->ndim > 0) {
    int64_t *shape = b->dims, *strides = b->dims + layout->ndim;
    memcpy(shape, layout->shape, (size_t)layout->ndim * sizeof(int64_t));
    if (layout->strides != NULL) {
      memcpy(strides, layout->strides, (size_t)layout->ndim * sizeof(int64_t));
    } else {
      (void)dlb_strides_row_major(layout->ndim, shape, strides, NULL);
    }
    m->dl_tensor.shape = shape;
    m->dl_tensor.strides = strides;
  } else {
    m->dl_tensor.shape = NULL;
    m->dl_tensor.strides = NULL;
  }
  registry_add(b);
  return dlb__tensor_from_managed(st, m); /* runs the deleter on failure */
}

/* ---- dlbridge.share ---------------------------------------------------------- */

/* When leftovers of dead processes were last looked for.  A scan lists
 * /dev/shm and signals each creator (kill 0), so it runs at most once a
 * second: often enough that a program which keeps killing workers (Pool
 * terminate) does not pile up segments, rare enough to cost nothing. */
static time_t last_cleanup;

static PyObject *py_share(PyObject *module, PyObject *obj) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  dlb_view view;
  dlb_error err;
  dlb_shm *shm = NULL;
  PyObject *res = NULL;
  const char *lo = NULL, *hi = NULL;
  int64_t nbytes = 0;

  if (dlb__is_tensor(st, obj) && dlb__tensor_is_shared((dlb_TensorObject *)obj))
    return Py_NewRef(obj);
  if (dlb__view_get(st, obj, 0, &view) < 0) return NULL;
  if (view.t.device.device_type == kDLCUDA || view.t.device.device_type == kDLCUDAManaged) {
    PyErr_SetString(PyExc_BufferError,
                    "share(): sharing CUDA tensors needs CUDA IPC, which this "
                    "dlbridge does not support yet; share a host copy instead");
    goto cleanup;
  }
  if (!dlb_device_is_host_accessible(view.t.device)) {
    PyObject *d = dlb__device_text(view.t.device);
    if (d != NULL) {
      PyErr_Format(PyExc_BufferError,
                   "share(): tensors on device '%U' cannot be put in shared memory",
                   d);
      Py_DECREF(d);
    }
    goto cleanup;
  }
  /* Already in a segment of ours (a framework's view of a shared tensor):
   * a Tensor over the same memory, no copy. */
  if (view.t.data != NULL && element_range(&view.t, &lo, &hi) == 0 &&
      registry_find(lo, hi) != NULL) {
    dlb__view_release(&view);
    return dlb__import(st, obj, NULL, 0);
  }
  PyErr_Clear();
  time_t now = time(NULL);
  if (now != last_cleanup) {
    last_cleanup = now;
    (void)dlb_shm_cleanup(NULL, NULL);
  }
  bool padded = (view.flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0;
  if (dlb_tensor_nbytes(&view.t, padded, &nbytes, &err) != DLB_OK ||
      dlb_shm_create((size_t)nbytes, &shm, &err) != DLB_OK) {
    dlb__raise(&err);
    goto cleanup;
  }
  DLTensor layout = view.t;
  int64_t strides[DLB_MAX_NDIM];
  layout.data = dlb_shm_data(shm);
  layout.byte_offset = 0;
  if (layout.ndim > 0) {
    (void)dlb_strides_row_major(layout.ndim, layout.shape, strides, NULL);
    layout.strides = strides;
  }
  if (dlb_copy(&layout, &view.t, &err) != DLB_OK) {
    dlb_shm_close(shm);
    dlb__raise(&err);
    goto cleanup;
  }
  /* Copied while the view is held; the view's shape is still needed for
   * the block, so release after. */
  res = shared_tensor(st, shm, &layout,
                      view.flags & (DLPACK_FLAG_BITMASK_READ_ONLY |
                                    DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED));

cleanup:
  dlb__view_release(&view);
  return res;
}

/* ---- the handle ------------------------------------------------------------------ */

static PyObject *int64_tuple(int32_t n, const int64_t *v) {
  PyObject *t = PyTuple_New(n);
  if (t == NULL) return NULL;
  for (int32_t i = 0; i < n; i++) {
    PyObject *x = PyLong_FromLongLong((long long)v[i]);
    if (x == NULL) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, i, x);
  }
  return t;
}

PyObject *dlb__shared_reduce(dlb_module_state *st, dlb_TensorObject *self) {
  PyObject *module = NULL, *rebuild = NULL, *shape = NULL, *strides = NULL;
  PyObject *res = NULL;
  const char *lo = NULL, *hi = NULL;
  int64_t scratch[DLB_MAX_NDIM];
  dlb_error err;
  if (element_range(&self->t, &lo, &hi) < 0) return NULL;
  dlb_shm *shm = registry_find(lo, hi);
  if (shm == NULL) {
    PyErr_SetString(PyExc_BufferError, "the tensor is no longer in shared memory");
    return NULL;
  }
  module = PyType_GetModule(st->TensorType);
  if (module == NULL) goto cleanup;
  rebuild = PyObject_GetAttrString(module, "_rebuild_shared");
  if (rebuild == NULL) goto cleanup;
  shape = int64_tuple(self->t.ndim, self->t.shape);
  strides = int64_tuple(self->t.ndim, dlb_tensor_strides(&self->t, scratch));
  if (shape == NULL || strides == NULL) goto cleanup;
  long long offset =
      (long long)((const char *)dlb_tensor_data(&self->t) - (const char *)dlb_shm_data(shm));
  PyObject *args = Py_BuildValue(
      "(sL(iii)OOK)", dlb_shm_name(shm), offset, (int)self->t.dtype.code,
      (int)self->t.dtype.bits, (int)self->t.dtype.lanes, shape, strides,
      (unsigned long long)(self->flags & (DLPACK_FLAG_BITMASK_READ_ONLY |
                                          DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)));
  if (args == NULL) goto cleanup;
  /* Counted last, when nothing can fail any more here: the handle is in
   * flight from now until some process opens it. */
  if (dlb_shm_hand_out(shm, &err) != DLB_OK) {
    Py_DECREF(args);
    dlb__raise(&err);
    goto cleanup;
  }
  res = PyTuple_Pack(2, rebuild, args);
  Py_DECREF(args);

cleanup:
  Py_XDECREF(rebuild);
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  return res;
}

/* _rebuild_shared(name, offset, dtype, shape, strides, flags) */
static PyObject *py_rebuild_shared(PyObject *module, PyObject *const *args,
                                   Py_ssize_t nargs) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  dlb_shm *shm = NULL;
  dlb_error err;
  DLTensor layout;
  int64_t shape[DLB_MAX_NDIM], strides[DLB_MAX_NDIM];
  int32_t ndim = 0, nstrides = 0;
  int64_t need = 0;
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "_rebuild_shared takes 6 arguments");
    return NULL;
  }
  if (!PyUnicode_Check(args[0])) {
    PyErr_SetString(PyExc_ValueError, "shared tensor handle: the name must be a str");
    return NULL;
  }
  Py_ssize_t name_len = 0;
  const char *name = PyUnicode_AsUTF8AndSize(args[0], &name_len);
  if (name == NULL) return NULL;
  if ((size_t)name_len != strlen(name)) {
    PyErr_SetString(PyExc_ValueError, "shared tensor handle: NUL in the name");
    return NULL;
  }
  long long offset = PyLong_AsLongLong(args[1]);
  if (offset == -1 && PyErr_Occurred()) return NULL;
  memset(&layout, 0, sizeof layout);
  if (dlb__parse_dtype_tuple(args[2], &layout.dtype) < 0) return NULL;
  if (dlb__parse_dims(args[3], "shape", &ndim, shape) < 0) return NULL;
  if (dlb__parse_dims(args[4], "strides", &nstrides, strides) < 0) return NULL;
  if (nstrides != ndim) {
    PyErr_SetString(PyExc_ValueError,
                    "shared tensor handle: strides and shape differ in length");
    return NULL;
  }
  unsigned long long flags = PyLong_AsUnsignedLongLong(args[5]);
  if (flags == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  flags &= DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;

  if (dlb_shm_open(name, &shm, &err) != DLB_OK) return dlb__raise(&err);
  /* From here the mapping is ours: close it on every failure. */
  size_t size = dlb_shm_size(shm);
  if (offset < 0 || (unsigned long long)offset > (unsigned long long)size) {
    PyErr_Format(PyExc_ValueError,
                 "shared tensor handle: offset %lld outside the %zu-byte segment",
                 offset, size);
    goto fail;
  }
  layout.data = (char *)dlb_shm_data(shm) + offset;
  layout.device = (DLDevice){kDLCPU, 0};
  layout.ndim = ndim;
  layout.shape = ndim > 0 ? shape : NULL;
  layout.strides = ndim > 0 ? strides : NULL;
  if (dlb__check_pickled_layout(&layout, flags, &need) < 0) goto fail;
  if (need > (int64_t)size - (int64_t)offset) {
    PyErr_Format(PyExc_ValueError,
                 "shared tensor handle: the tensor needs %lld bytes from offset "
                 "%lld, the segment has %zu",
                 (long long)need, offset, size);
    goto fail;
  }
  return shared_tensor(st, shm, &layout, (uint64_t)flags);

fail:
  dlb_shm_close(shm);
  return NULL;
}

/* _shm_cleanup() -> int: remove dead processes' leftover segments. */
static PyObject *py_shm_cleanup(PyObject *module, PyObject *unused) {
  (void)module;
  (void)unused;
  int removed = 0;
  dlb_error err;
  if (dlb_shm_cleanup(&removed, &err) != DLB_OK) return dlb__raise(&err);
  return PyLong_FromLong(removed);
}

/* _shm_info(tensor) -> (name, mappings, handles_in_flight), for tests and
 * diagnostics. */
static PyObject *py_shm_info(PyObject *module, PyObject *obj) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  const char *lo = NULL, *hi = NULL;
  if (!dlb__is_tensor(st, obj)) {
    PyErr_SetString(PyExc_TypeError, "_shm_info() takes a dlbridge.Tensor");
    return NULL;
  }
  dlb_TensorObject *t = (dlb_TensorObject *)obj;
  if (!dlb__tensor_is_shared(t) || element_range(&t->t, &lo, &hi) < 0) {
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "the tensor is not in shared memory");
    return NULL;
  }
  dlb_shm *shm = registry_find(lo, hi);
  uint32_t maps = 0, flight = 0;
  dlb_shm_counts(shm, &maps, &flight);
  return Py_BuildValue("(sII)", dlb_shm_name(shm), (unsigned)maps, (unsigned)flight);
}

static PyMethodDef share_methods[] = {
    {"share", py_share, METH_O,
     "share(obj) -> Tensor\n--\n\nThe tensor in POSIX shared memory another "
     "process can map (one copy; a tensor already there is returned without "
     "one).  A shared Tensor pickles as a handle: no data is copied."},
    {"_rebuild_shared", (PyCFunction)(void (*)(void))py_rebuild_shared, METH_FASTCALL,
     "_rebuild_shared(name, offset, dtype, shape, strides, flags)\n--\n\n"
     "Map a pickled shared-memory handle (used by pickle; validates "
     "everything)."},
    {"_shm_cleanup", py_shm_cleanup, METH_NOARGS,
     "_shm_cleanup() -> int\n--\n\nRemove the shared-memory segments of dead "
     "processes that nobody maps; returns how many."},
    {"_shm_info", py_shm_info, METH_O,
     "_shm_info(tensor) -> (name, mappings, handles_in_flight)"},
    {NULL, NULL, 0, NULL},
};

/* Tensor.__reduce_ex__: a shared tensor travels as a handle to its pages,
 * any other through pickle.c (protocol 5 out of band, else in band). */
static PyObject *tensor_reduce_ex(PyObject *op, PyObject *protocol) {
  dlb_TensorObject *self = (dlb_TensorObject *)op;
  dlb_module_state *st = dlb__state_from_type(Py_TYPE(op));
  if (st != NULL && dlb__tensor_is_shared(self))
    return dlb__shared_reduce(st, self);
  return dlb__tensor_reduce_ex(op, protocol);
}

static PyMethodDef tensor_pickle_methods[] = {
    {"__reduce_ex__", tensor_reduce_ex, METH_O,
     "Pickle support: protocol 5 sends the data out of band, a shared tensor "
     "a handle."},
    {"__deepcopy__", dlb__tensor_deepcopy, METH_O, "A copy of the data."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tensor_share_getset[] = {
    {"is_shared", dlb__tensor_get_is_shared, NULL,
     "True when the data is in shared memory another process can map "
     "(dlbridge.share).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* Pickling and sharing are added to Tensor here, above tensor.c and
 * pickle.c, as export.c adds __dlpack__: the type's own file stays below
 * the files that extend it. */
static int add_to_tensor_type(PyTypeObject *type) {
  for (PyMethodDef *def = tensor_pickle_methods; def->ml_name != NULL; def++) {
    PyObject *descr = PyDescr_NewMethod(type, def);
    if (descr == NULL) return -1;
    int rc = PyDict_SetItemString(type->tp_dict, def->ml_name, descr);
    Py_DECREF(descr);
    if (rc < 0) return -1;
  }
  for (PyGetSetDef *def = tensor_share_getset; def->name != NULL; def++) {
    PyObject *descr = PyDescr_NewGetSet(type, def);
    if (descr == NULL) return -1;
    int rc = PyDict_SetItemString(type->tp_dict, def->name, descr);
    Py_DECREF(descr);
    if (rc < 0) return -1;
  }
  PyType_Modified(type);
  return 0;
}

int dlb__share_init(PyObject *module, dlb_module_state *st) {
  if (add_to_tensor_type(st->TensorType) < 0) return -1;
  return PyModule_AddFunctions(module, share_methods);
}
