/*
 * dlbridge/python.h -- the C API of dlbridge for Python extension modules.
 *
 * An extension written in C (or C++) reads tensors of every framework dlbridge
 * understands -- NumPy, PyTorch, CuPy, JAX, TensorFlow, dlbridge.Tensor,
 * buffer-protocol objects -- as plain DLTensors, allocates results in the
 * caller's framework and hands them back, without linking against dlbridge:
 * everything goes through one table of function pointers that dlbridge._core
 * publishes as the capsule `dlbridge._core._C_API` (capsule name
 * "dlbridge._C_API").  The pattern is NumPy's import_array().
 *
 *   #include <dlbridge/python.h>      // compile with -I dlbridge.get_include()
 *
 *   static int my_exec(PyObject *m) {
 *     if (dlb_import_capi() < 0) return -1;   // ImportError on mismatch
 *     ...
 *   }
 *
 * Rules shared by every function below:
 *  - Call with the GIL held, after dlb_import_capi() succeeded.
 *  - int results are 0 on success, -1 with a Python exception set (TypeError:
 *    not tensor-like or wrong argument; BufferError: cannot be described, or
 *    read-only when writing was asked; ValueError: a bad value; MemoryError).
 *  - Out-parameters are written only on success.
 *  - "Steals" means the function owns the argument on success AND failure.
 *
 * Several translation units.  By default each file that includes this header
 * gets its own static table pointer and must call dlb_import_capi() itself.
 * To share one pointer, do what NumPy's PY_ARRAY_UNIQUE_SYMBOL does: define
 * DLB_CAPI_UNIQUE_SYMBOL to a name of your own in every file before the
 * include, and DLB_CAPI_NO_IMPORT as well in every file but the one that
 * calls dlb_import_capi().
 *
 * Sub-interpreters: the table of each dlbridge._core module instance carries
 * its own module state, and every entry takes the table as its first
 * argument.  The convenience functions use one process-wide pointer; an
 * extension that runs in several interpreters stores the result of
 * dlb_capi_get() in its own module state and calls api->view_get(api, ...).
 */
#ifndef DLBRIDGE_PYTHON_H_
#define DLBRIDGE_PYTHON_H_

#ifndef PY_SSIZE_T_CLEAN
#define PY_SSIZE_T_CLEAN
#endif
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

#include "dlpack/dlpack.h"
#include "dlbridge/dlbridge.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version of the table: (major << 16) | minor.  A major change breaks
 * compiled extensions (they refuse to import); a minor one only appends
 * entries to dlb_capi, which an extension checks with DLB_CAPI_HAS before
 * calling, so an extension built against a newer header still runs on an
 * older dlbridge as long as it does not call what is missing. */
#define DLB_CAPI_MAJOR 1
#define DLB_CAPI_MINOR 0
#define DLB_CAPI_VERSION ((DLB_CAPI_MAJOR << 16) | DLB_CAPI_MINOR)

/* Where the table lives. */
#define DLB_CAPI_MODULE "dlbridge._core"
#define DLB_CAPI_ATTRIBUTE "_C_API"
#define DLB_CAPI_CAPSULE_NAME "dlbridge._C_API"

/* Options of dlb_py_view_get. */
enum {
  /* Fail with BufferError unless the memory may be written. */
  DLB_PY_VIEW_WRITABLE = 1u << 0
};

/* Bytes a dlb_py_view occupies (on 64-bit platforms).  Fixed for a major
 * version: dlbridge keeps its private state in the reserved tail and checks
 * at import that it fits, so the struct can be allocated on the caller's
 * stack without a heap allocation per call. */
#define DLB_PY_VIEW_SIZE 1024

/* A borrowed view of a tensor-like object, valid from a successful
 * dlb_py_view_get until dlb_py_view_release.  Read `tensor` and `flags`;
 * never write them, never touch `private_`, and never copy or move the
 * struct while the view is live (tensor.strides may point into it). */
typedef struct dlb_py_view {
  DLTensor tensor;  /* data, device, ndim, dtype, shape, strides (never NULL
                       when ndim > 0), byte_offset */
  uint64_t flags;   /* DLPACK_FLAG_BITMASK_READ_ONLY, ..._IS_COPIED, ... */
  union {
    unsigned char bytes[DLB_PY_VIEW_SIZE - sizeof(DLTensor) - sizeof(uint64_t)];
    void *align_pointer_;
    int64_t align_int64_;
    double align_double_;
  } private_;
} dlb_py_view;

typedef struct dlb_capi dlb_capi;

/* The table.  abi_version and size come first and never move. */
struct dlb_capi {
  uint32_t abi_version; /* DLB_CAPI_VERSION of the dlbridge that made it */
  uint32_t size;        /* sizeof(dlb_capi) there: entries past it are absent */
  uint32_t view_size;   /* bytes of dlb_py_view that dlbridge writes */
  uint32_t reserved_;

  /* ---- 1.0 ---- */

  /* Borrow a view of obj (flags: DLB_PY_VIEW_*).  Nothing is copied and, for
   * dlbridge, NumPy, buffer and exchange-table objects, nothing allocated.
   * The caller keeps obj alive until release.  On failure there is nothing
   * to release. */
  int (*view_get)(const dlb_capi *api, PyObject *obj, unsigned flags,
                  dlb_py_view *view);
  /* End a view from a successful view_get; exactly once. */
  void (*view_release)(const dlb_capi *api, dlb_py_view *view);

  /* An owning managed tensor for obj (zero-copy; it keeps obj's memory
   * alive).  The caller owns *out and runs its deleter exactly once, from
   * any thread: the deleter takes the GIL itself when it needs it. */
  int (*import_managed)(const dlb_capi *api, PyObject *obj,
                        DLManagedTensorVersioned **out);

  /* m as a Python object (new reference in *out) of the framework named by
   * framework ("numpy", "torch", "cupy", "jax", "tensorflow", "dlbridge"),
   * or of like's framework, or a dlbridge.Tensor when both are NULL; giving
   * both is a ValueError.  Steals m.  Uses the framework's DLPack exchange
   * table when it has one, its from_dlpack otherwise. */
  int (*export_managed)(const dlb_capi *api, DLManagedTensorVersioned *m,
                        const char *framework, PyObject *like,
                        PyObject **out);

  /* A new contiguous tensor of ndim/shape/dtype, allocated by like's
   * framework on like's device (dlbridge's allocator when the framework has
   * no exchange table).  Contents uninitialised.  The caller owns *out. */
  int (*alloc_like)(const dlb_capi *api, PyObject *like, int32_t ndim,
                    const int64_t *shape, DLDataType dtype,
                    DLManagedTensorVersioned **out);

  /* The current work stream of obj's framework on obj's device (a
   * cudaStream_t as void *); NULL on the CPU and for the legacy default
   * stream. */
  int (*current_stream)(const dlb_capi *api, PyObject *obj, void **stream);

  /* Raise err as the Python exception dlbridge uses for its code
   * (DLB_ENOMEM -> MemoryError, DLB_EINVAL/EOVERFLOW -> ValueError,
   * DLB_EUNSUPPORTED/EVERSION/EREADONLY -> BufferError, DLB_ESYSTEM ->
   * OSError, else RuntimeError).
   * Returns NULL, so `return dlb_py_raise(&err);` ends a method. */
  PyObject *(*raise_error)(const dlb_capi *api, const dlb_error *err);
};

/* True when the table api has entry `member` (added in some minor version). */
#define DLB_CAPI_HAS(api, member)                                        \
  ((api) != NULL && (api)->size >= offsetof(dlb_capi, member) +          \
                                       sizeof(((dlb_capi *)0)->member) && \
   (api)->member != NULL)

/* ---- finding the table ------------------------------------------------------ */

/* Import dlbridge._core and return its table (borrowed: it lives as long as
 * that module, which the table itself keeps alive), or NULL with
 * ImportError when dlbridge is missing, the capsule is not ours, or its ABI
 * major differs from the one this header was written for. */
static inline const dlb_capi *dlb_capi_get(void) {
  PyObject *module = NULL, *capsule = NULL;
  const dlb_capi *api = NULL;

  module = PyImport_ImportModule(DLB_CAPI_MODULE);
  if (module == NULL) goto done;
  capsule = PyObject_GetAttrString(module, DLB_CAPI_ATTRIBUTE);
  if (capsule == NULL || !PyCapsule_IsValid(capsule, DLB_CAPI_CAPSULE_NAME)) {
    PyErr_Clear();
    PyErr_SetString(PyExc_ImportError,
                    DLB_CAPI_MODULE "." DLB_CAPI_ATTRIBUTE " is not a capsule "
                    "named \"" DLB_CAPI_CAPSULE_NAME "\": dlbridge is broken or "
                    "too old for this extension");
    goto done;
  }
  api = (const dlb_capi *)PyCapsule_GetPointer(capsule, DLB_CAPI_CAPSULE_NAME);
  if (api == NULL) goto done;
  if ((api->abi_version >> 16) != DLB_CAPI_MAJOR) {
    PyErr_Format(PyExc_ImportError,
                 "dlbridge C API version %u.%u is not compatible with the "
                 "version %d.%d this extension was built for (the major "
                 "versions differ): rebuild the extension against the "
                 "installed dlbridge",
                 (unsigned)(api->abi_version >> 16),
                 (unsigned)(api->abi_version & 0xffffu), DLB_CAPI_MAJOR,
                 DLB_CAPI_MINOR);
    api = NULL;
    goto done;
  }
  if (api->size < offsetof(dlb_capi, raise_error) + sizeof(api->raise_error) ||
      api->view_size > sizeof(dlb_py_view)) {
    PyErr_Format(PyExc_ImportError,
                 "dlbridge C API table is malformed (size %u, view size %u; "
                 "this extension has view size %u)",
                 (unsigned)api->size, (unsigned)api->view_size,
                 (unsigned)sizeof(dlb_py_view));
    api = NULL;
    goto done;
  }
done:
  Py_XDECREF(capsule);
  Py_XDECREF(module);
  return api;
}

/* ---- the table pointer used by the convenience functions --------------------- */

#if defined(DLB_CAPI_UNIQUE_SYMBOL)
#define dlb_capi_ptr DLB_CAPI_UNIQUE_SYMBOL
#if defined(DLB_CAPI_NO_IMPORT)
extern const dlb_capi *DLB_CAPI_UNIQUE_SYMBOL;
#else
extern const dlb_capi *DLB_CAPI_UNIQUE_SYMBOL;
const dlb_capi *DLB_CAPI_UNIQUE_SYMBOL = NULL;
#endif
#else
static const dlb_capi *dlb_capi_ptr = NULL;
#endif

#if !defined(DLB_CAPI_NO_IMPORT)
/* Fill this file's (or the shared) table pointer: 0, or -1 with ImportError.
 * Call it from the module's exec slot (or PyInit_ function).  On failure the
 * pointer keeps its previous value. */
static inline int dlb_import_capi(void) {
  const dlb_capi *api = dlb_capi_get();
  if (api == NULL) return -1;
  dlb_capi_ptr = api;
  return 0;
}
#endif

/* ---- convenience functions over dlb_capi_ptr --------------------------------- */

static inline int dlb_py_view_get(PyObject *obj, unsigned flags,
                                  dlb_py_view *view) {
  return dlb_capi_ptr->view_get(dlb_capi_ptr, obj, flags, view);
}
static inline void dlb_py_view_release(dlb_py_view *view) {
  dlb_capi_ptr->view_release(dlb_capi_ptr, view);
}
static inline DLTensor *dlb_py_view_tensor(dlb_py_view *view) {
  return &view->tensor;
}
static inline int dlb_py_import(PyObject *obj, DLManagedTensorVersioned **out) {
  return dlb_capi_ptr->import_managed(dlb_capi_ptr, obj, out);
}
static inline int dlb_py_export(DLManagedTensorVersioned *m,
                                const char *framework, PyObject *like,
                                PyObject **out) {
  return dlb_capi_ptr->export_managed(dlb_capi_ptr, m, framework, like, out);
}
static inline int dlb_py_alloc_like(PyObject *like, int32_t ndim,
                                    const int64_t *shape, DLDataType dtype,
                                    DLManagedTensorVersioned **out) {
  return dlb_capi_ptr->alloc_like(dlb_capi_ptr, like, ndim, shape, dtype, out);
}
static inline int dlb_py_current_stream(PyObject *obj, void **stream) {
  return dlb_capi_ptr->current_stream(dlb_capi_ptr, obj, stream);
}
static inline PyObject *dlb_py_raise(const dlb_error *err) {
  return dlb_capi_ptr->raise_error(dlb_capi_ptr, err);
}

/* Run m's deleter (NULL and a NULL deleter are fine).  The same as
 * dlb_managed_delete, here so extensions need not link libdlbridge. */
static inline void dlb_py_managed_delete(DLManagedTensorVersioned *m) {
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DLBRIDGE_PYTHON_H_ */
