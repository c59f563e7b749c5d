/*
 * function.c -- dlbridge.Function and dlbridge.load(): call one C kernel
 * (the dlb_kernel ABI in dlbridge.h) from any framework's tensors.
 *
 * A signature such as
 *     "saxpy(a: float32, x: float32[n], y: mut float32[n]) -> float32[n]"
 * is parsed once, at construction, by the core (dlb_signature_parse; the
 * grammar and the rules for dimension names are in src/core/signature.c
 * and docs/function.md) into a flat array of parameter and dim records.
 *
 * The call path is built for overhead, not generality: every check that can
 * be decided from the signature alone is decided at parse time.  Each dim
 * record says whether it binds a name, checks a literal, or checks against
 * the (parameter, axis) that bound its name -- so a call needs no symbol
 * table, just compares against the shape of the view that bound it.  Views
 * of the arguments are borrowed (dlb__view_get_with) into per-call arrays
 * that live on the stack for up to FN_INLINE (8) parameters and results,
 * in one heap block beyond; Python numbers for 0-d parameters are stored
 * there too.  Nothing else is allocated unless the signature has outputs.
 *
 * A torch tensor is the case the call is tuned for (bench/bench_calls.py:
 * its overhead against the raw exchange-table loop, tvm-ffi and the
 * __dlpack__ path): each parameter remembers the handler its last
 * argument's type had (dlb_handler_memo: no hash, no call), the table's
 * borrowed entry is called inline (dlb__view_exchange_borrowed), and the
 * DLTensor it wrote is validated in the checking pass with the core's
 * validator inline (src/core/validate_fast.h), after the dtype was found
 * to be the signature's.  Together these took the three-tensor call from
 * ~200 to ~178 ns (docs/function.md).
 * Error paths are kept out of line (DLB__OUT_OF_LINE), so the hot function
 * stays small: its frame was 46 KB when 64 views lived in it.
 *
 * Decisions (the spec leaves them open):
 *  - Errors: wrong argument count, non-tensor argument -> TypeError; dtype
 *    mismatch -> TypeError (the argument has the wrong type); ndim, extent
 *    and device mismatches -> ValueError; read-only data for a `mut`
 *    parameter, a torch tensor that requires grad or a producer's copy
 *    (IS_COPIED) for a `mut` parameter, a torch tensor with a lazy conj/neg
 *    bit -> BufferError; Python numbers follow scalars.c's one rule
 *    (OverflowError out of range, TypeError for a float into an integer).  A kernel's negative status maps
 *    as dlb__raise does (DLB_EINVAL -> ValueError, ...) with message
 *    "<name>: <kernel message>"; a positive return is a broken kernel and
 *    raises RuntimeError (never a silently accepted result).  A torch
 *    argument that requires grad, with grad mode on -> RuntimeError "<name>:
 *    dlbridge Function has no backward" (before the other checks, as the
 *    compiled routes' autograd kernel raises before their shape function);
 *    with it off, only writing into one is refused.
 *  - The kernel runs with the GIL held: the views are borrowed, not
 *    exported, and another thread could otherwise free an array's memory
 *    under the kernel (ndarray.resize, torch's resize_).  For the same
 *    reason no Python code runs between taking a borrowed view and the
 *    kernel's return: see function_call for the order of reading.
 *  - Outputs come from the first tensor argument's framework; what it
 *    cannot hold is refused before the kernel runs, and what its allocator
 *    returns is checked against the request (outputs.c).
 *  - Python numbers are accepted only for 0-d parameters that are not
 *    `mut`; they arrive as CPU 0-d tensors even when the other arguments
 *    live on a GPU, and take no part in the same-device check.
 *  - The stream is the first tensor argument's framework's current stream
 *    for its device, asked once per call; on the CPU it is NULL without
 *    asking (the ABI defines it so).
 *  - load() never calls dlclose while a Function made from the library
 *    lives: the handle is owned by a capsule the Function holds.
 */
#include "dlbridge_py.h"
#include "../core/validate_fast.h"

#include <dlfcn.h>
#include <float.h>
#include <math.h>
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

/* Parameters and results together (the signature language's limit). */
#define FN_MAX_PARAMS DLB_SIGNATURE_MAX_PARAMS

#define KERNEL_CAPSULE_NAME "dlb_kernel"
#define LIBRARY_CAPSULE_NAME "dlbridge._library"

/* ---- the compiled signature --------------------------------------------------- */

/* The parse of the core (dlb_signature_parse, src/core/signature.c): a
 * parameter is a dtype, a rank and its first dim record; a dim record
 * binds a name, checks a literal, or checks against the (parameter, axis)
 * that bound its name. */
typedef dlb_signature_param fn_param;
typedef dlb_signature_dim fn_dim;
#define DIM_LITERAL DLB_SIGNATURE_DIM_LITERAL
#define DIM_BIND DLB_SIGNATURE_DIM_BIND
#define DIM_CHECK DLB_SIGNATURE_DIM_CHECK

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  dlb_kernel kernel;
  dlb_module_state *st; /* alive as long as our type, which we hold */
  int32_t nin, nout;
  fn_param *params;     /* nin inputs then nout outputs; owns dims too */
  fn_dim *dims;
  /* [nin]: the last handler each input's type had (the common call passes
   * the same types every time) */
  dlb_handler_memo *memos;
  PyObject *name;        /* str */
  char *cname;           /* the name in UTF-8, for messages made without
                            the GIL (dlb__function_run) */
  PyObject *identity;    /* str "<name>_<hash>", made on first use */
  PyObject *signature;   /* str, as given */
  PyObject *param_names; /* tuple of str, the inputs */
  PyObject *sym_names;   /* tuple of str */
  PyObject *owner;       /* keeps the kernel's code alive, or NULL */
  PyObject *weakreflist;
} fn_object;

/* ValueError: message, the signature, and a caret under the bad character.
 * Control whitespace is shown as spaces and the caret column counts code
 * points, so it lines up for any signature. */
static void raise_parse_error(PyObject *sig, const dlb_signature *p) {
  Py_ssize_t col = 0;
  for (size_t i = 0; i < p->error_pos && i < p->length; i++)
    if (((unsigned char)p->text[i] & 0xC0) != 0x80) col++;
  PyObject *shown = NULL, *pad = NULL, *tmp = NULL;
  shown = Py_NewRef(sig);
  for (const char *ws = "\n\r\t"; *ws; ws++) {
    PyObject *from = PyUnicode_FromOrdinal(*ws);
    PyObject *to = PyUnicode_FromOrdinal(' ');
    tmp = (from && to) ? PyUnicode_Replace(shown, from, to, -1) : NULL;
    Py_XDECREF(from);
    Py_XDECREF(to);
    if (tmp == NULL) goto done;
    Py_SETREF(shown, tmp);
    tmp = NULL;
  }
  pad = PyUnicode_New(col, 127);
  if (pad == NULL) goto done;
  if (col > 0 && PyUnicode_Fill(pad, 0, col, ' ') < 0) goto done;
  PyErr_Format(PyExc_ValueError, "%s\n  %U\n  %U^", p->message, shown, pad);
done:
  Py_XDECREF(shown);
  Py_XDECREF(pad);
}

/* ---- construction ------------------------------------------------------------------ */

static PyObject *names_tuple(const char *const *w, const size_t *len,
                             int n) {
  PyObject *t = PyTuple_New(n);
  if (t == NULL) return NULL;
  for (int i = 0; i < n; i++) {
    PyObject *s = PyUnicode_FromStringAndSize(w[i], (Py_ssize_t)len[i]);
    if (s == NULL) {
      Py_DECREF(t);
      return NULL;
    }
    PyUnicode_InternInPlace(&s);
    PyTuple_SET_ITEM(t, i, s);
  }
  return t;
}

/* Parse sig into fn (fields params/dims/nin/nout/name/param_names/
 * sym_names).  0, or -1 with ValueError/TypeError/MemoryError. */
static int compile_signature(fn_object *fn, PyObject *sig) {
  int rc = -1;
  dlb_signature *p = NULL;
  dlb_error err;
  if (!PyUnicode_Check(sig)) {
    PyErr_Format(PyExc_TypeError, "signature must be a str, not %.100s",
                 Py_TYPE(sig)->tp_name);
    goto cleanup;
  }
  Py_ssize_t len;
  const char *s = PyUnicode_AsUTF8AndSize(sig, &len);
  if (s == NULL) goto cleanup;
  /* The parse is large (every possible dim); it lives only here. */
  p = (dlb_signature *)PyMem_Calloc(1, sizeof *p);
  if (p == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  if (dlb_signature_parse(s, (size_t)len, p, &err) != DLB_OK) {
    raise_parse_error(sig, p);
    goto cleanup;
  }
  size_t bytes = (size_t)p->nparams * sizeof(fn_param) +
                 (size_t)p->ndims * sizeof(fn_dim);
  fn->params = (fn_param *)PyMem_Malloc(bytes ? bytes : 1);
  if (fn->params == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  memcpy(fn->params, p->params, (size_t)p->nparams * sizeof(fn_param));
  fn->dims = (fn_dim *)(fn->params + p->nparams);
  memcpy(fn->dims, p->dims, (size_t)p->ndims * sizeof(fn_dim));
  fn->memos = (dlb_handler_memo *)PyMem_Calloc(p->nin ? (size_t)p->nin : 1,
                                               sizeof *fn->memos);
  if (fn->memos == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  fn->nin = p->nin;
  fn->nout = p->nparams - p->nin;
  fn->name = PyUnicode_FromStringAndSize(p->name, (Py_ssize_t)p->name_len);
  if (fn->name == NULL) goto cleanup;
  fn->cname = (char *)PyMem_Malloc(p->name_len + 1);
  if (fn->cname == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  memcpy(fn->cname, p->name, p->name_len);
  fn->cname[p->name_len] = '\0';
  fn->param_names = names_tuple(p->param_name, p->param_name_len, p->nin);
  if (fn->param_names == NULL) goto cleanup;
  fn->sym_names = names_tuple(p->sym, p->sym_len, p->nsyms);
  if (fn->sym_names == NULL) goto cleanup;
  fn->signature = Py_NewRef(sig);
  rc = 0;
cleanup:
  PyMem_Free(p);
  return rc;
}

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
                                  PyObject *owner, PyObject *sig);

static PyObject *function_vectorcall(PyObject *self, PyObject *const *args,
                                     size_t nargsf, PyObject *kwnames);

static fn_object *function_create(PyTypeObject *type, dlb_kernel kernel,
                                  PyObject *owner, PyObject *sig) {
  fn_object *fn = (fn_object *)type->tp_alloc(type, 0);
  if (fn == NULL) return NULL;
  fn->vectorcall = function_vectorcall;
  fn->kernel = kernel;
  fn->st = dlb__state_from_type(type);
  fn->owner = Py_XNewRef(owner);
  if (fn->st == NULL) {
    PyErr_SetString(PyExc_TypeError, "Function type without its module");
    Py_DECREF(fn);
    return NULL;
  }
  if (compile_signature(fn, sig) < 0) {
    Py_DECREF(fn);
    return NULL;
  }
  return fn;
}

static PyObject *function_new(PyTypeObject *type, PyObject *args,
                              PyObject *kwargs) {
  static char *kwlist[] = {"kernel", "signature", NULL};
  PyObject *kobj, *sig, *owner = NULL;
  dlb_kernel kernel;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OU:Function", kwlist, &kobj,
                                   &sig))
    return NULL;
  if (kernel_from_object(kobj, &kernel, &owner) < 0) return NULL;
  fn_object *fn = function_create(type, kernel, owner, sig);
  Py_XDECREF(owner);
  return (PyObject *)fn;
}

static void function_dealloc(PyObject *self) {
  fn_object *fn = (fn_object *)self;
  PyTypeObject *tp = Py_TYPE(self);
  if (fn->weakreflist != NULL) PyObject_ClearWeakRefs(self);
  PyMem_Free(fn->params);
  PyMem_Free(fn->memos);
  PyMem_Free(fn->cname);
  Py_CLEAR(fn->name);
  Py_CLEAR(fn->identity);
  Py_CLEAR(fn->signature);
  Py_CLEAR(fn->param_names);
  Py_CLEAR(fn->sym_names);
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
  void *handle = NULL;
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  PyObject *path, *symbol, *sig;
  if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError,
                    "load() takes positional arguments only: "
                    "load(path, symbol, signature)");
    goto cleanup;
  }
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError,
                 "load(path, symbol, signature) takes 3 arguments (%zd given)",
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
  const char *sym = PyUnicode_AsUTF8(symbol);
  if (sym == NULL) goto cleanup;
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
  dlerror();
  void *ptr = dlsym(handle, sym);
  const char *e = dlerror();
  if (ptr == NULL) {
    PyErr_Format(PyExc_ValueError, "symbol %R not found in %R: %s", symbol,
                 path, e ? e : "the symbol is NULL");
    goto fail;
  }
  memcpy(&fn->kernel, &ptr, sizeof fn->kernel);
  fn->owner = lib;
  lib = NULL;
  goto cleanup;
fail:
  Py_CLEAR(result);
cleanup:
  Py_XDECREF(lib);
  Py_XDECREF(path_bytes);
  return result;
}

/* ---- the call --------------------------------------------------------------------- */

static PyObject *pname(const fn_object *fn, int i) {
  return PyTuple_GET_ITEM(fn->param_names, i);
}

/* Re-raise the pending exception (same type) with the argument named. */
static void prefix_error(const fn_object *fn, int i) {
  dlb__error_prefix_argument(fn->name, pname(fn, i));
}

static int dim_error(const fn_object *fn, int i, int axis, int64_t got,
                     const fn_dim *d, DLTensor *const *argv) {
  if (d->kind == DIM_LITERAL)
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U': dimension %d is %lld but the signature "
                 "says %lld",
                 fn->name, pname(fn, i), axis, (long long)got,
                 (long long)d->value);
  else
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U': dimension %U is %lld here but %lld "
                 "from argument '%U'",
                 fn->name, pname(fn, i), PyTuple_GET_ITEM(fn->sym_names, d->sym),
                 (long long)got,
                 (long long)argv[d->from_param]->shape[d->from_axis],
                 pname(fn, d->from_param));
  return -1;
}

static int check_error(const fn_object *fn, int i, const DLTensor *t,
                       const fn_param *p, const DLTensor *first, int ifirst) {
  char a[48], b[48];
  if (t->dtype.code != p->dtype.code || t->dtype.bits != p->dtype.bits ||
      t->dtype.lanes != p->dtype.lanes) {
    dlb__dtype_str(p->dtype, a, sizeof a);
    dlb__dtype_str(t->dtype, b, sizeof b);
    PyErr_Format(PyExc_TypeError,
                 "%U() argument '%U': expected dtype %s, got %s", fn->name,
                 pname(fn, i), a, b);
  } else if (t->ndim != p->ndim) {
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U': expected %d dimension%s, got %d",
                 fn->name, pname(fn, i), (int)p->ndim,
                 p->ndim == 1 ? "" : "s", (int)t->ndim);
  } else {
    dlb__device_str(t->device, a, sizeof a);
    dlb__device_str(first->device, b, sizeof b);
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U' is on %s but argument '%U' is on %s",
                 fn->name, pname(fn, i), a, pname(fn, ifirst), b);
  }
  return -1;
}

static PyObject *kernel_error(const fn_object *fn, int rc, dlb_error *err) {
  err->message[DLB_ERROR_MESSAGE_SIZE - 1] = '\0';
  if (rc > 0) {
    PyErr_Format(PyExc_RuntimeError,
                 "%U: the kernel returned %d; a kernel returns 0 or a "
                 "negative dlb_status",
                 fn->name, rc);
    return NULL;
  }
  PyObject *exc;
  switch (rc) {
    case DLB_ENOMEM: exc = PyExc_MemoryError; break;
    case DLB_EINVAL:
    case DLB_EOVERFLOW: exc = PyExc_ValueError; break;
    case DLB_EUNSUPPORTED:
    case DLB_EVERSION:
    case DLB_EREADONLY: exc = PyExc_BufferError; break;
    default: exc = PyExc_RuntimeError; break;
  }
  if (err->message[0] != '\0')
    PyErr_Format(exc, "%U: %s", fn->name, err->message);
  else
    PyErr_Format(exc, "%U: the kernel failed with %s", fn->name,
                 dlb_status_name(rc));
  return NULL;
}

/* Arguments by keyword, into ordered[].  Off the fast path. */
static int order_keywords(const fn_object *fn, PyObject *const *args,
                          Py_ssize_t nargs, PyObject *kwnames,
                          PyObject **ordered) {
  Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
  if (nargs + nkw > fn->nin) {
    PyErr_Format(PyExc_TypeError, "%U() takes %d argument%s (%zd given)",
                 fn->name, (int)fn->nin, fn->nin == 1 ? "" : "s", nargs + nkw);
    return -1;
  }
  for (int i = 0; i < fn->nin; i++) ordered[i] = i < nargs ? args[i] : NULL;
  for (Py_ssize_t k = 0; k < nkw; k++) {
    PyObject *key = PyTuple_GET_ITEM(kwnames, k);
    int found = -1;
    for (int i = 0; i < fn->nin; i++) {
      PyObject *nm = pname(fn, i);
      if (nm == key || PyUnicode_Compare(nm, key) == 0) {
        found = i;
        break;
      }
    }
    if (found < 0) {
      if (PyErr_Occurred()) return -1;
      PyErr_Format(PyExc_TypeError,
                   "%U() got an unexpected keyword argument %R", fn->name, key);
      return -1;
    }
    if (ordered[found] != NULL) {
      PyErr_Format(PyExc_TypeError, "%U() got multiple values for argument %R",
                   fn->name, key);
      return -1;
    }
    ordered[found] = args[nargs + k];
  }
  for (int i = 0; i < fn->nin; i++)
    if (ordered[i] == NULL) {
      PyErr_Format(PyExc_TypeError, "%U() missing argument '%U'", fn->name,
                   pname(fn, i));
      return -1;
    }
  return 0;
}

/* Error paths, kept out of line: inlined they tripled the size of the hot
 * function (see the core's internal.h for the idiom). */
#define DLB__OUT_OF_LINE(ret, name, params) \
  static ret (*const volatile name##_out_of_line) params = name

/* Argument i's tensor t, read borrowed from obj's exchange table, failed
 * the inline validator: the full one says why (-1), or accepts what the
 * fast path would not decide (0). */
static int invalid_error(const fn_object *fn, int i, PyObject *obj,
                         const DLTensor *t) {
  dlb_error err;
  if (dlb_tensor_validate(t, 0, &err) == DLB_OK) return 0;
  dlb__raise_view_error("an object", obj, &err);
  prefix_error(fn, i);
  return -1;
}

static PyObject *nargs_error(const fn_object *fn, Py_ssize_t nargs) {
  PyErr_Format(PyExc_TypeError, "%U() takes %d argument%s (%zd given)",
               fn->name, (int)fn->nin, fn->nin == 1 ? "" : "s", nargs);
  return NULL;
}

static int mut_number_error(const fn_object *fn, int i, PyObject *obj) {
  PyErr_Format(PyExc_TypeError,
               "%U() argument '%U' is 'mut': it needs a writable 0-d tensor, "
               "not a Python %.50s",
               fn->name, pname(fn, i), Py_TYPE(obj)->tp_name);
  return -1;
}

static int changing_error(const fn_object *fn) {
  PyErr_Format(PyExc_RuntimeError,
               "%U(): the arguments kept changing while they were read "
               "(Python code run by one argument changed the class of "
               "another); call again",
               fn->name);
  return -1;
}

DLB__OUT_OF_LINE(PyObject *, nargs_error,
                 (const fn_object *, Py_ssize_t));
DLB__OUT_OF_LINE(int, mut_number_error, (const fn_object *, int, PyObject *));
DLB__OUT_OF_LINE(int, invalid_error,
                 (const fn_object *, int, PyObject *, const DLTensor *));
DLB__OUT_OF_LINE(void, prefix_error, (const fn_object *, int));
DLB__OUT_OF_LINE(int, dim_error,
                 (const fn_object *, int, int, int64_t, const fn_dim *,
                  DLTensor *const *));
DLB__OUT_OF_LINE(int, check_error,
                 (const fn_object *, int, const DLTensor *, const fn_param *,
                  const DLTensor *, int));
DLB__OUT_OF_LINE(PyObject *, kernel_error,
                 (const fn_object *, int, dlb_error *));
DLB__OUT_OF_LINE(int, order_keywords,
                 (const fn_object *, PyObject *const *, Py_ssize_t,
                  PyObject *, PyObject **));

/* ---- the signature's checks, shared by every caller ---------------------------
 *
 * The eager call (function_call), the compiled calls' shape function
 * (Function._result_specs, at trace time) and their run time
 * (dlb__function_run) check tensors against the signature with these, so
 * a mismatch is found by the same rule everywhere. */

#if defined(__GNUC__)
#define FN_HOT_INLINE __attribute__((always_inline)) inline
#else
#define FN_HOT_INLINE inline
#endif

/* Whether t has parameter p's dtype and rank. */
static FN_HOT_INLINE int type_matches(const fn_param *p, const DLTensor *t) {
  return t->dtype.code == p->dtype.code && t->dtype.bits == p->dtype.bits &&
         t->dtype.lanes == p->dtype.lanes && t->ndim == p->ndim;
}

/* The first axis of t (parameter p, of the right rank) whose extent is not
 * the signature's -- a literal, or the extent of the argument that bound
 * its name (argv[d->from_param], checked before) -- or -1.  With
 * some_unknown (a constant at each call site), an extent of -1 stands for
 * one not known yet (a compiler's dynamic dimension) and matches
 * anything. */
static FN_HOT_INLINE int dim_mismatch_in(const fn_object *fn,
                                         const fn_param *p, const DLTensor *t,
                                         DLTensor *const *argv,
                                         int some_unknown) {
  const fn_dim *d = &fn->dims[p->dim0];
  for (int a = 0; a < p->ndim; a++, d++) {
    if (d->kind == DIM_BIND) continue;
    int64_t want = d->kind == DIM_LITERAL
                       ? d->value
                       : argv[d->from_param]->shape[d->from_axis];
    if (some_unknown && (want < 0 || t->shape[a] < 0)) continue;
    if (t->shape[a] != want) return a;
  }
  return -1;
}

static FN_HOT_INLINE int dim_mismatch(const fn_object *fn, const fn_param *p,
                                      const DLTensor *t,
                                      DLTensor *const *argv) {
  return dim_mismatch_in(fn, p, t, argv, 0);
}

/* Result p's extents, from the inputs in argv that bound their names. */
static FN_HOT_INLINE void result_shape(const fn_object *fn, const fn_param *p,
                                       DLTensor *const *argv, int64_t *shape) {
  const fn_dim *d = &fn->dims[p->dim0];
  for (int a = 0; a < p->ndim; a++, d++)
    shape[a] = d->kind == DIM_LITERAL
                   ? d->value
                   : argv[d->from_param]->shape[d->from_axis];
}

/* Where an argument is in the call's reading (fn_frame.state). */
enum {
  ARG_PENDING = 0, /* not read yet */
  ARG_SCALAR,      /* a Python number, stored in scalars[i] */
  ARG_BORROWED,    /* a borrowed view (owns nothing): valid only while no
                      Python code runs, taken again if some does */
  ARG_FOREIGN,     /* the same, from an exchange table: not validated yet
                      (the checking pass does) */
  ARG_VIEW,        /* an owning view, safe across Python code; released at
                      the end.  Its handler is not: looked up again before
                      use (resolve_handlers) */
  ARG_UNREAD       /* Python code ran while it was read, before its view
                      was taken: the next pass reads it */
};

/* The per-call arrays.  On the stack for signatures of up to FN_INLINE
 * parameters and results (a dlb_view is ~670 bytes: 64 of them made a
 * 46 KB frame), in one heap block for larger ones. */
#define FN_INLINE 8

/* What the reading found out about an argument (fn_frame.marks). */
enum {
  MARK_AUTOGRAD = 1u << 0, /* a torch tensor autograd may have touched:
                              whether it requires grad is asked in step 3
                              (refuse_grad) */
  MARK_COPY = 1u << 1, /* `mut`, of a framework whose arrays are immutable:
                          the kernel writes a copy, returned as a result */
  MARK_WRITTEN = 1u << 2, /* `mut`, a torch tensor: its version counter
                             moves after the kernel (tell_written) */
  MARK_OWNING = 1u << 3 /* read owning (ARG_VIEW); in fn_frame.marked only */
};

typedef struct {
  dlb_view *views;                 /* [nin] */
  dlb_scalar *scalars;             /* [nin] */
  PyObject **ordered;              /* [nin], keyword calls */
  uint8_t *state;                  /* [nin], ARG_* */
  uint8_t *marks;                  /* [nin], MARK_*, set by each read */
  uint8_t marked;                  /* every mark set in this call (some may
                                      have been read again since): the
                                      fast path looks at nothing else */
  DLTensor **argv;                 /* [nin + nout] */
  /* [nout + copies]: the results, then the copies of MARK_COPY arguments */
  DLManagedTensorVersioned **outs;
  /* [nin + 1]: types held while their handlers are in use (a handler
   * lives as long as its type) */
  PyObject **pins;
  /* In the frame, not locals of function_call, which they would crowd for
   * the sake of the rare calls that use them. */
  int npins;                       /* pins[0..npins) */
  int ncopy;                       /* MARK_COPY arguments */
#ifdef Py_GIL_DISABLED
  /* [nin]: each argument's type, held from its reading to the end of the
   * call.  With a GIL an argument's class changes only when this call runs
   * Python code, which makes it read again; without one, another thread
   * may change it (and drop the last reference to the old class, handler
   * and all) whenever this thread waits for anything -- a lock of
   * CPython's, of a framework's, of ours.  NULL: not read yet. */
  PyObject **tpins;
#endif
} fn_frame;

/* Drop a pin (a type held by the call).  With no exception pending there
 * is nothing to keep from the type's dealloc; with a GIL, one that is not
 * the last reference runs no code either. */
static inline void unpin(PyObject **pin) {
#ifdef Py_GIL_DISABLED
  if (!PyErr_Occurred()) {
    Py_CLEAR(*pin);
    return;
  }
#else
  if (Py_REFCNT(*pin) > 1) {
    Py_DECREF(*pin);
    *pin = NULL;
    return;
  }
#endif
  dlb__clear_keep_error(pin);
}

/* The handler of obj's type when parameter i's memo does not stand:
 * looked up (and remembered).  Classifying a type runs Python code
 * (*python is set then), which may reassign obj's class and free the type
 * it was classifying, handler and all: the type is held while it is looked
 * up, and a handler whose type is no longer obj's is not returned (*moved
 * is set; nothing to use, no exception).  NULL with an exception. */
static const dlb_handler *arg_handler(fn_object *fn, int i, PyObject *obj,
                                      int *python, int *moved) {
  dlb_module_state *st = fn->st;
  PyTypeObject *type = (PyTypeObject *)Py_NewRef(Py_TYPE(obj));
  const dlb_handler *h = dlb__handler_for_memo(st, &fn->memos[i], type, python);
  if (h != NULL && Py_TYPE(obj) != type) {
    *moved = 1;
    *python = 1; /* the release below may free the type: Python again */
  }
  Py_DECREF(type);
  return h;
}

DLB__OUT_OF_LINE(const dlb_handler *, arg_handler,
                 (fn_object *, int, PyObject *, int *, int *));

#ifdef Py_GIL_DISABLED
/* Hold obj's class as argument i's type for the rest of the call
 * (fn_frame.tpins), letting go of the one held before: obj's class changed
 * since its last reading, so Python code ran (*python is set). */
static void pin_type(fn_frame *f, int i, PyObject *obj, int *python) {
  PyObject *old = f->tpins[i];
  f->tpins[i] = Py_NewRef((PyObject *)Py_TYPE(obj));
  if (old != NULL) {
    *python = 1;
    unpin(&old);
  }
}
DLB__OUT_OF_LINE(void, pin_type, (fn_frame *, int, PyObject *, int *));
#endif

/* Read argument i (not a number), looking its handler up.  A NumPy array,
 * a dlb.Tensor or a torch-like tensor is viewed borrowed; for the latter,
 * what its exchange table cannot say is checked next, knowing its dtype
 * (dlb__check_bits: inline when torch's bits can be read and say nothing
 * is set) -- on every pass, so the views the kernel gets were all checked
 * after the last Python code ran: the check runs none but for the first
 * torch tensor of the process (the argument is then read again).  Every
 * other kind is read owning (producers'
 * __dlpack__ run Python code).  *python is set when Python code may have
 * run.  0, -1 (the caller names the argument), or 1 when obj is a graph
 * compiler's placeholder (nothing read; views[i].handler is its handler):
 * the call belongs to the compiler. */
static FN_HOT_INLINE int read_arg(fn_object *fn, fn_frame *f, PyObject *obj,
                                  int i, int *python) {
  dlb_module_state *st = fn->st;
  unsigned opts = 0;
  f->marks[i] = 0;
#ifdef Py_GIL_DISABLED
  if (f->tpins[i] != (PyObject *)Py_TYPE(obj))
    pin_type_out_of_line(f, i, obj, python);
#endif
  const dlb_handler *h =
      dlb__handler_memo_get(st, &fn->memos[i], Py_TYPE(obj));
  if (h == NULL) {
    int moved = 0;
    h = arg_handler_out_of_line(fn, i, obj, python, &moved);
    if (h == NULL) return -1;
    if (moved) {
      f->state[i] = ARG_UNREAD;
      return 0;
    }
  }
  if (h->traced) {
    f->views[i].handler = h;
    return 1;
  }
  if (fn->params[i].mut) {
    /* An immutable framework's array is only read: its copy is written. */
    if (h->immutable) {
      f->marks[i] = MARK_COPY;
      f->marked |= MARK_COPY;
    } else {
      opts = DLB_VIEW_WRITABLE;
    }
  }
  switch (h->kind) {
    case DLB_KIND_EXCHANGE:
      if (h->api->dltensor_from_py_object_no_sync == NULL) break;
      if (dlb__view_exchange_borrowed(h, obj, &f->views[i]) < 0) return -1;
      if (dlb__bits_maybe_set(st, obj)) {
        /* Whether it requires grad is not asked here: only when it matters
         * -- grad mode on, or a write -- in step 3 (refuse_grad). */
        int ran = 0;
        if (dlb__check_bits(st, obj, 0, f->views[i].t.dtype, NULL, &ran) < 0)
          return -1;
        if (dlb__torch_autograd_touched(st, obj)) {
          f->marks[i] |= MARK_AUTOGRAD;
          f->marked |= MARK_AUTOGRAD;
        }
        if (ran) {
          /* The view may be stale, h dead with a class the Python code
           * dropped: the next pass reads it again. */
          *python = 1;
          f->state[i] = ARG_UNREAD;
          return 0;
        }
      }
      /* A torch tensor (torch's base type is known once one was checked,
       * as every one read here was) written in place: autograd is told. */
      PyTypeObject *torch_base = DLB_FT_LOAD_PTR(&st->torch_base);
      if ((opts & DLB_VIEW_WRITABLE) && torch_base != NULL &&
          PyObject_TypeCheck(obj, torch_base)) {
        f->marks[i] |= MARK_WRITTEN;
        f->marked |= MARK_WRITTEN;
      }
      f->state[i] = ARG_FOREIGN;
      return 0;
    case DLB_KIND_TENSOR:
    case DLB_KIND_NUMPY:
      if (dlb__view_get_with(st, h, obj, opts | DLB_VIEW_BITS_CHECKED,
                             &f->views[i]) < 0)
        return -1;
      f->state[i] = ARG_BORROWED;
      return 0;
    default:
      break;
  }
  *python = 1;
  if (dlb__view_get_with(st, h, obj, opts, &f->views[i]) < 0) return -1;
  f->state[i] = ARG_VIEW;
  f->marked |= MARK_OWNING;
  if ((opts & DLB_VIEW_WRITABLE) && h->framework == st->str_torch) {
    /* torch's, read another way (its __dlpack__): told as well */
    f->marks[i] |= MARK_WRITTEN;
    f->marked |= MARK_WRITTEN;
  }
  return 0;
}


/* After the kernel ran (or failed: it may have written first): torch counts
 * in-place writes -- autograd's version counters -- so a backward that
 * saved a `mut` torch argument (MARK_WRITTEN) raises instead of using the
 * new values, as after torch's own in-place ops.  0, or -1 with an
 * exception. */
static int tell_written(const fn_object *fn, const fn_frame *f,
                        PyObject *const *args) {
  PyObject *written[FN_MAX_PARAMS];
  int n = 0;
  for (int i = 0; i < fn->nin; i++)
    if (f->marks[i] & MARK_WRITTEN) written[n++] = args[i];
  return n > 0 ? dlb__torch_bump_versions(fn->st, written, n) : 0;
}

DLB__OUT_OF_LINE(int, tell_written,
                 (const fn_object *, const fn_frame *, PyObject *const *));

/* The arguments autograd may have touched (MARK_AUTOGRAD): one that
 * requires grad, with grad mode on, would give a result with no grad_fn and
 * a loss using it a silently wrong gradient -- the call is refused (the
 * compiled routes raise the same); with it off (no_grad, inference mode)
 * reading is fine, writing is not.  Each question only when its answer
 * matters: grad mode once, before the first read-only argument is asked
 * whether it requires grad (a view of a tensor autograd never touched has
 * autograd metadata, so reads under no_grad ask nothing else).  No Python
 * code runs.  0, or -1 with an exception. */
static int refuse_grad(const fn_object *fn, const fn_frame *f,
                       PyObject *const *args) {
  dlb_module_state *st = fn->st;
  int on = -1; /* grad mode, once asked */
  for (int i = 0; i < fn->nin; i++) {
    if (!(f->marks[i] & MARK_AUTOGRAD)) continue;
    int written = fn->params[i].mut && !(f->marks[i] & MARK_COPY);
    if (!written) {
      if (on < 0 && (on = dlb__torch_grad_enabled(st)) < 0) return -1;
      if (!on) continue;
    }
    int grad = dlb__torch_requires_grad(st, args[i]);
    if (grad < 0) return -1;
    if (!grad) continue;
    if (on < 0 && (on = dlb__torch_grad_enabled(st)) < 0) return -1;
    if (on) {
      PyErr_Format(PyExc_RuntimeError, "%U: dlbridge Function has no backward",
                   fn->name);
      return -1;
    }
    dlb__refuse_grad_write(args[i]);
    prefix_error(fn, i);
    return -1;
  }
  return 0;
}

/* What the marks ask for, before the signature's checks: the refusal of
 * an argument that requires grad (refuse_grad); the copies of the
 * MARK_COPY arguments counted (f->ncopy) and their handlers held
 * (f->pins) for the copies' allocation and hand-over.  0, or -1 with an
 * exception. */
static int marked(const fn_object *fn, fn_frame *f, PyObject *const *args) {
  if ((f->marked & MARK_AUTOGRAD) && refuse_grad(fn, f, args) < 0) return -1;
  for (int i = 0; i < fn->nin; i++)
    if (f->marks[i] & MARK_COPY) {
      f->ncopy++;
      f->pins[f->npins++] =
          Py_NewRef((PyObject *)f->views[i].handler->type);
    }
  return 0;
}

DLB__OUT_OF_LINE(int, marked,
                 (const fn_object *, fn_frame *, PyObject *const *));

/* The copies of the MARK_COPY arguments, for the kernel to write: each
 * allocated by its own framework's allocation path, like a result
 * (dlb__alloc_like, with its handler, whose type the caller holds), filled
 * from the argument (on stream for device memory) and put in its place in
 * the kernel's arguments; outs[*nalloc..] receives them, *nalloc counting
 * what is there to free.  0, or -1 with an exception. */
static int copy_immutable(const fn_object *fn, fn_frame *f, void *stream,
                          int *nalloc) {
  dlb_module_state *st = fn->st;
  for (int i = 0; i < fn->nin; i++) {
    if (!(f->marks[i] & MARK_COPY)) continue;
    const DLTensor *src = &f->views[i].t;
    DLTensor proto = *src;
    DLManagedTensorVersioned **out = &f->outs[*nalloc];
    dlb_error err;
    proto.data = NULL;
    proto.strides = NULL;
    proto.byte_offset = 0;
    if (dlb__alloc_like(st, f->views[i].handler, &proto, out) < 0) return -1;
    (*nalloc)++;
    DLTensor *dst = &(*out)->dl_tensor;
    if ((*out)->flags & DLPACK_FLAG_BITMASK_READ_ONLY) {
      PyErr_Format(PyExc_BufferError,
                   "%U(): the framework allocated a read-only copy of "
                   "argument '%U'",
                   fn->name, pname(fn, i));
      return -1;
    }
    int rc = dlb__is_cuda_device(src->device)
                 ? dlb_cuda_copy(dst, src, stream, &err)
                 : dlb_copy(dst, src, &err);
    if (rc != DLB_OK) {
      dlb__raise(&err);
      prefix_error(fn, i);
      return -1;
    }
    f->argv[i] = dst;
  }
  return 0;
}

/* What the call returns: the declared results (h's framework), then the new
 * values of the MARK_COPY arguments (each its own framework's) -- one
 * alone, several as a tuple.  Each of f->outs[0..nres) is stolen (and
 * NULLed) as it is handed over; what a failure leaves is the caller's to
 * free.  NULL with an exception. */
static PyObject *hand_back(const fn_object *fn, fn_frame *f,
                           const dlb_handler *h, int nres) {
  PyObject *tuple = NULL, *obj;
  if (nres > 1 && (tuple = PyTuple_New(nres)) == NULL) return NULL;
  for (int k = 0, i = 0; k < nres; k++) {
    const dlb_handler *hk = h;
    if (k >= fn->nout) {
      while (!(f->marks[i] & MARK_COPY)) i++;
      hk = f->views[i++].handler;
    }
    DLManagedTensorVersioned *m = f->outs[k];
    f->outs[k] = NULL; /* stolen whatever happens */
    if (dlb__to_framework(fn->st, hk, m, &obj) < 0) {
      Py_XDECREF(tuple);
      return NULL;
    }
    if (tuple == NULL) return obj;
    PyTuple_SET_ITEM(tuple, k, obj);
  }
  return tuple;
}

DLB__OUT_OF_LINE(int, copy_immutable,
                 (const fn_object *, fn_frame *, void *, int *));
DLB__OUT_OF_LINE(PyObject *, hand_back,
                 (const fn_object *, fn_frame *, const dlb_handler *, int));

/* The call with a compiler's placeholder among args (nin of them, in
 * parameter order), handed to python/dlbridge/_compiled.py's dispatch with
 * the framework whose placeholder it is.  Off the fast path. */
static PyObject *dispatch_traced(const fn_object *fn, PyObject *const *args,
                                 PyObject *framework) {
  PyObject *result = NULL, *module = NULL, *tuple = NULL;
  module = PyImport_ImportModule("dlbridge._compiled");
  if (module == NULL) goto cleanup;
  tuple = PyTuple_New(fn->nin);
  if (tuple == NULL) goto cleanup;
  for (int i = 0; i < fn->nin; i++)
    PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
  result = PyObject_CallMethod(module, "dispatch", "OOO", (PyObject *)fn,
                               framework, tuple);
cleanup:
  Py_XDECREF(tuple);
  Py_XDECREF(module);
  return result;
}

DLB__OUT_OF_LINE(PyObject *, dispatch_traced,
                 (const fn_object *, PyObject *const *, PyObject *));


/* After a pass that ran no Python code: the borrowed views are valid, but
 * the handler of an argument read owning is not -- Python code run after
 * its read (a later argument's __dlpack__, gc) may have reassigned its
 * class and freed the type, and the handler with it.  Each is looked up
 * again, through its memo (no call) or the cache, which may classify the
 * type (Python: *python is set, and the caller reads again).  0, or -1 with
 * an exception. */
static int resolve_handlers(fn_object *fn, fn_frame *f, PyObject *const *args,
                            int *python) {
  for (int i = 0; i < fn->nin; i++) {
    if (f->state[i] != ARG_VIEW) continue;
    PyObject *obj = args[i];
    const dlb_handler *h =
        dlb__handler_memo_get(fn->st, &fn->memos[i], Py_TYPE(obj));
    if (h == NULL) {
      int moved = 0;
      h = arg_handler(fn, i, obj, python, &moved);
      if (h == NULL) return -1;
      if (moved) continue; /* *python is set: looked up next time */
    }
    f->views[i].handler = h;
  }
  return 0;
}


/* Step 2 of function_call, off its fast path: python says whether Python
 * code ran in the first pass.  0; -1 with an exception; 1 with *traced
 * set when an argument turned out to be a compiler's placeholder. */
static int read_again(fn_object *fn, fn_frame *f, PyObject *const *args,
                      int python, PyObject **traced) {
  for (int round = 0;; round++) {
    if (!python) {
      if (!(f->marked & MARK_OWNING)) return 0;
      if (resolve_handlers(fn, f, args, &python) < 0) return -1;
      if (!python) return 0;
    }
    if (round == 4) return changing_error(fn);
    python = 0;
    for (int i = 0; i < fn->nin; i++) {
      uint8_t state = f->state[i];
      if (state != ARG_BORROWED && state != ARG_FOREIGN &&
          state != ARG_UNREAD)
        continue;
      int r = read_arg(fn, f, args[i], i, &python);
      if (r > 0) {
        *traced = Py_NewRef(f->views[i].handler->framework);
        return 1;
      }
      if (r < 0) {
        prefix_error(fn, i);
        return -1;
      }
    }
  }
}

DLB__OUT_OF_LINE(int, read_again,
                 (fn_object *, fn_frame *, PyObject *const *, int,
                  PyObject **));

/* The call, with its arrays in f.  The order is what keeps borrowed views
 * valid (a NumPy array's data, a torch tensor's storage: Python code may
 * resize or free them, and a reassigned class may free the handler):
 *   1. every argument is read in order, borrowed where it can be; this may
 *      run Python code (producers' __dlpack__, torch's checks);
 *   2. if Python code ran, the arguments read borrowed are read again (a
 *      new handler lookup, a new view), until a pass runs none -- so the
 *      views in use were all taken after the last Python code -- and the
 *      handlers of the arguments read owning are looked up again;
 *   3. the checks against the signature, the outputs' allocation and the
 *      kernel, with no Python code in between.  The handler that receives
 *      the results is held (its type is) from then on: the stream query,
 *      the frameworks' importers and producers' deleters run Python. */
static inline PyObject *function_call(fn_object *fn, PyObject *const *args,
                                      Py_ssize_t nargs, PyObject *kwnames,
                                      fn_frame *f) {
  dlb_module_state *st = fn->st;
  const int nin = fn->nin, nout = fn->nout;
  dlb_view *views = f->views;
  uint8_t *state = f->state;
  DLTensor **argv = f->argv;
  PyObject *result = NULL, *traced = NULL;
  int nseen = 0, nalloc = 0, ifirst = -1, python = 0, r;
  const dlb_handler *h = NULL;
  DLTensor proto;
  int64_t shape[DLB_MAX_NDIM];
  void *stream = NULL;
  dlb_error err;

  if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
    if (order_keywords_out_of_line(fn, args, nargs, kwnames, f->ordered) < 0)
      return NULL;
    args = f->ordered;
  } else if (nargs != nin) {
    return nargs_error_out_of_line(fn, nargs);
  }

  /* 1. */
  f->marked = 0;
  for (int i = 0; i < nin; i++) {
    const fn_param *p = &fn->params[i];
    PyObject *obj = args[i];
    state[i] = ARG_PENDING;
    nseen = i + 1;
    argv[i] = &views[i].t;
    if (p->ndim == 0 &&
        (PyLong_Check(obj) || PyFloat_Check(obj) || PyComplex_Check(obj))) {
      DLTensor *t = &views[i].t;
      if (p->mut) {
        mut_number_error_out_of_line(fn, i, obj);
        goto cleanup;
      }
      if (dlb__scalar_from_number(fn->name, pname(fn, i), obj, p->dtype,
                                  &f->scalars[i]) < 0)
        goto cleanup;
      t->data = f->scalars[i].bytes;
      t->device.device_type = kDLCPU;
      t->device.device_id = 0;
      t->ndim = 0;
      t->dtype = p->dtype;
      t->shape = NULL;
      t->strides = NULL;
      t->byte_offset = 0;
      state[i] = ARG_SCALAR;
      f->marks[i] = 0;
      continue;
    }
    r = read_arg(fn, f, obj, i, &python);
    if (r != 0) {
      if (r > 0) {
        /* a compiler's placeholder: the call is the compiler's (below) */
        traced = Py_NewRef(views[i].handler->framework);
        goto cleanup;
      }
      prefix_error_out_of_line(fn, i);
      goto cleanup;
    }
  }

  /* 2. */
  if (python || (f->marked & MARK_OWNING)) {
    r = read_again_out_of_line(fn, f, args, python, &traced);
    if (r != 0) goto cleanup;
  }

  /* 3.  From here to the kernel no Python code runs. */
  const uint8_t marked = f->marked; /* read once: the fast path has none */
  if ((marked & (MARK_AUTOGRAD | MARK_COPY)) &&
      marked_out_of_line(fn, f, args) < 0)
    goto cleanup;
  for (int i = 0; i < nin; i++) {
    const fn_param *p = &fn->params[i];
    DLTensor *t = &views[i].t;
    if (state[i] == ARG_SCALAR) continue;
    if (!type_matches(p, t)) {
      check_error_out_of_line(fn, i, t, p, NULL, -1);
      goto cleanup;
    }
    /* Before anything reads its shape.  The dtype is the signature's,
     * known to be valid: the inline check need not look it up. */
    if (state[i] == ARG_FOREIGN &&
        !dlb__validate_ok(t, DLB_VALIDATE_ANY_DTYPE, false) &&
        invalid_error_out_of_line(fn, i, args[i], t) < 0)
      goto cleanup;
    if (ifirst < 0) {
      ifirst = i;
    } else if (t->device.device_type != views[ifirst].t.device.device_type ||
               t->device.device_id != views[ifirst].t.device.device_id) {
      check_error_out_of_line(fn, i, t, p, &views[ifirst].t, ifirst);
      goto cleanup;
    }
    int axis = dim_mismatch(fn, p, t, argv);
    if (axis >= 0) {
      dim_error_out_of_line(fn, i, axis, t->shape[axis],
                            &fn->dims[p->dim0 + axis], argv);
      goto cleanup;
    }
  }

  /* Where results live and which stream the kernel runs on: the first
   * tensor argument's framework and device decide both. */
  if (ifirst >= 0) {
    h = views[ifirst].handler;
    proto.device = views[ifirst].t.device;
    if (nout > 0 || proto.device.device_type != kDLCPU)
      f->pins[f->npins++] = Py_NewRef((PyObject *)h->type);
    if (proto.device.device_type != kDLCPU &&
        dlb__current_stream(st, h, proto.device, &stream) < 0)
      goto cleanup;
  } else if (nout > 0) {
    h = dlb__handler_for(st, st->TensorType);
    if (h == NULL) goto cleanup;
    proto.device.device_type = kDLCPU;
    proto.device.device_id = 0;
  }

  for (int o = 0; o < nout; o++) {
    const fn_param *p = &fn->params[nin + o];
    result_shape(fn, p, argv, shape);
    proto.data = NULL;
    proto.ndim = p->ndim;
    proto.dtype = p->dtype;
    proto.shape = shape;
    proto.strides = NULL;
    proto.byte_offset = 0;
    if (dlb__alloc_like(st, h, &proto, &f->outs[o]) < 0) goto cleanup;
    nalloc = o + 1;
    if (f->outs[o]->flags & DLPACK_FLAG_BITMASK_READ_ONLY) {
      PyErr_Format(PyExc_BufferError,
                   "%U(): the framework allocated a read-only result", fn->name);
      goto cleanup;
    }
    argv[nin + o] = &f->outs[o]->dl_tensor;
  }
  if ((marked & MARK_COPY) &&
      copy_immutable_out_of_line(fn, f, stream, &nalloc) < 0)
    goto cleanup;

  err.code = DLB_OK;
  err.message[0] = '\0';
  int rc = fn->kernel(argv, nin + nout, stream, &err);
  if ((marked & MARK_WRITTEN) && tell_written_out_of_line(fn, f, args) < 0) {
    if (rc == 0) goto cleanup;
    PyErr_Clear(); /* the kernel's own error says more */
  }
  if (rc != 0) {
    kernel_error_out_of_line(fn, rc, &err);
    goto cleanup;
  }

  /* The inputs are done with: let go of them before any Python code runs
   * in the conversions below. */
  for (int i = 0; i < nseen; i++)
    if (state[i] == ARG_VIEW) dlb__view_release(&views[i]);
  nseen = 0;

  if (nout + f->ncopy == 0) {
    result = Py_NewRef(Py_None);
  } else if (nout + f->ncopy == 1 && nout == 1) {
    DLManagedTensorVersioned *m = f->outs[0];
    f->outs[0] = NULL; /* stolen whatever happens */
    if (dlb__to_framework(st, h, m, &result) < 0) result = NULL;
  } else {
    result = hand_back_out_of_line(fn, f, h, nout + f->ncopy);
  }

cleanup:
  for (int i = 0; i < nseen; i++)
    if (state[i] == ARG_VIEW) dlb__view_release(&views[i]);
  for (int o = 0; o < nalloc; o++)
    if (f->outs[o] != NULL) dlb_managed_delete(f->outs[o]);
  while (f->npins > 0) unpin(&f->pins[--f->npins]);
#ifdef Py_GIL_DISABLED
  for (int i = 0; i < nin; i++)
    if (f->tpins[i] != NULL) unpin(&f->tpins[i]);
#endif
  if (traced != NULL) {
    /* What was read is let go of; the compiler gets the whole call. */
    result = dispatch_traced_out_of_line(fn, args, traced);
    Py_DECREF(traced);
  }
  return result;
}

/* A signature with more than FN_INLINE parameters and results: the arrays
 * in one heap block (returned, to be freed by the caller).  Off the fast
 * path. */
static void *frame_alloc(const fn_object *fn, fn_frame *f) {
  size_t nin = (size_t)fn->nin, n = nin + (size_t)fn->nout;
  size_t bytes = nin * (sizeof(dlb_view) + sizeof(dlb_scalar) +
                        sizeof(PyObject *)) +
                 n * sizeof(DLTensor *) +
                 n * sizeof(DLManagedTensorVersioned *) +
                 (nin + 1) * sizeof(PyObject *) + 2 * nin;
#ifdef Py_GIL_DISABLED
  bytes += nin * sizeof(PyObject *);
#endif
  char *block = PyMem_Malloc(bytes);
  if (block == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  char *q = block; /* the most aligned first */
  f->views = (dlb_view *)q;
  q += nin * sizeof(dlb_view);
  f->scalars = (dlb_scalar *)q;
  q += nin * sizeof(dlb_scalar);
  f->ordered = (PyObject **)q;
  q += nin * sizeof(PyObject *);
  f->argv = (DLTensor **)q;
  q += n * sizeof(DLTensor *);
  f->outs = (DLManagedTensorVersioned **)q;
  q += n * sizeof(DLManagedTensorVersioned *);
  f->pins = (PyObject **)q;
  q += (nin + 1) * sizeof(PyObject *);
#ifdef Py_GIL_DISABLED
  f->tpins = (PyObject **)q;
  memset(f->tpins, 0, nin * sizeof(PyObject *));
  q += nin * sizeof(PyObject *);
#endif
  f->state = (uint8_t *)q;
  q += nin;
  f->marks = (uint8_t *)q;
  return block;
}

DLB__OUT_OF_LINE(void *, frame_alloc, (const fn_object *, fn_frame *));

static PyObject *function_vectorcall(PyObject *self, PyObject *const *args,
                                     size_t nargsf, PyObject *kwnames) {
  fn_object *fn = (fn_object *)self;
  dlb_view views[FN_INLINE];
  dlb_scalar scalars[FN_INLINE];
  PyObject *ordered[FN_INLINE];
  uint8_t state[FN_INLINE], marks[FN_INLINE];
  DLTensor *argv[FN_INLINE];
  DLManagedTensorVersioned *outs[FN_INLINE];
  PyObject *pins[FN_INLINE + 1];
#ifdef Py_GIL_DISABLED
  PyObject *tpins[FN_INLINE] = {NULL};
  fn_frame f = {views, scalars, ordered, state, marks, 0, argv, outs, pins,
                0, 0, tpins};
#else
  fn_frame f = {views, scalars, ordered, state, marks, 0, argv, outs, pins,
                0, 0};
#endif
  void *block = NULL;
  if (fn->nin + fn->nout > FN_INLINE) {
    block = frame_alloc_out_of_line(fn, &f);
    if (block == NULL) return NULL;
  }
  PyObject *r = function_call(fn, args, PyVectorcall_NARGS(nargsf), kwnames, &f);
  if (block != NULL) PyMem_Free(block);
  return r;
}

/* ---- what compilers ask of a Function (src/ops, python/dlbridge/_ops_*.py) -------- */

int dlb__function_check(PyObject *obj) {
  dlb_module_state *st = dlb__state_from_type(Py_TYPE(obj));
  return st != NULL && PyObject_TypeCheck(obj, st->FunctionType);
}

const dlb_signature_param *dlb__function_params(PyObject *self, int32_t *nin,
                                                int32_t *nout) {
  const fn_object *fn = (const fn_object *)self;
  *nin = fn->nin;
  *nout = fn->nout;
  return fn->params;
}

const char *dlb__function_name(PyObject *self) {
  return ((const fn_object *)self)->cname;
}

int dlb__function_same_kernel(PyObject *a, PyObject *b) {
  return ((const fn_object *)a)->kernel == ((const fn_object *)b)->kernel;
}

int dlb__function_run(PyObject *self, DLTensor *const *argv, int32_t nargs,
                      void *stream, dlb_error *err) {
  const fn_object *fn = (const fn_object *)self;
  if (nargs != fn->nin + fn->nout)
    return dlb_error_set(err, DLB_EINVAL,
                         "%s(): called with %d tensors; the signature has %d "
                         "parameters and %d results",
                         fn->cname, (int)nargs, (int)fn->nin, (int)fn->nout);
  for (int32_t i = 0; i < nargs; i++) {
    const fn_param *p = &fn->params[i];
    const DLTensor *t = argv[i];
    int axis = -1;
    if (!type_matches(p, t) || (axis = dim_mismatch(fn, p, t, argv)) >= 0) {
      char want[DLB_DESCRIBE_MAX], got[DLB_DESCRIBE_MAX];
      dlb__dtype_str(p->dtype, want, sizeof want);
      dlb__dtype_str(t->dtype, got, sizeof got);
      return dlb_error_set(
          err, DLB_EINVAL,
          "%s(): %s %d is a %s tensor of %d dimensions%s; the signature "
          "says %s with %d",
          fn->cname, i < fn->nin ? "argument" : "result",
          (int)(i < fn->nin ? i : i - fn->nin), got, (int)t->ndim,
          axis >= 0 ? " with another extent" : "", want, (int)p->ndim);
    }
  }
  err->code = DLB_OK;
  err->message[0] = '\0';
  int rc = fn->kernel(argv, nargs, stream, err);
  if (rc > 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "%s: the kernel returned %d; a kernel returns 0 or a "
                         "negative dlb_status",
                         fn->cname, rc);
  if (rc < 0) {
    /* The kernel's own message, named: "<name>: <message>". */
    char message[DLB_ERROR_MESSAGE_SIZE];
    err->message[DLB_ERROR_MESSAGE_SIZE - 1] = '\0';
    memcpy(message, err->message, sizeof message);
    if (message[0] != '\0')
      return dlb_error_set(err, rc, "%s: %s", fn->cname, message);
    return dlb_error_set(err, rc, "%s: the kernel failed with %s", fn->cname,
                         dlb_status_name(rc));
  }
  return DLB_OK;
}

void dlb__function_result_shape(PyObject *self, DLTensor *const *argv,
                                int32_t o, int64_t *shape) {
  const fn_object *fn = (const fn_object *)self;
  result_shape(fn, &fn->params[fn->nin + o], argv, shape);
}

/* One tensor of specs for Function._result_specs: shape (a sequence of
 * ints) and dtype (anything dlb.dtype takes) into t, its extents stored at
 * shape.  0, or -1 with an exception. */
static int spec_tensor(const fn_object *fn, int i, PyObject *spec, DLTensor *t,
                       int64_t *shape) {
  int rc = -1;
  PyObject *dims = NULL;
  if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2) {
    PyErr_Format(PyExc_TypeError,
                 "%U()._result_specs: the spec of argument '%U' must be a "
                 "(shape, dtype) pair or None, not %.100s",
                 fn->name, pname(fn, i), Py_TYPE(spec)->tp_name);
    goto cleanup;
  }
  if (dlb__dtype_converter(fn->st, PyTuple_GET_ITEM(spec, 1), &t->dtype) < 0)
    goto cleanup;
  dims = PySequence_Tuple(PyTuple_GET_ITEM(spec, 0));
  if (dims == NULL) goto cleanup;
  Py_ssize_t n = PyTuple_GET_SIZE(dims);
  if (n > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_ValueError,
                 "%U() argument '%U': %zd dimensions; at most %d are "
                 "supported",
                 fn->name, pname(fn, i), n, DLB_MAX_NDIM);
    goto cleanup;
  }
  for (Py_ssize_t a = 0; a < n; a++) {
    PyObject *d = PyTuple_GET_ITEM(dims, a);
    if (d == Py_None) {
      shape[a] = -1; /* not known until the graph runs */
      continue;
    }
    if (!PyLong_Check(d)) {
      PyErr_Format(PyExc_TypeError,
                   "%U() argument '%U': dimension %zd is %R; an extent is an "
                   "int, or None when it is not known until the graph runs",
                   fn->name, pname(fn, i), a, d);
      goto cleanup;
    }
    shape[a] = PyLong_AsLongLong(d);
    if (shape[a] == -1 && PyErr_Occurred()) goto cleanup;
    if (shape[a] < 0) {
      PyErr_Format(PyExc_ValueError,
                   "%U() argument '%U': dimension %zd is negative (%lld)",
                   fn->name, pname(fn, i), a, (long long)shape[a]);
      goto cleanup;
    }
  }
  t->data = NULL;
  t->device.device_type = kDLCPU;
  t->device.device_id = 0;
  t->ndim = (int32_t)n;
  t->shape = shape;
  t->strides = NULL;
  t->byte_offset = 0;
  rc = 0;
cleanup:
  Py_XDECREF(dims);
  return rc;
}

/* A shape as a tuple: an int per extent, None where it is -1 (unknown). */
static PyObject *extents_tuple(int32_t n, const int64_t *v) {
  PyObject *t = PyTuple_New(n);
  for (int32_t a = 0; t != NULL && a < n; a++) {
    PyObject *e = v[a] < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(v[a]);
    if (e == NULL) Py_CLEAR(t);
    else PyTuple_SET_ITEM(t, a, e);
  }
  return t;
}

/* Function._result_specs(specs) -> (results, aliases).  What a call with
 * inputs described by specs produces, checked as the eager call checks
 * its arguments (same rule, same exception and message): specs holds one
 * item per input in parameter order -- a (shape, dtype) pair for a tensor
 * (an extent may be None: not known until the graph runs, checked then),
 * the Python number itself for a number, or None for a number whose value
 * is not known.  results: a (shape, DType) pair per declared result (None
 * extents where they come from unknown ones); aliases: the indices of the
 * `mut` inputs, whose new values a compiler that cannot write its inputs
 * returns after the results.  The shape function of every compiled route. */
static PyObject *function_result_specs(PyObject *self, PyObject *specs) {
  fn_object *fn = (fn_object *)self;
  PyObject *result = NULL, *seq = NULL, *results = NULL, *aliases = NULL;
  int nin = fn->nin, nout = fn->nout, nmut = 0;
  DLTensor *ts = NULL, **argv = NULL;
  int64_t *shapes = NULL;
  /* A list is read from a copy: another thread may change it meanwhile. */
  seq = PyList_Check(specs)
            ? PyList_AsTuple(specs)
            : PySequence_Fast(specs, "_result_specs() takes a sequence of specs");
  if (seq == NULL) goto cleanup;
  if (PySequence_Fast_GET_SIZE(seq) != nin) {
    nargs_error(fn, PySequence_Fast_GET_SIZE(seq));
    goto cleanup;
  }
  ts = PyMem_Calloc((size_t)nin + 1, sizeof *ts);
  argv = PyMem_Calloc((size_t)nin + 1, sizeof *argv);
  shapes = PyMem_Calloc(((size_t)nin + 1) * DLB_MAX_NDIM, sizeof *shapes);
  if (ts == NULL || argv == NULL || shapes == NULL) {
    PyErr_NoMemory();
    goto cleanup;
  }
  for (int i = 0; i < nin; i++) {
    const fn_param *p = &fn->params[i];
    PyObject *spec = PySequence_Fast_GET_ITEM(seq, i);
    argv[i] = &ts[i];
    if (p->mut) nmut++;
    if (spec == Py_None) {
      /* A number whose value is not known (a compiler's scalar). */
      if (p->mut) {
        mut_number_error(fn, i, spec);
        goto cleanup;
      }
      if (p->ndim != 0) {
        PyErr_Format(PyExc_TypeError,
                     "%U() argument '%U': a Python number is accepted only "
                     "for a 0-d parameter",
                     fn->name, pname(fn, i));
        goto cleanup;
      }
      ts[i].dtype = p->dtype; /* a number takes the parameter's dtype */
      continue;
    }
    if (PyLong_Check(spec) || PyFloat_Check(spec) || PyComplex_Check(spec)) {
      /* The number itself: the eager call's steps exactly, so the same
       * exception and message (range, kind, 'mut', not tensor-like). */
      dlb_scalar value;
      if (p->ndim == 0) {
        if (p->mut) {
          mut_number_error(fn, i, spec);
          goto cleanup;
        }
        if (dlb__scalar_from_number(fn->name, pname(fn, i), spec, p->dtype,
                                    &value) < 0)
          goto cleanup;
        ts[i].dtype = p->dtype;
        continue;
      }
      dlb_view view;
      if (dlb__view_get(fn->st, spec, 0, &view) == 0) {
        dlb__view_release(&view); /* no number is tensor-like today */
        PyErr_Format(PyExc_TypeError,
                     "%U() argument '%U': a Python number is accepted only "
                     "for a 0-d parameter",
                     fn->name, pname(fn, i));
      }
      prefix_error(fn, i);
      goto cleanup;
    }
    if (spec_tensor(fn, i, spec, &ts[i], shapes + (size_t)i * DLB_MAX_NDIM) < 0)
      goto cleanup;
    if (!type_matches(p, &ts[i])) {
      check_error(fn, i, &ts[i], p, NULL, -1);
      goto cleanup;
    }
    int axis = dim_mismatch_in(fn, p, &ts[i], argv, 1);
    if (axis >= 0) {
      dim_error(fn, i, axis, ts[i].shape[axis], &fn->dims[p->dim0 + axis],
                argv);
      goto cleanup;
    }
    /* An extent bound where it is unknown and known further on: the known
     * one stands for the name from here (later checks and the results). */
    const fn_dim *d = &fn->dims[p->dim0];
    for (int a = 0; a < p->ndim; a++, d++)
      if (d->kind == DIM_CHECK && ts[i].shape[a] >= 0 &&
          argv[d->from_param]->shape[d->from_axis] < 0)
        argv[d->from_param]->shape[d->from_axis] = ts[i].shape[a];
  }
  results = PyTuple_New(nout);
  aliases = PyTuple_New(nmut);
  if (results == NULL || aliases == NULL) goto cleanup;
  for (int o = 0; o < nout; o++) {
    const fn_param *p = &fn->params[nin + o];
    int64_t *shape = shapes + (size_t)nin * DLB_MAX_NDIM;
    result_shape(fn, p, argv, shape);
    PyObject *pair = Py_BuildValue("(NN)", extents_tuple(p->ndim, shape),
                                   dlb__dtype_new(fn->st, p->dtype));
    if (pair == NULL) goto cleanup;
    PyTuple_SET_ITEM(results, o, pair);
  }
  for (int i = 0, k = 0; i < nin; i++) {
    if (!fn->params[i].mut) continue;
    PyObject *index = PyLong_FromLong(i);
    if (index == NULL) goto cleanup;
    PyTuple_SET_ITEM(aliases, k++, index);
  }
  result = PyTuple_Pack(2, results, aliases);
cleanup:
  PyMem_Free(shapes);
  PyMem_Free(argv);
  PyMem_Free(ts);
  Py_XDECREF(aliases);
  Py_XDECREF(results);
  Py_XDECREF(seq);
  return result;
}

/* One parameter or result as the signature language writes it, always the
 * same way: "x: mut float32[n, 3]" (name NULL for results). */
static PyObject *param_text(const fn_object *fn, const fn_param *p,
                            PyObject *name) {
  char dtype[DLB_DESCRIBE_MAX];
  dlb__dtype_str(p->dtype, dtype, sizeof dtype);
  PyObject *text = name ? PyUnicode_FromFormat("%U: %s%s", name,
                                               p->mut ? "mut " : "", dtype)
                        : PyUnicode_FromString(dtype);
  if (text == NULL || p->ndim == 0) return text;
  const fn_dim *d = &fn->dims[p->dim0];
  for (int a = 0; a < p->ndim && text != NULL; a++, d++) {
    PyObject *dim =
        d->kind == DIM_LITERAL
            ? PyUnicode_FromFormat("%s%lld", a ? ", " : "[",
                                   (long long)d->value)
            : PyUnicode_FromFormat("%s%U", a ? ", " : "[",
                                   PyTuple_GET_ITEM(fn->sym_names, d->sym));
    PyObject *joined = dim ? PyUnicode_Concat(text, dim) : NULL;
    Py_XDECREF(dim);
    Py_SETREF(text, joined);
  }
  if (text != NULL) {
    PyObject *close = PyUnicode_FromString("]");
    PyObject *joined = close ? PyUnicode_Concat(text, close) : NULL;
    Py_XDECREF(close);
    Py_SETREF(text, joined);
  }
  return text;
}

/* The signature in one spelling, whatever spacing it was written with:
 * "name(x: float32[n], y: mut float32[n]) -> (float32[n])". */
static PyObject *normalized_signature(const fn_object *fn) {
  PyObject *result = NULL, *ins = NULL, *outs = NULL, *sep = NULL;
  ins = PyList_New(0);
  outs = PyList_New(0);
  sep = PyUnicode_FromString(", ");
  if (ins == NULL || outs == NULL || sep == NULL) goto cleanup;
  for (int i = 0; i < fn->nin + fn->nout; i++) {
    PyObject *text = param_text(fn, &fn->params[i],
                                i < fn->nin ? pname(fn, i) : NULL);
    if (text == NULL ||
        PyList_Append(i < fn->nin ? ins : outs, text) < 0) {
      Py_XDECREF(text);
      goto cleanup;
    }
    Py_DECREF(text);
  }
  PyObject *a = PyUnicode_Join(sep, ins);
  PyObject *b = a ? PyUnicode_Join(sep, outs) : NULL;
  if (b != NULL) result = PyUnicode_FromFormat("%U(%U) -> (%U)", fn->name, a, b);
  Py_XDECREF(a);
  Py_XDECREF(b);
cleanup:
  Py_XDECREF(sep);
  Py_XDECREF(outs);
  Py_XDECREF(ins);
  return result;
}

PyObject *dlb__function_identity(PyObject *self) {
  fn_object *fn = (fn_object *)self;
  PyObject *made = DLB_FT_LOAD_PTR(&fn->identity);
  if (made != NULL) return Py_NewRef(made);
  PyObject *text = normalized_signature(fn);
  if (text == NULL) return NULL;
  Py_ssize_t len;
  const char *utf8 = PyUnicode_AsUTF8AndSize(text, &len);
  if (utf8 == NULL) {
    Py_DECREF(text);
    return NULL;
  }
  /* FNV-1a, 64 bits folded to 32: the same in every process and version
   * (Python's hash() of a str is salted per process). */
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (Py_ssize_t k = 0; k < len; k++) {
    h ^= (unsigned char)utf8[k];
    h *= UINT64_C(0x100000001b3);
  }
  Py_DECREF(text);
  PyObject *identity = PyUnicode_FromFormat(
      "%U_%08x", fn->name, (unsigned int)(uint32_t)(h ^ (h >> 32)));
  if (identity == NULL) return NULL;
  /* Kept by the first thread to make it; another's equal one is just
   * returned (the Function holds the kept one until it dies). */
  if (dlb__ft_set_once(&fn->identity, identity)) Py_INCREF(identity);
  return identity;
}

static PyObject *get_identity(PyObject *self, void *c) {
  (void)c;
  return dlb__function_identity(self);
}

static PyObject *get_normalized(PyObject *self, void *c) {
  (void)c;
  return normalized_signature((fn_object *)self);
}

/* _dims: per parameter, then per result, a tuple of its extents as the
 * signature writes them: an int for a literal, a str for a name. */
static PyObject *get_dims(PyObject *self, void *c) {
  (void)c;
  fn_object *fn = (fn_object *)self;
  int n = fn->nin + fn->nout;
  PyObject *all = PyTuple_New(n);
  for (int i = 0; all != NULL && i < n; i++) {
    const fn_param *p = &fn->params[i];
    PyObject *dims = PyTuple_New(p->ndim);
    const fn_dim *d = &fn->dims[p->dim0];
    for (int a = 0; dims != NULL && a < p->ndim; a++, d++) {
      PyObject *e = d->kind == DIM_LITERAL
                        ? PyLong_FromLongLong(d->value)
                        : Py_NewRef(PyTuple_GET_ITEM(fn->sym_names, d->sym));
      if (e == NULL) Py_CLEAR(dims);
      else PyTuple_SET_ITEM(dims, a, e);
    }
    if (dims == NULL) Py_CLEAR(all);
    else PyTuple_SET_ITEM(all, i, dims);
  }
  return all;
}

/* _inputs: (name, DType, ndim, mut) per input; _results: (DType, ndim) per
 * declared result. */
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
    {"_result_specs", function_result_specs, METH_O,
     "_result_specs(specs) -> (results, aliases)\n\nThe shape function of "
     "compiled calls: specs has a (shape, dtype) pair per input (None for a "
     "Python number), checked as a call checks its arguments; results is a "
     "(shape, DType) pair per declared result, aliases the indices of the "
     "'mut' inputs."},
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

static PyGetSetDef function_getset[] = {
    {"nin", get_nin, NULL, "Number of arguments the call takes.", NULL},
    {"nout", get_nout, NULL, "Number of results the call returns.", NULL},
    {"address", get_address, NULL, "Address of the kernel (int).", NULL},
    {"_identity", get_identity, NULL,
     "The Function's name in compiled graphs: '<name>_<hash of the "
     "normalized signature>', the same in every process.", NULL},
    {"_normalized_signature", get_normalized, NULL,
     "The signature in one spelling (what _identity hashes).", NULL},
    {"_inputs", get_inputs, NULL,
     "(name, DType, ndim, mut) for each input.", NULL},
    {"_results", get_results, NULL,
     "(DType, ndim) for each declared result.", NULL},
    {"_dims", get_dims, NULL,
     "Each parameter's, then each result's extents as the signature writes "
     "them: an int for a literal, a str for a name.", NULL},
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
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_repr, function_repr},
    {Py_tp_members, function_members},
    {Py_tp_getset, function_getset},
    {Py_tp_methods, function_methods},
    {Py_tp_doc,
     "Function(kernel, signature)\n--\n\n"
     "A C kernel (dlb_kernel ABI) callable with any framework's tensors.  "
     "kernel is an int address or a PyCapsule named 'dlb_kernel'; signature "
     "is e.g. 'saxpy(a: float32, x: float32[n], y: mut float32[n])' or "
     "'matmul(a: float32[m, k], b: float32[k, n]) -> float32[m, n]'."},
    {0, NULL},
};

static PyType_Spec function_spec = {
    .name = "dlbridge.Function",
    .basicsize = sizeof(fn_object),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_IMMUTABLETYPE,
    .slots = function_slots,
};

static PyMethodDef function_module_methods[] = {
    {"load", (PyCFunction)(void (*)(void))py_load,
     METH_FASTCALL | METH_KEYWORDS,
     "load(path, symbol, signature) -> Function\n\nLoad a kernel from a "
     "shared library (dlopen with RTLD_NOW | RTLD_LOCAL).  The library stays "
     "loaded while the Function lives."},
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
