/*
 * function.c -- the dlbridge.Function type and dlbridge.load(): a C kernel
 * (the dlb_kernel ABI in dlbridge.h) and its signature made one callable
 * object; its construction, attributes and methods.  The signature is
 * function_sig.c's, the call function_call.c's (function.h lists the
 * files).
 *
 * Decisions:
 *  - a kernel is an int address or a PyCapsule named "dlb_kernel", which
 *    the Function holds;
 *  - load() never calls dlclose while a Function made from the library
 *    lives: the handle is owned by a capsule the Function holds;
 *  - a derivative (vjp=, jvp=) is made here from what the caller gave --
 *    a Function, a (kernel, signature) pair, with load() also a symbol of
 *    the same library (its signature derived) or a (symbol, signature)
 *    pair -- and bound by function_grad.c; the derivative Function holds
 *    the library too.
 */
#include "dlbridge_py.h"
#include "function.h"

#include <dlfcn.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define FN_T_PYSSIZET T_PYSSIZET
#define FN_T_OBJECT T_OBJECT_EX
#define FN_READONLY READONLY
#else
#define FN_T_PYSSIZET Py_T_PYSSIZET
#define FN_T_OBJECT Py_T_OBJECT_EX
#define FN_READONLY Py_READONLY
#endif

#define KERNEL_CAPSULE_NAME "dlb_kernel"
#define LIBRARY_CAPSULE_NAME "dlbridge._library"

/* The kernel from an int address or a "dlb_kernel" capsule.  *owner gets a
 * new reference to what keeps it alive (the capsule) or NULL. */
static int kernel_from_object(PyObject *obj, dlb_kernel *out,
                              PyObject **owner) {
  void *ptr = NULL;
  *owner = NULL;
  if (PyCapsule_CheckExact(obj)) {
    const char *name = PyCapsule_GetName(obj);
    if (name == NULL && PyErr_Occurred()) return -1;
    if (name == NULL || strcmp(name, KERNEL_CAPSULE_NAME) != 0) {
      PyErr_Format(PyExc_TypeError,
                   "kernel capsule must be named '" KERNEL_CAPSULE_NAME
                   "', not %s%s%s",
                   name ? "'" : "", name ? name : "unnamed", name ? "'" : "");
      return -1;
    }
    ptr = PyCapsule_GetPointer(obj, KERNEL_CAPSULE_NAME);
    if (ptr == NULL) return -1;
    *owner = Py_NewRef(obj);
  } else if (PyLong_Check(obj) && !PyBool_Check(obj)) {
    ptr = PyLong_AsVoidPtr(obj);
    if (ptr == NULL) {
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "kernel address must not be 0");
      return -1;
    }
  } else {
    PyErr_Format(PyExc_TypeError,
                 "kernel must be an int address or a PyCapsule named '"
                 KERNEL_CAPSULE_NAME "', not %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  /* ISO C has no cast from void * to a function pointer; POSIX (dlsym)
   * guarantees the representation is the same, so copy the bits. */
  memcpy(out, &ptr, sizeof *out);
  return 0;
}

static fn_object *function_create(PyTypeObject *type, dlb_kernel kernel,
                                  PyObject *owner, PyObject *sig) {
  fn_object *fn = (fn_object *)type->tp_alloc(type, 0);
  if (fn == NULL) return NULL;
  fn->vectorcall = dlb__fn_vectorcall;
  fn->kernel = kernel;
  fn->st = dlb__state_from_type(type);
  fn->owner = Py_XNewRef(owner);
  if (fn->st == NULL) {
    PyErr_SetString(PyExc_TypeError, "Function type without its module");
    Py_DECREF(fn);
    return NULL;
  }
  if (dlb__fn_compile_signature(fn, sig) < 0) {
    Py_DECREF(fn);
    return NULL;
  }
  return fn;
}

/* The kernel of symbol (a str) in the library handle (path: for the
 * message), into *out.  0, or -1 with TypeError/ValueError. */
static int kernel_from_symbol(void *handle, PyObject *symbol, PyObject *path,
                              dlb_kernel *out) {
  if (!PyUnicode_Check(symbol)) {
    PyErr_Format(PyExc_TypeError, "symbol must be a str, not %.100s",
                 Py_TYPE(symbol)->tp_name);
    return -1;
  }
  const char *sym = PyUnicode_AsUTF8(symbol);
  if (sym == NULL) return -1;
  dlerror();
  void *ptr = dlsym(handle, sym);
  const char *e = dlerror();
  if (ptr == NULL) {
    PyErr_Format(PyExc_ValueError, "symbol %R not found in %R: %s", symbol,
                 path, e ? e : "the symbol is NULL");
    return -1;
  }
  memcpy(out, &ptr, sizeof *out);
  return 0;
}

/* Where a derivative's kernel comes from: load()'s library (handle, held
 * by lib; path for messages), or nothing for Function(). */
typedef struct {
  void *handle;
  PyObject *lib, *path;
} kernel_source;

/* The derivative of kind fn's caller declared as spec, made a Function
 * (new reference): spec is a Function (returned as is), a (kernel,
 * signature) pair -- with a library, (symbol, signature) -- or, with a
 * library, a symbol whose signature is derived from fn's.  NULL with
 * TypeError/ValueError/OSError. */
static PyObject *derivative_from_spec(fn_object *fn, int kind, PyObject *spec,
                                      const kernel_source *src) {
  const char *what = kind == DLB_DERIVATIVE_VJP ? "vjp" : "jvp";
  PyObject *result = NULL, *owner = NULL, *sig = NULL;
  PyObject *kobj = NULL;
  dlb_kernel kernel;
  if (dlb__function_check(spec)) return Py_NewRef(spec);
  if (PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) == 2) {
    kobj = PyTuple_GET_ITEM(spec, 0);
    sig = Py_NewRef(PyTuple_GET_ITEM(spec, 1));
    if (!PyUnicode_Check(sig)) {
      PyErr_Format(PyExc_TypeError,
                   "%U: %s=(%s, signature): the signature must be a str, not "
                   "%.100s",
                   fn->name, what, src->handle ? "symbol" : "kernel",
                   Py_TYPE(sig)->tp_name);
      goto cleanup;
    }
  } else if (src->handle != NULL && PyUnicode_Check(spec)) {
    kobj = spec;
    sig = dlb__fn_derived_signature(fn, kind);
    if (sig == NULL) goto cleanup;
  } else {
    PyErr_Format(PyExc_TypeError,
                 src->handle != NULL
                     ? "%U: %s= must be a Function, a symbol of the same "
                       "library or a (symbol, signature) pair, not %.100s"
                     : "%U: %s= must be a Function or a (kernel, signature) "
                       "pair, not %.100s (a symbol name needs "
                       "dlbridge.load(path, symbol, signature, vjp=...))",
                 fn->name, what, Py_TYPE(spec)->tp_name);
    goto cleanup;
  }
  if (src->handle != NULL) {
    if (kernel_from_symbol(src->handle, kobj, src->path, &kernel) < 0)
      goto cleanup;
    owner = Py_NewRef(src->lib);
  } else if (kernel_from_object(kobj, &kernel, &owner) < 0) {
    goto cleanup;
  }
  result = (PyObject *)function_create(Py_TYPE(fn), kernel, owner, sig);
cleanup:
  Py_XDECREF(owner);
  Py_XDECREF(sig);
  return result;
}

/* Make and bind fn's derivatives from the caller's vjp= and jvp= (each
 * NULL or None when not given).  0, or -1 with an exception. */
static int attach_derivatives(fn_object *fn, PyObject *vjp, PyObject *jvp,
                              const kernel_source *src) {
  PyObject *spec[2] = {vjp, jvp};
  const int kind[2] = {DLB_DERIVATIVE_VJP, DLB_DERIVATIVE_JVP};
  for (int k = 0; k < 2; k++) {
    if (spec[k] == NULL || spec[k] == Py_None) continue;
    PyObject *deriv = derivative_from_spec(fn, kind[k], spec[k], src);
    if (deriv == NULL) return -1;
    int rc = dlb__fn_bind_derivative(fn, kind[k], deriv);
    Py_DECREF(deriv);
    if (rc < 0) return -1;
  }
  return 0;
}

/* What a Function holds that can hold it back: its kernel's owner (any
 * object: a library capsule, a ctypes function, ...) and its derivatives
 * (Functions, which may be given each other).  The rest are str and
 * tuples of str and int, which hold nothing. */
static int function_traverse(PyObject *self, visitproc visit, void *arg) {
  fn_object *fn = (fn_object *)self;
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(fn->owner);
  Py_VISIT(fn->vjp);
  Py_VISIT(fn->jvp);
  return 0;
}

static int function_clear(PyObject *self) {
  fn_object *fn = (fn_object *)self;
  Py_CLEAR(fn->vjp);
  Py_CLEAR(fn->jvp);
  /* owner stays until dealloc: the kernel's code must outlive every
   * pointer to it, and a cleared Function can still be called. */
  return 0;
}

/* fn is made and about to be handed to the program: the reference
 * counting a program's long-lived callables get on a free-threaded build
 * (dlb__ft_defer_refcount, issue 26 item 5: threads calling one Function
 * would otherwise all write its reference count), for fn and the
 * derivatives made for it.  Last, after every step that can fail: a
 * Function freed on an error path is freed at once.  A derivative the
 * caller gave (a Function made earlier, perhaps in use by other threads)
 * was marked when it was made, and dlb__ft_defer_refcount leaves a marked
 * or immortal object alone.  Nothing on GIL builds. */
static void share_function(fn_object *fn) {
#ifdef Py_GIL_DISABLED
  PyObject *module = PyType_GetModule(Py_TYPE(fn));
  if (module == NULL) {
    PyErr_Clear();
    return;
  }
  if (fn->vjp != NULL) dlb__ft_defer_refcount(fn->vjp, module);
  if (fn->jvp != NULL) dlb__ft_defer_refcount(fn->jvp, module);
  dlb__ft_defer_refcount((PyObject *)fn, module);
#else
  (void)fn;
#endif
}

static PyObject *function_new(PyTypeObject *type, PyObject *args,
                              PyObject *kwargs) {
  static char *kwlist[] = {"kernel", "signature", "vjp", "jvp", NULL};
  PyObject *kobj, *sig, *owner = NULL, *vjp = NULL, *jvp = NULL;
  dlb_kernel kernel;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OU|$OO:Function", kwlist,
                                   &kobj, &sig, &vjp, &jvp))
    return NULL;
  if (kernel_from_object(kobj, &kernel, &owner) < 0) return NULL;
  fn_object *fn = function_create(type, kernel, owner, sig);
  Py_XDECREF(owner);
  const kernel_source none = {NULL, NULL, NULL};
  if (fn != NULL && attach_derivatives(fn, vjp, jvp, &none) < 0)
    Py_CLEAR(fn);
  if (fn != NULL) share_function(fn);
  return (PyObject *)fn;
}

static void function_dealloc(PyObject *self) {
  fn_object *fn = (fn_object *)self;
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  if (fn->weakreflist != NULL) PyObject_ClearWeakRefs(self);
  PyMem_Free(fn->params);
  PyMem_Free(fn->memos);
  PyMem_Free(fn->cname);
  Py_CLEAR(fn->name);
  Py_CLEAR(fn->identity);
  Py_CLEAR(fn->signature);
  Py_CLEAR(fn->param_names);
  Py_CLEAR(fn->sym_names);
  Py_CLEAR(fn->result_names);
  Py_CLEAR(fn->diff_inputs);
  Py_CLEAR(fn->diff_results);
  Py_CLEAR(fn->vjp_args);
  Py_CLEAR(fn->vjp_results);
  Py_CLEAR(fn->jvp_args);
  Py_CLEAR(fn->jvp_results);
  Py_CLEAR(fn->vjp);
  Py_CLEAR(fn->jvp);
  Py_CLEAR(fn->owner); /* last: may dlclose the kernel's library */
  tp->tp_free(self);
  Py_DECREF(tp);
}

/* ---- load() --------------------------------------------------------------------- */

static void library_capsule_destructor(PyObject *cap) {
  void *h = PyCapsule_GetPointer(cap, LIBRARY_CAPSULE_NAME);
  if (h != NULL)
    dlclose(h);
  else
    PyErr_Clear();
}

static PyObject *py_load(PyObject *module, PyObject *const *args,
                         Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *result = NULL, *path_bytes = NULL, *lib = NULL;
  PyObject *vjp = NULL, *jvp = NULL;
  void *handle = NULL;
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  PyObject *path, *symbol, *sig;
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; k++) {
    PyObject *key = PyTuple_GET_ITEM(kwnames, k);
    PyObject **slot = PyUnicode_CompareWithASCIIString(key, "vjp") == 0
                          ? &vjp
                      : PyUnicode_CompareWithASCIIString(key, "jvp") == 0
                          ? &jvp
                          : NULL;
    if (slot == NULL) {
      PyErr_Format(PyExc_TypeError,
                   "load() got an unexpected keyword argument %R: "
                   "load(path, symbol, signature, *, vjp=None, jvp=None)",
                   key);
      goto cleanup;
    }
    *slot = args[nargs + k];
  }
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError,
                 "load(path, symbol, signature) takes 3 positional arguments "
                 "(%zd given)",
                 nargs);
    goto cleanup;
  }
  path = args[0];
  symbol = args[1];
  sig = args[2];
  if (!PyUnicode_Check(symbol)) {
    PyErr_Format(PyExc_TypeError, "symbol must be a str, not %.100s",
                 Py_TYPE(symbol)->tp_name);
    goto cleanup;
  }
  if (!PyUnicode_FSConverter(path, &path_bytes)) goto cleanup;
  /* Parse first: a bad signature should not load code. */
  fn_object *fn = function_create(st->FunctionType, NULL, NULL, sig);
  if (fn == NULL) goto cleanup;
  result = (PyObject *)fn;
  dlerror(); /* clear stale state */
  handle = dlopen(PyBytes_AS_STRING(path_bytes), RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    const char *e = dlerror();
    PyErr_Format(PyExc_OSError, "cannot load %R: %s", path,
                 e ? e : "unknown error");
    goto fail;
  }
  lib = PyCapsule_New(handle, LIBRARY_CAPSULE_NAME,
                      library_capsule_destructor);
  if (lib == NULL) {
    dlclose(handle);
    goto fail;
  }
  if (kernel_from_symbol(handle, symbol, path, &fn->kernel) < 0) goto fail;
  fn->owner = Py_NewRef(lib);
  const kernel_source src = {handle, lib, path};
  if (attach_derivatives(fn, vjp, jvp, &src) < 0) goto fail;
  share_function(fn);
  goto cleanup;
fail:
  Py_CLEAR(result);
cleanup:
  Py_XDECREF(lib);
  Py_XDECREF(path_bytes);
  return result;
}

static PyObject *get_identity(PyObject *self, void *c) {
  (void)c;
  return dlb__function_identity(self);
}

static PyObject *get_normalized(PyObject *self, void *c) {
  (void)c;
  return dlb__fn_identity_text((fn_object *)self);
}

/* _dims: per parameter, then per result, a tuple of its extents as the
 * signature writes them: an int for a literal, a str for a name, the str
 * "..." first for batch dims. */
static PyObject *get_dims(PyObject *self, void *c) {
  (void)c;
  fn_object *fn = (fn_object *)self;
  int n = fn->nin + fn->nout;
  PyObject *all = PyTuple_New(n);
  for (int i = 0; all != NULL && i < n; i++) {
    const fn_param *p = &fn->params[i];
    int b = p->batch ? 1 : 0;
    PyObject *dims = PyTuple_New(p->ndim + b);
    if (dims != NULL && b) {
      PyObject *e = PyUnicode_FromString("...");
      if (e == NULL) Py_CLEAR(dims);
      else PyTuple_SET_ITEM(dims, 0, e);
    }
    const fn_dim *d = &fn->dims[p->dim0];
    for (int a = 0; dims != NULL && a < p->ndim; a++, d++) {
      PyObject *e = d->kind == DIM_LITERAL
                        ? PyLong_FromLongLong(d->value)
                        : Py_NewRef(PyTuple_GET_ITEM(fn->sym_names, d->sym));
      if (e == NULL) Py_CLEAR(dims);
      else PyTuple_SET_ITEM(dims, a + b, e);
    }
    if (dims == NULL) Py_CLEAR(all);
    else PyTuple_SET_ITEM(all, i, dims);
  }
  return all;
}

/* _batch: per parameter, then per result, whether its dims begin with
 * `...` (its leading axes are batch dims, broadcast among them). */
static PyObject *get_batch(PyObject *self, void *c) {
  (void)c;
  fn_object *fn = (fn_object *)self;
  int n = fn->nin + fn->nout;
  PyObject *t = PyTuple_New(n);
  for (int i = 0; t != NULL && i < n; i++)
    PyTuple_SET_ITEM(t, i, Py_NewRef(fn->params[i].batch ? Py_True : Py_False));
  return t;
}

/* _inputs: (name, DType, ndim, mut) per input; _results: (DType, ndim) per
 * declared result.  ndim is the core rank: a `...` parameter's tensors
 * have any number of batch dims before (_batch). */
static PyObject *get_inputs(PyObject *self, void *c) {
  (void)c;
  fn_object *fn = (fn_object *)self;
  PyObject *t = PyTuple_New(fn->nin);
  for (int i = 0; t != NULL && i < fn->nin; i++) {
    const fn_param *p = &fn->params[i];
    PyObject *item = Py_BuildValue("(ONiO)", pname(fn, i),
                                   dlb__dtype_new(fn->st, p->dtype),
                                   (int)p->ndim, p->mut ? Py_True : Py_False);
    if (item == NULL) Py_CLEAR(t);
    else PyTuple_SET_ITEM(t, i, item);
  }
  return t;
}

static PyObject *get_results(PyObject *self, void *c) {
  (void)c;
  fn_object *fn = (fn_object *)self;
  PyObject *t = PyTuple_New(fn->nout);
  for (int o = 0; t != NULL && o < fn->nout; o++) {
    const fn_param *p = &fn->params[fn->nin + o];
    PyObject *item =
        Py_BuildValue("(Ni)", dlb__dtype_new(fn->st, p->dtype), (int)p->ndim);
    if (item == NULL) Py_CLEAR(t);
    else PyTuple_SET_ITEM(t, o, item);
  }
  return t;
}

static PyMethodDef function_methods[] = {
    {"_result_specs", dlb__fn_result_specs, METH_O,
     "_result_specs(specs) -> (results, aliases)\n\nThe shape function of "
     "compiled calls: specs has a (shape, dtype) pair per input (None for a "
     "Python number), checked as a call checks its arguments; results is a "
     "(shape, DType) pair per declared result, aliases the indices of the "
     "'mut' inputs."},
    {"_refuse_overlap", dlb__fn_refuse_overlap_specs, METH_O,
     "_refuse_overlap(specs) -> None\n\nThe eager call's rule for 'mut' "
     "inputs that overlap another input, for a compiler's placeholders: "
     "specs has None or (storage, byte_offset, shape, strides, dtype) per "
     "input; BufferError naming both parameters."},
    {NULL, NULL, 0, NULL},
};

/* ---- attributes --------------------------------------------------------------------- */

static PyObject *function_repr(PyObject *self) {
  fn_object *fn = (fn_object *)self;
  return PyUnicode_FromFormat("<dlbridge.Function %U>", fn->signature);
}

static PyObject *get_nin(PyObject *self, void *c) {
  (void)c;
  return PyLong_FromLong(((fn_object *)self)->nin);
}

static PyObject *get_nout(PyObject *self, void *c) {
  (void)c;
  return PyLong_FromLong(((fn_object *)self)->nout);
}

static PyObject *get_address(PyObject *self, void *c) {
  (void)c;
  void *ptr;
  dlb_kernel k = ((fn_object *)self)->kernel;
  memcpy(&ptr, &k, sizeof ptr);
  return PyLong_FromVoidPtr(ptr);
}

/* __signature__: inspect.signature(f), for tools that read a callable's
 * parameters (tf.function, functools, IDEs): one positional-or-keyword
 * parameter per input, named as in the signature (the call takes them by
 * keyword too), built when asked -- importing inspect is not for every
 * Function.  A name Python cannot take as a parameter (a keyword such as
 * "lambda") becomes positional-only "arg<i>", as the torch schema names
 * it. */
static PyObject *get_signature(PyObject *self, void *c) {
  (void)c;
  fn_object *fn = (fn_object *)self;
  PyObject *result = NULL, *inspect = NULL, *parameter = NULL, *kind = NULL,
           *params = NULL, *signature = NULL;
  inspect = PyImport_ImportModule("inspect");
  if (inspect == NULL) goto cleanup;
  parameter = PyObject_GetAttrString(inspect, "Parameter");
  if (parameter == NULL) goto cleanup;
  for (int pass = 0; pass < 2 && params == NULL; pass++) {
    /* pass 0: every name as written; pass 1 (a name was refused): all
     * positional-only, the refused ones "arg<i>" (positional-only
     * parameters cannot follow the others). */
    Py_XSETREF(kind, PyObject_GetAttrString(
                         parameter, pass ? "POSITIONAL_ONLY"
                                         : "POSITIONAL_OR_KEYWORD"));
    if (kind == NULL || (params = PyList_New(fn->nin)) == NULL) goto cleanup;
    for (int i = 0; i < fn->nin; i++) {
      PyObject *p = PyObject_CallFunctionObjArgs(parameter, pname(fn, i),
                                                 kind, NULL);
      if (p == NULL && pass == 1 && PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        PyObject *generic = PyUnicode_FromFormat("arg%d", i);
        if (generic == NULL) goto cleanup;
        p = PyObject_CallFunctionObjArgs(parameter, generic, kind, NULL);
        Py_DECREF(generic);
      }
      if (p == NULL) {
        if (pass == 1 || !PyErr_ExceptionMatches(PyExc_ValueError))
          goto cleanup;
        PyErr_Clear(); /* a name Python refuses: the second pass */
        Py_CLEAR(params);
        break;
      }
      PyList_SET_ITEM(params, i, p);
    }
  }
  signature = PyObject_GetAttrString(inspect, "Signature");
  if (signature == NULL) goto cleanup;
  result = PyObject_CallOneArg(signature, params);
cleanup:
  Py_XDECREF(signature);
  Py_XDECREF(params);
  Py_XDECREF(kind);
  Py_XDECREF(parameter);
  Py_XDECREF(inspect);
  return result;
}

/* A derivative attribute (closure: its offset in fn_object): None when
 * not declared. */
static PyObject *get_or_none(PyObject *self, void *offset) {
  PyObject *v = *(PyObject **)((char *)self + (uintptr_t)offset);
  return Py_NewRef(v != NULL ? v : Py_None);
}

#define FN_FIELD(name) ((void *)(uintptr_t)offsetof(fn_object, name))

static PyGetSetDef function_getset[] = {
    {"__signature__", get_signature, NULL,
     "inspect.Signature of the call: the inputs by name.", NULL},
    {"nin", get_nin, NULL, "Number of arguments the call takes.", NULL},
    {"nout", get_nout, NULL, "Number of results the call returns.", NULL},
    {"address", get_address, NULL, "Address of the kernel (int).", NULL},
    {"_identity", get_identity, NULL,
     "The Function's name in compiled graphs: '<name>_<hash of the "
     "normalized signature and derivatives'>', the same in every "
     "process.", NULL},
    {"_normalized_signature", get_normalized, NULL,
     "The signature in one spelling (what _identity hashes, with the "
     "derivatives' when declared).", NULL},
    {"_inputs", get_inputs, NULL,
     "(name, DType, ndim, mut) for each input.", NULL},
    {"_results", get_results, NULL,
     "(DType, ndim) for each declared result.", NULL},
    {"_result_names", get_or_none, NULL,
     "Each result's label: its name, or out / out<k>.",
     FN_FIELD(result_names)},
    {"_diff_inputs", get_or_none, NULL,
     "The indices of the differentiable inputs (floating or complex, not "
     "mut, not nodiff).",
     FN_FIELD(diff_inputs)},
    {"_diff_results", get_or_none, NULL,
     "The indices of the differentiable results.", FN_FIELD(diff_results)},
    {"_vjp", get_or_none, NULL, "The vjp Function, or None.", FN_FIELD(vjp)},
    {"_jvp", get_or_none, NULL, "The jvp Function, or None.", FN_FIELD(jvp)},
    {"_vjp_args", get_or_none, NULL,
     "Per vjp parameter, what it receives: ('input', i), ('result', o) or "
     "('cotangent', o); None without a vjp.",
     FN_FIELD(vjp_args)},
    {"_vjp_results", get_or_none, NULL,
     "Per vjp result, the input it is the cotangent of; None without a vjp.",
     FN_FIELD(vjp_results)},
    {"_jvp_args", get_or_none, NULL,
     "Per jvp parameter: ('input', i) or ('tangent', i); None without a "
     "jvp.",
     FN_FIELD(jvp_args)},
    {"_jvp_results", get_or_none, NULL,
     "Per jvp result, the result it is the tangent of; None without a jvp.",
     FN_FIELD(jvp_results)},
    {"_dims", get_dims, NULL,
     "Each parameter's, then each result's extents as the signature writes "
     "them: an int for a literal, a str for a name; \"...\" first for "
     "batch dimensions.", NULL},
    {"_batch", get_batch, NULL,
     "Per parameter, then per result: whether its dims begin with '...' "
     "(batch dimensions).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef function_members[] = {
    {"signature", FN_T_OBJECT, offsetof(fn_object, signature), FN_READONLY,
     "The signature string, as given."},
    {"name", FN_T_OBJECT, offsetof(fn_object, name), FN_READONLY,
     "The function name from the signature."},
    {"__name__", FN_T_OBJECT, offsetof(fn_object, name), FN_READONLY, NULL},
    {"__qualname__", FN_T_OBJECT, offsetof(fn_object, name), FN_READONLY,
     NULL},
    {"__vectorcalloffset__", FN_T_PYSSIZET, offsetof(fn_object, vectorcall),
     FN_READONLY, NULL},
    {"__weaklistoffset__", FN_T_PYSSIZET, offsetof(fn_object, weakreflist),
     FN_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot function_slots[] = {
    {Py_tp_new, function_new},
    {Py_tp_dealloc, function_dealloc},
    {Py_tp_traverse, function_traverse},
    {Py_tp_clear, function_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_repr, function_repr},
    {Py_tp_members, function_members},
    {Py_tp_getset, function_getset},
    {Py_tp_methods, function_methods},
    {Py_tp_doc,
     "Function(kernel, signature, *, vjp=None, jvp=None)\n--\n\n"
     "A C kernel (dlb_kernel ABI) callable with any framework's tensors.  "
     "kernel is an int address or a PyCapsule named 'dlb_kernel'; signature "
     "is e.g. 'saxpy(a: float32, x: float32[n], y: mut float32[n])' or "
     "'matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]'.  vjp= "
     "and jvp=: its derivatives, a Function or a (kernel, signature) pair "
     "(docs/function.md, Gradients)."},
    {0, NULL},
};

static PyType_Spec function_spec = {
    .name = "dlbridge.Function",
    .basicsize = sizeof(fn_object),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = function_slots,
};

static PyMethodDef function_module_methods[] = {
    {"load", (PyCFunction)(void (*)(void))py_load,
     METH_FASTCALL | METH_KEYWORDS,
     "load(path, symbol, signature, *, vjp=None, jvp=None) -> Function\n\n"
     "Load a kernel from a shared library (dlopen with RTLD_NOW | "
     "RTLD_LOCAL).  The library stays loaded while the Function lives.  "
     "vjp= and jvp=: a Function, a symbol of the same library (its "
     "signature derived) or a (symbol, signature) pair."},
    {NULL, NULL, 0, NULL},
};

int dlb__function_init(PyObject *module, dlb_module_state *st) {
  st->FunctionType =
      (PyTypeObject *)PyType_FromModuleAndSpec(module, &function_spec, NULL);
  if (st->FunctionType == NULL) return -1;
  if (PyModule_AddType(module, st->FunctionType) < 0) return -1;
  if (PyModule_AddFunctions(module, function_module_methods) < 0) return -1;
  return 0;
}
