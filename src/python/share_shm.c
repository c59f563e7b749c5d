/* share_shm.c -- shared host tensors: POSIX shared memory (src/core/shm.c).
 *
 * A shared tensor owns one mapping of a segment.  Every live mapping of
 * this process is listed in a registry, so "is this memory shared?" is a
 * lookup by address: a Tensor -- or any framework's tensor made from one
 * through convert() -- whose elements lie inside a mapping is shared,
 * share() returns it without copying, and pickling it sends the segment's
 * name and the offset instead of the bytes.
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

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

/* One mapping of this process, in the registry; the release context of
 * the Tensor over it (dlb_managed_wrap). */
typedef struct shm_block {
  dlb_shm *shm;                  /* owned */
  /* Set while the load that opened shm can still fail: the release then
   * gives the handle back (dlb_shm_close_unused) instead of consuming it. */
  bool unused;
  dlb_allocator allocator;       /* what allocated this block */
  struct shm_block *prev, *next; /* the registry */
} shm_block;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static shm_block *registry;

static void registry_add(shm_block *b) {
  pthread_mutex_lock(&registry_lock);
  b->prev = NULL;
  b->next = registry;
  if (registry != NULL) registry->prev = b;
  registry = b;
  pthread_mutex_unlock(&registry_lock);
}

static void registry_remove(shm_block *b) {
  pthread_mutex_lock(&registry_lock);
  if (b->prev != NULL) b->prev->next = b->next;
  else registry = b->next;
  if (b->next != NULL) b->next->prev = b->prev;
  pthread_mutex_unlock(&registry_lock);
}

/* The mapping whose data holds t's elements, or NULL.  The caller must
 * hold an object that keeps that memory alive, so the mapping found
 * outlives the call. */
static dlb_shm *shm_find(const DLTensor *t) {
  const char *lo = NULL, *hi = NULL;
  dlb_shm *found = NULL;
  if (!dlb_device_is_host_accessible(t->device) || !dlb__element_range(t, &lo, &hi))
    return NULL;
  pthread_mutex_lock(&registry_lock);
  for (shm_block *b = registry; b != NULL; b = b->next) {
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

bool dlb__shm_holds(const DLTensor *t) { return shm_find(t) != NULL; }

/* Close shm: a mapping a failed load opened gives its handle back. */
static void shm_drop(dlb_shm *shm, bool unused) {
  if (unused)
    dlb_shm_close_unused(shm);
  else
    dlb_shm_close(shm);
}

/* dlb_release_fn of a shared tensor: unmap (no Python). */
static void shm_block_release(void *ctx) {
  shm_block *b = (shm_block *)ctx;
  registry_remove(b);
  shm_drop(b->shm, b->unused);
  dlb_allocator a = b->allocator;
  a.release(b, a.ctx);
}

/* A new Tensor over layout (whose data points into shm's mapping) that owns
 * shm.  Takes shm on success and failure; loaded: shm was opened from a
 * handle, which a failure here gives back. */
static PyObject *shm_tensor(dlb_module_state *st, dlb_shm *shm,
                            const DLTensor *layout, uint64_t flags,
                            bool loaded) {
  const dlb_allocator *a = dlb_get_allocator();
  DLManagedTensorVersioned *m = NULL;
  dlb_error err;
  shm_block *b = (shm_block *)a->alloc(sizeof *b, a->ctx);
  if (b == NULL) {
    shm_drop(shm, loaded);
    return PyErr_NoMemory();
  }
  b->shm = shm;
  b->unused = loaded;
  b->allocator = *a;
  if (dlb_managed_wrap(layout, flags, shm_block_release, b, &m, &err) != DLB_OK) {
    b->allocator.release(b, b->allocator.ctx);
    shm_drop(shm, loaded);
    return dlb__raise(&err);
  }
  registry_add(b);
  /* runs the release on failure */
  PyObject *t = dlb__tensor_from_managed(st, m);
  if (t != NULL) b->unused = false; /* loaded: the handle is the Tensor's now */
  return t;
}

/* ---- share ------------------------------------------------------------------------ */

/* When leftovers were last looked for (dlb_shm_cleanup: dead processes'
 * segments, and ours that workers ending with os._exit held when we let
 * go).  A scan lists /dev/shm and signals each creator (kill 0), so it runs
 * at most once a second: often enough that a program which keeps killing
 * workers (Pool terminate) does not pile up segments, rare enough to cost
 * nothing. */
static _Atomic(long long) last_cleanup;

PyObject *dlb__shm_share(dlb_module_state *st, const dlb_view *view) {
  dlb_shm *shm = NULL;
  dlb_error err;
  int64_t nbytes = 0;
  long long now = (long long)time(NULL);
  long long last = atomic_load_explicit(&last_cleanup, memory_order_relaxed);
  /* One thread a second scans (without the GIL several may get here). */
  if (now != last &&
      atomic_compare_exchange_strong_explicit(&last_cleanup, &last, now,
                                              memory_order_relaxed,
                                              memory_order_relaxed))
    (void)dlb_shm_cleanup(NULL, NULL);
  bool padded = (view->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0;
  if (dlb_tensor_nbytes(&view->t, padded, &nbytes, &err) != DLB_OK)
    return dlb__raise_status("share()", &err, NULL);
  if (dlb_shm_create((size_t)nbytes, &shm, &err) != DLB_OK)
    return dlb__raise_errno("share()", &err, errno);
  DLTensor layout = view->t;
  int64_t strides[DLB_MAX_NDIM];
  layout.data = dlb_shm_data(shm);
  layout.byte_offset = 0;
  if (layout.ndim > 0) {
    (void)dlb_strides_row_major(layout.ndim, layout.shape, strides, NULL);
    layout.strides = strides;
  }
  if (dlb_copy(&layout, &view->t, &err) != DLB_OK) {
    dlb_shm_close(shm);
    return dlb__raise_status("share()", &err, NULL);
  }
  return shm_tensor(st, shm, &layout, view->flags & DLB_PICKLED_FLAGS, false);
}

/* ---- the handle ------------------------------------------------------------------- */

PyObject *dlb__shm_reduce(dlb_module_state *st, dlb_TensorObject *self) {
  PyObject *module = NULL, *rebuild = NULL, *shape = NULL, *strides = NULL;
  PyObject *res = NULL;
  int64_t scratch[DLB_MAX_NDIM];
  dlb_error err;
  dlb_shm *shm = shm_find(&self->t);
  if (shm == NULL) {
    PyErr_SetString(PyExc_BufferError, "the tensor is no longer in shared memory");
    return NULL;
  }
  module = PyType_GetModule(st->TensorType);
  if (module == NULL) goto cleanup;
  rebuild = PyObject_GetAttrString(module, "_rebuild_shared");
  if (rebuild == NULL) goto cleanup;
  shape = dlb__int64_tuple(self->t.ndim, self->t.shape);
  strides = dlb__int64_tuple(self->t.ndim, dlb_tensor_strides(&self->t, scratch));
  if (shape == NULL || strides == NULL) goto cleanup;
  long long offset =
      (long long)((const char *)dlb_tensor_data(&self->t) - (const char *)dlb_shm_data(shm));
  PyObject *args = Py_BuildValue(
      "(sL(iii)OOK)", dlb_shm_name(shm), offset, (int)self->t.dtype.code,
      (int)self->t.dtype.bits, (int)self->t.dtype.lanes, shape, strides,
      (unsigned long long)(self->flags & DLB_PICKLED_FLAGS));
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
  dlb_pickled_layout l;
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
  if (dlb__parse_pickled_layout(args + 2, &l) < 0) return NULL;

  if (dlb_shm_open(name, &shm, &err) != DLB_OK)
    return dlb__raise_errno(NULL, &err, errno);
  /* From here the mapping is ours.  A load that fails gives the handle
   * back: the pickle stays loadable, the segment held by it. */
  if (dlb__place_pickled_layout(&l, (char *)dlb_shm_data(shm), offset,
                                (int64_t)dlb_shm_size(shm), "segment") < 0) {
    dlb_shm_close_unused(shm);
    return NULL;
  }
  return shm_tensor(st, shm, &l.t, l.flags, true);
}

/* _shm_cleanup() -> int: remove leftover segments (dlb_shm_cleanup). */
static PyObject *py_shm_cleanup(PyObject *module, PyObject *unused) {
  (void)module;
  (void)unused;
  int removed = 0;
  dlb_error err;
  if (dlb_shm_cleanup(&removed, &err) != DLB_OK)
    return dlb__raise_errno(NULL, &err, errno);
  return PyLong_FromLong(removed);
}

/* _shm_info(tensor) -> (name, mappings, handles_in_flight), for tests and
 * diagnostics. */
static PyObject *py_shm_info(PyObject *module, PyObject *obj) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  if (!dlb__is_tensor(st, obj)) {
    PyErr_SetString(PyExc_TypeError, "_shm_info() takes a dlbridge.Tensor");
    return NULL;
  }
  dlb_shm *shm = shm_find(&((dlb_TensorObject *)obj)->t);
  if (shm == NULL) {
    PyErr_SetString(PyExc_ValueError, "the tensor is not in shared memory");
    return NULL;
  }
  uint32_t maps = 0, flight = 0;
  dlb_shm_counts(shm, &maps, &flight);
  return Py_BuildValue("(sII)", dlb_shm_name(shm), (unsigned)maps, (unsigned)flight);
}

static PyMethodDef shm_methods[] = {
    {"_rebuild_shared", (PyCFunction)(void (*)(void))py_rebuild_shared, METH_FASTCALL,
     "_rebuild_shared(name, offset, dtype, shape, strides, flags)\n--\n\n"
     "Map a pickled shared-memory handle (used by pickle; validates "
     "everything)."},
    {"_shm_cleanup", py_shm_cleanup, METH_NOARGS,
     "_shm_cleanup() -> int\n--\n\nRemove the shared-memory segments that "
     "nobody maps: dead processes' and this process's own with no handle in "
     "flight; returns how many."},
    {"_shm_info", py_shm_info, METH_O,
     "_shm_info(tensor) -> (name, mappings, handles_in_flight)"},
    {NULL, NULL, 0, NULL},
};

int dlb__share_shm_init(PyObject *module) {
  return PyModule_AddFunctions(module, shm_methods);
}
