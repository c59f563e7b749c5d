/*
 * module.c -- dlbridge._core: module definition, per-module state and the
 * module-level method table.  Multi-phase init, so the module can be
 * re-created (sub-interpreters, importlib.reload) without sharing state; no
 * framework is imported here or anywhere at import time.
 *
 * The top of src/python's layering (dlbridge_py.h): exec initialises every
 * other file, lowest first; clear undoes them.  The state struct itself is
 * declared in dlbridge_py.h, and every file finds it through
 * dlb__state_from_type there.
 */
#include "dlbridge_py.h"

static int intern_name(PyObject **slot, const char *name) {
  *slot = PyUnicode_InternFromString(name);
  return *slot == NULL ? -1 : 0;
}

/* dlbridge runs in the main interpreter only.  Deleters may run on any
 * thread and take the GIL with PyGILState_Ensure, which always attaches to
 * the main interpreter: a deleter of a tensor made in a sub-interpreter
 * would deadlock or run Python code in the wrong interpreter, and the C
 * exchange table is process wide.  Until each of those is per-interpreter,
 * importing dlbridge in a sub-interpreter is refused with ImportError. */
static int refuse_subinterpreter(void) {
  if (PyInterpreterState_Get() == PyInterpreterState_Main()) return 0;
  PyErr_SetString(PyExc_ImportError,
                  "dlbridge._core cannot be imported in a sub-interpreter: "
                  "its deleters and its DLPack exchange table belong to the "
                  "main interpreter; use dlbridge from the main interpreter");
  return -1;
}

static int module_exec(PyObject *module) {
  if (refuse_subinterpreter() < 0) return -1;
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  if (intern_name(&st->str_dlpack, "__dlpack__") < 0 ||
      intern_name(&st->str_dlpack_device, "__dlpack_device__") < 0 ||
      intern_name(&st->str_max_version, "max_version") < 0 ||
      intern_name(&st->str_dl_device, "dl_device") < 0 ||
      intern_name(&st->str_copy, "copy") < 0 ||
      intern_name(&st->str_stream, "stream") < 0 ||
      intern_name(&st->str_array_interface, "__array_interface__") < 0 ||
      intern_name(&st->str_cuda_array_interface, "__cuda_array_interface__") < 0 ||
      intern_name(&st->str_is_conj, "is_conj") < 0 ||
      intern_name(&st->str_is_neg, "is_neg") < 0 ||
      intern_name(&st->str_requires_grad, "requires_grad") < 0 ||
      intern_name(&st->str_torch, "torch") < 0) {
    return -1;
  }
  static const char *const legacy[DLB_N_LEGACY_METHODS] =
      DLB_LEGACY_METHOD_NAMES;
  for (int i = 0; i < DLB_N_LEGACY_METHODS; i++)
    if (intern_name(&st->str_legacy[i], legacy[i]) < 0) return -1;
  st->max_version_tuple = Py_BuildValue("(ii)", DLPACK_MAJOR_VERSION,
                                        DLPACK_MINOR_VERSION);
  if (st->max_version_tuple == NULL) return -1;
  if (dlb__types_init(module, st) < 0) return -1;
  if (dlb__cuda_init(module) < 0) return -1;
  if (dlb__tensor_init(module, st, dlb__share_tensor_methods,
                        dlb__share_tensor_getset) < 0)
    return -1;
  if (dlb__export_init(st) < 0) return -1;
  if (dlb__handlers_init(st) < 0) return -1;
  if (dlb__function_init(module, st) < 0) return -1;
  if (dlb__ops_registry_init(module) < 0) return -1;
  if (dlb__ops_tf_init(module) < 0) return -1;
  if (dlb__ops_xla_init(module) < 0) return -1;
  if (dlb__capi_init(module, st) < 0) return -1;
  if (dlb__testing_init(module, st) < 0) return -1;
  if (dlb__pickle_init(module, st) < 0 || dlb__share_init(module, st) < 0) return -1;
  if (PyModule_AddStringConstant(module, "__version__", DLB_VERSION_STRING) < 0)
    return -1;
  if (PyModule_AddIntConstant(module, "MAX_NDIM", DLB_MAX_NDIM) < 0) return -1;
  if (PyModule_AddIntConstant(module, "DLPACK_MAJOR_VERSION",
                              DLPACK_MAJOR_VERSION) < 0 ||
      PyModule_AddIntConstant(module, "DLPACK_MINOR_VERSION",
                              DLPACK_MINOR_VERSION) < 0)
    return -1;
  return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  Py_VISIT(st->TensorType);
  Py_VISIT(st->DTypeType);
  Py_VISIT(st->DeviceType);
  Py_VISIT(st->max_version_tuple);
  Py_VISIT(st->FunctionType);
  int rc = dlb__torch_traverse(st, visit, arg);
  if (rc != 0) return rc;
  for (size_t i = 0; i < sizeof st->dtype_cache / sizeof *st->dtype_cache; i++)
    Py_VISIT(st->dtype_cache[i]);
  return 0;
}

static int module_clear(PyObject *module) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  Py_CLEAR(st->TensorType);
  Py_CLEAR(st->DTypeType);
  Py_CLEAR(st->DeviceType);
  Py_CLEAR(st->str_dlpack);
  Py_CLEAR(st->str_dlpack_device);
  Py_CLEAR(st->str_max_version);
  Py_CLEAR(st->str_dl_device);
  Py_CLEAR(st->str_copy);
  Py_CLEAR(st->str_stream);
  Py_CLEAR(st->str_array_interface);
  Py_CLEAR(st->str_cuda_array_interface);
  Py_CLEAR(st->str_is_conj);
  Py_CLEAR(st->str_is_neg);
  Py_CLEAR(st->str_requires_grad);
  Py_CLEAR(st->str_torch);
  dlb__torch_clear(st);
  Py_CLEAR(st->max_version_tuple);
  for (int i = 0; i < DLB_N_LEGACY_METHODS; i++) Py_CLEAR(st->str_legacy[i]);
  Py_CLEAR(st->FunctionType);
  for (size_t i = 0; i < sizeof st->dtype_cache / sizeof *st->dtype_cache; i++)
    Py_CLEAR(st->dtype_cache[i]);
  dlb__export_clear(st);
  dlb__handlers_clear(st);
  return 0;
}

static void module_free(void *module) { module_clear((PyObject *)module); }

static PyMethodDef module_methods[] = {
    {"dtype", (PyCFunction)dlb__py_dtype, METH_O,
     "dtype(spec) -> DType\n\nThe dtype named by spec: a name such as "
     "'float32' or 'bfloat16', a DType, or a framework dtype."},
    {"device", (PyCFunction)dlb__py_device, METH_O,
     "device(spec) -> Device\n\nThe device named by spec: 'cpu', 'cuda:1', a "
     "(device_type, device_id) tuple, or a Device."},
    {"empty", (PyCFunction)(void (*)(void))dlb__py_empty,
     METH_FASTCALL | METH_KEYWORDS,
     "empty(shape, dtype='float32', device='cpu') -> Tensor\n\nA new tensor "
     "whose contents are not initialised."},
    {"zeros", (PyCFunction)(void (*)(void))dlb__py_zeros,
     METH_FASTCALL | METH_KEYWORDS,
     "zeros(shape, dtype='float32', device='cpu') -> Tensor\n\nA new tensor "
     "filled with zeros."},
    {"tensor", (PyCFunction)(void (*)(void))dlb__py_tensor,
     METH_FASTCALL | METH_KEYWORDS,
     "tensor(data, dtype=None, device='cpu') -> Tensor\n\nA new tensor holding "
     "a copy of nested lists or a scalar."},
    {"_type_framework", (PyCFunction)dlb__py_type_framework, METH_O,
     "Private (dlbridge.convert): the framework name of a type, from the "
     "handler cache."},
    {"from_dlpack", (PyCFunction)(void (*)(void))dlb__py_from_dlpack,
     METH_FASTCALL | METH_KEYWORDS,
     "from_dlpack(obj, /, *, device=None, copy=None) -> Tensor\n\nA Tensor "
     "viewing the memory of any tensor-like object, without copying unless "
     "asked or needed."},
    {"convert", (PyCFunction)(void (*)(void))dlb__py_convert,
     METH_FASTCALL | METH_KEYWORDS,
     "convert(obj, to, *, copy=None, device=None) -> object\n\nobj as a "
     "tensor of framework `to` (a name such as 'torch', a type, or an "
     "object of the framework), sharing memory whenever that framework can "
     "hold it safely and copying otherwise (copy=None); copy=False shares or "
     "raises BufferError, copy=True always copies; device= moves it."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#ifdef Py_GIL_DISABLED
    /* Safe without the GIL (docs/python-versions.md, "Free-threading
     * guarantees": every cache and registry is published atomically and
     * filled under a lock, or per thread; make test-tsan races 8 threads
     * through it under ThreadSanitizer).  Without this slot importing
     * dlbridge would turn the GIL back on for the whole process. */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

PyModuleDef dlb__module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dlbridge._core",
    .m_doc = "dlbridge's C core: Tensor, DType, Device, from_dlpack.",
    .m_size = sizeof(dlb_module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&dlb__module_def); }
