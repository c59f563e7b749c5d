/*
 * dlbridge_py.h -- what the source files of dlbridge._core share.  Not
 * installed; extension authors use include/dlbridge/python.h instead.
 *
 * Module layout (multi-phase init, heap types, per-module state), one
 * concern per file, listed lowest first:
 *   errors.c   the error policy: dlb_status -> exception, the pending
 *              exception kept around deleters and DECREFs, chaining
 *   types.c    DType and Device heap types, dlb.dtype(), dlb.device(),
 *              devices and dtypes as text
 *   scalars.c  Python numbers <-> elements of every dtype
 *   formats.c  struct format / typestr / NumPy descr <-> dtype,
 *              Py_buffer -> DLTensor
 *   cuda.c     dlbridge's current CUDA stream (dlb.stream), stream
 *              ordering, copies between host and CUDA memory
 *   tensor.c   Tensor heap type: attributes, buffer protocol,
 *              __array_interface__, tolist, copy, repr, empty/zeros/tensor
 *   export.c   what dlb.Tensor gives consumers: __dlpack__,
 *              __dlpack_device__, capsules, its C exchange table
 *   handlers.c the type -> handler cache and classification: the
 *              ladder's type-level rungs, cached per type (version-tag
 *              checked); framework names from python/dlbridge/_frameworks.py
 *   readers.c  owning readers: capsules, __dlpack__, legacy producers,
 *              buffers, __array_interface__ / __cuda_array_interface__, and
 *              the ladder's owning rungs in order (dlb__read_owned), shared
 *              by import.c and views.c
 *   torchbits.c what an exchange table cannot say, asked of the tensor:
 *              torch's lazy conj/neg bits, requires_grad
 *   views.c    borrowed views (dlb__view_get / dlb__view_release)
 *   outputs.c  current stream, allocate-like, hand a result to a framework
 *   import.c   from_dlpack's policy: which reader, device= and copy=
 *   convert.c  dlbridge.convert: targets bound from the registry, what
 *              each can hold, copy= and device=, the hand-over
 *   function_sig.c  (Function, six files sharing src/python/function.h)
 *              the signature: parse, mismatch messages, one spelling,
 *              identity
 *   function_mut.c  what a call's reading marked: grad refusal, the
 *              copies of immutable `mut` arguments, version counters,
 *              the hand-back of results
 *   function_call.c the eager call: reading, checks, the kernel
 *   function_ops.c  what graph compilers ask of a Function
 *   function_grad.c its derivatives: vjp/jvp Functions bound by name
 *   function.c the Function type and load()
 *   ops/registry.c  (src/ops: a Function as a graph compiler's op) the
 *              Functions compiled graphs name, by identity
 *   ops/tf.c   the DlbridgeCall op and its kernels, registered through
 *              TensorFlow's C API (found at run time)
 *   ops/xla.c  the XLA FFI handler that runs a Function in a jax.jit graph
 *   capi.c     the dlbridge._C_API capsule (include/dlbridge/python.h)
 *   testing.c  every private test hook (_fail_allocations, _exchange_*)
 *   pickle.c   Tensor pickling: protocol 5 out of band, in band below 5,
 *              the validated rebuild
 *   share_shm.c shared tensors in POSIX shared memory: which tensors lie
 *              in a segment, the copy into one, the handle, its rebuild
 *   share_ipc.c shared CUDA tensors through CUDA IPC: the same four verbs
 *   share.c    dlb.share's policy over the two transports, is_shared, and
 *              the __reduce_ex__, __deepcopy__ and is_shared Tensor gets
 *   module.c   module def, exec (initialises the others), the method table
 *
 * Layering: the files form a DAG in exactly the order above.  A file calls
 * (or names) private functions and data of files listed before it, never of
 * a file listed after it; scripts/check-layering checks this.  The only
 * name every file reaches "up" for is dlb__module_def, through the inline
 * dlb__state_from_type below: the module's identity, defined in module.c
 * because it names the method table.  The declarations below are grouped
 * by file in the same order.  Of the core's private headers one is used
 * here: function_call.c includes src/core/validate_fast.h, the inline fast path
 * of dlb_tensor_validate, to validate torch arguments without a call.
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

#include "pycompat.h"
#include "dlbridge/dlbridge.h"

#include <string.h>

/* ---- Module state (module.c) ------------------------------------------------ */

/* The methods of legacy producers that return a "dltensor" capsule, in the
 * order readers.c tries them (interned in module state). */
#define DLB_LEGACY_METHOD_NAMES \
  {"toDlpack", "to_dlpack", "to_dlpack_for_write", "to_dlpack_for_read"}
#define DLB_N_LEGACY_METHODS 4
#define DLB_LEGACY_FOR_READ 3 /* index of to_dlpack_for_read */

/* Where torch's lazy conj/neg bits and autograd pointer come from
 * (torchbits.c): not looked for yet (the first torch tensor runs the
 * experiment that finds them), read from the TensorImpl at the offsets it
 * found, or asked of each tensor (it failed, or a test forced it). */
typedef enum {
  DLB_TORCH_BITS_ASK = -1,
  DLB_TORCH_BITS_UNTRIED = 0,
  DLB_TORCH_BITS_READ = 1
} dlb_torch_bits;

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
  /* readers.c: the legacy producers' methods, in the order tried */
  PyObject *str_legacy[DLB_N_LEGACY_METHODS];
  /* torchbits.c: torch's lazy bits and autograd (dlb__check_bits) */
  PyObject *str_is_conj;           /* "is_conj" */
  PyObject *str_is_neg;            /* "is_neg" */
  PyObject *str_requires_grad;     /* "requires_grad" */
  /* torchbits.c: where torch keeps the lazy bits, found once by
   * experiment (torch_found: it succeeded, so the offsets below are
   * usable; torch_bits says whether they are used). */
  PyObject *str_torch;             /* "torch" */
  PyTypeObject *torch_base;        /* strong: torch._C.TensorBase, set by
                                      the first torch tensor seen, once
                                      what asking needs (torch_ask, ...) is
                                      in place */
  int torch_bits;                  /* a dlb_torch_bits; offsets and masks
                                      are written before it says READ */
  int torch_found;
  /* torchbits.c: meeting torch and the experiment are done by one thread
   * at a time on free-threaded builds (torch_owner: which, so that Python
   * code they run cannot wait for itself); no Python code runs while the
   * lock is waited for by its owner. */
  dlb_ft_mutex torch_lock;
  unsigned long torch_owner;
  int torch_impl_off, torch_flag_off, torch_key_off, torch_meta_off;
  uint64_t torch_neg_mask, torch_conj_mask;
  uint64_t torch_wrap_mask; /* functorch wrappers' key bits (0: unknown) */
  /* torchbits.c: what asking calls (strong; NULL when torch has no such
   * thing): TensorBase's is_neg, is_conj and requires_grad descriptors,
   * and torch._C.DisableTorchFunction() with its __enter__ and __exit__
   * descriptors. */
  PyObject *torch_ask[3];
  PyObject *torch_quiet[3];
  /* torchbits.c: torch.is_grad_enabled, and what tells autograd that
   * tensors were written in place (torch._C._increment_version, behind
   * torch.autograd.graph.increment_version); strong, set with torch_base. */
  PyObject *torch_grad_enabled;
  PyObject *torch_bump;
  /* torchbits.c: what tells a Function call that forward-mode AD or a
   * functorch transform may want it (the call then goes to torch's
   * autograd, python/dlbridge/_ops_torch.py): the module
   * torch.autograd.forward_ad (its _current_level), torch._C.
   * _is_fwd_grad_enabled and torch._C._functorch.
   * is_functorch_wrapped_tensor; strong, set with torch_base, each NULL
   * when this torch has none; torch_fw_level: "_current_level", interned
   * (a lookup by C string would make the str on every call). */
  PyObject *torch_fwad, *torch_fw_enabled, *torch_wrapped, *torch_fw_level;
  /* handlers.c: the per-type handler cache (owned, freed by
   * dlb__handlers_clear). */
  struct dlb_handler_cache *handlers;
  /* function.c: the Function type */
  PyTypeObject *FunctionType;
  /* types.c: DType objects already made, direct-mapped by a hash of
   * (code, bits, lanes).  Reading t.dtype is common and a DType is
   * immutable, so handing out the same object saves an allocation and a
   * name lookup each time.  With the GIL a collision replaces the entry.
   * Free-threaded builds fill each slot once (under dtype_lock) with an
   * immortal DType and never replace it, so a hit is one acquire load and
   * writes nothing shared: no lock, no reference count (issue 26 item 5);
   * a colliding dtype gets a new DType each time. */
  PyObject *dtype_cache[64];
  dlb_ft_mutex dtype_lock;
} dlb_module_state;

/* Free-threaded CPython 3.13: type, one of ours whose instances every
 * thread makes and frees (Tensor, DType, Device), made immortal at module
 * init.  Every instance holds a reference to its heap type, and 3.13
 * counts those in the type's one shared reference count: threads making
 * Tensors on their own arrays would all write that cache line
 * (from_dlpack, convert).  3.14 counts heap types' references per thread;
 * GIL builds have no such cost.  The types live as long as the process
 * then, as CPython 3.13t's own classes do once a second thread starts
 * (gh-117783). */
static inline void dlb__ft_share_type(PyTypeObject *type) {
#if defined(Py_GIL_DISABLED) && PY_VERSION_HEX < 0x030E0000
  dlb__ft_immortalize((PyObject *)type);
#else
  (void)type;
#endif
}

extern PyModuleDef dlb__module_def;

/* State of the module that defined type (a Tensor, DType or Device type, or
 * a subclass of one).  Never NULL for our own types. */
static inline dlb_module_state *dlb__state_from_type(PyTypeObject *type) {
  /* PyType_GetModuleByDef walks the MRO, so subclasses defined in Python
   * find our module too. */
  PyObject *module = PyType_GetModuleByDef(type, &dlb__module_def);
  if (module == NULL) {
    PyErr_Clear();
    return NULL;
  }
  return (dlb_module_state *)PyModule_GetState(module);
}

/* ---- Errors, and the GIL for code that runs deleters (errors.c) -------------
 *
 * Deleters and release functions may run on any thread, with or without the
 * GIL, from non-Python code, and during or after interpreter shutdown; a
 * destructor may run while an exception propagates.  These helpers are the
 * one place those rules are written down. */

/* The pending exception, put aside while code that may run Python (a
 * destructor, a deleter) runs. */
typedef struct {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject *exc;
#else
  PyObject *type, *value, *tb;
#endif
} dlb__saved_error;

void dlb__error_save(dlb__saved_error *s);
void dlb__error_restore(dlb__saved_error *s);
/* Drop a saved exception. */
void dlb__error_discard(dlb__saved_error *s);
/* Make the saved exception prev the __context__ of the pending one, as
 * `except: raise ...` does in Python.  Consumes prev. */
void dlb__error_chain_context(dlb__saved_error *prev);
/* The same as __cause__, as `raise ... from prev` does.  Consumes prev. */
void dlb__error_chain_cause(dlb__saved_error *prev);
/* Name the argument in the pending exception: dlbridge's own refusals are
 * re-raised as "<fname>() argument '<argname>': <message>" (the original as
 * __cause__); any other exception is kept as it is, with a note. */
void dlb__error_prefix_argument(PyObject *fname, PyObject *argname);
/* After a producer's exchange-table entry failed on an object of type: the
 * object cannot be exported, so the pending exception becomes a short
 * BufferError ("'torch.Tensor' cannot be exported through its DLPack
 * exchange table (RuntimeError): <first line>"), the original chained as
 * __cause__ -- torch raises RuntimeError with a 1.5 KB C++ backtrace for
 * sparse, meta and quantized tensors.  MemoryError, BufferError and
 * non-Exception exceptions pass unchanged; with none pending, a BufferError
 * saying the table failed to <what> ("describe", "export") without saying
 * why. */
void dlb__error_exchange_refusal(PyTypeObject *type, const char *what);
/* When the pending exception is one of types (a class or a tuple of them)
 * and no MemoryError: BufferError "<prefix>: <its first line>", the
 * original chained as __cause__ (convert.c: an importer's refusal).  Any
 * other exception is left as it is. */
void dlb__error_as_buffer_error(PyObject *types, PyObject *prefix);
/* The same with exc (an exception class) instead of BufferError: the
 * pending exception, when one of types and no MemoryError, becomes exc
 * "<prefix>: <its first line>", the original chained as __cause__. */
void dlb__error_reraise(PyObject *exc, PyObject *types, PyObject *prefix);
/* o as an int64 (o must be an int or have __index__): an integer outside
 * int64 is a BufferError naming what ("from_dlpack: __array_interface__
 * shape entry"), not an OverflowError.  0, or -1 with an exception. */
int dlb__read_int64(PyObject *o, const char *what, int64_t *out);

/* Whether the calling thread holds the GIL (of the interpreter it is
 * attached to) -- on a free-threaded build, whether it has an attached
 * thread state.  Not PyGILState_Check(): on 3.11 that answers 1 for every
 * thread once any subinterpreter has been created, which would let a
 * deleter on a foreign thread DECREF without the GIL.  The thread state
 * says it exactly (pycompat.h, dlb__py_attached). */
static inline int dlb__gil_held(void) { return dlb__py_attached(); }

/* True when a deleter must not touch Python and should leak instead: this
 * thread does not hold the GIL and cannot take it, because the interpreter
 * is gone or finalizing (asking for the GIL then would hang or end the
 * thread).  A thread that holds the GIL may always touch Python: the
 * finalizing thread does while CPython tears modules down and collects
 * their objects -- Py_IsInitialized() already answers 0 then, and a deleter
 * that leaked at that point would leave behind whatever it guards (a
 * shared-memory segment in /dev/shm), not a few bytes.  What a deleter
 * releases outside Python (a mapping, a segment, device memory) it releases
 * whatever this says. */
static inline int dlb__python_gone(void) {
  if (dlb__gil_held()) return 0;
  return dlb__py_finalizing();
}

/* Drop a reference from a deleter: safe on any thread, with or without the
 * GIL, at any point of shutdown (leaks when dlb__python_gone), leaving an
 * in-flight exception as it was.  have_gil: the caller knows it holds the
 * GIL, which skips asking. */
void dlb__release_ref(PyObject *obj, int have_gil);

/* Py_CLEAR(*slot) without letting the object's destructor see or clobber
 * the pending exception (B16).  GIL held. */
void dlb__clear_keep_error(PyObject **slot);

/* Run m's deleter (which may run Python code through a producer's release)
 * leaving the pending exception as it was; an error the deleter leaves is
 * discarded.  NULL is a no-op.  GIL held. */
void dlb__delete_keep_error(DLManagedTensorVersioned *m);

/* The one status -> exception policy: raise err as "<what>: <message>"
 * (just the message when what is NULL) with the exception its status maps
 * to: DLB_ENOMEM -> MemoryError; DLB_EINVAL, DLB_EOVERFLOW -> ValueError;
 * DLB_EUNSUPPORTED, DLB_EVERSION, DLB_EREADONLY -> BufferError; DLB_EDEVICE
 * (a device runtime call failed or is missing) -> device_exc, RuntimeError
 * when NULL (allocations say RuntimeError, as torch and CuPy do; copies and
 * exports BufferError, DLPack's "this move cannot be made"); DLB_ESYSTEM
 * (a failed system call) -> OSError; anything else -> RuntimeError.  The message is read up to its first NUL or its
 * DLB_ERROR_MESSAGE_SIZE bytes, bytes that are not UTF-8 becoming \xNN
 * escapes.  No file but errors.c formats a dlb_error's message.  Returns
 * NULL. */
PyObject *dlb__raise_status(const char *what, const dlb_error *err,
                            PyObject *device_exc);
/* dlb__raise_status(NULL, err, NULL). */
PyObject *dlb__raise(const dlb_error *err);
/* dlb__raise_status(what, err, NULL), except that DLB_ESYSTEM is
 * OSError(os_errno, message) -- the subclass errno names -- when os_errno
 * is not 0.  The core leaves errno set with DLB_ESYSTEM: pass errno
 * straight from the failed call, before anything else can change it. */
PyObject *dlb__raise_errno(const char *what, const dlb_error *err,
                           int os_errno);
/* "<what>: <message>" as exc whatever the status, except that DLB_ENOMEM
 * stays MemoryError: for failures whose meaning the caller knows better
 * than the status does (a hostile pickle is a ValueError, whichever check
 * refused it).  Returns NULL. */
PyObject *dlb__raise_as(PyObject *exc, const char *what, const dlb_error *err);

/* BufferError "from_dlpack: <what>: <core message>" for a failed core call;
 * MemoryError stays MemoryError.  Returns NULL. */
PyObject *dlb__raise_import(const char *what, const dlb_error *err);

/* BufferError "<what> of type '<type of obj>' cannot be described: <core
 * message>"; MemoryError stays MemoryError.  Returns -1. */
int dlb__raise_view_error(const char *what, PyObject *obj, const dlb_error *err);

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

/* s's UTF-8 text for a C parser; NULL with ValueError when it holds a NUL
 * (the parser would stop there and read a prefix).  what names the value
 * in the message ("dtype name", "typestr"). */
const char *dlb__text_of_name(PyObject *s, const char *what);

/* New DType / Device objects (new references, NULL with an exception). */
PyObject *dlb__dtype_new(dlb_module_state *st, DLDataType dtype);
PyObject *dlb__device_new(dlb_module_state *st, DLDevice device);

/* Read a dtype from a DType, a name str, or any object with a .dtype
 * attribute naming a NumPy-style dtype (numpy.dtype, type objects such as
 * numpy.float32, torch.float32).  0 on success, -1 with ValueError/TypeError. */
int dlb__dtype_converter(dlb_module_state *st, PyObject *obj, DLDataType *out);

/* The int of a device type object, the one rule for producers'
 * __dlpack_device__() and callers' (type, id) tuples: an int (an IntEnum is
 * one), anything with __index__, or an enum.Enum member whose .value is
 * such an int (Open3D's plain-Enum DLDeviceType; the array API types the
 * result Tuple[Enum, int]).  A new reference to an exact int; NULL without
 * an exception when o is none of these (the caller says what it expected);
 * NULL with one when an __index__ or .value raised. */
PyObject *dlb__device_type_int(PyObject *o);

/* Read a device from a Device, "cuda:1", (type, id) tuple, or None (CPU).
 * 0 on success, -1 with an exception. */
int dlb__device_converter(dlb_module_state *st, PyObject *obj, DLDevice *out);
/* The array API's copy= keyword of fn (its name, for the message): True 1,
 * False 0, None -1; anything else is a TypeError (-1 returned, *out left). */
int dlb__copy_converter(PyObject *obj, const char *fn, int *out);

/* A device as text, the core's one spelling (dlb_device_describe): "cpu"
 * for CPU 0, else "cuda:1", "device_type_5:0" for types we do not know.
 * What str(Device) gives; every message uses it too. */
PyObject *dlb__device_text(DLDevice device);

/* The same into buf (n >= DLB_DESCRIBE_MAX holds it all).  Returns buf. */
const char *dlb__device_str(DLDevice device, char *buf, size_t n);

/* Same device type and id. */
int dlb__same_device(DLDevice a, DLDevice b);

/* dlb_dtype_describe into buf: a dtype's name, or "(code C, bits B, lanes
 * L)". */
void dlb__dtype_str(DLDataType dtype, char *buf, size_t n);

/* Module-level functions dtype() and device(). */
PyObject *dlb__py_dtype(PyObject *module, PyObject *arg);
PyObject *dlb__py_device(PyObject *module, PyObject *arg);

/* ---- Python numbers <-> elements (scalars.c) -------------------------------- */

/* The dtypes that have a Python scalar equivalent. */
typedef enum {
  K_NONE = 0,
  K_BOOL,
  K_I8, K_I16, K_I32, K_I64,
  K_U8, K_U16, K_U32, K_U64,
  K_F16, K_F32, K_F64, K_BF16,
  K_C32, K_C64, K_C128
} scalar_kind;

scalar_kind dlb__scalar_kind(DLDataType dt);

/* The element at p as a new Python scalar.  memcpy: tensors need not be
 * aligned. */
PyObject *dlb__read_scalar(scalar_kind k, const char *p);

/* Python number classes, ordered so the inferred dtype is the maximum. */
enum { C_NONE = 0, C_BOOL = 1, C_INT = 2, C_FLOAT = 3, C_COMPLEX = 4 };

/* The class of a leaf of dlb.tensor()'s data; -1 with TypeError when it is
 * not a number. */
int dlb__number_class(PyObject *o);

/* Store o (of number class cls) at p as kind k (dtype named name), range
 * checked: dlb.tensor()'s rules.  0 or -1. */
int dlb__store_scalar(PyObject *o, int cls, scalar_kind k, const char *name,
                      char *p);

/* Storage for a Python number passed as a 0-d tensor. */
typedef union {
  int64_t i;
  uint64_t u;
  double d[2];
  unsigned char bytes[16];
} dlb_scalar;

/* Store Python number obj as dtype dt in *out: 0-d Function parameters'
 * rules (messages name argument argname of fname()).  0 or -1. */
int dlb__scalar_from_number(PyObject *fname, PyObject *argname, PyObject *obj,
                            DLDataType dt, dlb_scalar *out);

/* ---- Formats (formats.c) --------------------------------------------------- */

/* struct-module format of a kind (buffer protocol); NULL when none. */
const char *dlb__buffer_format(scalar_kind k);

/* __array_interface__ typestr of a kind; NULL when NumPy has no name for it
 * (the caller then uses "|V<itemsize>"). */
const char *dlb__array_typestr(scalar_kind k);

/* dtype of a buffer-protocol format string; BufferError when it has none. */
int dlb__buffer_format_dtype(const char *fmt, Py_ssize_t itemsize,
                             DLDataType *out);

/* dtype from an array interface typestr such as '<f4', '|b1', '=i8'. */
int dlb__typestr_dtype(PyObject *ts, DLDataType *out);

/* Byte strides -> DLPack element strides: the one rule of every reader of
 * byte strides (buffers owned and viewed, __array_interface__ and
 * __cuda_array_interface__, NumPy's fields).  A stride must be a multiple
 * of the itemsize, except on a dimension of extent 0 or 1, where it never
 * leads to another element: NumPy leaves whatever it was given there
 * (np.ndarray((10, 5, 1), 'f8', strides=(8, 80, 4))), and such a stride
 * becomes 0, as in NumPy's own DLPack export.  Inline because NumPy's
 * direct read (Function's hot path) runs it per argument.  shape, bstrides
 * and out hold ndim entries.  -1 when every stride converts; otherwise the
 * first dimension that does not, for dlb__raise_stride_not_multiple. */
static inline int dlb__elem_strides(int ndim, const int64_t *shape,
                                    const int64_t *bstrides, int64_t itemsize,
                                    int64_t *out) {
  /* Every NumPy and DLPack itemsize is a power of two: a mask and a shift
   * then do what a 64-bit division (tens of cycles) would.  Negative
   * strides, rare, are still divided (a right shift of a negative number
   * is the implementation's to define). */
  int shift = itemsize == 4 ? 2 : itemsize == 8 ? 3 : itemsize == 1 ? 0
            : itemsize == 2 ? 1 : itemsize == 16 ? 4 : -1;
  for (int i = 0; i < ndim; i++) {
    int64_t b = bstrides[i], q;
    int exact;
    if (shift >= 0 && b >= 0) {
      q = b >> shift;
      exact = (b & (itemsize - 1)) == 0;
    } else {
      q = b / itemsize;
      exact = q * itemsize == b;
    }
    if (!exact) {
      if (shape[i] > 1) return i;
      q = 0;
    }
    out[i] = q;
  }
  return -1;
}
/* dlb__elem_strides' refusal of dimension dim: BufferError "<what> stride
 * S of dimension D is not a multiple of the itemsize N ...".  -1. */
int dlb__raise_stride_not_multiple(const char *what, const int64_t *bstrides,
                                   int dim, int64_t itemsize);

/* The DLTensor (CPU) for a Py_buffer; shape and strides are filled into
 * the caller's arrays of DLB_MAX_NDIM.  0, or -1 with BufferError. */
int dlb__dltensor_from_buffer(const Py_buffer *b, DLTensor *t, int64_t *shape,
                              int64_t *strides);

/* NumPy descr -> DLDataType, filled once per descr through Python
 * attributes and remembered (strong references) in a small cache. */
#define DLB_DESCR_CACHE_SIZE 32
typedef struct {
  PyObject *descr; /* strong; NULL when the slot is free */
  DLDataType dtype;
} dlb_descr_entry;

/* Where the cache's probe for descr starts. */
static inline size_t dlb__descr_home(const PyObject *descr) {
  return (size_t)(((uintptr_t)descr >> 4) % DLB_DESCR_CACHE_SIZE);
}

/* The DLDataType of a NumPy descr, from cache (DLB_DESCR_CACHE_SIZE
 * entries, probed from dlb__descr_home) or, the first time, from
 * descr.kind / .itemsize / .byteorder. */
int dlb__numpy_descr_dtype(dlb_descr_entry *cache, PyObject *descr,
                           DLDataType *out);
void dlb__numpy_descr_cache_clear(dlb_descr_entry *cache);

/* ---- CUDA streams and copies (cuda.c) --------------------------------------- */

/* This thread's current CUDA stream: what dlb.stream(...) set, else the
 * legacy default stream (DLB_CUDA_STREAM_LEGACY; also under dlb.stream(-1),
 * which asks producers for no ordering but still needs a stream for
 * dlbridge's own work); and, as a new Python int, what a DLPack producer is
 * given (1 legacy, 2 per-thread, -1 no ordering, else the handle). */
void *dlb__stream_current(void);
PyObject *dlb__stream_current_object(void);
/* Make stream the current one (C callers that run dlbridge work on a
 * framework's stream); returns the previous one, to swap back. */
void *dlb__stream_swap(void *stream);
/* A CUstream as a DLPack stream value: NULL (the legacy stream) is 1. */
int64_t dlb__cuda_stream_value(void *stream);

/* kDLCUDA or kDLCUDAManaged: memory whose pending work is on a stream. */
int dlb__is_cuda_device(DLDevice device);

/* Order everything queued on producer before later work on consumer
 * (dlb_cuda_stream_order; no host wait).  No-op for devices that are not
 * CUDA.  0, or -1 with an exception. */
int dlb__stream_order(DLDevice device, void *producer, void *consumer);
/* The same with dlbridge's current stream as the consumer, as an import
 * does; nothing under dlb.stream(-1), which asks for no ordering. */
int dlb__stream_order_before_current(DLDevice device, void *producer);

/* A new contiguous tensor on target (CPU, cuda:N or cuda_host) holding a
 * copy of src's elements (any layout; host or CUDA memory), made on the
 * current stream; a host result is complete when this returns.  what
 * names the caller in messages.  0, or -1 with BufferError (devices that
 * cannot be copied between), MemoryError, or BufferError for a driver failure. */
int dlb__copy_managed(const DLTensor *src, uint64_t flags, DLDevice target,
                      const char *what, DLManagedTensorVersioned **out);

/* A new compact tensor on device (CPU, cuda:N on the current stream, or
 * cuda_host), zero-filled when zero; what ("zeros") names the caller in
 * messages.  0, or -1 with an exception. */
int dlb__empty_managed(int32_t ndim, const int64_t *shape, DLDataType dtype,
                       DLDevice device, bool zero, const char *what,
                       DLManagedTensorVersioned **out);

/* Adds _swap_stream and _current_stream to the module. */
int dlb__cuda_init(PyObject *module);

/* ---- Tensor (tensor.c) ------------------------------------------------------ */

typedef struct dlb_TensorObject {
  PyObject_HEAD
  DLTensor t;                        /* the view; see header comment */
  DLManagedTensorVersioned *managed; /* owner of the memory, never NULL */
  uint64_t flags;                    /* DLPACK_FLAG_BITMASK_* of this view */
  Py_ssize_t buffer_exports;         /* live Py_buffer views of us */
  PyObject *weakreflist;
  /* Once dead: the next Tensor on its thread's list of tensors waiting to
   * be released (tensor.c, "destruction"). */
  struct dlb_TensorObject *next_dying;
} dlb_TensorObject;

/* Makes the Tensor type with its own methods and attributes followed by
 * more_methods and more_getset (NULL-terminated, may be NULL): those of
 * files above tensor.c, which module.c hands over. */
int dlb__tensor_init(PyObject *module, dlb_module_state *st,
                     const PyMethodDef *more_methods,
                     const PyGetSetDef *more_getset);

static inline int dlb__is_tensor(dlb_module_state *st, PyObject *obj) {
  return PyObject_TypeCheck(obj, st->TensorType);
}

/* A new Tensor that takes ownership of m (steals it on success AND failure:
 * on failure m's deleter has run).  The view is m->dl_tensor; flags are
 * m->flags.  m must already be validated. */
PyObject *dlb__tensor_from_managed(dlb_module_state *st,
                                   DLManagedTensorVersioned *m);

/* A tuple of n Python ints (new reference, NULL with an exception). */
PyObject *dlb__int64_tuple(int32_t n, const int64_t *v);

/* Note self as exported (export.c, with the GIL): while it lives, an import
 * whose view is exactly self's is answered with self (tensor.c explains). */
void dlb__tensor_note_exported(dlb_TensorObject *self);
/* The live exported Tensor whose view and flags are exactly t's and flags'
 * (borrowed), or NULL.  GIL held. */
PyObject *dlb__tensor_find_exported(const DLTensor *t, uint64_t flags);

/* Python owners of a Tensor's memory: the release contexts of tensors
 * wrapped (dlb_managed_wrap) around memory a Python object owns.  The
 * Tensor's GC traversal recognises exactly these, so every reader that
 * keeps a Python object alive from a managed tensor uses one of them. */
typedef struct {
  PyObject *owner;   /* strong reference or NULL */
  int has_view;      /* view holds a buffer to release */
  Py_buffer view;
} dlb_py_keeper;
/* A zeroed keeper (raw allocator), or NULL with MemoryError. */
dlb_py_keeper *dlb__keeper_new(void);
/* dlb_release_fn of a keeper: releases the buffer and the owner; any
 * thread, with or without the GIL, even at shutdown (then it leaks). */
void dlb__keeper_release(void *ctx);
/* Free a keeper never attached to a managed tensor.  GIL held; NULL ok. */
void dlb__keeper_free(dlb_py_keeper *k);
/* dlb_release_fn whose ctx is a strong reference to the owner itself (the
 * NumPy import: no keeper allocation on that path). */
void dlb__owner_release(void *ctx);

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

/* A legacy "dltensor" capsule of view, whose memory owner keeps alive:
 * the export block and capsule rules of a Tensor's export (a strong
 * reference to owner until the consumer's deleter runs, a capsule nobody
 * took runs it once).  view must be describable by a legacy capsule
 * (writable; not padded sub-byte).  NULL with an exception. */
PyObject *dlb__legacy_capsule_of(PyObject *owner, const DLTensor *view);

/* The Tensor a zero-copy export made by dlb__tensor_export_managed /
 * __dlpack__ keeps alive (borrowed: valid while m is), or NULL when m was
 * not made here.  Its view is the Tensor's (byte_offset folded), its flags
 * the Tensor's: importers return the Tensor instead of wrapping the export
 * again. */
PyObject *dlb__export_source(const DLManagedTensorVersioned *m);
PyObject *dlb__export_source_legacy(const DLManagedTensor *m);

/* dlb.Tensor's own exchange table (process lifetime). */
extern const DLPackExchangeAPI dlb__tensor_exchange_api;

/* The name of the capsule an exchange table is published in. */
#define DLB_EXCHANGE_API_CAPSULE_NAME "dlpack_exchange_api"

/* Check an owned tensor from outside: its major, then its DLTensor.  On
 * failure m has been deleted and BufferError is set ("<what>: ...").
 * 0 or -1. */
int dlb__check_owned(DLManagedTensorVersioned *m, const char *what);

/* Installs __dlpack__, __dlpack_device__ and __dlpack_c_exchange_api__ on
 * st->TensorType; clear forgets st as the table's module. */
int dlb__export_init(dlb_module_state *st);
void dlb__export_clear(dlb_module_state *st);

/* ---- Per-type handlers (handlers.c) ----------------------------------------
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
  DLB_KIND_NONE = 0,   /* the type has no fast path: the ladder's owning
                          rungs (dlb__read_owned) read the object */
  DLB_KIND_TENSOR,     /* dlbridge.Tensor (or subclass): direct struct access */
  DLB_KIND_EXCHANGE,   /* the type publishes a DLPack C exchange table */
  DLB_KIND_NUMPY,      /* numpy.ndarray: fields read directly */
  DLB_KIND_DLPACK,     /* __dlpack__ only: owning export per view */
  DLB_KIND_BUFFER,     /* buffer protocol */
  DLB_KIND_ARRAY_INTERFACE,      /* __array_interface__ */
  DLB_KIND_CUDA_ARRAY_INTERFACE, /* __cuda_array_interface__ */
  DLB_KIND_BUFFER_DLPACK, /* the buffer protocol, cheaper, then __dlpack__
                             for what it refuses (the registry's
                             Framework.read_buffer: JAX) */
  DLB_KIND_TF_EAGER    /* a TensorFlow eager tensor: TF's own capsule export
                          (what its __dlpack__() calls, h->to_capsule),
                          without that method's Python frame */
} dlb_kind;

typedef struct dlb_handler {
  PyTypeObject *type;            /* borrowed; the entry dies with it */
  dlb_kind kind;
  /* The type's exchange table (major 1, after walking prev_api), or NULL.
   * dlb.Tensor's own table is set here too, so producers and consumers
   * share one code path. */
  const DLPackExchangeAPI *api;
  PyObject *api_owner;           /* keeps the capsule/int alive; may be NULL */
  /* DLB_KIND_TF_EAGER: tensorflow.python.pywrap_tfe.TFE_ToDlpackCapsule
   * and the type's _datatype_enum method descriptor, strong; NULL for
   * every other kind. */
  PyObject *to_capsule;
  PyObject *dtype_enum;
  /* DLB_KIND_TF_EAGER: tensorflow.python.pywrap_tfe.TFE_Py_TapeSetIsEmpty
   * (a C function, strong), which a Function call asks once before it reads
   * a TF tensor: a GradientTape or ForwardAccumulator that is recording
   * would see nothing of a kernel run directly (function_call.c); NULL for
   * every other kind. */
  PyObject *tape_empty;
  /* The C++ function behind it, when found (handlers.c): called directly,
   * it costs a few ns where pybind11's dispatch of tape_empty costs ~150. */
  PyObject *(*tape_empty_c)(void);
  /* Framework name from the type's module ("numpy", "torch", "jax",
   * "tensorflow", "cupy", "dlbridge", ...): interned str, strong ref. */
  PyObject *framework;
  /* The type is a graph compiler's placeholder for a tensor (a JAX
   * tracer, a torch fake or functional tensor, a TensorFlow symbolic
   * tensor; the registry's _is_traced): it has no memory to read.  Function
   * hands such a call to the compiler (python/dlbridge/_compiled.py); every
   * other reader treats the type by its kind as before. */
  int traced;
  /* The framework's arrays are immutable (JAX, TensorFlow: the registry's
   * Framework.immutable): Function never writes into one -- a `mut`
   * argument is copied and its new value returned. */
  int immutable;
} dlb_handler;

/* NumPy's array struct, mirrored.  The leading fields of NumPy's
 * PyArrayObject_fields, unchanged from 1.7 through 2.x (NumPy keeps them
 * stable for its own ABI: PyArray_DATA and friends are macros reading
 * them).  We read nothing past flags, so we need no NumPy headers and no
 * NumPy at build time.  handlers.c checks a type is big enough for it;
 * views.c reads it. */
typedef struct {
  PyObject_HEAD
  char *data;
  int nd;
  Py_intptr_t *dimensions;
  Py_intptr_t *strides;
  PyObject *base;
  PyObject *descr;
  int flags;
  PyObject *weakreflist;
} np_array_head;

#define NP_ARRAY_C_CONTIGUOUS 0x0001
#define NP_ARRAY_WRITEABLE 0x0400

/* The cache behind dlb__handler_for (made and freed by handlers.c), and the
 * per-module caches that live with it: NumPy descrs (formats.c, filled by
 * views.c) and framework converters (outputs.c). */
struct dlb_handler_cache {
  struct dlb_handler_entry **slots;
  size_t mask;   /* capacity - 1, capacity a power of two */
  size_t count;
  /* Moves whenever an entry is freed (its type died): a memo taken before
   * (dlb_handler_memo) may point at freed memory and is not used.  Starts
   * at a value no other cache of the process started at. */
  uint64_t generation;
  /* Free-threaded builds: guards slots, mask, count and the entries'
   * versions; generation is also read without it (atomically).  Held for
   * a few loads and stores, never while Python code runs, and waited for
   * attached (pycompat.h: dlb_ft_lock).  Nothing on GIL builds.  A cache
   * line of its own on free-threaded builds: every handler lookup of every
   * thread reads generation, and a lock taken beside it would make each
   * of them miss (issue 26 item 5). */
#ifdef Py_GIL_DISABLED
  char lock_pad_before[64];
  dlb_ft_lock lock;
  char lock_pad_after[64];
#else
  dlb_ft_lock lock;
#endif
  PyObject *callback; /* weakref callback; self = cache_capsule */
  PyObject *cache_capsule;
  int skip_exchange;  /* DLBRIDGE_SKIP_EXCHANGE_API */
  dlb_descr_entry dtypes[DLB_DESCR_CACHE_SIZE];
  PyObject *converters; /* dict framework name -> from_dlpack callable */
  /* dlbridge._streams.framework_stream, imported on first use (outputs.c) */
  PyObject *framework_stream;
  PyObject *targets;    /* dict framework name (or a type bound by
                           type) -> convert's bound target, convert.c */
  /* convert.c: the last `to` (a str or a type, strong) and its bound
   * target (strong): a call naming the same target as the last one finds
   * it by identity, without a dict lookup. */
  PyObject *target_memo_key;
  PyObject *target_memo;
  void *target_memo_pointer; /* what target_memo holds, read without a
                                PyCapsule_GetPointer */
  PyObject *str_module; /* "__module__" */
  PyObject *str_tag_probe; /* an interned name no class defines: looking
                              it up tags a type on 3.11 (pycompat.h) */
  PyObject *str_exchange;        /* "__dlpack_c_exchange_api__" */
  PyObject *str_exchange_legacy; /* "__c_dlpack_exchange_api__" */
  PyObject *str_registry;        /* "dlbridge._frameworks" */
  PyObject *str_type_framework;  /* "_type_framework" */
  PyObject *str_is_traced;       /* "_is_traced" */
  PyObject *str_traits;          /* "_c_traits" */
};

/* The handler for type (borrowed; lives as long as the type).  Never NULL
 * unless an exception is set: a type with no fast path gets a handler with
 * kind DLB_KIND_NONE, cached too.  A type modified since it was classified
 * (its version tag moved) is classified again, which runs Python code: the
 * caller must hold type itself (a reference, or the type is the caller's
 * argument or held by module state) -- for the type of an object, whose
 * class that Python code may change, use dlb__handler_held. */
const dlb_handler *dlb__handler_for(dlb_module_state *st, PyTypeObject *type);

/* The handler of obj's class, that class held in *held (a new reference
 * the caller drops once done with the handler, which lives as long as it).
 * When classifying ran Python code that gave obj another class, the new
 * class is classified instead, so the answer is always that of the class
 * obj has on return; an object whose class changes every time is refused
 * (TypeError).  NULL (*held NULL) with an exception. */
const dlb_handler *dlb__handler_held(dlb_module_state *st, PyObject *obj,
                                     PyTypeObject **held);

/* After a read of obj routed by the handler of routed_by (held) failed
 * with an exception: 1 (exception cleared) when obj should be read again
 * from the start -- Python code the read ran gave obj another class, and
 * the error is one a stale route makes (AttributeError: the old class's
 * method is gone; TypeError, BufferError); 0 to keep the exception.  After
 * a few tries (*tries counts them, starting at 0) the stale route's error
 * becomes dlbridge's TypeError saying so: its AttributeError never reaches
 * the caller. */
int dlb__reread(PyObject *obj, PyTypeObject *routed_by, int *tries);

/* One remembered answer of dlb__handler_for, for a caller that meets the
 * same type call after call (each Function parameter keeps one).  It stands
 * while the cache is the same and has freed nothing since (generation),
 * and the type has the version tag it had then: tags are never reused and
 * a modified class gets a new one, so a hit is the handler dlb__handler_for
 * would return, found without hashing or calling.  Zeroed: empty. */
typedef struct {
  PyTypeObject *type;
  const struct dlb_handler_cache *cache;
  uint64_t generation;
  const dlb_handler *handler;
  unsigned int tag; /* never 0 in a filled memo */
} dlb_handler_memo;

#ifdef Py_GIL_DISABLED
/* Free-threaded builds: the handler this thread last found for type, if it
 * still stands (handlers.c, "each thread's front of the cache"), else NULL.
 * No lock. */
const dlb_handler *dlb__handler_front(const dlb_module_state *st,
                                      PyTypeObject *type);
#endif

/* The memo's handler for type, or NULL when it does not stand (call
 * dlb__handler_for_memo).  Without the GIL a memo shared by the threads
 * calling one Function would be torn by their writes: the thread's own
 * front of the cache answers instead, and memos stay empty. */
static inline const dlb_handler *dlb__handler_memo_get(
    const dlb_module_state *st, const dlb_handler_memo *m,
    PyTypeObject *type) {
#ifdef Py_GIL_DISABLED
  (void)m;
  return dlb__handler_front(st, type);
#else
  const struct dlb_handler_cache *c = st->handlers;
  if (m->type != type || m->cache != c || m->tag != type->tp_version_tag ||
      m->generation != c->generation)
    return NULL;
  return m->handler;
#endif
}

/* dlb__handler_for, refilling m from the answer when the type's version
 * tag still matches the classification (else m is left empty; always on
 * free-threaded builds).  *ran_python is set when Python code may have run
 * (the type was classified): what the caller holds borrowed must be read
 * again. */
const dlb_handler *dlb__handler_for_memo(dlb_module_state *st,
                                         dlb_handler_memo *m,
                                         PyTypeObject *type, int *ran_python);

/* _core._type_framework(type): the framework name cached in type's handler
 * (the registry's answer), for dlbridge.convert. */
PyObject *dlb__py_type_framework(PyObject *module, PyObject *type);

/* Whether type (through its MRO) defines name, looked up as Python looks up
 * special methods: no bound method, a miss raises nothing. */
int dlb__type_has(PyTypeObject *type, PyObject *name);

/* Handlers cached in module state; cleared with the module. */
int dlb__handlers_init(dlb_module_state *st);
void dlb__handlers_clear(dlb_module_state *st);

/* ---- Owning readers (readers.c) --------------------------------------------
 *
 * Each gives an owning, validated managed tensor in *out (0), or -1 with an
 * exception and nothing owned. */

/* Look up an attribute that may be missing: 1 found (*out new ref), 0
 * missing (no exception), -1 error. */
int dlb__get_optional_attr(PyObject *obj, PyObject *name, PyObject **out);

/* Take ownership of the tensor in a DLPack capsule (legacy tensors are
 * wrapped as versioned ones). */
int dlb__consume_capsule(PyObject *cap, DLManagedTensorVersioned **out);

/* Call obj.__dlpack__ (after __dlpack_device__) asking for target / copy
 * (NULL / -1: no request) and consume the capsule it returns. */
int dlb__dunder_dlpack_managed(dlb_module_state *st, PyObject *obj,
                               const DLDevice *target, int copy,
                               DLManagedTensorVersioned **out);

/* The capsule of a legacy producer (toDlpack(), to_dlpack(),
 * to_dlpack_for_write(), to_dlpack_for_read(), TensorFlow's to_dlpack):
 * 1 with *cap set (new ref), 0 not a legacy producer, -1 error. */
int dlb__legacy_producer_capsule(dlb_module_state *st, PyObject *obj,
                                 PyObject **cap);
/* The same capsule consumed: 1 with *out owned and validated (READ_ONLY
 * when it came from to_dlpack_for_read()), 0 not a legacy producer, -1
 * error. */
int dlb__legacy_producer_managed(dlb_module_state *st, PyObject *obj,
                                 DLManagedTensorVersioned **out);

/* obj's buffer (CPU), held until the tensor is deleted. */
int dlb__buffer_managed(PyObject *obj, DLManagedTensorVersioned **out);

/* The v3 __array_interface__ (cuda == 0) or __cuda_array_interface__
 * (cuda == 1) dict ai whose owner is obj; and the same, looking the
 * attribute up on obj. */
int dlb__array_interface_dict_managed(PyObject *obj, PyObject *ai, int cuda,
                                      DLManagedTensorVersioned **out);
int dlb__array_interface_managed(dlb_module_state *st, PyObject *obj, int cuda,
                                 DLManagedTensorVersioned **out);

/* The one "is it tensor-like?" ladder, its owning rungs in DESIGN.md's
 * order: __dlpack__, a raw capsule, a legacy producer, the buffer protocol,
 * __array_interface__, __cuda_array_interface__.  from_dlpack (import.c),
 * Function and the C API (views.c) all come here for an object whose type
 * has no fast path in its handler, so each sees the same objects as
 * tensor-like.  target / copy as for dlb__dunder_dlpack_managed.  1 with
 * *out owned and validated, 0 when obj is none of these (no exception: the
 * caller says "not tensor-like" in its own words), -1 with an exception. */
int dlb__read_owned(dlb_module_state *st, PyObject *obj, const DLDevice *target,
                    int copy, DLManagedTensorVersioned **out);
/* ---- What an exchange table cannot say (torchbits.c) ---------------------- */

/* What an exchange table cannot say about a torch tensor, asked of obj
 * itself: a lazy conjugate or negative bit (is_conj(), is_neg(); the
 * table's DLTensor silently drops them) is a BufferError; a tensor that
 * requires grad is read-only to dlbridge: a BufferError when options has
 * DLB_VIEW_WRITABLE (views.c), else *readonly = 1 (not asked when
 * readonly is NULL; Function reads it as "requires grad").  dtype is the tensor's as its table described it
 * (only a complex tensor can be conjugate, so only one is asked
 * is_conj()).  Objects whose type has no such methods pass (0).
 * *ran_python is set to 1 when Python code may have run (the first torch
 * tensor seen, a subclass's __torch_function__, a Python override).  The
 * answers are read from torch's TensorImpl where an experiment run once
 * found them, else asked.  0 or -1. */
int dlb__check_bits(dlb_module_state *st, PyObject *obj, unsigned options,
                    DLDataType dtype, int *readonly, int *ran_python);
/* obj's TensorImpl *, read at the offset torchbits.c's experiment found
 * (torch_bits is DLB_TORCH_BITS_READ and obj a torch tensor), or NULL when
 * the object holds none. */
static inline const char *dlb__torch_impl(const dlb_module_state *st,
                                          PyObject *obj) {
  const char *o = (const char *)obj, *impl;
  if (st->torch_flag_off >= 0 && o[st->torch_flag_off] != 0) return NULL;
  memcpy(&impl, o + st->torch_impl_off, sizeof impl);
  return impl;
}
/* The hot path of dlb__check_bits for torch tensors, inline: 0 when the
 * experiment found where torch keeps its lazy bits and autograd's pointer,
 * obj is a torch tensor, both bits are clear and autograd never touched
 * it (so it cannot require grad): nothing to check.  1 otherwise (call
 * dlb__check_bits: it reports a set bit, runs the experiment, or asks the
 * tensor). */
static inline int dlb__bits_maybe_set(const dlb_module_state *st,
                                      PyObject *obj) {
  /* torch_bits first (an acquire load without the GIL): READ means
   * torch_base and the offsets are in place. */
  if (DLB_FT_LOAD_INT(&st->torch_bits) != DLB_TORCH_BITS_READ ||
      st->torch_meta_off < 0 ||
      (Py_TYPE(obj)->tp_base != st->torch_base &&
       !PyObject_TypeCheck(obj, st->torch_base)))
    return 1;
  const char *impl = dlb__torch_impl(st, obj);
  if (impl == NULL) return 1;
  uint64_t key, meta;
  memcpy(&key, impl + st->torch_key_off, sizeof key);
  memcpy(&meta, impl + st->torch_meta_off, sizeof meta);
  return (key & (st->torch_neg_mask | st->torch_conj_mask |
                 st->torch_wrap_mask)) != 0 ||
         meta != 0;
}
/* Whether obj, a torch tensor for which dlb__bits_maybe_set said 1, has a
 * functorch wrapper's key bit (a BatchedTensor, a GradTrackingTensor,
 * found by torchbits.c's experiment): ask dlb__torch_functorch_wrapped
 * before reading it.  0 when the bits are not read from the TensorImpl. */
static inline int dlb__torch_wrapper_bit(const dlb_module_state *st,
                                         PyObject *obj) {
  if (st->torch_wrap_mask == 0 ||
      DLB_FT_LOAD_INT(&st->torch_bits) != DLB_TORCH_BITS_READ ||
      (Py_TYPE(obj)->tp_base != st->torch_base &&
       !PyObject_TypeCheck(obj, st->torch_base)))
    return 0;
  const char *impl = dlb__torch_impl(st, obj);
  if (impl == NULL) return 0;
  uint64_t key;
  memcpy(&key, impl + st->torch_key_off, sizeof key);
  return (key & st->torch_wrap_mask) != 0;
}
/* Whether obj is a torch tensor autograd may have touched (its
 * autograd_meta_ is set, or cannot be read): whether it requires grad is
 * then a question (dlb__torch_requires_grad).  0 for anything else.
 * Inline, for Function's reading of its arguments. */
static inline int dlb__torch_autograd_touched(const dlb_module_state *st,
                                              PyObject *obj) {
  PyTypeObject *base = DLB_FT_LOAD_PTR(&st->torch_base);
  if (base == NULL ||
      (Py_TYPE(obj)->tp_base != base && !PyObject_TypeCheck(obj, base)))
    return 0;
  if (DLB_FT_LOAD_INT(&st->torch_bits) != DLB_TORCH_BITS_READ ||
      st->torch_meta_off < 0)
    return 1;
  const char *impl = dlb__torch_impl(st, obj);
  if (impl == NULL) return 1;
  uint64_t meta;
  memcpy(&meta, impl + st->torch_meta_off, sizeof meta);
  return meta != 0;
}
/* Whether obj, a torch tensor seen by dlb__check_bits, requires grad: no
 * question for one autograd never touched, else asked of torch (no Python
 * code runs where torch has DisableTorchFunction, every supported torch).
 * 1, 0, or -1 with an exception. */
int dlb__torch_requires_grad(dlb_module_state *st, PyObject *obj);
/* BufferError: obj requires grad, and writing into it would go behind
 * autograd's back.  Returns -1. */
int dlb__refuse_grad_write(PyObject *obj);
/* Whether torch's grad mode is on (torch.is_grad_enabled(): off under
 * torch.no_grad() and in inference mode): 1, 0, or -1 with an exception.
 * Only once a torch tensor was seen (dlb__check_bits); runs no Python. */
int dlb__torch_grad_enabled(dlb_module_state *st);
/* Whether a forward-mode AD level is entered and forward grad is on (a
 * dual tensor may carry a tangent; off inside an autograd.Function's
 * forward, which is what lets dlbridge's own run the kernel): 1, 0, or -1
 * with an exception.  Runs no Python code (one module attribute read,
 * one C function). */
int dlb__torch_forward_ad_on(dlb_module_state *st);
/* After reading obj failed with an exception: whether obj is a tensor a
 * functorch transform wrapped (a BatchedTensor, a GradTrackingTensor: no
 * memory of its own to read) -- 1 with the exception cleared (the call is
 * torch's, _ops_torch), else 0 with the exception kept (also called with
 * none pending, before reading a tensor dlb__torch_wrapper_bit points
 * at).  Runs torch's C function. */
int dlb__torch_functorch_wrapped(dlb_module_state *st, PyObject *obj);
/* Tell autograd that the torch tensors among objs[0..n) were written in
 * place: their version counters move (views share their base's), so a
 * backward that saved one raises as after torch's own in-place ops;
 * inference tensors have none and are skipped, as torch does.  Other
 * objects are ignored.  0, or -1 with an exception. */
int dlb__torch_bump_versions(dlb_module_state *st, PyObject *const *objs,
                             int n);
/* What torchbits.c keeps of torch in module state, for module.c's
 * traverse and clear. */
int dlb__torch_traverse(dlb_module_state *st, visitproc visit, void *arg);
void dlb__torch_clear(dlb_module_state *st);

/* ---- Borrowed views (views.c) ----------------------------------------------- */

/* A borrowed view of a tensor-like object, for the length of one call.
 * Lives on the caller's stack; nothing in it is allocated for the dlbridge,
 * NumPy, exchange-table (dltensor_from_py_object_no_sync) and buffer paths. */
typedef struct {
  DLTensor t;                 /* valid until dlb__view_release */
  uint64_t flags;             /* DLPACK_FLAG_BITMASK_READ_ONLY, ... */
  const dlb_handler *handler; /* how the object was read: the handler of
                                 the class obj has when dlb__view_get
                                 returns, valid while obj keeps it */
  DLManagedTensorVersioned *owned; /* owning export made for this view */
  Py_buffer buffer;           /* held when has_buffer */
  int has_buffer;
  int64_t strides_storage[DLB_MAX_NDIM]; /* strides converted from bytes */
} dlb_view;

/* Options for dlb__view_get. */
enum {
  DLB_VIEW_WRITABLE = 1u << 0, /* fail with BufferError if read-only */
  /* The caller already ran dlb__check_bits on obj (Function does,
   * before any borrowed view is taken, because the check may run Python
   * code); the view skips it. */
  DLB_VIEW_BITS_CHECKED = 1u << 1
};

/* Fill view for obj (which the caller keeps alive until release).  0 on
 * success; -1 with TypeError (not tensor-like), BufferError (cannot be
 * described, or read-only with DLB_VIEW_WRITABLE).  On failure nothing needs
 * releasing. */
int dlb__view_get(dlb_module_state *st, PyObject *obj, unsigned options,
                  dlb_view *view);
/* dlb__view_get for a caller that already holds h = the handler of
 * Py_TYPE(obj) (saves the second lookup). */
int dlb__view_get_with(dlb_module_state *st, const dlb_handler *h,
                       PyObject *obj, unsigned options, dlb_view *view);
/* dlb__view_get_with for h->kind DLB_KIND_NUMPY and no options: a NumPy
 * array read straight from its fields (nothing to release); *row_major is
 * NumPy's C_CONTIGUOUS flag (compact row-major, known without a walk). */
int dlb__view_numpy(dlb_module_state *st, const dlb_handler *h,
                    PyObject *obj, dlb_view *view, int *row_major);
/* The borrowed exchange-table view (h->api has
 * dltensor_from_py_object_no_sync) for a caller that has run
 * dlb__check_bits on obj already: dlb__view_get_with's EXCHANGE path,
 * inline for Function, which reads torch tensors this way on every call.
 * NOT validated: the caller validates v->t before anything reads its shape
 * (dlb__view_fill does; Function does in its checking pass, with the
 * validator inline).  The entry cannot say read-only; dlb__check_bits
 * refused what must not be written.  0, or -1 with an exception and
 * nothing to release. */
static inline int dlb__view_exchange_borrowed(const dlb_handler *h,
                                              PyObject *obj, dlb_view *v) {
  v->handler = h;
  v->owned = NULL;
  v->has_buffer = 0;
  v->flags = 0;
  if (h->api->dltensor_from_py_object_no_sync(obj, &v->t) != 0) {
    dlb__error_exchange_refusal(Py_TYPE(obj), "describe");
    return -1;
  }
  return 0;
}
/* dlb__view_get_with reading obj as kind (h's own kind, or a forced one for
 * the tests and benchmarks). */
int dlb__view_fill(dlb_module_state *st, PyObject *obj, unsigned options,
                   const dlb_handler *h, dlb_kind kind, dlb_view *view);
void dlb__view_release(dlb_view *view);

/* ---- Streams, allocation, results (outputs.c) ------------------------------- */

/* The framework's current work stream for device (NULL on CPU, and NULL for
 * the legacy default stream on CUDA): its exchange table's
 * current_work_stream; for dlbridge, its current stream (dlb.stream); for
 * CUDA tensors of other frameworks, dlbridge._streams.framework_stream
 * (torch's or CuPy's current stream, else dlbridge's).  0, or -1 with an
 * exception. */
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

/* ---- Import (import.c) ------------------------------------------------------ */

/* dlbridge.from_dlpack(obj, /, *, device=None, copy=None). */
PyObject *dlb__py_from_dlpack(PyObject *module, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames);

/* Import any tensor-like obj as a Tensor (new reference).  device: NULL for
 * "where it is"; copy: -1 None, 0 False, 1 True. */
PyObject *dlb__import(dlb_module_state *st, PyObject *obj,
                      const DLDevice *device, int copy);

/* ---- Convert (convert.c) ----------------------------------------------------- */

/* dlbridge.convert(obj, to, *, copy=None, device=None). */
PyObject *dlb__py_convert(PyObject *module, PyObject *const *args,
                          Py_ssize_t nargs, PyObject *kwnames);

/* obj as a tensor of the framework `to` stands for (a registry name, a
 * type or an object of the framework), under convert's rules: device as
 * for dlb__import, copy -1 None, 0 False, 1 True.  New reference. */
PyObject *dlb__convert(dlb_module_state *st, PyObject *obj, PyObject *to,
                       const DLDevice *device, int copy);

/* Whether framework name is a convert target (the registry's FRAMEWORKS):
 * 1, 0, or -1 with an exception. */
int dlb__convert_is_target(dlb_module_state *st, PyObject *name);

/* ---- Function (function_*.c), the C API capsule (capi.c), tests (testing.c) */

/* Adds the Function type and load() to the module. */
int dlb__function_init(PyObject *module, dlb_module_state *st);

/* What a graph compiler's op (src/ops/) needs of a Function.  GIL held
 * unless a line says otherwise. */
/* Whether obj is a dlbridge.Function. */
int dlb__function_check(PyObject *obj);
/* The signature's records: *nin inputs, then *nout results. */
const dlb_signature_param *dlb__function_params(PyObject *fn, int32_t *nin,
                                                int32_t *nout);
/* The name, UTF-8 (valid while fn lives; needs no GIL). */
const char *dlb__function_name(PyObject *fn);
/* Whether two Functions run the same kernel (same address). */
int dlb__function_same_kernel(PyObject *a, PyObject *b);
/* The compiled identity "<name>_<16 hex digits>": a 64-bit hash of the
 * signature in one spelling, the same in every process (new reference). */
PyObject *dlb__function_identity(PyObject *fn);
/* The signature in one spelling, what the identity hashes (new
 * reference): the registry compares it whole. */
PyObject *dlb__function_normalized(PyObject *fn);
/* Tests only (testing.c): make fn's identity the str identity, before it
 * was made.  0, or -1 with ValueError (already made) or TypeError. */
int dlb__function_force_identity(PyObject *fn, PyObject *identity);
/* Run fn's kernel on argv: its nin inputs then nout results, in signature
 * order, each checked against the signature first (dtype, rank, extents;
 * a Python number arrives as the 0-d tensor it was made into); stream as
 * the kernel ABI says.  A Function with `...` parameters gets the eager
 * call's batch rule: B is the broadcast of its inputs' batch parts, every
 * result and `mut` input must be all of B, and the kernel sees every
 * `...` tensor left-padded to B's rank (extent 1, stride 0, strides
 * written: dlb_signature_batch_pad).  Needs neither Python nor the GIL, so
 * a compiler calls it from its own threads; the caller keeps fn alive.
 * DLB_OK, or a negative status with err saying "<name>: ...". */
int dlb__function_run(PyObject *fn, DLTensor *const *argv, int32_t nargs,
                      void *stream, dlb_error *err);
/* dlb__function_run in two halves: the check of argv against the
 * signature (its errors; depends only on argv's count, dtypes and shapes),
 * then the run of a call that passed it (batch dims, the kernel).  A
 * caller that saw the same dtypes and shapes pass may skip the first. */
int dlb__function_check_run(PyObject *fn, DLTensor *const *argv,
                            int32_t nargs, dlb_error *err);
int dlb__function_run_checked(PyObject *fn, DLTensor *const *argv,
                              int32_t nargs, void *stream, dlb_error *err);
/* Whether dlb__function_run_checked would hand argv to the kernel as it
 * is: no `...` parameter, or every `...` tensor already of the broadcast
 * batch rank, with strides, and the batch parts broadcasting.  Depends
 * only on argv's dtypes, shapes and whether it has strides, so a caller
 * that saw 1 for them may call dlb__function_run_as_is -- the kernel,
 * nothing else -- for later calls of the same (a compiled call site). */
int dlb__function_runs_as_is(PyObject *fn, DLTensor *const *argv,
                             int32_t nargs);
int dlb__function_run_as_is(PyObject *fn, DLTensor *const *argv,
                            int32_t nargs, void *stream, dlb_error *err);
/* dlb__function_run once per item of a loop over the first nloop dims of
 * the call (a Function under a vmap that its signature cannot batch): the
 * results and every `...` tensor have them in front, a tensor of a
 * parameter without `...` has them or not (then every item gets it whole:
 * a number, an operand the vmap does not batch), all with the same
 * extents.  Each item is a view (dims after the loop's, strides the
 * tensor's, byte offset moved on; a 0-d parameter's item is 0-d), in
 * row-major order; the first failing item's status ends the loop.  Needs
 * no GIL; nloop 0 is dlb__function_run. */
int dlb__function_run_looped(PyObject *fn, DLTensor *const *argv,
                             int32_t nargs, int32_t nloop, void *stream,
                             dlb_error *err);
/* Result o's shape into shape (DLB_MAX_NDIM entries) and its rank into
 * *ndim: a `...` result's batch shape (the broadcast of the inputs' batch
 * parts) then its core extents from the inputs in argv that bound their
 * names (not checked: dlb__function_run checks).  Only the inputs of argv
 * are read.  DLB_OK, or DLB_EINVAL with err (the inputs' batch parts do not
 * broadcast).  Needs no GIL. */
int dlb__function_result_shape(PyObject *fn, DLTensor *const *argv,
                               int32_t o, int64_t *shape, int32_t *ndim,
                               dlb_error *err);
/* Adds the dlbridge._C_API capsule (include/dlbridge/python.h). */
int dlb__capi_init(PyObject *module, dlb_module_state *st);

/* Adds every private hook for the tests (testing.c): allocation-failure
 * injection through the core allocator, live-block counts, and the
 * _exchange_* hooks. */
int dlb__testing_init(PyObject *module, dlb_module_state *st);

/* dlb.Tensor's own exchange table (process lifetime). */
extern const DLPackExchangeAPI dlb__tensor_exchange_api;

/* Readers shared with views.c (readers.c).  Each gives an owning, validated
 * managed tensor in *out (0), or -1 with an exception and nothing owned. */
int dlb__dunder_dlpack_managed(dlb_module_state *st, PyObject *obj,
                               const DLDevice *target, int copy,
                               DLManagedTensorVersioned **out);
int dlb__array_interface_managed(dlb_module_state *st, PyObject *obj, int cuda,
                                 DLManagedTensorVersioned **out);
/* A TensorFlow eager tensor (h: its DLB_KIND_TF_EAGER handler) through
 * h->to_capsule: the legacy capsule TF's __dlpack__() returns, ready to
 * read (TF waits for pending work before it returns).  Strings, resources
 * and variants are a BufferError before TF is asked: TF 2.21 aborts the
 * process on them (its __dlpack__ does too). */
int dlb__tf_eager_managed(const dlb_handler *h, PyObject *obj,
                          DLManagedTensorVersioned **out);
/* dlb__view_get for a caller that already holds h = the handler of
 * Py_TYPE(obj) (saves the second lookup). */
int dlb__view_get_with(dlb_module_state *st, const dlb_handler *h,
                       PyObject *obj, unsigned options, dlb_view *view);
/* dtype of a buffer-protocol format string; BufferError when it has none. */
int dlb__buffer_format_dtype(const char *fmt, Py_ssize_t itemsize,
                             DLDataType *out);

/* ---- Functions in compiled graphs (src/ops/) ------------------------------- */

/* At most this many Function identities are registered for compiled
 * graphs in one process (ops/registry.c; a power of two). */
#define DLB_OPS_MAX 4096

/* Register fn for compiled graphs under its identity, idempotently: on
 * success *registered is the Function registered under it (fn itself the
 * first time; alive until exit).  ValueError when a Function with another
 * signature (a hash collision) or another kernel holds the identity,
 * RuntimeError past DLB_OPS_MAX.  GIL held.  0 or -1. */
int dlb__ops_register(PyObject *fn, PyObject **registered);
/* The Function registered under identity (len bytes, UTF-8), borrowed and
 * alive until exit; NULL when none.  Lock-free; needs no GIL. */
PyObject *dlb__ops_find(const char *identity, size_t len);
/* Adds _ops_register and _ops_find to the module. */
int dlb__ops_registry_init(PyObject *module);
/* Adds _tf_register, _tf_dtype and _TF_OP to the module (ops/tf.c). */
int dlb__ops_tf_init(PyObject *module);
/* Adds _xla_handler (the XLA FFI handlers as capsules) and _xla_ffi_layout
 * to the module (ops/xla.c). */
int dlb__ops_xla_init(PyObject *module);

/* ---- Pickling (pickle.c) --------------------------------------------------- */

/* The DLPack flags a pickle or a shared tensor's handle carries; any other
 * bit is dropped. */
#define DLB_PICKLED_FLAGS \
  (DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)

/* Tensor.__reduce_ex__ for a tensor that is not shared (share.c
 * dispatches) and Tensor.__deepcopy__(memo). */
PyObject *dlb__tensor_reduce_ex(PyObject *self, PyObject *protocol);
PyObject *dlb__tensor_deepcopy(PyObject *self, PyObject *memo);
/* Adds _rebuild_tensor to the module. */
int dlb__pickle_init(PyObject *module, dlb_module_state *st);

/* The layout a pickle describes, read once for every rebuild (a buffer's,
 * a shared-memory handle's, a CUDA IPC handle's). */
typedef struct {
  DLTensor t;                   /* data NULL until placed; device CPU */
  int64_t shape[DLB_MAX_NDIM];
  int64_t strides[DLB_MAX_NDIM];
  uint64_t flags;               /* DLB_PICKLED_FLAGS bits */
  int64_t lo, hi;               /* bytes [lo, hi) it reads, from element 0 */
} dlb_pickled_layout;

/* Read args[0..3] -- dtype as (code, bits, lanes), shape, strides (a tuple,
 * or None for row-major), flags -- into *out, validated as any imported
 * tensor is, with the byte span it reads.  A pickle may be hostile: 0, or
 * -1 with ValueError (TypeError for a flags value that is no int). */
int dlb__parse_pickled_layout(PyObject *const *args, dlb_pickled_layout *out);
/* Put l's element 0 at base + offset in an area of size bytes (what names
 * it in messages: "buffer", "segment", "allocation"); every byte l reads,
 * before element 0 (negative strides) and after it, must lie in the area.
 * base NULL: only check that l fits an area of that size.  0, or -1 with
 * ValueError. */
int dlb__place_pickled_layout(dlb_pickled_layout *l, char *base,
                              long long offset, int64_t size,
                              const char *what);

/* ---- Shared tensors (share_shm.c, share_ipc.c, share.c) ---------------------
 *
 * Two transports, one file each, with the same four verbs: holds (is a
 * tensor's memory in one of our shared areas?), share (copy a tensor into
 * a new one), reduce (the handle a shared tensor pickles as), and the
 * rebuild of that handle.  share.c is the policy above them: share(),
 * is_shared, and which __reduce_ex__ a Tensor gets. */

/* The bytes [*lo, *hi) t's elements occupy, in the address space of its
 * device; false when t has no byte span (no exception). */
static inline bool dlb__element_range(const DLTensor *t, const char **lo,
                                      const char **hi) {
  int64_t a = 0, z = 0;
  if (t->data == NULL || dlb_tensor_byte_span(t, &a, &z, NULL) != DLB_OK)
    return false;
  const char *base = (const char *)dlb_tensor_data(t);
  *lo = base + a;
  *hi = base + z;
  return true;
}

/* share_shm.c: host tensors in POSIX shared memory (src/core/shm.c). */
/* Whether t's elements lie in a segment this process maps. */
bool dlb__shm_holds(const DLTensor *t);
/* A new Tensor over a copy, in a new segment, of view's tensor (row-major,
 * view's read-only flag kept).  NULL with an exception. */
PyObject *dlb__shm_share(dlb_module_state *st, const dlb_view *view);
/* (_rebuild_shared, (name, offset, dtype, shape, strides, flags)), one
 * handle counted in flight; BufferError when self is not in a segment. */
PyObject *dlb__shm_reduce(dlb_module_state *st, dlb_TensorObject *self);
/* Adds _rebuild_shared, _shm_cleanup and _shm_info to the module. */
int dlb__share_shm_init(PyObject *module);

/* share_ipc.c: CUDA tensors through CUDA IPC (src/core/cuda_ipc.c). */
/* Whether t's elements lie in IPC memory this process allocated or
 * opened. */
bool dlb__ipc_holds(const DLTensor *t);
/* share() of the CUDA tensor obj: obj itself as a Tensor when it already
 * lies in IPC memory, else a Tensor over a copy in a new IPC allocation
 * (made on the current stream).  NULL with an exception. */
PyObject *dlb__ipc_share(dlb_module_state *st, PyObject *obj);
/* (_rebuild_cuda_shared, (handle, offset, dtype, shape, strides, flags));
 * BufferError when self is not in IPC memory. */
PyObject *dlb__ipc_reduce(dlb_module_state *st, dlb_TensorObject *self);
/* Adds _rebuild_cuda_shared to the module. */
int dlb__share_ipc_init(PyObject *module);

/* share.c: the policy. */
/* True when self's elements lie in memory another process can map: a
 * segment or IPC memory of this process (Tensor.is_shared). */
int dlb__tensor_is_shared(const dlb_TensorObject *self);
/* What share.c adds to Tensor: __reduce_ex__, __deepcopy__, is_shared.
 * module.c hands them to dlb__tensor_init, so the type is made with them
 * (it is immutable: nothing is added to it afterwards). */
extern PyMethodDef dlb__share_tensor_methods[];
extern PyGetSetDef dlb__share_tensor_getset[];
/* Adds share() to the module, and each transport's functions. */
int dlb__share_init(PyObject *module, dlb_module_state *st);

#endif /* DLB_PYTHON_DLBRIDGE_PY_H_ */
