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
} dlb_module_state;

extern PyModuleDef dlb__module_def;

/* State of the module that defined type (a Tensor, DType or Device type, or
 * a subclass of one).  Never NULL for our own types. */
dlb_module_state *dlb__state_from_type(PyTypeObject *type);

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

#endif /* DLB_PYTHON_DLBRIDGE_PY_H_ */
