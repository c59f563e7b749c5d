/*
 * export.c -- everything dlb.Tensor gives consumers: Tensor.__dlpack__ and
 * Tensor.__dlpack_device__ (capsule creation, keyword negotiation and the
 * managed tensor that keeps a Tensor alive while a consumer holds its
 * memory), and dlb.Tensor's DLPack C exchange table.  dlb__export_init
 * installs all three on the Tensor type.
 *
 * Ownership: every export, versioned or legacy, is ONE allocation
 * (export_view: struct, shape and strides together; block_alloc says from
 * which allocator) holding a strong
 * reference to the Tensor, dropped by dlb__release_ref() when the consumer
 * calls the deleter.  A copy (copy=True, or a different dl_device) is first
 * made into a new Tensor of its own (dlb_managed_empty), which is then
 * exported the same way, so every capsule we make holds an export_block.
 *
 * The block belongs to the managed tensor alone: its deleter frees it.  A
 * capsule's destructor must run the deleter when nobody took the tensor,
 * and must not when someone did -- also when a consumer ran the deleter
 * without renaming the capsule (torch 2.13 does on a failure path), which
 * a name cannot tell; and nothing may depend on the destructor running at
 * all (jaxlib renames the capsule and clears its destructor).  So a capsule
 * names its export by a serial number (its context), listed as pending
 * from the export until the deleter runs: the destructor of a capsule
 * nobody renamed runs the deleter only if its serial is still pending,
 * and never reads the block otherwise.
 *
 * Decisions recorded here (known-bugs.md section 3, DESIGN.md):
 *
 *  - Version.  A versioned capsule reports {1, 3} (what export_view and
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
 *    values >= -1 are accepted; on ROCm 1 and 2 are ValueError.  A CUDA
 *    tensor's pending work is taken to be on dlbridge's current stream
 *    (cuda.c, dlb.stream); unless the consumer passed -1 it is ordered
 *    before the consumer's stream (None: the legacy stream) with an event
 *    record + cuStreamWaitEvent -- never a host wait, and nothing when the
 *    two streams are the same.  During graph capture that ordering is
 *    legal between two non-legacy streams only (the core refuses the rest).
 *  - dl_device equal to the tensor's device: no copy.  Another device
 *    (CPU, cuda:N, cuda_host) is a copy (BufferError with copy=False):
 *    host <-> CUDA and CUDA <-> CUDA on the current stream (cuda.c), a host
 *    result complete before the capsule is returned.  Devices dlbridge
 *    cannot copy between are a BufferError naming both.
 *  - copy=True copies into a new contiguous tensor on the target device
 *    (IS_COPIED set, writable); copy=False never copies.  copy must be a
 *    bool or None.
 *  - byte_offset is folded into data for CPU, CUDA and ROCm memory kinds
 *    (their data pointers are plain addresses); for other devices (OpenCL
 *    handles and the like) it is passed on unchanged.
 *
 * The exchange table.  dlb__tensor_exchange_api is a process-lifetime
 * table, version 1.3, prev_api NULL, all five entries set.  It is published
 * on dlb.Tensor as the class attribute __dlpack_c_exchange_api__, a
 * PyCapsule named "dlpack_exchange_api" with no destructor (the table is
 * static).  Tensor is an immutable heap type, so the attribute goes into
 * tp_dict from C, followed by PyType_Modified.  Every entry must be called
 * with the GIL held (as for every table); none leaves an exception set on
 * success.
 *
 * Decisions written down here (known-bugs section 3):
 *  3.8 managed_tensor_to_py_object_no_sync STEALS the tensor on success AND
 *      on failure: when it returns -1 the tensor's deleter has already run.
 *      The header says only "stolen"; the alternative (ownership returns to
 *      the caller on failure) cannot be told apart by a caller from a
 *      producer that did steal, so a caller that deleted on failure would
 *      double-free with half the producers.  As a consumer we assume the
 *      same of every foreign table (the callee took it) and never delete
 *      after a failed call: at worst a non-stealing producer leaks one
 *      tensor on an error path, never frees it twice.
 *  -   The allocator makes CPU, CUDA (stream-ordered, on the current
 *      stream) and pinned tensors; any other device is a BufferError
 *      through SetError.
 *  -   current_work_stream writes dlbridge's current stream for CUDA
 *      (NULL for the legacy stream) and NULL for every other device.
 *  -   Borrowed views through a foreign table's dltensor_from_py_object_no_sync
 *      carry flags 0: the table has no way to say read-only on that path.
 *      A framework whose tensors can be read-only must leave that entry NULL
 *      (we then take the managed path, whose flags we honour) or refuse
 *      read-only objects there.  dlb.Tensor's own entry does the latter:
 *      a read-only Tensor is a BufferError on the borrowed entry, so the
 *      fast path stays for writable ones.
 *
 * Layering: this file sits above tensor.c (the table's
 * managed_tensor_to_py_object_no_sync makes Tensors), so tensor.c's own
 * method table cannot name __dlpack__; dlb__export_init installs
 * __dlpack__ and __dlpack_device__ on the type instead, the same way as
 * the table attribute.
 */
#include "dlbridge_py.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char kVersionedName[] = "dltensor_versioned";
static const char kLegacyName[] = "dltensor";

#define AS_TENSOR(o) ((dlb_TensorObject *)(o))

/* ---- the exported managed tensor ------------------------------------------------ */

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

/* Every zero-copy export -- versioned or legacy, capsule or exchange API --
 * is ONE block (block_alloc: Python's allocator, or the core allocator a
 * user installed): this header, the managed struct of
 * the kind asked for, then shape and strides.  The block is made here
 * rather than by dlb_managed_wrap because a legacy export would otherwise
 * cost two blocks (dlb_managed_to_legacy wraps the versioned one), and
 * because the export's layout is simple enough to build with straight-line
 * code on the hottest path of the library.
 *
 * Shape and strides are COPIED from the Tensor, not pointed at, although
 * the Tensor outlives the export (the block holds a reference to it):
 * DLPack consumers must not write to them, but one that did would
 * otherwise corrupt the Tensor's own view for every later user
 * (known-bugs B11); the copy is 2 * ndim stores into memory we allocate
 * anyway.  The allocator is copied too, so the block is freed through the
 * allocator that made it even after dlb_set_allocator changed it. */
typedef struct export_block {
  dlb_allocator allocator; /* what made it (block_alloc) */
  PyObject *owner; /* strong reference to the exported Tensor (or, for
                      dlb__legacy_capsule_of, whatever owns the memory) */
  int owner_is_tensor; /* owner is the Tensor the export views */
  /* The serial of the capsule made around it (pending until the deleter
   * runs), 0 for an export in no capsule (the exchange table's). */
  uintptr_t serial;
  union {
    DLManagedTensorVersioned versioned;
    DLManagedTensor legacy;
  } m;
  int64_t dims[]; /* shape[ndim], then strides[ndim] */
} export_block;

/* ---- capsules still pending: serial -> block, until the deleter runs ------------
 *
 * A small open-addressing table (linear probing, backward-shift deletion,
 * grown at half load) under a mutex: a deleter may run on any thread, with
 * or without the GIL.  Serials count up from 1 and are never reused (a
 * uintptr_t: on 64-bit platforms it never wraps). */
typedef struct {
  uintptr_t serial; /* 0: a free slot */
  export_block *block;
} pending_slot;

/* A spin lock: it is held for a few dozen instructions (a probe, a store)
 * on the path of every capsule, where a pthread mutex's lock and unlock
 * cost a capsule export ~10 ns more; a waiter yields its CPU now and then,
 * so one that spins while the holder is descheduled lets it run. */
static atomic_flag pending_busy = ATOMIC_FLAG_INIT;

static void pending_lock(void) {
  unsigned spins = 0;
  while (atomic_flag_test_and_set_explicit(&pending_busy, memory_order_acquire))
    if (++spins % 64 == 0) sched_yield();
}

static void pending_unlock(void) {
  atomic_flag_clear_explicit(&pending_busy, memory_order_release);
}
static pending_slot *pending;
static size_t pending_mask, pending_count;
static uintptr_t pending_next = 1;

static size_t pending_home(uintptr_t serial) {
  uint64_t x = (uint64_t)serial * UINT64_C(0x9E3779B97F4A7C15);
  return (size_t)(x >> 32) & pending_mask;
}

/* With the pending lock held: room for one more, growing at half load.  0, or
 * -1 when the larger table cannot be allocated (the old one is kept). */
static int pending_reserve(void) {
  if (pending != NULL && 2 * (pending_count + 1) <= pending_mask + 1) return 0;
  size_t capacity = pending == NULL ? 64 : 2 * (pending_mask + 1);
  pending_slot *grown = calloc(capacity, sizeof *grown);
  if (grown == NULL) return -1;
  pending_slot *old = pending;
  size_t old_capacity = old == NULL ? 0 : pending_mask + 1;
  pending = grown;
  pending_mask = capacity - 1;
  for (size_t i = 0; i < old_capacity; i++) {
    if (old[i].serial == 0) continue;
    size_t j = pending_home(old[i].serial);
    while (pending[j].serial != 0) j = (j + 1) & pending_mask;
    pending[j] = old[i];
  }
  free(old);
  return 0;
}

/* List b as pending under a new serial (written into b).  0, or -1 with
 * nothing listed (out of memory). */
static int pending_add(export_block *b) {
  pending_lock();
  int rc = pending_reserve();
  if (rc == 0) {
    uintptr_t serial = pending_next++;
    size_t i = pending_home(serial);
    while (pending[i].serial != 0) i = (i + 1) & pending_mask;
    pending[i].serial = serial;
    pending[i].block = b;
    pending_count++;
    b->serial = serial;
  }
  pending_unlock();
  return rc;
}

/* Take serial off the list: its block, or NULL when it was not pending
 * (the deleter already ran).  Whoever gets the block runs the deleter's
 * work, exactly once. */
static export_block *pending_take(uintptr_t serial) {
  export_block *b = NULL;
  pending_lock();
  if (pending != NULL) {
    size_t i = pending_home(serial);
    while (pending[i].serial != 0 && pending[i].serial != serial)
      i = (i + 1) & pending_mask;
    if (pending[i].serial == serial) {
      b = pending[i].block;
      /* backward-shift: later members of the run move up into the hole */
      size_t j = i;
      for (;;) {
        j = (j + 1) & pending_mask;
        if (pending[j].serial == 0) break;
        size_t k = pending_home(pending[j].serial);
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        pending[i] = pending[j];
        i = j;
      }
      pending[i].serial = 0;
      pending[i].block = NULL;
      pending_count--;
    }
  }
  pending_unlock();
  return b;
}

/* Where a block's memory comes from: Python's object allocator (its free
 * lists; glibc's malloc and free cost a capsule's life some 200
 * instructions more, a tenth of a NumPy -> Dr.Jit convert) while the core
 * allocator is dlbridge's own, else the allocator installed -- the tests'
 * counting one, a user's -- as for everything else.  *from records which
 * (release NULL: Python's).  PyMem wants an attached thread: every export
 * is made with the GIL, and a deleter without it takes it to free the
 * block (export_block_free). */
static export_block *block_alloc(size_t bytes, dlb_allocator *from) {
  if (dlb_allocator_is_default()) {
    from->alloc = NULL;
    from->release = NULL;
    from->ctx = NULL;
    return PyMem_Malloc(bytes);
  }
  *from = *dlb_get_allocator();
  return from->alloc(bytes, from->ctx);
}

/* Free b, made by block_alloc from `from`; with the GIL (or an attached
 * thread state) when it came from Python's allocator. */
static void block_release(export_block *b, const dlb_allocator *from) {
  if (from->release == NULL)
    PyMem_Free(b);
  else
    from->release(b, from->ctx);
}

/* The deleter's work: free the block, then drop the Tensor (the DECREF may
 * run arbitrary code).  A block of Python's allocator is freed with the
 * GIL, taken here when the deleter runs without it -- or, when Python is
 * gone and it cannot be, left behind with the reference, as
 * dlb__release_ref leaves references then. */
static void export_block_free(export_block *b, int have_gil) {
  PyObject *owner = b->owner;
  dlb_allocator from = b->allocator;
  int gil = have_gil || dlb__gil_held();
  if (gil || from.release != NULL) {
    block_release(b, &from);
    dlb__release_ref(owner, gil);
    return;
  }
  if (dlb__python_gone()) return;
  PyGILState_STATE g = PyGILState_Ensure();
  block_release(b, &from);
  dlb__release_ref(owner, 1);
  PyGILState_Release(g);
}

/* The deleter: a block made for a capsule is taken off the pending list
 * first (if the capsule's destructor got there first, it is not listed
 * and this call is a consumer's second, wrong, one: nothing is done). */
static void export_delete(export_block *b) {
  if (b->serial != 0 && pending_take(b->serial) != b) return;
  export_block_free(b, 0);
}

static void versioned_export_deleter(DLManagedTensorVersioned *self) {
  if (self != NULL) export_delete((export_block *)self->manager_ctx);
}

static void legacy_export_deleter(DLManagedTensor *self) {
  if (self != NULL) export_delete((export_block *)self->manager_ctx);
}

/* A zero-copy export of src (with flags), versioned (*out is a
 * DLManagedTensorVersioned) or legacy (a DLManagedTensor), that keeps owner
 * (whose memory src views) alive until its deleter runs.  Nothing is owned
 * on failure.  The caller has checked that a legacy export can describe src
 * (not read-only, not padded sub-byte). */
static int export_block_make(PyObject *owner, const DLTensor *src,
                             uint64_t flags, int versioned, int copied,
                             void **out, dlb_error *err) {
  int32_t ndim = src->ndim;
  /* A Tensor's view was validated when it was made: ndim is in
   * [0, DLB_MAX_NDIM] and shape is non-NULL when ndim > 0, so the size
   * cannot overflow. */
  size_t bytes = sizeof(export_block) + 2u * (size_t)ndim * sizeof(int64_t);
  dlb_allocator from;
  export_block *b = block_alloc(bytes, &from);
  if (b == NULL) {
    return dlb_error_set(err, DLB_ENOMEM,
                         "cannot export the tensor: out of memory allocating "
                         "%zu bytes",
                         bytes);
  }

  DLTensor t;
  t.data = src->data;
  t.device = src->device;
  t.ndim = ndim;
  t.dtype = src->dtype;
  t.byte_offset = src->byte_offset;
  if (address_device(t.device.device_type) && t.data != NULL) {
    t.data = (char *)t.data + t.byte_offset;
    t.byte_offset = 0;
  }
  /* ndim == 0: NULL shape and strides, as every tensor the core makes. */
  t.shape = NULL;
  t.strides = NULL;
  if (ndim > 0) {
    int64_t *shape = b->dims, *strides = b->dims + ndim;
    for (int32_t i = 0; i < ndim; i++) shape[i] = src->shape[i];
    if (src->strides != NULL) {
      for (int32_t i = 0; i < ndim; i++) strides[i] = src->strides[i];
    } else {
      /* Compact row-major, never NULL: the 1.2 rule for versioned
       * tensors, and harmless for legacy ones.  Cannot fail on a shape
       * that was validated; free the block if it somehow does. */
      int rc = dlb_strides_row_major(ndim, shape, strides, err);
      if (rc != DLB_OK) {
        block_release(b, &from);
        return rc;
      }
    }
    t.shape = shape;
    t.strides = strides;
  }

  b->allocator = from;
  b->owner = owner;
  b->owner_is_tensor = 0;
  b->serial = 0;
  Py_INCREF(owner); /* last: nothing above can fail after it */
  if (versioned) {
    DLManagedTensorVersioned *m = &b->m.versioned;
    m->version.major = DLPACK_MAJOR_VERSION;
    m->version.minor = DLPACK_MINOR_VERSION;
    m->manager_ctx = b;
    m->deleter = versioned_export_deleter;
    /* IS_COPIED describes the export, not the tensor: sharing our memory
     * is a copy only when the Tensor was made for this consumer. */
    m->flags = (flags & ~(uint64_t)DLPACK_FLAG_BITMASK_IS_COPIED) |
               (copied ? (uint64_t)DLPACK_FLAG_BITMASK_IS_COPIED : 0u);
    m->dl_tensor = t;
    *out = m;
  } else {
    DLManagedTensor *m = &b->m.legacy;
    m->manager_ctx = b;
    m->deleter = legacy_export_deleter;
    m->dl_tensor = t;
    *out = m;
  }
  return DLB_OK;
}

/* export_block_make for a Tensor: its own view and flags. */
static int export_view(dlb_TensorObject *self, int versioned, int copied,
                       void **out, dlb_error *err) {
  int rc = export_block_make((PyObject *)self, &self->t, self->flags,
                             versioned, copied, out, err);
  if (rc == DLB_OK) {
    export_block *b =
        versioned
            ? (export_block *)((DLManagedTensorVersioned *)*out)->manager_ctx
            : (export_block *)((DLManagedTensor *)*out)->manager_ctx;
    b->owner_is_tensor = 1;
    dlb__tensor_note_exported(self); /* so an import of it is recognised */
  }
  return rc;
}

int dlb__tensor_export_managed(dlb_TensorObject *self,
                               DLManagedTensorVersioned **out,
                               dlb_error *err) {
  void *m = NULL;
  int rc = export_view(self, 1, 0, &m, err);
  if (rc == DLB_OK) *out = (DLManagedTensorVersioned *)m;
  return rc;
}

PyObject *dlb__export_source(const DLManagedTensorVersioned *m) {
  if (m == NULL || m->deleter != versioned_export_deleter) return NULL;
  const export_block *b = m->manager_ctx;
  return b->owner_is_tensor ? b->owner : NULL;
}

PyObject *dlb__export_source_legacy(const DLManagedTensor *m) {
  if (m == NULL || m->deleter != legacy_export_deleter) return NULL;
  const export_block *b = m->manager_ctx;
  return b->owner_is_tensor ? b->owner : NULL;
}

/* ---- capsules ------------------------------------------------------------------------ */

/* The capsule's context is the serial of its export (see the header): the
 * destructor never reads the managed tensor or the block unless the
 * serial is still pending, which means the deleter has not run -- so it
 * runs it, exactly once however consumers misbehave.  A capsule that was
 * renamed was taken: its consumer owns the tensor, and nothing is done.
 * (The name is compared by pointer first: a capsule nobody renamed still
 * carries our static name.)  Nothing here sets an error, and
 * dlb__release_ref keeps an in-flight one (a capsule is often dropped while
 * an exception propagates).  A capsule destructor runs with the GIL. */
static void capsule_destructor(PyObject *capsule, const char *ours) {
  const char *name = PyCapsule_GetName(capsule);
  if (!(name == ours || (name != NULL && strcmp(name, ours) == 0))) return;
  uintptr_t serial = (uintptr_t)PyCapsule_GetContext(capsule);
  export_block *b = serial != 0 ? pending_take(serial) : NULL;
  if (b != NULL) export_block_free(b, 1);
}

static void versioned_capsule_destructor(PyObject *capsule) {
  capsule_destructor(capsule, kVersionedName);
}

static void legacy_capsule_destructor(PyObject *capsule) {
  capsule_destructor(capsule, kLegacyName);
}

/* A capsule of the right kind around m, the managed struct of an
 * export_block made by export_view (a DLManagedTensorVersioned when
 * versioned, else a DLManagedTensor); m is consumed on every path: on
 * failure its deleter runs, with the MemoryError kept (the deleter
 * preserves the error indicator). */
static PyObject *capsule_of(void *m, int versioned) {
  export_block *b =
      versioned ? (export_block *)((DLManagedTensorVersioned *)m)->manager_ctx
                : (export_block *)((DLManagedTensor *)m)->manager_ctx;
  if (pending_add(b) < 0) {
    export_block_free(b, 1);
    return PyErr_NoMemory();
  }
  PyObject *cap =
      versioned
          ? PyCapsule_New(m, kVersionedName, versioned_capsule_destructor)
          : PyCapsule_New(m, kLegacyName, legacy_capsule_destructor);
  if (cap == NULL) {
    if (pending_take(b->serial) == b) export_block_free(b, 1);
    return NULL;
  }
  /* Cannot fail on the valid capsule just made. */
  (void)PyCapsule_SetContext(cap, (void *)b->serial);
  return cap;
}

PyObject *dlb__legacy_capsule_of(PyObject *owner, const DLTensor *view) {
  dlb_error err;
  void *m = NULL;
  if (export_block_make(owner, view, 0, 0, 0, &m, &err) != DLB_OK)
    return dlb__raise(&err);
  return capsule_of(m, 0);
}

/* A zero-copy export of self in a capsule; copied: self is a copy made for
 * this consumer (IS_COPIED). */
static PyObject *view_capsule(dlb_TensorObject *self, int versioned,
                              int copied) {
  dlb_error err;
  void *m = NULL;
  if (!versioned &&
      (self->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) &&
      dlb_dtype_is_subbyte(self->t.dtype)) {
    /* Checked before anything is allocated. */
    dlb_error_set(&err, DLB_EUNSUPPORTED,
                  "cannot export padded sub-byte data "
                  "(IS_SUBBYTE_TYPE_PADDED) as a legacy DLPack capsule, "
                  "which assumes packed elements; pass max_version=(1, 0) "
                  "or higher");
    return dlb__raise(&err);
  }
  if (export_view(self, versioned, copied, &m, &err) != DLB_OK)
    return dlb__raise(&err);
  return capsule_of(m, versioned);
}

/* A copy of self on target (dlb__copy_managed) in a capsule: the copy becomes a Tensor of
 * its own, exported like any other, so every capsule holds an
 * export_block. */
static PyObject *copy_capsule(dlb_TensorObject *self, int versioned,
                              DLDevice target) {
  DLManagedTensorVersioned *m = NULL;
  dlb_module_state *st = dlb__state_from_type(Py_TYPE(self));
  if (st == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "dlbridge module state is gone");
    return NULL;
  }
  /* Host <-> CUDA and CUDA <-> CUDA copies run on dlbridge's current
   * stream (cuda.c); a copy to the host is complete when it returns. */
  if (dlb__copy_managed(&self->t, self->flags, target, "__dlpack__()", &m) < 0)
    return NULL;
  PyObject *copy = dlb__tensor_from_managed(st, m); /* steals m */
  if (copy == NULL) return NULL;
  PyObject *cap = view_capsule(AS_TENSOR(copy), versioned, 1);
  Py_DECREF(copy);
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
      PyObject *dev = dlb__device_text(d);
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

/* The producer's half of DLPack's stream contract: the tensor's pending
 * work is on dlbridge's current stream (cuda.c); order it before the
 * stream the consumer named (already checked by check_stream), GPU-side.
 * -1 asks for no ordering; None means the legacy stream. */
static int order_for_consumer(PyObject *stream, DLDevice device) {
  int64_t v;
  bool order = false;
  void *consumer = NULL;
  dlb_error err;
  if (stream != Py_None &&
      dlb__read_int64(stream, "__dlpack__(): stream", &v) < 0)
    return -1;
  if (dlb_cuda_stream_from_dlpack(stream == Py_None ? NULL : &v, &consumer,
                                  &order, &err) != DLB_OK) {
    dlb__raise(&err);
    return -1;
  }
  if (!order) return 0;
  return dlb__stream_order(device, dlb__stream_current(), consumer);
}

PyObject *dlb__tensor_dlpack(PyObject *op, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames) {
  dlb_TensorObject *self = AS_TENSOR(op);
  PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None,
           *copy = Py_None;

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
    if (cross_device && want_copy == 0) {
      PyErr_Format(PyExc_BufferError,
                   "dl_device=%R needs a copy but copy=False", dl_device);
      return NULL;
    }
  }
  if (check_stream(stream, target) < 0) return NULL;

  int do_copy = want_copy == 1 || cross_device;
  if (!versioned && !do_copy &&
      (self->flags & DLPACK_FLAG_BITMASK_READ_ONLY)) {
    PyErr_SetString(PyExc_BufferError,
                    "cannot export a read-only tensor as a legacy "
                    "(unversioned) DLPack capsule, which cannot say "
                    "read-only; pass max_version=(1, 0) or higher, or "
                    "copy=True");
    return NULL;
  }

  PyObject *cap = do_copy ? copy_capsule(self, versioned, target)
                         : view_capsule(self, versioned, 0);
  if (cap != NULL && dlb__is_cuda_device(target) &&
      order_for_consumer(stream, target) < 0)
    Py_CLEAR(cap); /* the capsule's destructor frees the unconsumed export */
  return cap;
}

PyObject *dlb__tensor_dlpack_device(PyObject *op, PyObject *unused) {
  (void)unused;
  DLDevice d = AS_TENSOR(op)->t.device;
  return Py_BuildValue("(ii)", (int)d.device_type, (int)d.device_id);
}

/* The state of the module whose Tensor type the static table produces and
 * consumes (the first module created in the process; tables are process
 * wide, module states are not).  NULL once that module is cleared.  Read
 * atomically: the table's entries run on any thread. */
static dlb_module_state *g_state = NULL;

/* ---- the producer: dlb.Tensor's table ----------------------------------------- */

/* o as a dlb.Tensor, or NULL with TypeError. */
static dlb_TensorObject *as_our_tensor(PyObject *o, const char *entry) {
  if (o == NULL) {
    PyErr_Format(PyExc_ValueError, "%s: py_object is NULL", entry);
    return NULL;
  }
  dlb_module_state *g = DLB_FT_LOAD_PTR(&g_state);
  if (g != NULL && PyObject_TypeCheck(o, g->TensorType))
    return (dlb_TensorObject *)o;
  /* Another module instance (a sub-interpreter) has its own Tensor type. */
  dlb_module_state *st = dlb__state_from_type(Py_TYPE(o));
  if (st != NULL && dlb__is_tensor(st, o)) return (dlb_TensorObject *)o;
  PyErr_Format(PyExc_TypeError,
               "%s: expected a dlbridge.Tensor, got '%.200s' (this table "
               "belongs to dlbridge.Tensor)",
               entry, Py_TYPE(o)->tp_name);
  return NULL;
}

static int tx_allocator(DLTensor *prototype, DLManagedTensorVersioned **out,
                        void *error_ctx,
                        void (*SetError)(void *error_ctx, const char *kind,
                                         const char *message)) {
  char msg[DLB_ERROR_MESSAGE_SIZE + 96];
  dlb_error err;
  if (prototype == NULL || out == NULL) {
    SetError(error_ctx, "ValueError",
             "dlbridge managed_tensor_allocator: prototype and out must not "
             "be NULL");
    return -1;
  }
  DLDeviceType type = prototype->device.device_type;
  int rc;
  if (type == kDLCPU) {
    rc = dlb_managed_empty(prototype->ndim, prototype->shape, prototype->dtype,
                           prototype->device, false, out, &err);
  } else if (type == kDLCUDA || type == kDLCUDAHost) {
    /* On dlbridge's current stream: the stream current_work_stream names. */
    rc = dlb_cuda_managed_empty(prototype->ndim, prototype->shape,
                                prototype->dtype, prototype->device, false,
                                dlb__stream_current(), out, &err);
  } else {
    char dev[DLB_DESCRIBE_MAX];
    PyOS_snprintf(msg, sizeof msg,
                  "dlbridge.Tensor can be allocated on the CPU, CUDA devices "
                  "and pinned host memory, not on %s",
                  dlb_device_describe(prototype->device, dev, sizeof dev));
    SetError(error_ctx, "BufferError", msg);
    return -1;
  }
  if (rc != DLB_OK) {
    const char *kind = rc == DLB_ENOMEM   ? "MemoryError"
                       : rc == DLB_EINVAL || rc == DLB_EOVERFLOW ? "ValueError"
                       : rc == DLB_EDEVICE                       ? "RuntimeError"
                                                                 : "BufferError";
    PyOS_snprintf(msg, sizeof msg, "dlbridge managed_tensor_allocator: %s",
                  err.message);
    SetError(error_ctx, kind, msg);
    return -1;
  }
  return 0;
}

static int tx_from_py(void *py_object, DLManagedTensorVersioned **out) {
  dlb_error err;
  dlb_TensorObject *self =
      as_our_tensor((PyObject *)py_object, "managed_tensor_from_py_object_no_sync");
  if (self == NULL) return -1;
  if (out == NULL) {
    PyErr_SetString(PyExc_ValueError,
                    "managed_tensor_from_py_object_no_sync: out is NULL");
    return -1;
  }
  if (dlb__tensor_export_managed(self, out, &err) != DLB_OK) {
    dlb__raise(&err);
    return -1;
  }
  return 0;
}

/* Check an owned tensor from outside: its major, then its DLTensor.  On
 * failure m has been deleted and BufferError is set (decision 3.8 applied to
 * our own inputs: whatever we were given is ours to free). */
int dlb__check_owned(DLManagedTensorVersioned *m, const char *what) {
  dlb_error err;
  if (dlb_managed_check_version(m, &err) != DLB_OK) {
    dlb__delete_keep_error(m);
    PyErr_Format(PyExc_BufferError, "%s: %s", what, err.message);
    return -1;
  }
  if (dlb_tensor_validate(&m->dl_tensor, 0, &err) != DLB_OK) {
    dlb__delete_keep_error(m);
    PyErr_Format(PyExc_BufferError, "%s: the tensor cannot be used: %s", what,
                 err.message);
    return -1;
  }
  return 0;
}

static int tx_to_py(DLManagedTensorVersioned *tensor, void **out_py_object) {
  static const char what[] = "dlbridge managed_tensor_to_py_object_no_sync";
  if (tensor == NULL || out_py_object == NULL) {
    dlb_managed_delete(tensor);
    PyErr_Format(PyExc_ValueError, "%s: tensor and out must not be NULL", what);
    return -1;
  }
  dlb_module_state *g = DLB_FT_LOAD_PTR(&g_state);
  if (g == NULL) {
    dlb__delete_keep_error(tensor);
    PyErr_Format(PyExc_RuntimeError, "%s: dlbridge._core has been unloaded",
                 what);
    return -1;
  }
  if (dlb__check_owned(tensor, what) < 0) return -1;
  PyObject *obj = dlb__tensor_from_managed(g, tensor); /* steals */
  if (obj == NULL) return -1;
  *out_py_object = obj;
  return 0;
}

static int tx_dltensor(void *py_object, DLTensor *out) {
  dlb_TensorObject *self =
      as_our_tensor((PyObject *)py_object, "dltensor_from_py_object_no_sync");
  if (self == NULL) return -1;
  if (out == NULL) {
    PyErr_SetString(PyExc_ValueError, "dltensor_from_py_object_no_sync: out is NULL");
    return -1;
  }
  /* This entry has no way to say read-only (decision 3.8), and a consumer
   * that takes it writes through it: a read-only Tensor (over bytes, a
   * read-only array) is refused here; the owning entry carries the flag. */
  if (self->flags & DLPACK_FLAG_BITMASK_READ_ONLY) {
    PyErr_SetString(PyExc_BufferError,
                    "dltensor_from_py_object_no_sync: the dlbridge.Tensor is "
                    "read-only and this entry cannot say so; use "
                    "managed_tensor_from_py_object_no_sync, whose flags "
                    "carry READ_ONLY");
    return -1;
  }
  *out = self->t; /* shape/strides point into our managed block: no copy */
  return 0;
}

static int tx_stream(DLDeviceType device_type, int32_t device_id,
                     void **out_current_stream) {
  (void)device_id;
  if (out_current_stream == NULL) {
    PyErr_SetString(PyExc_ValueError, "current_work_stream: out is NULL");
    return -1;
  }
  /* dlbridge's current stream (dlb.stream) on CUDA; NULL (the legacy
   * stream, or no stream) otherwise. */
  void *s = dlb__stream_current();
  *out_current_stream =
      (device_type == kDLCUDA || device_type == kDLCUDAManaged) &&
              dlb__cuda_stream_value(s) != 1
          ? s
          : NULL;
  return 0;
}

const DLPackExchangeAPI dlb__tensor_exchange_api = {
    .header = {.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION},
               .prev_api = NULL},
    .managed_tensor_allocator = tx_allocator,
    .managed_tensor_from_py_object_no_sync = tx_from_py,
    .managed_tensor_to_py_object_no_sync = tx_to_py,
    .dltensor_from_py_object_no_sync = tx_dltensor,
    .current_work_stream = tx_stream,
};

/* ---- installing the consumer-facing attributes on dlb.Tensor -------------------- */

static PyMethodDef export_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))dlb__tensor_dlpack,
     METH_FASTCALL | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, "
     "copy=None)\n--\n\nExport as a DLPack capsule."},
    {"__dlpack_device__", dlb__tensor_dlpack_device, METH_NOARGS,
     "__dlpack_device__()\n--\n\n(device_type, device_id) of the data."},
    {NULL, NULL, 0, NULL},
};

int dlb__export_init(dlb_module_state *st) {
  PyTypeObject *type = st->TensorType;
  for (PyMethodDef *def = export_methods; def->ml_name != NULL; def++) {
    PyObject *descr = PyDescr_NewMethod(type, def);
    if (descr == NULL) return -1;
    int rc = PyDict_SetItemString(type->tp_dict, def->ml_name, descr);
    Py_DECREF(descr);
    if (rc < 0) return -1;
  }
  /* Publish the table on Tensor (immutable type: through tp_dict). */
  PyObject *cap = PyCapsule_New((void *)&dlb__tensor_exchange_api,
                                DLB_EXCHANGE_API_CAPSULE_NAME, NULL);
  if (cap == NULL) return -1;
  int rc = PyDict_SetItemString(type->tp_dict, "__dlpack_c_exchange_api__", cap);
  Py_DECREF(cap);
  if (rc < 0) return -1;
  PyType_Modified(type);
  (void)dlb__ft_set_once(&g_state, st);
  return 0;
}

void dlb__export_clear(dlb_module_state *st) {
  if (DLB_FT_LOAD_PTR(&g_state) == st) DLB_FT_STORE_PTR(&g_state, NULL);
}
