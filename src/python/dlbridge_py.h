/*
 * dlbridge_py.h -- what the source files of dlbridge._core share.  Not
 * installed; extension authors use include/dlbridge/python.h instead.
 *
 * Module layout (multi-phase init, heap types, per-module state):
 *   module.c   module def, exec slot, state traverse/clear, the method table
 *   types.c    DType and Device heap types, dlb.dtype(), dlb.device()
 *   tensor.c   Tensor heap type: attributes, buffer protocol,
 *              __array_interface__, tolist, copy, repr, empty/zeros/tensor
 *   export.c   Tensor.__dlpack__ / __dlpack_device__, capsule creation
 *   import.c   from_dlpack: every producer path, capsule ownership
 *
 * Ownership model: every Tensor owns exactly one DLManagedTensorVersioned
 * (self->managed), whatever it came from -- an allocation of ours, a
 * consumed capsule, a Py_buffer, an __array_interface__ owner.  Dealloc runs
 * its deleter once.  self->t is the tensor's view of the data and normally
 * equals self->managed->dl_tensor; it is kept in the object so the hot paths
 * read one cache line, not two.
 */
#ifndef DLB_PYTHON_DLBRIDGE_PY_H_
#define DLB_PYTHON_DLBRIDGE_PY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dlbridge/dlbridge.h"

/* Per-module state: the heap types and interned names.  Reached from a
 * method through PyModule_GetState(module), from a Tensor method through
 * dlb__state_from_type(Py_TYPE(self)). */
typedef struct {
  PyTypeObject *TensorType;
  PyTypeObject *DTypeType;
  PyTypeObject *DeviceType;
  /* interned attribute / keyword names, made once in exec */
  PyObject *str_dlpack;            /* "__dlpack__" */
  PyObject *str_dlpack_device;     /* "__dlpack_device__" */
  PyObject *str_max_version;       /* "max_version" */
  PyObject *str_dl_device;         /* "dl_device" */
  PyObject *str_copy;              /* "copy" */
  PyObject *str_stream;            /* "stream" */
  PyObject *str_array_interface;   /* "__array_interface__" */
  PyObject *str_cuda_array_interface; /* "__cuda_array_interface__" */
  PyObject *max_version_tuple;     /* (1, 3): what we ask producers for */
  /* exchange.c: the per-type handler cache (owned, freed by
   * dlb__exchange_clear). */
  struct dlb_handler_cache *handlers;
  /* function.c */
  PyTypeObject *FunctionType;
  /* types.c: DType objects already made, direct-mapped by a hash of
   * (code, bits, lanes).  Reading t.dtype is common and a DType is
   * immutable, so handing out the same object saves an allocation and a
   * name lookup each time. */
  PyObject *dtype_cache[64];
} dlb_module_state;

extern PyModuleDef dlb__module_def;

/* State of the module that defined type (a Tensor, DType or Device type, or
 * a subclass of one).  Never NULL for our own types. */
dlb_module_state *dlb__state_from_type(PyTypeObject *type);

/* ---- The error indicator and the GIL, for code that runs deleters ----------
 *
 * Deleters and release functions may run on any thread, with or without the
 * GIL, from non-Python code, and during or after interpreter shutdown; a
 * destructor may run while an exception propagates.  These helpers are the
 * one place those rules are written down. */

/* The pending exception, put aside while code that may run Python (a
 * destructor, a deleter) runs.  PyErr_Fetch is deprecated from 3.12. */
typedef struct {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject *exc;
#else
  PyObject *type, *value, *tb;
#endif
} dlb__saved_error;

static inline void dlb__error_save(dlb__saved_error *s) {
#if PY_VERSION_HEX >= 0x030C0000
  s->exc = PyErr_GetRaisedException();
#else
  PyErr_Fetch(&s->type, &s->value, &s->tb);
#endif
}

static inline void dlb__error_restore(dlb__saved_error *s) {
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(s->exc);
#else
  PyErr_Restore(s->type, s->value, s->tb);
#endif
}

/* Whether the calling thread holds the GIL (of the interpreter it is
 * attached to).  Not PyGILState_Check(): on 3.11 that answers 1 for every
 * thread once any subinterpreter has been created, which would let a
 * deleter on a foreign thread DECREF without the GIL.  The thread state says
 * it exactly: on 3.12+ the current thread state is thread-local and non-NULL
 * only while this thread is attached; on 3.11 it is the process-wide GIL
 * holder, compared with this thread's own state (a thread-local read). */
static inline int dlb__gil_held(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyThreadState_GetUnchecked() != NULL;
#elif PY_VERSION_HEX >= 0x030C0000
  return _PyThreadState_UncheckedGet() != NULL;
#else
  PyThreadState *ts = _PyThreadState_UncheckedGet();
  return ts != NULL && ts == PyGILState_GetThisThreadState();
#endif
}

/* True when a deleter must not touch Python and should leak instead: the
 * interpreter is gone, or it is finalizing and this thread does not hold the
 * GIL (asking for it then would hang or be terminated).  The finalizing
 * thread itself, which holds the GIL, may still release references. */
static inline int dlb__python_gone(void) {
  if (!Py_IsInitialized()) return 1;
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() && !dlb__gil_held();
#else
  return _Py_IsFinalizing() && !dlb__gil_held();
#endif
}

/* Drop a reference from a deleter: safe on any thread, with or without the
 * GIL, at any point of shutdown (leaks when dlb__python_gone), leaving an
 * in-flight exception as it was.  have_gil: the caller knows it holds the
 * GIL, which skips asking.  (module.c) */
void dlb__release_ref(PyObject *obj, int have_gil);

/* ---- DType / Device (types.c) --------------------------------------------- */

typedef struct {
  PyObject_HEAD
  DLDataType dtype;
  PyObject *name; /* str, canonical name */
} dlb_DTypeObject;

typedef struct {
  PyObject_HEAD
  DLDevice device;
} dlb_DeviceObject;

int dlb__types_init(PyObject *module, dlb_module_state *st);

/* New DType / Device objects (new references, NULL with an exception). */
PyObject *dlb__dtype_new(dlb_module_state *st, DLDataType dtype);
PyObject *dlb__device_new(dlb_module_state *st, DLDevice device);

/* Read a dtype from a DType, a name str, or any object with a .dtype
 * attribute naming a NumPy-style dtype (numpy.dtype, type objects such as
 * numpy.float32, torch.float32).  0 on success, -1 with ValueError/TypeError. */
int dlb__dtype_converter(dlb_module_state *st, PyObject *obj, DLDataType *out);

/* Read a device from a Device, "cuda:1", (type, id) tuple, or None (CPU).
 * 0 on success, -1 with an exception. */
int dlb__device_converter(dlb_module_state *st, PyObject *obj, DLDevice *out);

/* A device as text: "cpu" for CPU 0, else "cuda:1", "device_type_5:0" for
 * types we do not know.  What str(Device) gives; messages use it too. */
PyObject *dlb__device_text(DLDevice device);

/* Module-level functions dtype() and device(). */
PyObject *dlb__py_dtype(PyObject *module, PyObject *arg);
PyObject *dlb__py_device(PyObject *module, PyObject *arg);

/* ---- Tensor (tensor.c) ------------------------------------------------------ */

typedef struct {
  PyObject_HEAD
  DLTensor t;                        /* the view; see header comment */
  DLManagedTensorVersioned *managed; /* owner of the memory, never NULL */
  uint64_t flags;                    /* DLPACK_FLAG_BITMASK_* of this view */
  Py_ssize_t buffer_exports;         /* live Py_buffer views of us */
  PyObject *weakreflist;
} dlb_TensorObject;

int dlb__tensor_init(PyObject *module, dlb_module_state *st);

static inline int dlb__is_tensor(dlb_module_state *st, PyObject *obj) {
  return PyObject_TypeCheck(obj, st->TensorType);
}

/* A new Tensor that takes ownership of m (steals it on success AND failure:
 * on failure m's deleter has run).  The view is m->dl_tensor; flags are
 * m->flags.  m must already be validated. */
PyObject *dlb__tensor_from_managed(dlb_module_state *st,
                                   DLManagedTensorVersioned *m);

/* Raise the Python exception matching a dlb_status: DLB_ENOMEM ->
 * MemoryError, DLB_EINVAL -> ValueError, everything describing a tensor that
 * cannot be exported or imported -> BufferError.  Returns NULL. */
PyObject *dlb__raise(const dlb_error *err);

/* Module-level factories. */
PyObject *dlb__py_empty(PyObject *module, PyObject *const *args,
                        Py_ssize_t nargs, PyObject *kwnames);
PyObject *dlb__py_zeros(PyObject *module, PyObject *const *args,
                        Py_ssize_t nargs, PyObject *kwnames);
PyObject *dlb__py_tensor(PyObject *module, PyObject *const *args,
                         Py_ssize_t nargs, PyObject *kwnames);

/* ---- Export (export.c) ------------------------------------------------------ */

/* Tensor.__dlpack__ and Tensor.__dlpack_device__ (METH_FASTCALL|KEYWORDS). */
PyObject *dlb__tensor_dlpack(PyObject *self, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames);
PyObject *dlb__tensor_dlpack_device(PyObject *self, PyObject *unused);

/* A new owning managed tensor that keeps self alive (one allocation; folds
 * byte_offset into data for CPU and CUDA memory).  Used by __dlpack__ and
 * the exchange API. */
int dlb__tensor_export_managed(dlb_TensorObject *self,
                               DLManagedTensorVersioned **out,
                               dlb_error *err);

/* ---- Import (import.c) ------------------------------------------------------ */

/* dlbridge.from_dlpack(obj, /, *, device=None, copy=None). */
PyObject *dlb__py_from_dlpack(PyObject *module, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames);

/* Import any tensor-like obj as a Tensor (new reference).  device: NULL for
 * "where it is"; copy: -1 None, 0 False, 1 True. */
PyObject *dlb__import(dlb_module_state *st, PyObject *obj,
                      const DLDevice *device, int copy);

/* ---- Per-type handlers and borrowed views (exchange.c) ----------------------
 *
 * The fast path.  The first time an object of some type is seen, its type is
 * classified once and the result cached in module state; from then on,
 * finding the handler is a hash and a pointer compare.  An entry lives
 * exactly as long as its type: it holds a weak reference whose callback
 * removes the entry before the type's memory can be reused, so a freed type
 * can never alias a new one at the same address, and a program that makes
 * and drops types does not grow the cache.
 * Every consumer of tensors -- from_dlpack, Function, the C API -- reads
 * objects through a handler, so each framework is supported in one place. */

typedef enum {
  DLB_KIND_NONE = 0,   /* not tensor-like */
  DLB_KIND_TENSOR,     /* dlbridge.Tensor (or subclass): direct struct access */
  DLB_KIND_EXCHANGE,   /* the type publishes a DLPack C exchange table */
  DLB_KIND_NUMPY,      /* numpy.ndarray: fields read directly */
  DLB_KIND_DLPACK,     /* __dlpack__ only: owning export per view */
  DLB_KIND_BUFFER,     /* buffer protocol */
  DLB_KIND_ARRAY_INTERFACE,      /* __array_interface__ */
  DLB_KIND_CUDA_ARRAY_INTERFACE  /* __cuda_array_interface__ */
} dlb_kind;

typedef struct dlb_handler {
  PyTypeObject *type;            /* borrowed; the entry dies with it */
  dlb_kind kind;
  /* The type's exchange table (major 1, after walking prev_api), or NULL.
   * dlb.Tensor's own table is set here too, so producers and consumers
   * share one code path. */
  const DLPackExchangeAPI *api;
  PyObject *api_owner;           /* keeps the capsule/int alive; may be NULL */
  /* Framework name from the type's module ("numpy", "torch", "jax",
   * "tensorflow", "cupy", "dlbridge", ...): interned str, strong ref. */
  PyObject *framework;
} dlb_handler;

/* The handler for type (borrowed, lives as long as the module).  Never NULL
 * unless an exception is set: a type that is not tensor-like gets a handler
 * with kind DLB_KIND_NONE, cached too. */
const dlb_handler *dlb__handler_for(dlb_module_state *st, PyTypeObject *type);

/* A borrowed view of a tensor-like object, for the length of one call.
 * Lives on the caller's stack; nothing in it is allocated for the dlbridge,
 * NumPy, exchange-table (dltensor_from_py_object_no_sync) and buffer paths. */
typedef struct {
  DLTensor t;                 /* valid until dlb__view_release */
  uint64_t flags;             /* DLPACK_FLAG_BITMASK_READ_ONLY, ... */
  const dlb_handler *handler; /* how the object was read */
  DLManagedTensorVersioned *owned; /* owning export made for this view */
  Py_buffer buffer;           /* held when has_buffer */
  int has_buffer;
  int64_t strides_storage[DLB_MAX_NDIM]; /* strides converted from bytes */
} dlb_view;

/* Options for dlb__view_get. */
enum {
  DLB_VIEW_WRITABLE = 1u << 0  /* fail with BufferError if read-only */
};

/* Fill view for obj (which the caller keeps alive until release).  0 on
 * success; -1 with TypeError (not tensor-like), BufferError (cannot be
 * described, or read-only with DLB_VIEW_WRITABLE).  On failure nothing needs
 * releasing. */
int dlb__view_get(dlb_module_state *st, PyObject *obj, unsigned options,
                  dlb_view *view);
void dlb__view_release(dlb_view *view);

/* The framework's current work stream for device (NULL on CPU, and NULL for
 * the legacy default stream on CUDA).  0, or -1 with an exception. */
int dlb__current_stream(dlb_module_state *st, const dlb_handler *h,
                        DLDevice device, void **stream);

/* A new owning tensor allocated by h's framework (its exchange table's
 * allocator when it has one, else dlbridge's own allocator), contiguous,
 * shaped by prototype's ndim/shape/dtype/device.  0, or -1 with an
 * exception. */
int dlb__alloc_like(dlb_module_state *st, const dlb_handler *h,
                    const DLTensor *prototype, DLManagedTensorVersioned **out);

/* m as an object of h's framework (new reference in *out): the table's
 * managed_tensor_to_py_object_no_sync when there is one, a dlb.Tensor for
 * dlbridge, else the framework's from_dlpack on a dlb.Tensor.  Steals m on
 * success and failure. */
int dlb__to_framework(dlb_module_state *st, const dlb_handler *h,
                      DLManagedTensorVersioned *m, PyObject **out);

/* Handlers cached in module state; cleared with the module. */
int dlb__exchange_init(PyObject *module, dlb_module_state *st);
void dlb__exchange_clear(dlb_module_state *st);

/* ---- Function (function.c) and the C API capsule (capi.c) ------------------ */

/* Adds the Function type and load() to the module. */
int dlb__function_init(PyObject *module, dlb_module_state *st);
/* Adds the dlbridge._C_API capsule (include/dlbridge/python.h). */
int dlb__capi_init(PyObject *module, dlb_module_state *st);

/* Adds private hooks for the tests (testing.c): allocation-failure
 * injection through the core allocator, live-block counts. */
int dlb__testing_init(PyObject *module, dlb_module_state *st);

/* dlb.Tensor's own exchange table (process lifetime). */
extern const DLPackExchangeAPI dlb__tensor_exchange_api;

/* added by exchange.c */
/* import.c, shared with exchange.c's views.  Each gives an owning, validated
 * managed tensor in *out (0), or -1 with an exception and nothing owned. */
int dlb__dunder_dlpack_managed(dlb_module_state *st, PyObject *obj,
                               const DLDevice *target, int copy,
                               DLManagedTensorVersioned **out);
int dlb__array_interface_managed(dlb_module_state *st, PyObject *obj, int cuda,
                                 DLManagedTensorVersioned **out);
/* dlb__view_get for a caller that already holds h = the handler of
 * Py_TYPE(obj) (saves the second lookup). */
int dlb__view_get_with(dlb_module_state *st, const dlb_handler *h,
                       PyObject *obj, unsigned options, dlb_view *view);
/* dtype of a buffer-protocol format string; BufferError when it has none. */
int dlb__buffer_format_dtype(const char *fmt, Py_ssize_t itemsize,
                             DLDataType *out);

/* ---- Pickling and shared memory (pickle.c, share.c) ------------------------ */

/* Tensor.__reduce_ex__(protocol) and Tensor.__deepcopy__(memo). */
PyObject *dlb__tensor_reduce_ex(PyObject *self, PyObject *protocol);
PyObject *dlb__tensor_deepcopy(PyObject *self, PyObject *memo);
/* Adds _rebuild_tensor to the module. */
int dlb__pickle_init(PyObject *module, dlb_module_state *st);
/* Pieces of a pickle, validated: a (code, bits, lanes) tuple; a tuple of at
 * most DLB_MAX_NDIM ints (what names it in messages); a layout whose data is
 * set, with the bytes [0, *need) it reads from element 0.  0, or -1 with
 * ValueError. */
int dlb__parse_dtype_tuple(PyObject *obj, DLDataType *out);
int dlb__parse_dims(PyObject *obj, const char *what, int32_t *n, int64_t *v);
int dlb__check_pickled_layout(DLTensor *view, uint64_t flags, int64_t *need);

/* True when self's elements lie in a shared-memory mapping of this
 * process; Tensor.is_shared. */
int dlb__tensor_is_shared(const dlb_TensorObject *self);
PyObject *dlb__tensor_get_is_shared(PyObject *self, void *closure);
/* __reduce_ex__ of a shared tensor: the handle (counted in flight). */
PyObject *dlb__shared_reduce(dlb_module_state *st, dlb_TensorObject *self);
/* Adds share, _rebuild_shared, _shm_cleanup, _shm_info to the module. */
int dlb__share_init(PyObject *module, dlb_module_state *st);

#endif /* DLB_PYTHON_DLBRIDGE_PY_H_ */
