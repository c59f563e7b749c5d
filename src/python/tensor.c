/*
 * tensor.c -- the dlbridge.Tensor heap type: attributes, tolist, copy, repr,
 * the buffer protocol, __array_interface__ / __cuda_array_interface__, and
 * the factories empty(), zeros() and tensor().  Elements <-> Python numbers
 * are scalars.c's, struct formats and typestrs formats.c's; __dlpack__,
 * __dlpack_device__ and the exchange table are installed on the type by
 * export.c, which sits above this file.
 *
 * A Tensor owns exactly one DLManagedTensorVersioned (self->managed); its
 * deleter runs once, in tp_dealloc (or tp_clear).  Tensors hold no Python
 * objects in fields of their own, but a tensor imported from a Python
 * owner -- a buffer, an __array_interface__ owner, a NumPy array -- keeps
 * that owner alive through its managed tensor's release context, made here
 * (the "owners" section) so that the garbage collector can see it:
 * tp_traverse visits the owner.  Tensors kept alive through a keeper
 * (buffer, array interface) are GC-tracked, so a Tensor -> owner -> Tensor
 * cycle (o.t = dlb.from_dlpack(o)) is collected; every other Tensor (our
 * own allocations, foreign capsules, NumPy imports: managed_has_owner says
 * why) is a GC type left untracked, which costs the collector nothing.
 * Dealloc never nests more than two deep, so freeing a long chain of
 * tensors that keep each other alive (through owners or exports) cannot
 * overflow the C stack ("destruction" below).
 *
 * Decisions recorded here (DESIGN.md asks that each be written down):
 *
 *  - Buffer protocol.  Formats follow the struct module: bool "?", ints
 *    "b B h H i I q Q", float16 "e", float32 "f", float64 "d", complex64
 *    "Zf", complex128 "Zd".  Dtypes with no struct code (bfloat16, fp8,
 *    complex32, vector types) are refused with BufferError when the
 *    consumer asks for a format (PyBUF_FORMAT, which memoryview() always
 *    does), because a wrong format silently misreads data; a consumer that
 *    asks for no format gets format NULL ("unsigned bytes") with the true
 *    itemsize, as NumPy does -- it has said it only wants raw bytes.
 *    Packed sub-byte dtypes are always refused: their elements have no byte
 *    address.  Strides are in bytes, may be negative; buf is element 0.
 *  - __array_interface__ (v3) typestr: "|b1" bool, "|i1"/"|u1", native
 *    "<i2"... "<f2" "<f4" "<f8" "<c8" "<c16" (">" on big-endian hosts).
 *    Dtypes NumPy cannot name (bfloat16, fp8, complex32, vector types) are
 *    "|V<itemsize>": NumPy then sees opaque elements of the right size and
 *    layout, which a user can .view() as ml_dtypes.bfloat16 and the like --
 *    never a silently wrong numeric type.  strides is None when the tensor
 *    is C-contiguous.  Only host-accessible tensors have the attribute
 *    (AttributeError otherwise, so hasattr() is False on CUDA tensors).
 *  - __cuda_array_interface__ (v3): CUDA and CUDA-managed tensors only.
 *    "stream" is dlbridge's current stream (cuda.c: dlb.stream, else 1, the
 *    legacy default stream): the stream whose queued work the consumer must
 *    order its own after (numba synchronises on it, CuPy waits on it).
 *  - tolist() of a CUDA tensor reads a host copy (cuda.c).  tolist() converts bool, ints, float16/32/64, bfloat16 (exactly, via
 *    float32) and complex32/64/128; other dtypes (fp8/fp6/fp4, int4,
 *    vectors) raise BufferError, since no Python scalar holds them exactly.
 *  - tensor(data): inference as NumPy: all bool -> bool, ints -> int64,
 *    floats -> float64, complex -> complex128; an empty list is float64.
 *    Conversions are range checked: an int out of range for the dtype is
 *    OverflowError; a float stored into an int dtype is truncated toward
 *    zero (as NumPy and PyTorch do) when in range, NaN/inf are ValueError.
 *  - Allocation (empty/zeros/tensor/copy) on the CPU, on 'cuda:N'
 *    (stream-ordered on the current stream) and in pinned host memory
 *    ('cuda_host'); any other device is a BufferError naming it.  copy()
 *    stays on the tensor's device unless device= says otherwise.
 */
#include "dlbridge_py.h"

#include <float.h>
#include <math.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define DLB_T_PYSSIZET T_PYSSIZET
#define DLB_READONLY READONLY
#else
#define DLB_T_PYSSIZET Py_T_PYSSIZET
#define DLB_READONLY Py_READONLY
#endif

#define AS_TENSOR(o) ((dlb_TensorObject *)(o))

/* ---- layout helpers ------------------------------------------------------------ */

static dlb_module_state *tensor_state(PyObject *self) {
  return dlb__state_from_type(Py_TYPE(self));
}

static int64_t tensor_numel(const DLTensor *t) {
  /* Validation guarantees the count fits, but not that a running product
   * does: [2**40, 2**40, 0] holds no elements and overflows before it
   * reaches the zero.  The core's count looks for a zero extent first. */
  int64_t n = 0;
  (void)dlb_shape_numel(t->ndim, t->shape, &n, NULL);
  return n;
}

/* Byte strides of t into out (ndim values).  Extent-1 (and empty-tensor)
 * dims get their row-major value: their stride is meaningless in DLPack and
 * may be anything, so it must not leak into a consumer's contiguity checks
 * or overflow when scaled.  -1 with BufferError when a stride in bytes does
 * not fit in int64. */
static int byte_strides(const DLTensor *t, int64_t itemsize, int64_t *out) {
  int64_t scratch[DLB_MAX_NDIM];
  const int64_t *st = t->ndim > 0 ? dlb_tensor_strides(t, scratch) : NULL;
  int empty = tensor_numel(t) == 0;
  int64_t row = itemsize;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    int64_t e = t->shape[i];
    if (e <= 1 || empty || st == NULL) {
      out[i] = row;
    } else {
      int64_t s = st[i];
      if (s != 0 && (s > INT64_MAX / itemsize || s < INT64_MIN / itemsize)) {
        PyErr_Format(PyExc_BufferError,
                     "stride %lld of dim %d does not fit in bytes",
                     (long long)s, (int)i);
        return -1;
      }
      out[i] = s * itemsize;
    }
    /* row-major running product; saturate (only ever used for extent <= 1
     * dims, where any value is correct) */
    if (e > 1 && row <= INT64_MAX / e) row *= e;
  }
  return 0;
}

static int host_accessible(const dlb_TensorObject *self) {
  return dlb_device_is_host_accessible(self->t.device);
}

static int require_host(const dlb_TensorObject *self, const char *what) {
  if (host_accessible(self)) return 0;
  PyObject *d = dlb__device_text(self->t.device);
  if (d == NULL) return -1;
  PyErr_Format(PyExc_BufferError,
               "%s needs memory the CPU can read, but the tensor is on %U; "
               "copy it to the CPU first",
               what, d);
  Py_DECREF(d);
  return -1;
}

/* ---- Python owners of a Tensor's memory ------------------------------------------ */

/* dlb_release_fn: may run on any thread, with or without the GIL, even
 * during interpreter shutdown (B15).  Once the interpreter is gone it leaks
 * rather than touch Python. */
void dlb__keeper_release(void *ctx) {
  dlb_py_keeper *k = (dlb_py_keeper *)ctx;
  if (k == NULL) return;
  if (dlb__python_gone()) return;
  PyGILState_STATE g = PyGILState_Ensure();
  dlb__keeper_free(k);
  PyGILState_Release(g);
}

dlb_py_keeper *dlb__keeper_new(void) {
  dlb_py_keeper *k = PyMem_RawCalloc(1, sizeof *k);
  if (k == NULL) PyErr_NoMemory();
  return k;
}

void dlb__keeper_free(dlb_py_keeper *k) {
  if (k == NULL) return;
  dlb__saved_error e;
  dlb__error_save(&e);
  if (k->has_view) PyBuffer_Release(&k->view);
  Py_XDECREF(k->owner);
  PyMem_RawFree(k);
  dlb__error_restore(&e);
}

void dlb__owner_release(void *ctx) {
  if (ctx != NULL) dlb__release_ref((PyObject *)ctx, 0);
}

/* Visit the Python objects m keeps alive, when m is one of the wraps above
 * (the only release contexts whose contents we know). */
static int managed_traverse(const DLManagedTensorVersioned *m, visitproc visit,
                            void *arg) {
  dlb_release_fn release;
  void *ctx;
  if (!dlb_managed_wrap_context(m, &release, &ctx) || ctx == NULL) return 0;
  if (release == dlb__keeper_release) {
    dlb_py_keeper *k = (dlb_py_keeper *)ctx;
    Py_VISIT(k->owner);
    if (k->has_view) Py_VISIT(k->view.obj); /* the Py_buffer's reference */
  } else if (release == dlb__owner_release) {
    Py_VISIT((PyObject *)ctx);
  }
  return 0;
}

/* Whether the collector should track a Tensor owning m: m keeps a Python
 * owner alive through a keeper (buffer, array interface), which may lead
 * back to the Tensor.  A NumPy import (dlb__owner_release) is traversed
 * but not tracked: ndarray is not a GC type, so the collector can never
 * account for the references an array holds, and no cycle through one can
 * be collected whatever the Tensor does -- tracking it would only add the
 * collector's cost to the fastest import. */
static int managed_has_owner(const DLManagedTensorVersioned *m) {
  dlb_release_fn release;
  return dlb_managed_wrap_context(m, &release, NULL) &&
         release == dlb__keeper_release;
}

/* ---- exported tensors, recognised when their memory comes back -------------------
 *
 * A Tensor handed to another framework often comes back: convert(convert(x,
 * "torch"), "numpy") in a loop imports a torch tensor that views a Tensor's
 * export, whose numpy result is imported again, and so on.  Wrapping each
 * import anew builds a chain in which every object keeps the previous one
 * alive (~1.3 KB per round trip, never freed), through frameworks whose
 * managed tensors dlbridge cannot look inside.  So every exported Tensor is
 * noted here, by the address of its element 0, and an import whose view is
 * exactly a noted Tensor's -- same device, element-0 address, dtype, shape,
 * strides and read-only flag -- is answered with that Tensor.  This is
 * sound because a noted Tensor is alive (its entry is cleared in dealloc
 * and tp_clear) and keeps its memory alive: another live tensor at the same
 * address on the same device views that same memory, which the Tensor
 * keeps alive at least as long.  The table is a small direct-mapped cache
 * of borrowed pointers, touched only with the GIL held (export, import,
 * dealloc); a collision just forgets an entry.  Process-wide, like the
 * memory it describes (sub-interpreters are refused); off in free-threaded
 * builds, where it would need a lock. */
#define EXPORTED_SLOTS 256
#ifndef Py_GIL_DISABLED
static dlb_TensorObject *exported[EXPORTED_SLOTS];

static size_t exported_slot(const DLTensor *t) {
  uintptr_t a = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  return (size_t)((a >> 4) ^ (a >> 12) ^ (a >> 20)) & (EXPORTED_SLOTS - 1);
}
#endif

static void exported_forget(dlb_TensorObject *self) {
#ifndef Py_GIL_DISABLED
  size_t i = exported_slot(&self->t);
  if (exported[i] == self) exported[i] = NULL;
#else
  (void)self;
#endif
}

void dlb__tensor_note_exported(dlb_TensorObject *self) {
#ifndef Py_GIL_DISABLED
  /* Empty tensors are noted too (the lookup refuses them): counting the
   * elements here would cost every export a call. */
  exported[exported_slot(&self->t)] = self;
#else
  (void)self;
#endif
}

#ifndef Py_GIL_DISABLED
/* Same layout: every dim of extent > 1 has the same stride (the others'
 * strides mean nothing and frameworks normalise them differently). */
static int same_view(const DLTensor *a, const DLTensor *b) {
  if (a->ndim != b->ndim || a->dtype.code != b->dtype.code ||
      a->dtype.bits != b->dtype.bits || a->dtype.lanes != b->dtype.lanes ||
      !dlb__same_device(a->device, b->device) ||
      (char *)a->data + a->byte_offset != (char *)b->data + b->byte_offset)
    return 0;
  int64_t sa[DLB_MAX_NDIM], sb[DLB_MAX_NDIM];
  const int64_t *ta = a->ndim > 0 ? dlb_tensor_strides(a, sa) : NULL;
  const int64_t *tb = b->ndim > 0 ? dlb_tensor_strides(b, sb) : NULL;
  for (int32_t i = 0; i < a->ndim; i++) {
    if (a->shape[i] != b->shape[i]) return 0;
    if (a->shape[i] > 1 && ta[i] != tb[i]) return 0;
  }
  return 1;
}
#endif

PyObject *dlb__tensor_find_exported(const DLTensor *t, uint64_t flags) {
#ifndef Py_GIL_DISABLED
  const uint64_t kept = DLPACK_FLAG_BITMASK_READ_ONLY |
                        DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
  dlb_TensorObject *s = exported[exported_slot(t)];
  if (s == NULL || (s->flags & kept) != (flags & kept) ||
      !dlb_device_is_host_accessible(t->device) || tensor_numel(t) == 0 ||
      !same_view(&s->t, t))
    return NULL;
  return (PyObject *)s;
#else
  (void)t;
  (void)flags;
  return NULL;
#endif
}

/* ---- construction / destruction ---------------------------------------------------- */
PyObject *dlb__tensor_from_managed(dlb_module_state *st,
                                   DLManagedTensorVersioned *m) {
  /* PyObject_GC_New, not tp_alloc (PyType_GenericAlloc): the type has no
   * items and cannot be subclassed (no Py_TPFLAGS_BASETYPE), so the
   * zero-fill of the generic path buys nothing; every field is set below.
   * tp_free of a GC heap type is PyObject_GC_Del, the matching release;
   * PyObject_GC_New takes the reference to the heap type that
   * tensor_dealloc drops.  Only a tensor whose memory a Python owner keeps
   * alive is tracked (see the header comment). */
  dlb_TensorObject *self = PyObject_GC_New(dlb_TensorObject, st->TensorType);
  if (self == NULL) {
    dlb__delete_keep_error(m); /* stolen even on failure */
    return NULL;
  }
  /* Zero the body first so a field added later starts as tp_alloc would
   * have left it (a constant-size fill the compiler inlines). */
  memset((char *)self + sizeof(PyObject), 0,
         sizeof(dlb_TensorObject) - sizeof(PyObject));
  self->t = m->dl_tensor;
  self->managed = m;
  self->flags = m->flags;
  self->buffer_exports = 0;
  self->weakreflist = NULL;
  if (managed_has_owner(m)) PyObject_GC_Track((PyObject *)self);
  return (PyObject *)self;
}

/* ---- destruction ---------------------------------------------------------------
 *
 * Deleting a Tensor's managed tensor may drop the last reference to another
 * Tensor (the owner of an imported buffer, an export's source), whose
 * deletion may do the same, down a chain of any length: 100,000 rounds of
 * t = from_dlpack(memoryview(t)) make one, and each link costs the C stack
 * a Tensor's, a memoryview's and a managed buffer's dealloc.  CPython's
 * trashcan does not bound that on every version: 3.13's defers only after
 * 10,000 nested trashcan deallocs, and with the other frames of each link
 * that is several MiB of stack (a 1 MiB thread stack overflows).  So the
 * bound is ours: a Tensor that dies while its thread is already releasing
 * a Tensor is not released there but put on that thread's list of dying
 * tensors, and the outermost tensor_dealloc releases them one after
 * another in a loop.  tensor_dealloc thus nests at most two deep, on every
 * Python version, whatever the chain.
 *
 * A dying Tensor is already dead to everyone else when it is listed: its
 * refcount is 0, the collector no longer tracks it, its weak references are
 * cleared and the export cache forgot it; only its managed tensor (and the
 * reference to its type) is left to release.  The list is per thread: a
 * deleter may run Python code that lets another thread run (or, without
 * the GIL, other threads release at the same time), and a thread releases
 * only what died on it, when its own outermost dealloc returns -- so a
 * release never waits on another thread's deleter. */
static _Thread_local struct {
  bool releasing;               /* a tensor_dealloc on this thread is in a release */
  dlb_TensorObject *dying;      /* died meanwhile, released before it returns */
} this_thread;

/* Delete self's managed tensor (which may run Python code and drop other
 * Tensors) and free self. */
static void tensor_release(dlb_TensorObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  if (self->managed != NULL) {
    DLManagedTensorVersioned *m = self->managed;
    self->managed = NULL;
    dlb__delete_keep_error(m);
  }
  tp->tp_free(self);
  Py_DECREF(tp);
}

static void tensor_dealloc(PyObject *op) {
  dlb_TensorObject *self = AS_TENSOR(op);
  PyObject_GC_UnTrack(op);
  exported_forget(self);
  if (self->weakreflist != NULL) PyObject_ClearWeakRefs(op);
  if (this_thread.releasing) {
    self->next_dying = this_thread.dying;
    this_thread.dying = self;
    return;
  }
  this_thread.releasing = true;
  tensor_release(self);
  while (this_thread.dying != NULL) {
    dlb_TensorObject *next = this_thread.dying;
    this_thread.dying = next->next_dying;
    tensor_release(next);
  }
  this_thread.releasing = false;
}

static int tensor_traverse(PyObject *op, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(op)); /* instances of heap types own their type */
  return managed_traverse(AS_TENSOR(op)->managed, visit, arg);
}

/* The collector found self in a dead cycle: drop the owner (deleting the
 * managed tensor) and leave an empty view, so the Tensor stays safe to
 * touch until its own refcount reaches zero.  Not while a Py_buffer of it
 * is out: its holder (in the same dead cycle) still points at the memory,
 * and clearing the holder first breaks the cycle just as well. */
static int tensor_clear(PyObject *op) {
  static int64_t empty_dims[2] = {0, 1}; /* shape {0}, strides {1} */
  dlb_TensorObject *self = AS_TENSOR(op);
  if (self->managed == NULL || DLB_FT_LOAD_SSIZE(&self->buffer_exports) > 0)
    return 0;
  DLManagedTensorVersioned *m = self->managed;
  exported_forget(self);
  self->managed = NULL;
  self->t.data = NULL;
  self->t.ndim = 1;
  self->t.shape = &empty_dims[0];
  self->t.strides = &empty_dims[1];
  self->t.byte_offset = 0;
  self->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  dlb__delete_keep_error(m);
  return 0;
}

static PyObject *tensor_new(PyTypeObject *type, PyObject *args,
                            PyObject *kwds) {
  (void)type;
  (void)args;
  (void)kwds;
  PyErr_SetString(PyExc_TypeError,
                  "dlbridge.Tensor cannot be created directly; use "
                  "dlbridge.from_dlpack(obj), dlbridge.tensor(data), "
                  "dlbridge.empty(shape) or dlbridge.zeros(shape)");
  return NULL;
}

/* ---- attributes ----------------------------------------------------------------- */

PyObject *dlb__int64_tuple(int32_t n, const int64_t *v) {
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

static PyObject *tensor_get_shape(PyObject *op, void *c) {
  (void)c;
  dlb_TensorObject *self = AS_TENSOR(op);
  return dlb__int64_tuple(self->t.ndim, self->t.shape);
}

static PyObject *tensor_get_strides(PyObject *op, void *c) {
  (void)c;
  dlb_TensorObject *self = AS_TENSOR(op);
  if (self->t.ndim == 0) return PyTuple_New(0);
  int64_t scratch[DLB_MAX_NDIM];
  const int64_t *st = dlb_tensor_strides(&self->t, scratch);
  if (st == NULL) {
    PyErr_SetString(PyExc_BufferError, "tensor has no valid strides");
    return NULL;
  }
  return dlb__int64_tuple(self->t.ndim, st);
}

static PyObject *tensor_get_dtype(PyObject *op, void *c) {
  (void)c;
  dlb_module_state *st = tensor_state(op);
  if (st == NULL) return NULL;
  return dlb__dtype_new(st, AS_TENSOR(op)->t.dtype);
}

static PyObject *tensor_get_device(PyObject *op, void *c) {
  (void)c;
  dlb_module_state *st = tensor_state(op);
  if (st == NULL) return NULL;
  return dlb__device_new(st, AS_TENSOR(op)->t.device);
}

static PyObject *tensor_get_ndim(PyObject *op, void *c) {
  (void)c;
  return PyLong_FromLong(AS_TENSOR(op)->t.ndim);
}

static PyObject *tensor_get_size(PyObject *op, void *c) {
  (void)c;
  return PyLong_FromLongLong((long long)tensor_numel(&AS_TENSOR(op)->t));
}

static PyObject *tensor_get_nbytes(PyObject *op, void *c) {
  (void)c;
  dlb_TensorObject *self = AS_TENSOR(op);
  int64_t n;
  dlb_error err;
  bool padded = (self->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0;
  if (dlb_tensor_nbytes(&self->t, padded, &n, &err) != DLB_OK)
    return dlb__raise(&err);
  return PyLong_FromLongLong((long long)n);
}

static PyObject *tensor_get_itemsize(PyObject *op, void *c) {
  (void)c;
  return PyLong_FromLongLong(dlb_dtype_itemsize(AS_TENSOR(op)->t.dtype));
}

static PyObject *tensor_get_data_ptr(PyObject *op, void *c) {
  (void)c;
  return PyLong_FromVoidPtr(dlb_tensor_data(&AS_TENSOR(op)->t));
}

static PyObject *tensor_get_readonly(PyObject *op, void *c) {
  (void)c;
  return PyBool_FromLong(
      (AS_TENSOR(op)->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
}

static PyObject *tensor_get_is_contiguous(PyObject *op, void *c) {
  (void)c;
  return PyBool_FromLong(dlb_tensor_is_contiguous(&AS_TENSOR(op)->t));
}

/* The dict shared by __array_interface__ and __cuda_array_interface__. */
static PyObject *interface_dict(dlb_TensorObject *self) {
  PyObject *d = NULL, *res = NULL, *v = NULL;
  const DLTensor *t = &self->t;
  int64_t itemsize = dlb_dtype_itemsize(t->dtype);
  int readonly = (self->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;

  if (dlb_dtype_is_subbyte(t->dtype)) {
    PyErr_SetString(PyExc_BufferError,
                    "a packed sub-byte dtype cannot be described by the array "
                    "interface: its elements have no byte address");
    goto cleanup;
  }
  d = PyDict_New();
  if (d == NULL) goto cleanup;

  v = dlb__int64_tuple(t->ndim, t->shape);
  if (v == NULL || PyDict_SetItemString(d, "shape", v) < 0) goto cleanup;
  Py_CLEAR(v);

  const char *ts = dlb__array_typestr(dlb__scalar_kind(t->dtype));
  v = ts != NULL ? PyUnicode_FromString(ts)
                 : PyUnicode_FromFormat("|V%lld", (long long)itemsize);
  if (v == NULL || PyDict_SetItemString(d, "typestr", v) < 0) goto cleanup;
  Py_CLEAR(v);

  v = Py_BuildValue("(NO)", PyLong_FromVoidPtr(dlb_tensor_data(t)),
                    readonly ? Py_True : Py_False);
  if (v == NULL || PyDict_SetItemString(d, "data", v) < 0) goto cleanup;
  Py_CLEAR(v);

  if (dlb_tensor_is_contiguous(t)) {
    v = Py_NewRef(Py_None);
  } else {
    int64_t bs[DLB_MAX_NDIM];
    if (byte_strides(t, itemsize, bs) < 0) goto cleanup;
    v = dlb__int64_tuple(t->ndim, bs);
  }
  if (v == NULL || PyDict_SetItemString(d, "strides", v) < 0) goto cleanup;
  Py_CLEAR(v);

  v = PyLong_FromLong(3);
  if (v == NULL || PyDict_SetItemString(d, "version", v) < 0) goto cleanup;
  Py_CLEAR(v);

  res = d;
  d = NULL;

cleanup:
  Py_XDECREF(v);
  Py_XDECREF(d);
  return res;
}

static PyObject *tensor_get_array_interface(PyObject *op, void *c) {
  (void)c;
  dlb_TensorObject *self = AS_TENSOR(op);
  if (!host_accessible(self)) {
    PyObject *d = dlb__device_text(self->t.device);
    if (d == NULL) return NULL;
    /* CUDA memory has its own interface, which a consumer probing with
     * hasattr() moves on to.  Any other device (ROCm, Metal, TPU, a
     * foreign type) has none the CPU can use: BufferError, as for every
     * host access to it, so np.asarray() says so instead of wrapping the
     * tensor in an object array. */
    if (self->t.device.device_type == kDLCUDA)
      PyErr_Format(PyExc_AttributeError,
                   "__array_interface__ is only defined for tensors in host "
                   "memory; this one is on %U (use __cuda_array_interface__ "
                   "or __dlpack__)",
                   d);
    else
      PyErr_Format(PyExc_BufferError,
                   "__array_interface__ needs memory the CPU can read, but "
                   "the tensor is on %U; pass it on with __dlpack__",
                   d);
    Py_DECREF(d);
    return NULL;
  }
  return interface_dict(self);
}

static PyObject *tensor_get_cuda_array_interface(PyObject *op, void *c) {
  (void)c;
  dlb_TensorObject *self = AS_TENSOR(op);
  DLDeviceType dt = self->t.device.device_type;
  if (dt != kDLCUDA && dt != kDLCUDAManaged) {
    PyErr_SetString(PyExc_AttributeError,
                    "__cuda_array_interface__ is only defined for tensors in "
                    "CUDA memory");
    return NULL;
  }
  PyObject *d = interface_dict(self);
  if (d == NULL) return NULL;
  /* v3: the stream the data's pending work is on -- dlbridge's current
   * stream (the legacy one, 1, under dlb.stream(-1): dlbridge's own work
   * runs there) -- which a consumer orders its own work after. */
  void *cur = dlb__stream_current();
  PyObject *s = dlb__cuda_stream_value(cur) == 1
                    ? PyLong_FromLong(1)
                    : PyLong_FromUnsignedLongLong(
                          (unsigned long long)(uintptr_t)cur);
  if (s == NULL || PyDict_SetItemString(d, "stream", s) < 0) {
    Py_XDECREF(s);
    Py_DECREF(d);
    return NULL;
  }
  Py_DECREF(s);
  return d;
}

static PyGetSetDef tensor_getset[] = {
    {"shape", tensor_get_shape, NULL, "Extents (tuple of int).", NULL},
    {"strides", tensor_get_strides, NULL,
     "Strides in elements, as DLPack counts them (tuple of int).", NULL},
    {"dtype", tensor_get_dtype, NULL, "Element type (dlbridge.DType).", NULL},
    {"device", tensor_get_device, NULL, "Device (dlbridge.Device).", NULL},
    {"ndim", tensor_get_ndim, NULL, "Number of dimensions.", NULL},
    {"size", tensor_get_size, NULL, "Number of elements.", NULL},
    {"nbytes", tensor_get_nbytes, NULL,
     "Bytes the elements take stored compactly (packed for sub-byte types).",
     NULL},
    {"itemsize", tensor_get_itemsize, NULL,
     "Bytes per element (rounded up for sub-byte types).", NULL},
    {"data_ptr", tensor_get_data_ptr, NULL,
     "Address of element 0 (data + byte_offset), as an int.", NULL},
    {"readonly", tensor_get_readonly, NULL,
     "True when the memory must not be written.", NULL},
    {"is_contiguous", tensor_get_is_contiguous, NULL,
     "True when row-major compact (extent-1 strides ignored).", NULL},
    {"__array_interface__", tensor_get_array_interface, NULL,
     "NumPy array interface (v3); host memory only.", NULL},
    {"__cuda_array_interface__", tensor_get_cuda_array_interface, NULL,
     "CUDA array interface (v3); CUDA memory only.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef tensor_members[] = {
    {"__weaklistoffset__", DLB_T_PYSSIZET,
     offsetof(dlb_TensorObject, weakreflist), DLB_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

/* ---- tolist ---------------------------------------------------------------------- */

static PyObject *tolist_rec(scalar_kind k, const char *p, int32_t dim,
                            const DLTensor *t, const int64_t *bs) {
  if (dim == t->ndim) return dlb__read_scalar(k, p);
  int64_t n = t->shape[dim];
  PyObject *list = PyList_New((Py_ssize_t)n);
  if (list == NULL) return NULL;
  for (int64_t i = 0; i < n; i++) {
    /* p is NULL for a tensor with no elements: no arithmetic on it. */
    PyObject *x = tolist_rec(k, p != NULL ? p + i * bs[dim] : NULL, dim + 1,
                             t, bs);
    if (x == NULL) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, (Py_ssize_t)i, x);
  }
  return list;
}

static PyObject *tensor_tolist(PyObject *op, PyObject *unused) {
  (void)unused;
  dlb_TensorObject *self = AS_TENSOR(op);
  const DLTensor *t = &self->t;
  if (self->t.device.device_type == kDLCUDA) {
    /* Device memory: read through a host copy (one host wait). */
    dlb_module_state *st = tensor_state(op);
    DLManagedTensorVersioned *m = NULL;
    DLDevice cpu = {kDLCPU, 0};
    if (st == NULL) return NULL;
    if (dlb__copy_managed(t, self->flags, cpu, "tolist()", &m) < 0)
      return NULL;
    PyObject *host = dlb__tensor_from_managed(st, m);
    if (host == NULL) return NULL;
    PyObject *res = tensor_tolist(host, NULL);
    Py_DECREF(host);
    return res;
  }
  if (require_host(self, "tolist()") < 0) return NULL;
  scalar_kind k = dlb__scalar_kind(t->dtype);
  if (k == K_NONE) {
    char name[48];
    if (dlb_dtype_name(t->dtype, name, sizeof name, NULL) != DLB_OK)
      strcpy(name, "(unknown)");
    PyErr_Format(PyExc_BufferError,
                 "tolist() cannot convert dtype %s to Python scalars: no "
                 "Python number holds it exactly; export it to a framework "
                 "that knows the type",
                 name);
    return NULL;
  }
  int64_t bs[DLB_MAX_NDIM];
  if (byte_strides(t, dlb_dtype_itemsize(t->dtype), bs) < 0) return NULL;
  return tolist_rec(k, (const char *)dlb_tensor_data(t), 0, t, bs);
}

/* ---- keyword parsing ---------------------------------------------------------------- */

/* Spread fastcall arguments over names[] (positional-or-keyword, in order).
 * out[i] is a borrowed reference or NULL when not given.  Not a hot path
 * (factories), but still no tuple/dict is built. */
static int parse_args(const char *fname, PyObject *const *args,
                      Py_ssize_t nargs, PyObject *kwnames,
                      const char *const *names, int nnames, int npos_max,
                      int nrequired, PyObject **out) {
  for (int i = 0; i < nnames; i++) out[i] = NULL;
  if (nargs > npos_max) {
    PyErr_Format(PyExc_TypeError,
                 "%s() takes at most %d positional argument%s (%zd given)",
                 fname, npos_max, npos_max == 1 ? "" : "s", nargs);
    return -1;
  }
  for (Py_ssize_t i = 0; i < nargs; i++) out[i] = args[i];
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t j = 0; j < nkw; j++) {
    PyObject *key = PyTuple_GET_ITEM(kwnames, j);
    int found = -1;
    for (int i = 0; i < nnames; i++) {
      if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
        found = i;
        break;
      }
    }
    if (found < 0) {
      PyErr_Format(PyExc_TypeError,
                   "%s() got an unexpected keyword argument '%U'", fname, key);
      return -1;
    }
    if (out[found] != NULL) {
      PyErr_Format(PyExc_TypeError,
                   "%s() got multiple values for argument '%s'", fname,
                   names[found]);
      return -1;
    }
    out[found] = args[nargs + j];
  }
  for (int i = 0; i < nrequired; i++) {
    if (out[i] == NULL) {
      PyErr_Format(PyExc_TypeError,
                   "%s() missing required argument '%s' (pos %d)", fname,
                   names[i], i + 1);
      return -1;
    }
  }
  return 0;
}

/* ---- copy ----------------------------------------------------------------------------- */

static PyObject *tensor_copy(PyObject *op, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"device"};
  dlb_TensorObject *self = AS_TENSOR(op);
  PyObject *a[1];
  DLManagedTensorVersioned *m = NULL;
  dlb_module_state *st = tensor_state(op);
  if (st == NULL) return NULL;
  if (parse_args("copy", args, nargs, kwnames, names, 1, 0, 0, a) < 0)
    return NULL;
  /* By default the copy stays on the tensor's device; memory dlbridge
   * cannot allocate itself (managed, other host kinds) is copied to the
   * CPU, as before the device layer existed. */
  DLDevice target = self->t.device;
  if (target.device_type != kDLCUDA && target.device_type != kDLCUDAHost) {
    target.device_type = kDLCPU;
    target.device_id = 0;
  }
  if (a[0] != NULL && a[0] != Py_None &&
      dlb__device_converter(st, a[0], &target) < 0)
    return NULL;
  if (dlb__copy_managed(&self->t, self->flags, target, "copy()", &m) < 0)
    return NULL;
  return dlb__tensor_from_managed(st, m);
}

/* ---- repr / len -------------------------------------------------------------------------- */

#define REPR_MAX_ELEMENTS 100

static PyObject *tensor_repr(PyObject *op) {
  dlb_TensorObject *self = AS_TENSOR(op);
  const DLTensor *t = &self->t;
  PyObject *values = NULL, *shape = NULL, *dev = NULL, *res = NULL;
  char name[DLB_DESCRIBE_MAX];
  dlb_dtype_describe(t->dtype, name, sizeof name);
  if (host_accessible(self) && dlb__scalar_kind(t->dtype) != K_NONE &&
      tensor_numel(t) <= REPR_MAX_ELEMENTS) {
    PyObject *list = tensor_tolist(op, NULL);
    if (list == NULL) goto cleanup;
    values = PyObject_Repr(list);
    Py_DECREF(list);
  } else {
    values = PyUnicode_FromString("...");
  }
  if (values == NULL) goto cleanup;
  shape = tensor_get_shape(op, NULL);
  if (shape == NULL) goto cleanup;
  dev = dlb__device_text(t->device);
  if (dev == NULL) goto cleanup;
  res = PyUnicode_FromFormat(
      "dlbridge.Tensor(%U, shape=%R, dtype=%s, device=%U%s)", values, shape,
      name, dev,
      (self->flags & DLPACK_FLAG_BITMASK_READ_ONLY) ? ", readonly=True" : "");

cleanup:
  Py_XDECREF(values);
  Py_XDECREF(shape);
  Py_XDECREF(dev);
  return res;
}

static Py_ssize_t tensor_len(PyObject *op) {
  dlb_TensorObject *self = AS_TENSOR(op);
  if (self->t.ndim == 0) {
    PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
    return -1;
  }
  return (Py_ssize_t)self->t.shape[0];
}

/* ---- buffer protocol ------------------------------------------------------------------- */

static int tensor_getbuffer(PyObject *op, Py_buffer *view, int flags) {
  dlb_TensorObject *self = AS_TENSOR(op);
  const DLTensor *t = &self->t;
  Py_ssize_t *dims = NULL;
  int rc = -1;
  char name[48];

  view->obj = NULL;
  if (require_host(self, "the buffer protocol") < 0) goto cleanup;
  if ((flags & PyBUF_WRITABLE) &&
      (self->flags & DLPACK_FLAG_BITMASK_READ_ONLY)) {
    PyErr_SetString(PyExc_BufferError,
                    "the tensor is read-only; a writable buffer was asked "
                    "for");
    goto cleanup;
  }
  if (dlb_dtype_name(t->dtype, name, sizeof name, NULL) != DLB_OK)
    strcpy(name, "(unknown)");
  if (dlb_dtype_is_subbyte(t->dtype)) {
    PyErr_Format(PyExc_BufferError,
                 "dtype %s packs elements below a byte; the buffer protocol "
                 "cannot describe it",
                 name);
    goto cleanup;
  }
  const char *format = dlb__buffer_format(dlb__scalar_kind(t->dtype));
  if ((flags & PyBUF_FORMAT) && format == NULL) {
    PyErr_Format(PyExc_BufferError,
                 "dtype %s has no struct-module format code, so the buffer "
                 "protocol cannot describe it; use __dlpack__ or "
                 "__array_interface__",
                 name);
    goto cleanup;
  }
  int64_t itemsize = dlb_dtype_itemsize(t->dtype);
  int64_t numel = tensor_numel(t);
  int c_contig = dlb_tensor_is_contiguous(t);
  int f_contig = dlb_tensor_is_contiguous_f(t);

  /* Contiguity demanded by the request. */
  if ((flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS && !c_contig) {
    PyErr_SetString(PyExc_BufferError, "the tensor is not C-contiguous");
    goto cleanup;
  }
  if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && !f_contig) {
    PyErr_SetString(PyExc_BufferError, "the tensor is not Fortran-contiguous");
    goto cleanup;
  }
  if ((flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS && !c_contig &&
      !f_contig) {
    PyErr_SetString(PyExc_BufferError, "the tensor is not contiguous");
    goto cleanup;
  }
  /* Without PyBUF_STRIDES the consumer will assume C order. */
  if ((flags & PyBUF_STRIDES) != PyBUF_STRIDES && !c_contig) {
    PyErr_SetString(PyExc_BufferError,
                    "the tensor is not C-contiguous and the consumer did not "
                    "ask for strides");
    goto cleanup;
  }

  if ((flags & PyBUF_ND) == PyBUF_ND && t->ndim > 0) {
    /* shape and strides must outlive the view: one block in internal. */
    dims = PyMem_Malloc(2 * (size_t)t->ndim * sizeof(Py_ssize_t));
    if (dims == NULL) {
      PyErr_NoMemory();
      goto cleanup;
    }
    int64_t bs[DLB_MAX_NDIM];
    if (byte_strides(t, itemsize, bs) < 0) goto cleanup;
    for (int32_t i = 0; i < t->ndim; i++) {
      dims[i] = (Py_ssize_t)t->shape[i];
      dims[t->ndim + i] = (Py_ssize_t)bs[i];
    }
  }

  view->buf = dlb_tensor_data(t);
  view->len = (Py_ssize_t)(numel * itemsize);
  view->readonly = (self->flags & DLPACK_FLAG_BITMASK_READ_ONLY) ? 1 : 0;
  view->itemsize = (Py_ssize_t)itemsize;
  /* The struct codes are string literals: they outlive every view. */
  view->format = (flags & PyBUF_FORMAT) ? (char *)format : NULL;
  if ((flags & PyBUF_ND) == PyBUF_ND) {
    view->ndim = t->ndim;
    view->shape = dims;
    view->strides =
        (flags & PyBUF_STRIDES) == PyBUF_STRIDES && dims != NULL
            ? dims + t->ndim
            : NULL;
  } else {
    /* PyBUF_SIMPLE: one flat run of bytes (contiguity checked above). */
    view->ndim = 1;
    view->shape = NULL;
    view->strides = NULL;
  }
  view->suboffsets = NULL;
  view->internal = dims;
  view->obj = Py_NewRef(op);
  DLB_FT_ADD_SSIZE(&self->buffer_exports, 1); /* views may come from any thread */
  dims = NULL;
  rc = 0;

cleanup:
  PyMem_Free(dims);
  return rc;
}

static void tensor_releasebuffer(PyObject *op, Py_buffer *view) {
  PyMem_Free(view->internal);
  view->internal = NULL;
  DLB_FT_ADD_SSIZE(&AS_TENSOR(op)->buffer_exports, -1);
}

/* ---- empty / zeros -------------------------------------------------------------------- */

/* shape: an int or a sequence of ints, each >= 0. */
static int parse_shape(PyObject *obj, int32_t *ndim, int64_t *shape) {
  int rc = -1;
  PyObject *seq = NULL;
  if (PyLong_Check(obj) || (PyIndex_Check(obj) && !PySequence_Check(obj))) {
    seq = PyTuple_Pack(1, obj);
  } else if (PyUnicode_Check(obj) || PyBytes_Check(obj) ||
             !PySequence_Check(obj)) {
    PyErr_Format(PyExc_TypeError,
                 "shape must be an int or a sequence of ints, not %.200s",
                 Py_TYPE(obj)->tp_name);
    goto cleanup;
  } else {
    /* A tuple copy, not PySequence_Fast (which hands back a list itself):
     * an item's __index__ may change the list while the items are read. */
    seq = PySequence_Tuple(obj);
  }
  if (seq == NULL) goto cleanup;
  Py_ssize_t n = PyTuple_GET_SIZE(seq);
  if (n > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_BufferError,
                 "shape has %zd dimensions; dlbridge handles at most %d "
                 "(MAX_NDIM)",
                 n, DLB_MAX_NDIM);
    goto cleanup;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PyTuple_GET_ITEM(seq, i);
    if (!PyIndex_Check(item)) {
      PyErr_Format(PyExc_TypeError,
                   "shape[%zd] must be an int, not %.200s", i,
                   Py_TYPE(item)->tp_name);
      goto cleanup;
    }
    PyObject *idx = PyNumber_Index(item);
    if (idx == NULL) goto cleanup;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
    Py_DECREF(idx);
    if (v == -1 && PyErr_Occurred()) goto cleanup;
    if (overflow > 0) {
      PyErr_Format(PyExc_ValueError, "shape[%zd] is too large", i);
      goto cleanup;
    }
    if (overflow < 0 || v < 0) {
      PyErr_Format(PyExc_ValueError,
                   "shape[%zd] is negative (%R); extents must be >= 0", i,
                   item);
      goto cleanup;
    }
    shape[i] = (int64_t)v;
  }
  *ndim = (int32_t)n;
  rc = 0;

cleanup:
  Py_XDECREF(seq);
  return rc;
}

static PyObject *make_filled(const char *fname, PyObject *module,
                             PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames, bool zero) {
  static const char *const names[] = {"shape", "dtype", "device"};
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  PyObject *a[3];
  int32_t ndim = 0;
  int64_t shape[DLB_MAX_NDIM];
  DLDataType dtype = {kDLFloat, 32, 1};
  DLDevice device = {kDLCPU, 0};
  DLManagedTensorVersioned *m = NULL;

  if (parse_args(fname, args, nargs, kwnames, names, 3, 3, 1, a) < 0)
    return NULL;
  if (parse_shape(a[0], &ndim, shape) < 0) return NULL;
  if (a[1] != NULL && a[1] != Py_None &&
      dlb__dtype_converter(st, a[1], &dtype) < 0)
    return NULL;
  if (a[2] != NULL && dlb__device_converter(st, a[2], &device) < 0)
    return NULL;
  if (dlb__empty_managed(ndim, shape, dtype, device, zero, fname, &m) < 0)
    return NULL;
  return dlb__tensor_from_managed(st, m);
}

PyObject *dlb__py_empty(PyObject *module, PyObject *const *args,
                        Py_ssize_t nargs, PyObject *kwnames) {
  return make_filled("empty", module, args, nargs, kwnames, false);
}

PyObject *dlb__py_zeros(PyObject *module, PyObject *const *args,
                        Py_ssize_t nargs, PyObject *kwnames) {
  return make_filled("zeros", module, args, nargs, kwnames, true);
}

/* ---- tensor(data) ------------------------------------------------------------------ */

static int is_nested(PyObject *o) { return PyList_Check(o) || PyTuple_Check(o); }

/* Item i of o (a list or tuple), a new reference; NULL when a list is no
 * longer that long (changed while it was read; no exception).  A list's
 * item through PyList_GetItemRef where there is one: without the GIL
 * another thread may replace the item, and free it, between a borrowed
 * read and its INCREF. */
static PyObject *nested_item(PyObject *o, Py_ssize_t i) {
#if PY_VERSION_HEX >= 0x030D0000
  if (PyList_Check(o)) {
    PyObject *item = PyList_GetItemRef(o, i);
    if (item == NULL) PyErr_Clear();
    return item;
  }
#endif
  if (i >= PySequence_Fast_GET_SIZE(o)) return NULL;
  return Py_NewRef(PySequence_Fast_GET_ITEM(o, i));
}

/* A list of data shrank or grew while its items were being read (an
 * item's __float__ or __index__ changed it). */
static int changed_while_read(int32_t dim) {
  PyErr_Format(PyExc_ValueError,
               "tensor() data changed while it was read: a list at depth %d "
               "changed length",
               (int)dim);
  return -1;
}

static int ragged(int32_t dim) {
  PyErr_Format(PyExc_ValueError,
               "tensor() data is ragged: the lists at depth %d do not all "
               "have the same length (or mix lists and scalars)",
               (int)dim);
  return -1;
}

/* Check the nesting against shape and find the widest number class. */
static int infer_rec(PyObject *o, int32_t dim, int32_t ndim,
                     const int64_t *shape, int *cls) {
  if (dim == ndim) {
    if (is_nested(o)) return ragged(dim);
    int c = dlb__number_class(o);
    if (c < 0) return -1;
    if (c > *cls) *cls = c;
    return 0;
  }
  if (!is_nested(o) || PySequence_Fast_GET_SIZE(o) != shape[dim])
    return ragged(dim);
  Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  for (Py_ssize_t i = 0; i < n; i++) {
    /* The previous item's conversion ran Python code. */
    if (PySequence_Fast_GET_SIZE(o) != n) return changed_while_read(dim);
    PyObject *item = nested_item(o, i);
    if (item == NULL) return changed_while_read(dim);
    int r = infer_rec(item, dim + 1, ndim, shape, cls);
    Py_DECREF(item);
    if (r < 0) return -1;
  }
  return 0;
}

/* Write the leaves of o in row-major order at *dst, re-checking the nesting
 * (a __float__ or __index__ method may have changed the lists since
 * infer_rec looked). */
static int fill_rec(PyObject *o, int32_t dim, int32_t ndim,
                    const int64_t *shape, scalar_kind k, const char *name,
                    int64_t itemsize, char **dst) {
  if (dim == ndim) {
    if (is_nested(o)) return ragged(dim);
    int c = dlb__number_class(o);
    if (c < 0) return -1;
    if (dlb__store_scalar(o, c, k, name, *dst) < 0) return -1;
    *dst += itemsize;
    return 0;
  }
  if (!is_nested(o) || PySequence_Fast_GET_SIZE(o) != shape[dim])
    return ragged(dim);
  Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  for (Py_ssize_t i = 0; i < n; i++) {
    /* The previous item's conversion ran Python code. */
    if (PySequence_Fast_GET_SIZE(o) != n) return changed_while_read(dim);
    PyObject *item = nested_item(o, i);
    if (item == NULL) return changed_while_read(dim);
    int r = fill_rec(item, dim + 1, ndim, shape, k, name, itemsize, dst);
    Py_DECREF(item);
    if (r < 0) return -1;
  }
  return 0;
}

PyObject *dlb__py_tensor(PyObject *module, PyObject *const *args,
                         Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"data", "dtype", "device"};
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  PyObject *a[3];
  int32_t ndim = 0;
  int64_t shape[DLB_MAX_NDIM];
  DLDataType dtype;
  DLDevice device = {kDLCPU, 0};
  DLManagedTensorVersioned *m = NULL;
  PyObject *res = NULL;
  dlb_error err;
  char name[48];

  if (parse_args("tensor", args, nargs, kwnames, names, 3, 3, 1, a) < 0)
    goto cleanup;
  PyObject *data = a[0];
  if (a[2] != NULL && dlb__device_converter(st, a[2], &device) < 0)
    goto cleanup;

  /* The shape is read down the first elements (held: another thread may
   * change a list meanwhile); every other element is checked against it
   * while inferring / filling. */
  for (PyObject *cur = Py_NewRef(data); cur != NULL;) {
    PyObject *next = NULL;
    if (is_nested(cur)) {
      if (ndim == DLB_MAX_NDIM) {
        PyErr_Format(PyExc_BufferError,
                     "tensor() data nests deeper than %d levels (MAX_NDIM)",
                     DLB_MAX_NDIM);
        Py_DECREF(cur);
        goto cleanup;
      }
      Py_ssize_t n = PySequence_Fast_GET_SIZE(cur);
      shape[ndim++] = n;
      if (n > 0 && (next = nested_item(cur, 0)) == NULL) {
        Py_DECREF(cur);
        changed_while_read(ndim - 1);
        goto cleanup;
      }
    }
    Py_DECREF(cur);
    cur = next;
  }

  if (a[1] != NULL && a[1] != Py_None) {
    if (dlb__dtype_converter(st, a[1], &dtype) < 0) goto cleanup;
  } else {
    int cls = C_NONE;
    if (infer_rec(data, 0, ndim, shape, &cls) < 0) goto cleanup;
    static const char *const inferred[] = {"float64", "bool", "int64",
                                           "float64", "complex128"};
    if (dlb_dtype_from_name(inferred[cls], &dtype, &err) != DLB_OK) {
      dlb__raise(&err);
      goto cleanup;
    }
  }
  if (dlb_dtype_name(dtype, name, sizeof name, &err) != DLB_OK) {
    dlb__raise(&err);
    goto cleanup;
  }
  scalar_kind k = dlb__scalar_kind(dtype);
  if (k == K_NONE) {
    PyErr_Format(PyExc_TypeError,
                 "tensor() cannot convert Python numbers to %s", name);
    goto cleanup;
  }
  /* Filled on the CPU, then copied once to any other device. */
  DLDevice cpu = {kDLCPU, 0};
  if (dlb_managed_empty(ndim, shape, dtype, cpu, false, &m, &err) != DLB_OK) {
    dlb__raise(&err);
    goto cleanup;
  }
  char *dst = (char *)m->dl_tensor.data;
  if (tensor_numel(&m->dl_tensor) > 0 &&
      fill_rec(data, 0, ndim, shape, k, name, dlb_dtype_itemsize(dtype),
               &dst) < 0)
    goto cleanup;
  if (!dlb__same_device(device, cpu)) {
    DLManagedTensorVersioned *moved = NULL;
    if (dlb__copy_managed(&m->dl_tensor, m->flags, device, "tensor()",
                          &moved) < 0)
      goto cleanup;
    dlb_managed_delete(m);
    m = moved;
  }
  res = dlb__tensor_from_managed(st, m);
  m = NULL; /* stolen, even on failure */

cleanup:
  if (m != NULL) dlb_managed_delete(m); /* ours: touches no Python */
  return res;
}

/* ---- type ------------------------------------------------------------------------------ */

static PyMethodDef tensor_methods[] = {
    {"tolist", tensor_tolist, METH_NOARGS,
     "tolist()\n--\n\nThe elements as nested lists of Python scalars (a "
     "scalar for a 0-d tensor)."},
    {"copy", (PyCFunction)(void (*)(void))tensor_copy,
     METH_FASTCALL | METH_KEYWORDS,
     "copy(*, device=None)\n--\n\nA new contiguous tensor owning a copy of "
     "the data."},
    {NULL, NULL, 0, NULL},
};

/* Tensor's methods and attributes: its own, then those a file above this
 * one brings (share.c: pickling, is_shared), put together before the type
 * is made -- it is immutable, so nothing is added to it afterwards.
 * Process lifetime: the type's descriptors point into these arrays. */
#define MORE_DEFS_MAX 8
static PyMethodDef all_methods[sizeof tensor_methods / sizeof *tensor_methods +
                               MORE_DEFS_MAX];
static PyGetSetDef all_getset[sizeof tensor_getset / sizeof *tensor_getset +
                              MORE_DEFS_MAX];

static int assemble_defs(const PyMethodDef *more_methods,
                         const PyGetSetDef *more_getset) {
  size_t n = 0, n_methods = 0, n_getset = 0;
  if (all_methods[0].ml_name != NULL) return 0; /* done by an earlier module */
  while (more_methods != NULL && more_methods[n_methods].ml_name != NULL) n_methods++;
  while (more_getset != NULL && more_getset[n_getset].name != NULL) n_getset++;
  if (n_methods > MORE_DEFS_MAX || n_getset > MORE_DEFS_MAX) {
    PyErr_SetString(PyExc_SystemError, "dlbridge.Tensor: raise MORE_DEFS_MAX");
    return -1;
  }
  for (const PyMethodDef *d = tensor_methods; d->ml_name != NULL; d++)
    all_methods[n++] = *d;
  if (n_methods > 0)
    memcpy(all_methods + n, more_methods, n_methods * sizeof *more_methods);
  n = 0;
  for (const PyGetSetDef *d = tensor_getset; d->name != NULL; d++)
    all_getset[n++] = *d;
  if (n_getset > 0)
    memcpy(all_getset + n, more_getset, n_getset * sizeof *more_getset);
  return 0;
}

static PyType_Slot tensor_slots[] = {
    {Py_tp_dealloc, tensor_dealloc},
    {Py_tp_traverse, tensor_traverse},
    {Py_tp_clear, tensor_clear},
    {Py_tp_new, tensor_new},
    {Py_tp_repr, tensor_repr},
    {Py_tp_methods, all_methods},
    {Py_tp_getset, all_getset},
    {Py_tp_members, tensor_members},
    {Py_mp_length, tensor_len},
    {Py_bf_getbuffer, tensor_getbuffer},
    {Py_bf_releasebuffer, tensor_releasebuffer},
    {Py_tp_doc,
     "A strided view of memory owned through DLPack.  Made by "
     "dlbridge.from_dlpack(), tensor(), empty() and zeros()."},
    {0, NULL},
};

static PyType_Spec tensor_spec = {
    .name = "dlbridge.Tensor",
    .basicsize = sizeof(dlb_TensorObject),
    .itemsize = 0,
    /* Immutable: the exchange API table and the fast paths cache this type;
     * C code may still add class attributes through tp_dict +
     * PyType_Modified. */
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = tensor_slots,
};

int dlb__tensor_init(PyObject *module, dlb_module_state *st,
                     const PyMethodDef *more_methods,
                     const PyGetSetDef *more_getset) {
  if (assemble_defs(more_methods, more_getset) < 0) return -1;
  st->TensorType =
      (PyTypeObject *)PyType_FromModuleAndSpec(module, &tensor_spec, NULL);
  if (st->TensorType == NULL) return -1;
  dlb__ft_share_type(st->TensorType);
  if (PyModule_AddType(module, st->TensorType) < 0) return -1;
  return 0;
}
