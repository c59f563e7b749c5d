/* share_ipc.c -- shared CUDA tensors: CUDA IPC (src/core/cuda_ipc.c).
 *
 * share() of a CUDA tensor copies it (on the current stream) into memory
 * allocated for IPC; pickling such a tensor sends a dlb_cuda_ipc_handle
 * (the memory's and an interprocess event's handles, the device UUID), and
 * the receiver maps the same device memory, its stream waiting for the
 * exporter's event on the GPU.  One ipc_allocation per allocation or
 * mapping in this process, shared by every Tensor over it (a share()
 * result, views of it, same-process unpickles), counted: the last one
 * frees the memory (exporter) or closes the mapping (importer).  Lifetime
 * across processes is CUDA's rule, written down in docs/scale-out.md: the
 * exporter keeps the memory alive while importers use it.
 */
#include "dlbridge_py.h" /* Python.h first: it sets the feature macros */

#include <pthread.h>
#include <string.h>
#include <unistd.h>

/* An IPC allocation (exported) or mapping (imported) of this process. */
typedef struct ipc_allocation {
  int refs;                   /* guarded by registry_lock */
  int device_id;
  char *base;                 /* allocation (exported) or mapping (imported) */
  size_t size;
  void *event;                /* exporter's interprocess event, or NULL */
  int imported;               /* opened from another process's handle */
  dlb_cuda_ipc_handle handle; /* imported: the handle it came from */
  struct ipc_allocation *prev, *next;
} ipc_allocation;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static ipc_allocation *registry;

/* The allocation holding [lo, hi) on device_id, with a reference taken, or
 * NULL. */
static ipc_allocation *registry_find(int device_id, const char *lo,
                                     const char *hi) {
  ipc_allocation *found = NULL;
  pthread_mutex_lock(&registry_lock);
  for (ipc_allocation *c = registry; c != NULL; c = c->next) {
    if (c->device_id == device_id && lo >= c->base && hi <= c->base + c->size) {
      found = c;
      found->refs++;
      break;
    }
  }
  pthread_mutex_unlock(&registry_lock);
  return found;
}

static void ipc_allocation_drop(ipc_allocation *c) {
  pthread_mutex_lock(&registry_lock);
  int last = --c->refs == 0;
  if (last) {
    if (c->prev != NULL) c->prev->next = c->next;
    else registry = c->next;
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

/* A new registered allocation with one reference, or NULL (MemoryError). */
static ipc_allocation *ipc_allocation_new(int device_id, void *base, size_t size,
                                          void *event,
                                          const dlb_cuda_ipc_handle *from) {
  ipc_allocation *c = PyMem_RawCalloc(1, sizeof *c);
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
  c->next = registry;
  if (registry != NULL) registry->prev = c;
  registry = c;
  pthread_mutex_unlock(&registry_lock);
  return c;
}

/* The allocation t's elements lie in, with a reference taken, or NULL (no
 * exception). */
static ipc_allocation *ipc_find(const DLTensor *t) {
  const char *lo = NULL, *hi = NULL;
  if (t->device.device_type != kDLCUDA || !dlb__element_range(t, &lo, &hi))
    return NULL;
  return registry_find(t->device.device_id, lo, hi);
}

bool dlb__ipc_holds(const DLTensor *t) {
  ipc_allocation *c = ipc_find(t);
  if (c == NULL) return false;
  ipc_allocation_drop(c);
  return true;
}

/* dlb_release_fn of a Tensor over IPC memory: its reference. */
static void ipc_tensor_release(void *ctx) { ipc_allocation_drop((ipc_allocation *)ctx); }

/* A new Tensor over layout (inside c's memory, on c's device), holding the
 * reference to c the caller had.  Takes that reference on success and
 * failure. */
static PyObject *ipc_tensor(dlb_module_state *st, ipc_allocation *c,
                            const DLTensor *layout, uint64_t flags) {
  DLManagedTensorVersioned *m = NULL;
  dlb_error err;
  if (dlb_managed_wrap(layout, flags, ipc_tensor_release, c, &m, &err) != DLB_OK) {
    ipc_allocation_drop(c);
    return dlb__raise(&err);
  }
  /* runs the release on failure */
  return dlb__tensor_from_managed(st, m);
}

/* ---- share ------------------------------------------------------------------------ */

/* Imported first (so its producer's stream is ordered before ours), then
 * -- unless it already lies in IPC memory -- copied compactly into a new
 * IPC allocation on the current stream. */
PyObject *dlb__ipc_share(dlb_module_state *st, PyObject *obj) {
  PyObject *src = dlb__import(st, obj, NULL, -1), *res = NULL;
  void *base = NULL, *event = NULL;
  int64_t nbytes = 0;
  dlb_error err;
  if (src == NULL) return NULL;
  const DLTensor *t = &((dlb_TensorObject *)src)->t;
  uint64_t flags = ((dlb_TensorObject *)src)->flags & DLB_PICKLED_FLAGS;
  int dev = t->device.device_id;
  if (dlb__ipc_holds(t)) return src; /* a view of shared memory already: no copy */
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
    /* A driver failure is BufferError, as on every path of share(). */
    dlb__raise_status("share()", &err, PyExc_BufferError);
    goto cleanup;
  }
  layout.data = base;
  layout.byte_offset = 0;
  ipc_allocation *c =
      ipc_allocation_new(dev, base, (size_t)(nbytes > 0 ? nbytes : 1), event, NULL);
  if (c == NULL) goto cleanup;
  base = event = NULL; /* c owns them now */
  res = ipc_tensor(st, c, &layout, flags);

cleanup:
  (void)dlb_cuda_ipc_event_destroy(dev, event, NULL);
  (void)dlb_cuda_ipc_free(dev, base, NULL);
  Py_DECREF(src);
  return res;
}

/* ---- the handle ------------------------------------------------------------------- */

/* A shared CUDA tensor's pickle.  The exporter's event is recorded anew on
 * the current stream each time, so the receiver waits for everything
 * queued on it before this pickle was made.  A tensor that was itself
 * imported passes its original handle on (CUDA cannot export a mapping it
 * opened); its own later writes are then the caller's to order. */
PyObject *dlb__ipc_reduce(dlb_module_state *st, dlb_TensorObject *self) {
  PyObject *module = NULL, *rebuild = NULL, *shape = NULL, *strides = NULL;
  PyObject *res = NULL;
  int64_t scratch[DLB_MAX_NDIM];
  dlb_cuda_ipc_handle h;
  dlb_error err;
  ipc_allocation *c = ipc_find(&self->t);
  if (c == NULL) {
    PyErr_SetString(PyExc_BufferError, "the tensor is no longer in CUDA IPC memory");
    return NULL;
  }
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
  shape = dlb__int64_tuple(self->t.ndim, self->t.shape);
  strides = dlb__int64_tuple(self->t.ndim, dlb_tensor_strides(&self->t, scratch));
  if (shape == NULL || strides == NULL) goto cleanup;
  long long offset = (long long)((const char *)dlb_tensor_data(&self->t) - c->base);
  PyObject *args = Py_BuildValue(
      "(y#L(iii)OOK)", (const char *)&h, (Py_ssize_t)sizeof h, offset,
      (int)self->t.dtype.code, (int)self->t.dtype.bits, (int)self->t.dtype.lanes,
      shape, strides, (unsigned long long)(self->flags & DLB_PICKLED_FLAGS));
  if (args == NULL) goto cleanup;
  res = PyTuple_Pack(2, rebuild, args);
  Py_DECREF(args);

cleanup:
  ipc_allocation_drop(c);
  Py_XDECREF(rebuild);
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  return res;
}

/* _rebuild_cuda_shared(handle, offset, dtype, shape, strides, flags): the
 * receiving end of dlb__ipc_reduce.  Another process's handle is opened
 * (its event waited for on the current stream); this process's own is
 * found in the registry by address.  Everything is validated: the layout
 * must lie inside the allocation the handle names. */
static PyObject *py_rebuild_cuda_shared(PyObject *module, PyObject *const *args,
                                        Py_ssize_t nargs) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  dlb_cuda_ipc_handle h;
  dlb_error err;
  dlb_pickled_layout l;
  ipc_allocation *c = NULL;
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
  if (dlb__parse_pickled_layout(args + 2, &l) < 0) return NULL;
  if (h.size == 0 || h.size > (uint64_t)INT64_MAX) {
    PyErr_Format(PyExc_ValueError,
                 "shared CUDA tensor handle: an allocation of %llu bytes",
                 (unsigned long long)h.size);
    return NULL;
  }
  /* The layout against the size the handle claims, before anything is
   * opened (a bad handle maps nothing, waits for nothing); the claim itself
   * is checked against the driver's when the memory is opened. */
  if (dlb__place_pickled_layout(&l, NULL, offset, (int64_t)h.size, "allocation") < 0)
    return NULL;

  if (h.pid == (int64_t)getpid()) {
    /* Our own export: the memory is at h.base, alive while its
     * ipc_allocation is (the registry gives us a reference, or nothing). */
    int dev = -1;
    if (dlb_cuda_ipc_find_device(&h, &dev, &err) != DLB_OK) return dlb__raise(&err);
    char *b = (char *)(uintptr_t)h.base;
    c = registry_find(dev, b, b);
    if (c == NULL || c->base != b) {
      if (c != NULL) ipc_allocation_drop(c);
      PyErr_SetString(PyExc_ValueError,
                      "shared CUDA tensor handle: made by this process for "
                      "memory that is no longer shared (the exporting tensor "
                      "is gone)");
      return NULL;
    }
    if (h.size > c->size) {
      PyErr_Format(PyExc_ValueError,
                   "shared CUDA tensor handle: it claims %llu bytes, but the "
                   "allocation it names has %zu",
                   (unsigned long long)h.size, c->size);
      ipc_allocation_drop(c);
      return NULL;
    }
  } else {
    int dev = -1;
    void *base = NULL;
    /* A handle that does not fit this process's devices or the allocation
     * it names is a bad value (ValueError, as every hostile handle); a
     * driver that refuses the memory, a move that cannot be made. */
    if (dlb_cuda_ipc_open(&h, dlb__stream_current(), &dev, &base, &err) != DLB_OK)
      return dlb__raise_status("unpickling a shared CUDA tensor", &err,
                               PyExc_BufferError);
    c = ipc_allocation_new(dev, base, (size_t)h.size, NULL, &h);
    if (c == NULL) {
      (void)dlb_cuda_ipc_close(dev, base, NULL);
      return NULL;
    }
  }
  /* From here c holds one reference: dropped on every failure. */
  if (dlb__place_pickled_layout(&l, c->base, offset, (int64_t)c->size,
                                "allocation") < 0) {
    ipc_allocation_drop(c);
    return NULL;
  }
  l.t.device = (DLDevice){kDLCUDA, c->device_id};
  return ipc_tensor(st, c, &l.t, l.flags);
}

static PyMethodDef ipc_methods[] = {
    {"_rebuild_cuda_shared", (PyCFunction)(void (*)(void))py_rebuild_cuda_shared,
     METH_FASTCALL,
     "_rebuild_cuda_shared(handle, offset, dtype, shape, strides, flags)\n--\n\n"
     "Map a pickled CUDA IPC handle (used by pickle; validates everything)."},
    {NULL, NULL, 0, NULL},
};

int dlb__share_ipc_init(PyObject *module) {
  return PyModule_AddFunctions(module, ipc_methods);
}
