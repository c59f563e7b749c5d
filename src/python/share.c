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
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How every block of this file starts: the tensor's managed struct (whose
 * context is the block) and the allocator that made the block, which frees
 * it.  Its shape and strides follow in the block's flexible tail. */
typedef struct {
  DLManagedTensorVersioned managed;
  dlb_allocator allocator;
} block_head;

/* A shared tensor's managed struct, with its shape and strides after it. */
typedef struct shared_block {
  block_head head;
  dlb_shm *shm;                     /* this block's mapping, owned */
  struct shared_block *prev, *next; /* the registry */
  int64_t dims[];                   /* shape, then strides */
} shared_block;

/* Fill m, the managed struct of a block whose shape and strides live at
 * dims (2 * ndim int64s, also in the block): a versioned view of layout
 * with its own copy of the extents (row-major strides when layout has
 * none), owned through ctx and deleter. */
static void managed_over(DLManagedTensorVersioned *m, void *ctx,
                         void (*deleter)(DLManagedTensorVersioned *),
                         const DLTensor *layout, uint64_t flags,
                         int64_t *dims) {
  m->version.major = DLPACK_MAJOR_VERSION;
  m->version.minor = DLPACK_MINOR_VERSION;
  m->manager_ctx = ctx;
  m->deleter = deleter;
  m->flags = flags;
  m->dl_tensor = *layout;
  m->dl_tensor.shape = NULL;
  m->dl_tensor.strides = NULL;
  if (layout->ndim > 0) {
    int64_t *shape = dims, *strides = dims + layout->ndim;
    memcpy(shape, layout->shape, (size_t)layout->ndim * sizeof(int64_t));
    if (layout->strides != NULL)
      memcpy(strides, layout->strides, (size_t)layout->ndim * sizeof(int64_t));
    else
      (void)dlb_strides_row_major(layout->ndim, shape, strides, NULL);
    m->dl_tensor.shape = shape;
    m->dl_tensor.strides = strides;
  }
}

/* A new block whose tail (2 * layout->ndim int64s) starts at dims_offset,
 * zeroed before it, from the installed allocator, its managed struct
 * filled over layout (managed_over) with deleter.  NULL when out of memory
 * (no exception set). */
static void *block_new(size_t dims_offset,
                       void (*deleter)(DLManagedTensorVersioned *),
                       const DLTensor *layout, uint64_t flags) {
  const dlb_allocator *a = dlb_get_allocator();
  size_t bytes = dims_offset + 2u * (size_t)layout->ndim * sizeof(int64_t);
  char *b = (char *)a->alloc(bytes, a->ctx);
  if (b == NULL) return NULL;
  memset(b, 0, dims_offset);
  block_head *h = (block_head *)b;
  h->allocator = *a;
  managed_over(&h->managed, b, deleter, layout, flags,
               (int64_t *)(b + dims_offset));
  return b;
}

/* Give a block back to the allocator that made it. */
static void block_free(block_head *h) {
  dlb_allocator a = h->allocator;
  a.release(h, a.ctx);
}

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

/* ---- CUDA tensors: CUDA IPC (src/core/cuda_ipc.c) -------------------------
 *
 * share() of a CUDA tensor copies it (on the current stream) into memory
 * allocated for IPC; pickling such a tensor sends a dlb_cuda_ipc_handle
 * (the memory's and an interprocess event's handles, the device UUID), and
 * the receiver maps the same device memory, its stream waiting for the
 * exporter's event on the GPU.  One cuda_shared per allocation or mapping
 * in this process, shared by every Tensor over it (a share() result, views
 * of it, same-process unpickles), counted: the last one frees the memory
 * (exporter) or closes the mapping (importer).  Lifetime across processes
 * is CUDA's rule, written down in docs/scale-out.md: the exporter keeps the
 * memory alive while importers use it. */
typedef struct cuda_shared {
  int refs;                   /* guarded by registry_lock */
  int device_id;
  char *base;                 /* allocation (exported) or mapping (imported) */
  size_t size;
  void *event;                /* exporter's interprocess event, or NULL */
  int imported;               /* opened from another process's handle */
  dlb_cuda_ipc_handle handle; /* imported: the handle it came from */
  struct cuda_shared *prev, *next;
} cuda_shared;

static cuda_shared *cuda_registry;

/* A Tensor's managed struct over a cuda_shared, shape and strides after. */
typedef struct cuda_block {
  block_head head;
  cuda_shared *shared;
  int64_t dims[];
} cuda_block;

/* The cuda_shared holding [lo, hi) on device_id, with a reference taken,
 * or NULL. */
static cuda_shared *cuda_registry_find(int device_id, const char *lo,
                                       const char *hi) {
  cuda_shared *found = NULL;
  pthread_mutex_lock(&registry_lock);
  for (cuda_shared *c = cuda_registry; c != NULL; c = c->next) {
    if (c->device_id == device_id && lo >= c->base && hi <= c->base + c->size) {
      found = c;
      found->refs++;
      break;
    }
  }
  pthread_mutex_unlock(&registry_lock);
  return found;
}

static void cuda_shared_drop(cuda_shared *c) {
  pthread_mutex_lock(&registry_lock);
  int last = --c->refs == 0;
  if (last) {
    if (c->prev != NULL) c->prev->next = c->next;
    else cuda_registry = c->next;
    if (c->next != NULL) c->next->prev = c->prev;
  }
  pthread_mutex_unlock(&registry_lock);
  if (!last) return;
  /* Deleters cannot report failure: a mapping or allocation the driver
   * refuses to let go of is leaked, never freed twice. */
  if (c->imported) {
    (void)dlb_cuda_ipc_close(c->device_id, c->base, NULL);
  } else {
    (void)dlb_cuda_ipc_event_destroy(c->device_id, c->event, NULL);
    (void)dlb_cuda_ipc_free(c->device_id, c->base, NULL);
  }
  PyMem_RawFree(c);
}

/* A new registered cuda_shared with one reference, or NULL (MemoryError). */
static cuda_shared *cuda_shared_new(int device_id, void *base, size_t size,
                                    void *event, const dlb_cuda_ipc_handle *from) {
  cuda_shared *c = PyMem_RawCalloc(1, sizeof *c);
  if (c == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  c->refs = 1;
  c->device_id = device_id;
  c->base = base;
  c->size = size;
  c->event = event;
  if (from != NULL) {
    c->imported = 1;
    c->handle = *from;
  }
  pthread_mutex_lock(&registry_lock);
  c->next = cuda_registry;
  if (cuda_registry != NULL) cuda_registry->prev = c;
  cuda_registry = c;
  pthread_mutex_unlock(&registry_lock);
  return c;
}

static void cuda_block_deleter(DLManagedTensorVersioned *self) {
  if (self == NULL) return;
  cuda_block *b = (cuda_block *)self->manager_ctx;
  cuda_shared *c = b->shared;
  block_free(&b->head);
  cuda_shared_drop(c);
}

/* A new Tensor over layout (inside c's memory, on c's device), holding the
 * reference to c the caller had.  Takes that reference on success and
 * failure. */
static PyObject *cuda_shared_tensor(dlb_module_state *st, cuda_shared *c,
                                    const DLTensor *layout, uint64_t flags) {
  cuda_block *b = (cuda_block *)block_new(offsetof(cuda_block, dims),
                                          cuda_block_deleter, layout, flags);
  if (b == NULL) {
    cuda_shared_drop(c);
    return PyErr_NoMemory();
  }
  b->shared = c;
  /* runs the deleter on failure */
  return dlb__tensor_from_managed(st, &b->head.managed);
}

static void shared_deleter(DLManagedTensorVersioned *self) {
  if (self == NULL) return;
  shared_block *b = (shared_block *)self->manager_ctx;
  registry_remove(b);
  dlb_shm_close(b->shm);
  block_free(&b->head);
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

/* The cuda_shared t's elements lie in, with a reference taken, or NULL
 * (no exception). */
static cuda_shared *cuda_shared_of(const DLTensor *t) {
  const char *lo = NULL, *hi = NULL;
  if (t->device.device_type != kDLCUDA || t->data == NULL) return NULL;
  if (element_range(t, &lo, &hi) < 0) {
    PyErr_Clear();
    return NULL;
  }
  return cuda_registry_find(t->device.device_id, lo, hi);
}

int dlb__tensor_is_shared(const dlb_TensorObject *self) {
  const char *lo = NULL, *hi = NULL;
  cuda_shared *c = cuda_shared_of(&self->t);
  if (c != NULL) {
    cuda_shared_drop(c);
    return 1;
  }
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
  shared_block *b = (shared_block *)block_new(offsetof(shared_block, dims),
                                              shared_deleter, layout, flags);
  if (b == NULL) {
    dlb_shm_close(shm);
    return PyErr_NoMemory();
  }
  b->shm = shm;
  registry_add(b);
  /* runs the deleter on failure */
  return dlb__tensor_from_managed(st, &b->head.managed);
}

/* ---- dlbridge.share ---------------------------------------------------------- */

/* When leftovers of dead processes were last looked for.  A scan lists
 * /dev/shm and signals each creator (kill 0), so it runs at most once a
 * second: often enough that a program which keeps killing workers (Pool
 * terminate) does not pile up segments, rare enough to cost nothing. */
static time_t last_cleanup;

/* share() of a CUDA tensor: imported first (so its producer's stream is
 * ordered before ours), then -- unless it already lies in IPC memory --
 * copied compactly into a new IPC allocation on the current stream. */
static PyObject *share_cuda(dlb_module_state *st, PyObject *obj) {
  PyObject *src = dlb__import(st, obj, NULL, -1), *res = NULL;
  void *base = NULL, *event = NULL;
  int64_t nbytes = 0;
  dlb_error err;
  if (src == NULL) return NULL;
  const DLTensor *t = &((dlb_TensorObject *)src)->t;
  uint64_t flags = ((dlb_TensorObject *)src)->flags &
                   (DLPACK_FLAG_BITMASK_READ_ONLY |
                    DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
  int dev = t->device.device_id;
  cuda_shared *c = cuda_shared_of(t);
  if (c != NULL) {
    cuda_shared_drop(c);
    return src; /* a view of shared memory already: no copy */
  }
  DLTensor layout = *t;
  int64_t strides[DLB_MAX_NDIM];
  int rc = dlb_tensor_nbytes(t, (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0,
                             &nbytes, &err);
  if (rc == DLB_OK) rc = dlb_cuda_ipc_alloc(dev, (size_t)nbytes, &base, &err);
  if (rc == DLB_OK) rc = dlb_cuda_ipc_event_create(dev, &event, &err);
  if (rc == DLB_OK && nbytes > 0) {
    layout.data = base;
    layout.byte_offset = 0;
    if (layout.ndim > 0) {
      (void)dlb_strides_row_major(layout.ndim, layout.shape, strides, NULL);
      layout.strides = strides;
    }
    rc = dlb_cuda_copy(&layout, t, dlb__stream_current(), &err);
  }
  if (rc != DLB_OK) {
    dlb__raise_as(PyExc_BufferError, "share()", &err);
    goto cleanup;
  }
  layout.data = base;
  layout.byte_offset = 0;
  c = cuda_shared_new(dev, base, (size_t)(nbytes > 0 ? nbytes : 1), event, NULL);
  if (c == NULL) goto cleanup;
  base = event = NULL; /* c owns them now */
  res = cuda_shared_tensor(st, c, &layout, flags);

cleanup:
  (void)dlb_cuda_ipc_event_destroy(dev, event, NULL);
  (void)dlb_cuda_ipc_free(dev, base, NULL);
  Py_DECREF(src);
  return res;
}

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
  if (view.t.device.device_type == kDLCUDA) {
    dlb__view_release(&view);
    return share_cuda(st, obj);
  }
  if (view.t.device.device_type == kDLCUDAManaged) {
    PyErr_SetString(PyExc_BufferError,
                    "share(): CUDA managed memory cannot be exported with CUDA "
                    "IPC; copy it to a device first (copy(device='cuda:N'))");
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

/* A shared CUDA tensor's pickle: (_rebuild_cuda_shared, (handle bytes,
 * offset, dtype, shape, strides, flags)).  The exporter's event is
 * recorded anew on the current stream each time, so the receiver waits for
 * everything queued on it before this pickle was made.  A tensor that was
 * itself imported passes its original handle on (CUDA cannot export a
 * mapping it opened); its own later writes are then the caller's to order. */
static PyObject *cuda_shared_reduce(dlb_module_state *st, dlb_TensorObject *self,
                                    cuda_shared *c) {
  PyObject *module = NULL, *rebuild = NULL, *shape = NULL, *strides = NULL;
  PyObject *res = NULL;
  int64_t scratch[DLB_MAX_NDIM];
  dlb_cuda_ipc_handle h;
  dlb_error err;
  if (c->imported) {
    h = c->handle;
  } else if (dlb_cuda_ipc_export(c->device_id, c->base, c->size, c->event,
                                 dlb__stream_current(), &h, &err) != DLB_OK) {
    dlb__raise_as(PyExc_BufferError, "pickling a shared CUDA tensor", &err);
    goto cleanup;
  }
  module = PyType_GetModule(st->TensorType);
  if (module == NULL) goto cleanup;
  rebuild = PyObject_GetAttrString(module, "_rebuild_cuda_shared");
  if (rebuild == NULL) goto cleanup;
  shape = int64_tuple(self->t.ndim, self->t.shape);
  strides = int64_tuple(self->t.ndim, dlb_tensor_strides(&self->t, scratch));
  if (shape == NULL || strides == NULL) goto cleanup;
  long long offset = (long long)((const char *)dlb_tensor_data(&self->t) - c->base);
  PyObject *args = Py_BuildValue(
      "(y#L(iii)OOK)", (const char *)&h, (Py_ssize_t)sizeof h, offset,
      (int)self->t.dtype.code, (int)self->t.dtype.bits, (int)self->t.dtype.lanes,
      shape, strides,
      (unsigned long long)(self->flags & (DLPACK_FLAG_BITMASK_READ_ONLY |
                                          DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)));
  if (args == NULL) goto cleanup;
  res = PyTuple_Pack(2, rebuild, args);
  Py_DECREF(args);

cleanup:
  cuda_shared_drop(c);
  Py_XDECREF(rebuild);
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  return res;
}

PyObject *dlb__shared_reduce(dlb_module_state *st, dlb_TensorObject *self) {
  PyObject *module = NULL, *rebuild = NULL, *shape = NULL, *strides = NULL;
  PyObject *res = NULL;
  const char *lo = NULL, *hi = NULL;
  int64_t scratch[DLB_MAX_NDIM];
  dlb_error err;
  cuda_shared *c = cuda_shared_of(&self->t);
  if (c != NULL) return cuda_shared_reduce(st, self, c); /* takes c's reference */
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

/* _rebuild_cuda_shared(handle, offset, dtype, shape, strides, flags): the
 * receiving end of cuda_shared_reduce.  Another process's handle is opened
 * (its event waited for on the current stream); this process's own is
 * found in the registry by address.  Everything is validated: the layout
 * must lie inside the allocation the handle names. */
static PyObject *py_rebuild_cuda_shared(PyObject *module, PyObject *const *args,
                                        Py_ssize_t nargs) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  dlb_cuda_ipc_handle h;
  dlb_error err;
  DLTensor layout;
  int64_t shape[DLB_MAX_NDIM], strides[DLB_MAX_NDIM];
  int32_t ndim = 0, nstrides = 0;
  int64_t need = 0;
  cuda_shared *c = NULL;
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "_rebuild_cuda_shared takes 6 arguments");
    return NULL;
  }
  if (!PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)sizeof h) {
    PyErr_Format(PyExc_ValueError,
                 "shared CUDA tensor handle: expected %zu bytes of handle",
                 sizeof h);
    return NULL;
  }
  memcpy(&h, PyBytes_AS_STRING(args[0]), sizeof h);
  long long offset = PyLong_AsLongLong(args[1]);
  if (offset == -1 && PyErr_Occurred()) return NULL;
  memset(&layout, 0, sizeof layout);
  if (dlb__parse_dtype_tuple(args[2], &layout.dtype) < 0) return NULL;
  if (dlb__parse_dims(args[3], "shape", &ndim, shape) < 0) return NULL;
  if (dlb__parse_dims(args[4], "strides", &nstrides, strides) < 0) return NULL;
  if (nstrides != ndim) {
    PyErr_SetString(PyExc_ValueError,
                    "shared CUDA tensor handle: strides and shape differ in length");
    return NULL;
  }
  unsigned long long flags = PyLong_AsUnsignedLongLong(args[5]);
  if (flags == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  flags &= DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
  if (h.size == 0 || offset < 0 || (unsigned long long)offset > h.size) {
    PyErr_Format(PyExc_ValueError,
                 "shared CUDA tensor handle: offset %lld outside the %llu-byte "
                 "allocation",
                 offset, (unsigned long long)h.size);
    return NULL;
  }

  if (h.pid == (int64_t)getpid()) {
    /* Our own export: the memory is at h.base, alive while its cuda_shared
     * is (the registry gives us a reference, or nothing). */
    int dev = -1;
    if (dlb_cuda_ipc_find_device(&h, &dev, &err) != DLB_OK) return dlb__raise(&err);
    char *b = (char *)(uintptr_t)h.base;
    c = cuda_registry_find(dev, b, b + h.size);
    if (c == NULL || c->base != b) {
      if (c != NULL) cuda_shared_drop(c);
      PyErr_SetString(PyExc_ValueError,
                      "shared CUDA tensor handle: made by this process for "
                      "memory that is no longer shared (the exporting tensor "
                      "is gone)");
      return NULL;
    }
  } else {
    int dev = -1;
    void *base = NULL;
    if (dlb_cuda_ipc_open(&h, dlb__stream_current(), &dev, &base, &err) != DLB_OK) {
      dlb__raise_as(PyExc_BufferError, "unpickling a shared CUDA tensor", &err);
      return NULL;
    }
    c = cuda_shared_new(dev, base, (size_t)h.size, NULL, &h);
    if (c == NULL) {
      (void)dlb_cuda_ipc_close(dev, base, NULL);
      return NULL;
    }
  }
  /* From here c holds one reference: dropped on every failure. */
  layout.data = c->base + offset;
  layout.device = (DLDevice){kDLCUDA, c->device_id};
  layout.ndim = ndim;
  layout.shape = ndim > 0 ? shape : NULL;
  layout.strides = ndim > 0 ? strides : NULL;
  if (dlb__check_pickled_layout(&layout, flags, &need) < 0) goto fail;
  if (need > (int64_t)c->size - (int64_t)offset) {
    PyErr_Format(PyExc_ValueError,
                 "shared CUDA tensor handle: the tensor needs %lld bytes from "
                 "offset %lld, the allocation has %zu",
                 (long long)need, offset, c->size);
    goto fail;
  }
  return cuda_shared_tensor(st, c, &layout, (uint64_t)flags);

fail:
  cuda_shared_drop(c);
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
    {"_rebuild_cuda_shared", (PyCFunction)(void (*)(void))py_rebuild_cuda_shared,
     METH_FASTCALL,
     "_rebuild_cuda_shared(handle, offset, dtype, shape, strides, flags)\n--\n\n"
     "Map a pickled CUDA IPC handle (used by pickle; validates everything)."},
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
