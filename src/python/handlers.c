/*
 * handlers.c -- the per-type handler cache and classification: what kind
 * of tensor-like object a Python type is, decided once per type.
 *
 * The first time an object of some type is seen, its type is classified
 * once and the result cached in module state; from then on, finding the
 * handler is a hash and a pointer compare.  Every consumer of tensors --
 * from_dlpack, Function, the C API -- reads objects through a handler, so
 * each framework is supported in one place.
 *
 * The cache.  A small open-addressing table (linear
 * probing, backward-shift deletion, grown at half load, shrunk when an
 * eighth full) keyed by
 * PyTypeObject*: a type seen before costs a hash and one pointer compare.
 * Policy: entries live exactly as long as their type.  Each entry holds a
 * weak reference to its type whose callback removes (and frees) the entry
 * when the type dies -- before the type's memory can be reused, so a new
 * type at the same address can never find a stale handler.  A strong
 * reference would give the same guarantee but would keep every type ever
 * seen alive: a program that makes types in a loop (1000 classes publishing
 * tables) would grow without bound.  A bounded table with eviction was
 * rejected because handlers are handed out as borrowed pointers that a
 * caller may hold across Python code; a handler is only freed when its
 * type is gone, which cannot happen while the caller holds an object of
 * that type.  dlb_handler.type is therefore a borrowed pointer kept valid
 * by that rule.
 *
 * Stale entries.  A class can change after it was first seen (a
 * __dlpack__ assigned to it, a base class losing __array_interface__).
 * CPython gives every type a version tag that changes whenever the type or
 * one of its bases is modified (it is what its own attribute cache is
 * keyed by): an entry remembers the tag it was classified under, and a
 * lookup that finds another tag classifies the type again.  A new answer
 * goes into a new entry; the old one is retired, not freed -- a caller may
 * still hold it for a call in flight -- and freed with the type.  An answer
 * that did not change only updates the tag, so a class that rewrites a
 * class attribute on every call does not grow the cache.  A type CPython
 * will not tag (tag 0: after very many modifications) is classified again
 * on every lookup: slow, but never stale.  Types that cannot change (static
 * types such as numpy.ndarray, immutable heap types such as dlbridge's own,
 * with every base immutable too) skip the check.
 *
 * The framework a type belongs to is the registry's answer
 * (python/dlbridge/_frameworks.py, _type_framework), asked once per
 * classification and cached here; dlbridge.convert reads it back through
 * _core._type_framework, so the two never disagree and neither side holds
 * types strongly.
 *
 * The cache struct (dlbridge_py.h) also carries the NumPy descr -> dtype
 * cache (formats.c, read by views.c), the framework converters (outputs.c)
 * and export targets (capi.c); it is made and freed here.
 */
#include "dlbridge_py.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* ---- the handler cache ---------------------------------------------------------- */

typedef struct dlb_handler_entry {
  dlb_handler h;     /* must be first: we hand out &entry->h */
  PyObject *weakref; /* to h.type; its callback removes this entry */
  unsigned int version; /* h.type->tp_version_tag when classified; 0: none */
  /* The type and every class on its MRO are immutable (static types such
   * as numpy.ndarray, dlbridge's own): it cannot change, so lookups skip
   * the version check and its load of the type. */
  int immutable;
  /* Earlier classifications of the same type, still possibly borrowed by a
   * call in flight; freed with this entry (see "Stale entries"). */
  struct dlb_handler_entry *retired;
} handler_entry;

static size_t hash_type(const PyTypeObject *t) {
  uint64_t x = (uint64_t)(uintptr_t)t;
  x ^= x >> 17;
  x *= UINT64_C(0x9E3779B97F4A7C15);
  return (size_t)(x >> 29);
}

static void entry_free(handler_entry *e) {
  while (e != NULL) {
    handler_entry *next = e->retired;
    /* The weakref first: once it is gone its callback can no longer run. */
    Py_CLEAR(e->weakref);
    Py_CLEAR(e->h.api_owner);
    Py_CLEAR(e->h.to_capsule);
    Py_CLEAR(e->h.dtype_enum);
    Py_CLEAR(e->h.tape_empty);
    Py_CLEAR(e->h.framework);
    PyMem_Free(e);
    e = next;
  }
}

/* Remove slot i by shifting later members of its probe run back. */
static void cache_remove_at(struct dlb_handler_cache *c, size_t i) {
  size_t j = i;
  for (;;) {
    j = (j + 1) & c->mask;
    handler_entry *e = c->slots[j];
    if (e == NULL) break;
    size_t k = hash_type(e->h.type) & c->mask;
    /* e may move to i when its home k is not cyclically in (i, j]. */
    int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    c->slots[i] = e;
    i = j;
  }
  c->slots[i] = NULL;
  c->count--;
}

#define CACHE_MIN_CAPACITY 16

/* Rehash into ncap slots (a power of two above twice the count).  -1 only
 * when the new array cannot be allocated; the old one is then kept. */
static int cache_resize(struct dlb_handler_cache *c, size_t ncap) {
  handler_entry **ns = PyMem_Calloc(ncap, sizeof *ns);
  if (ns == NULL) return -1;
  for (size_t i = 0; i <= c->mask; i++) {
    handler_entry *o = c->slots[i];
    if (o == NULL) continue;
    size_t k = hash_type(o->h.type) & (ncap - 1);
    while (ns[k] != NULL) k = (k + 1) & (ncap - 1);
    ns[k] = o;
  }
  PyMem_Free(c->slots);
  c->slots = ns;
  c->mask = ncap - 1;
  return 0;
}

static int cache_insert(struct dlb_handler_cache *c, handler_entry *e) {
  if ((c->count + 1) * 2 > c->mask + 1 &&
      cache_resize(c, (c->mask + 1) * 2) < 0) {
    PyErr_NoMemory();
    return -1;
  }
  size_t k = hash_type(e->h.type) & c->mask;
  while (c->slots[k] != NULL) k = (k + 1) & c->mask;
  c->slots[k] = e;
  c->count++;
  return 0;
}

/* The weakref callback: a cached type is being destroyed.  The entry is
 * unlinked under the cache's lock and freed after it (its references may
 * run code). */
static PyObject *on_type_dead(PyObject *capsule, PyObject *wr) {
  struct dlb_handler_cache *c = PyCapsule_GetContext(capsule);
  if (c == NULL) {
    PyErr_Clear();
    Py_RETURN_NONE; /* the cache is gone already */
  }
  handler_entry *dead = NULL;
  DLB_FT_LOCK(&c->lock);
  for (size_t i = 0; i <= c->mask; i++) {
    handler_entry *e = c->slots[i];
    if (e != NULL && e->weakref == wr) {
      cache_remove_at(c, i);
      /* before the free: no memo (and no thread's front) may use e again */
      DLB_FT_ADD_U64(&c->generation, 1);
      dead = e;
      break;
    }
  }
  /* Give memory back after a burst of short-lived types (a quarter of the
   * grow threshold, so an insert/remove pair at the edge cannot thrash).
   * A failed shrink just keeps the larger array. */
  size_t cap = c->mask + 1;
  if (cap > CACHE_MIN_CAPACITY && c->count * 8 < cap) {
    size_t ncap = cap;
    while (ncap > CACHE_MIN_CAPACITY && c->count * 4 < ncap / 2) ncap /= 2;
    (void)cache_resize(c, ncap);
  }
  DLB_FT_UNLOCK(&c->lock);
  entry_free(dead);
  Py_RETURN_NONE;
}

static PyMethodDef on_type_dead_def = {
    "_dlbridge_handler_evict", (PyCFunction)on_type_dead, METH_O,
    "Removes a dead type's handler from dlbridge's cache."};

/* ---- classification ---------------------------------------------------------------- */

/* The major-1 table reachable from hdr, or NULL. */
static const DLPackExchangeAPI *walk_versions(const DLPackExchangeAPIHeader *hdr) {
  int guard = 0;
  while (hdr != NULL && guard++ < 64) {
    if (hdr->version.major == 1) return (const DLPackExchangeAPI *)hdr;
    hdr = hdr->prev_api;
  }
  return NULL;
}

/* The table published by attr (a capsule, or an int address for the 1.2
 * spelling when allow_int), or NULL (never with an exception set: an
 * unusable attribute means "fall back to the next kind"). */
static const DLPackExchangeAPI *table_from_attr(PyObject *attr, int allow_int) {
  const DLPackExchangeAPIHeader *hdr = NULL;
  if (PyCapsule_CheckExact(attr)) {
    hdr = PyCapsule_GetPointer(attr, DLB_EXCHANGE_API_CAPSULE_NAME);
  } else if (allow_int && PyLong_CheckExact(attr)) {
    hdr = PyLong_AsVoidPtr(attr);
  }
  if (hdr == NULL) {
    PyErr_Clear();
    return NULL;
  }
  const DLPackExchangeAPI *api = walk_versions(hdr);
  /* The managed export and import entries are what we cannot do without;
   * the others are NULL-checked where used. */
  if (api == NULL || api->managed_tensor_from_py_object_no_sync == NULL ||
      api->managed_tensor_to_py_object_no_sync == NULL)
    return NULL;
  return api;
}

/* The framework type belongs to, as the registry names it (interned str,
 * new reference): "torch" for torch.nn.Parameter, "jax" for a jaxlib type,
 * the root of __module__ for a type of no framework dlbridge knows.  The one
 * list of frameworks is python/dlbridge/_frameworks.py; asking it costs a
 * Python call, once per classification.  NULL with an exception (memory,
 * a broken registry): nothing is cached then, so a later call asks again. */
static PyObject *framework_of(struct dlb_handler_cache *c, PyTypeObject *type) {
  PyObject *registry = PyImport_Import(c->str_registry);
  if (registry == NULL) return NULL;
  PyObject *name =
      PyObject_CallMethodOneArg(registry, c->str_type_framework, (PyObject *)type);
  Py_DECREF(registry);
  if (name == NULL) return NULL;
  if (!PyUnicode_CheckExact(name)) {
    PyErr_Format(PyExc_TypeError,
                 "dlbridge._frameworks._type_framework returned %.200s, not "
                 "str",
                 Py_TYPE(name)->tp_name);
    Py_DECREF(name);
    return NULL;
  }
  PyUnicode_InternInPlace(&name);
  return name;
}

/* Whether type is a graph compiler's placeholder (dlb_handler.traced): the
 * registry's answer, asked only for the frameworks that have compilers
 * dlbridge serves, so other types cost no second call.  1, 0, or -1 with
 * an exception. */
static int is_traced(struct dlb_handler_cache *c, PyTypeObject *type,
                     PyObject *framework) {
  if (PyUnicode_CompareWithASCIIString(framework, "jax") != 0 &&
      PyUnicode_CompareWithASCIIString(framework, "torch") != 0 &&
      PyUnicode_CompareWithASCIIString(framework, "tensorflow") != 0)
    return 0;
  PyObject *registry = PyImport_Import(c->str_registry);
  if (registry == NULL) return -1;
  PyObject *answer =
      PyObject_CallMethodOneArg(registry, c->str_is_traced, (PyObject *)type);
  Py_DECREF(registry);
  if (answer == NULL) return -1;
  int traced = PyObject_IsTrue(answer);
  Py_DECREF(answer);
  return traced;
}

/* What the registry says of framework (its _c_traits): whether its arrays
 * are immutable, whether they are read through their buffer first.  0, or
 * -1 with an exception. */
static int framework_traits(struct dlb_handler_cache *c, PyObject *framework,
                            int *immutable, int *read_buffer) {
  PyObject *registry = PyImport_Import(c->str_registry);
  if (registry == NULL) return -1;
  PyObject *answer =
      PyObject_CallMethodOneArg(registry, c->str_traits, framework);
  Py_DECREF(registry);
  if (answer == NULL) return -1;
  int rc = -1;
  if (!PyTuple_Check(answer) || PyTuple_GET_SIZE(answer) != 2) {
    PyErr_SetString(PyExc_TypeError,
                    "dlbridge._frameworks._c_traits returned no pair");
  } else if ((*immutable = PyObject_IsTrue(PyTuple_GET_ITEM(answer, 0))) >= 0 &&
             (*read_buffer = PyObject_IsTrue(PyTuple_GET_ITEM(answer, 1))) >=
                 0) {
    rc = 0;
  }
  Py_DECREF(answer);
  return rc;
}

/* Special methods are looked up on the type, as Python does for its own
 * protocols: no bound method is created and a miss raises nothing. */
int dlb__type_has(PyTypeObject *type, PyObject *name) {
  PyObject *attr = dlb__py_type_lookup(type, name);
  Py_XDECREF(attr);
  return attr != NULL;
}

/* numpy.ndarray from the numpy module, or NULL when it has none (0), or -1
 * with an exception.  (PyObject_GetOptionalAttr is 3.13+.) */
static int numpy_ndarray_of(PyObject *module, PyObject **out) {
  *out = PyObject_GetAttrString(module, "ndarray");
  if (*out != NULL) return 1;
  if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
  PyErr_Clear();
  return 0;
}

/* Whether type IS numpy.ndarray: its fields are then read directly, so a
 * name is not enough (a Python class can call itself "numpy.ndarray").  The
 * type must be the static type numpy's already-imported module publishes;
 * numpy is never imported here.  1, 0, or -1 with an exception. */
static int is_numpy_ndarray(PyTypeObject *type) {
  if (strcmp(type->tp_name, "numpy.ndarray") != 0 ||
      (type->tp_flags & Py_TPFLAGS_HEAPTYPE) != 0 ||
      type->tp_basicsize < (Py_ssize_t)sizeof(np_array_head))
    return 0;
  int result = -1;
  PyObject *name = NULL, *numpy = NULL, *ndarray = NULL;
  name = PyUnicode_FromString("numpy");
  if (name == NULL) goto cleanup;
  numpy = PyImport_GetModule(name); /* never imports */
  if (numpy == NULL) {
    result = PyErr_Occurred() ? -1 : 0;
    goto cleanup;
  }
  if (numpy_ndarray_of(numpy, &ndarray) < 0) goto cleanup;
  result = ndarray == (PyObject *)type;

cleanup:
  Py_XDECREF(ndarray);
  Py_XDECREF(numpy);
  Py_XDECREF(name);
  return result;
}

/* An attribute of an already-imported module (never imports), or NULL
 * without an exception when either is missing. */
static PyObject *attr_of_loaded_module(const char *module, const char *attr) {
  PyObject *name = PyUnicode_FromString(module);
  if (name == NULL) return NULL;
  PyObject *mod = PyImport_GetModule(name);
  Py_DECREF(name);
  if (mod == NULL) return NULL;
  PyObject *res = PyObject_GetAttrString(mod, attr);
  Py_DECREF(mod);
  PyErr_Clear();
  return res;
}

/* TensorFlow's own capsule export for type (*fn) and the type's
 * _datatype_enum method (*dtype_enum), when its __dlpack__ is the one
 * TensorFlow 2.x defines for eager tensors: a Python method that checks
 * its keywords and returns pywrap_tfe.TFE_ToDlpackCapsule(self) -- so
 * calling that C function directly is __dlpack__() without the Python
 * frame, the keyword parsing and the __dlpack_device__() call before it
 * (from 1.2 us to about 0.45 us per tensor).  Checked, not assumed: the
 * TensorFlow major version is 2, the method's code names
 * TFE_ToDlpackCapsule, that name in pywrap_tfe is a C function, and the
 * type has _datatype_enum (to refuse the dtypes TF aborts on).  Also
 * pywrap_tfe's TFE_Py_TapeSetIsEmpty, the tape check a Function call makes
 * (function_call.c): a type read without it would give a tape nothing to
 * record, so it is required too.  1 with three new references, or 0 (no
 * exception) when anything differs: the type then goes through __dlpack__
 * like any producer. */
/* TFE_Py_TapeSetIsEmpty itself, the C++ function pywrap_tfe's binding
 * calls -- `PyObject *TFE_Py_TapeSetIsEmpty()`, exported by the library
 * TensorFlow's Python bindings share (Itanium mangling, which names no
 * return type) -- or NULL when this TensorFlow has no such symbol there:
 * the binding is called then.  Found in the copy `import tensorflow`
 * loaded (RTLD_NOLOAD); the library is never unloaded while TF lives. */
static PyObject *(*tf_tape_empty_c(void))(void) {
  void *lib = dlopen("lib_pywrap_tensorflow_common.so",
                     RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == NULL) return NULL;
  void *sym = dlsym(lib, "_Z21TFE_Py_TapeSetIsEmptyv");
  PyObject *(*fn)(void) = NULL;
  memcpy(&fn, &sym, sizeof fn); /* object to function pointer, as POSIX allows */
  dlclose(lib); /* drops our reference only: the library stays loaded */
  return fn;
}

static int tf_capsule_function(dlb_module_state *st, PyTypeObject *type,
                               PyObject **out_fn, PyObject **out_dtype_enum,
                               PyObject **out_tape_empty) {
  PyObject *fn = NULL, *names = NULL, *version = NULL, *dtype_enum = NULL;
  PyObject *tape_empty = NULL;
  *out_fn = *out_dtype_enum = *out_tape_empty = NULL;
  /* Held: the module lookups below may run Python code. */
  PyObject *dunder = dlb__py_type_lookup(type, st->str_dlpack);
  if (dunder == NULL || !PyFunction_Check(dunder)) goto done;
  version = attr_of_loaded_module("tensorflow", "__version__");
  const char *v = version != NULL && PyUnicode_Check(version)
                      ? PyUnicode_AsUTF8(version)
                      : NULL;
  if (v == NULL || strncmp(v, "2.", 2) != 0) goto done;
  /* Through __code__ (a new reference): another thread may replace the
   * function's code, freeing a borrowed one. */
  PyObject *code = PyObject_GetAttrString(dunder, "__code__");
  names = code != NULL ? PyObject_GetAttrString(code, "co_names") : NULL;
  Py_XDECREF(code);
  if (names == NULL || !PyTuple_Check(names)) goto done;
  int found = 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names) && !found; i++) {
    PyObject *n = PyTuple_GET_ITEM(names, i);
    found = PyUnicode_Check(n) &&
            PyUnicode_CompareWithASCIIString(n, "TFE_ToDlpackCapsule") == 0;
  }
  if (!found) goto done;
  fn = attr_of_loaded_module("tensorflow.python.pywrap_tfe",
                             "TFE_ToDlpackCapsule");
  if (fn != NULL && !PyCFunction_Check(fn)) Py_CLEAR(fn);
  tape_empty = attr_of_loaded_module("tensorflow.python.pywrap_tfe",
                                     "TFE_Py_TapeSetIsEmpty");
  if (tape_empty != NULL && !PyCFunction_Check(tape_empty))
    Py_CLEAR(tape_empty);
  dtype_enum = PyObject_GetAttrString((PyObject *)type, "_datatype_enum");
  if (fn != NULL && dtype_enum != NULL && tape_empty != NULL) {
    *out_fn = fn;
    *out_dtype_enum = dtype_enum;
    *out_tape_empty = tape_empty;
    fn = dtype_enum = tape_empty = NULL;
  }
done:
  Py_XDECREF(fn);
  Py_XDECREF(dtype_enum);
  Py_XDECREF(tape_empty);
  Py_XDECREF(names);
  Py_XDECREF(version);
  Py_XDECREF(dunder);
  PyErr_Clear(); /* every failure above means "not this fast path" */
  return *out_fn != NULL;
}

static void classify(dlb_module_state *st, struct dlb_handler_cache *c,
                     PyTypeObject *type, int read_buffer, dlb_handler *h) {
  if (PyType_IsSubtype(type, st->TensorType)) {
    h->kind = DLB_KIND_TENSOR;
    h->api = &dlb__tensor_exchange_api;
    return;
  }
  if (!c->skip_exchange) {
    /* On the type, through its MRO (torch.nn.Parameter inherits it); held,
     * as another thread may replace the attribute meanwhile. */
    PyObject *attr = dlb__py_type_lookup(type, c->str_exchange);
    const DLPackExchangeAPI *api = attr ? table_from_attr(attr, 0) : NULL;
    if (api == NULL) {
      Py_XDECREF(attr);
      attr = dlb__py_type_lookup(type, c->str_exchange_legacy);
      api = attr ? table_from_attr(attr, 1) : NULL;
    }
    if (api != NULL) {
      h->kind = DLB_KIND_EXCHANGE;
      h->api = api;
      h->api_owner = attr; /* the lookup's reference */
      return;
    }
    Py_XDECREF(attr);
  }
  int numpy = is_numpy_ndarray(type);
  if (numpy < 0) return;
  if (numpy) {
    h->kind = DLB_KIND_NUMPY;
    return;
  }
  if (PyUnicode_CompareWithASCIIString(h->framework, "tensorflow") == 0 &&
      tf_capsule_function(st, type, &h->to_capsule, &h->dtype_enum,
                          &h->tape_empty)) {
    h->tape_empty_c = tf_tape_empty_c();
    h->kind = DLB_KIND_TF_EAGER;
    return;
  }
  int has_buffer =
      type->tp_as_buffer != NULL && type->tp_as_buffer->bf_getbuffer != NULL;
  if (read_buffer && has_buffer && dlb__type_has(type, st->str_dlpack)) {
    h->kind = DLB_KIND_BUFFER_DLPACK;
  } else if (dlb__type_has(type, st->str_dlpack) &&
             !(PyUnicode_CompareWithASCIIString(h->framework, "cupy") == 0 &&
               dlb__type_has(type, st->str_cuda_array_interface))) {
    h->kind = DLB_KIND_DLPACK;
  } else if (dlb__type_has(type, st->str_cuda_array_interface) &&
             dlb__type_has(type, st->str_dlpack)) {
    /* CuPy through __cuda_array_interface__: its __dlpack__ (14.x) exports
     * negative strides divided as unsigned numbers (known-bugs B27,
     * cupy#10172), which validation refuses; the interface's byte strides
     * are signed and right, and its 'stream' orders the work the same
     * way. */
    h->kind = DLB_KIND_CUDA_ARRAY_INTERFACE;
  } else if (has_buffer) {
    h->kind = DLB_KIND_BUFFER;
  } else if (dlb__type_has(type, st->str_array_interface)) {
    h->kind = DLB_KIND_ARRAY_INTERFACE;
  } else if (dlb__type_has(type, st->str_cuda_array_interface)) {
    h->kind = DLB_KIND_CUDA_ARRAY_INTERFACE;
  } else {
    h->kind = DLB_KIND_NONE;
  }
}

/* type's version tag, assigned if it has none yet; 0 when CPython will not
 * tag it (the entry is then checked again on every lookup). */
static unsigned int version_of(struct dlb_handler_cache *c, PyTypeObject *type) {
  if (!dlb__py_type_tag(type, c->str_tag_probe)) return 0;
  return DLB_FT_LOAD_UINT(&type->tp_version_tag);
}

/* Whether type and every class on its MRO refuse attribute assignment. */
static int all_immutable(PyTypeObject *type) {
  PyObject *mro = type->tp_mro;
  if (mro == NULL || !PyTuple_Check(mro)) return 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
    PyObject *base = PyTuple_GET_ITEM(mro, i);
    if (!PyType_Check(base) ||
        !PyType_HasFeature((PyTypeObject *)base, Py_TPFLAGS_IMMUTABLETYPE))
      return 0;
  }
  return 1;
}

/* A new entry for type, classified now; NULL with an exception.  Runs
 * Python code (the registry, __module__, NumPy's module): the caller must
 * look the table up again afterwards. */
static handler_entry *entry_new(dlb_module_state *st, struct dlb_handler_cache *c,
                                PyTypeObject *type) {
  handler_entry *e = PyMem_Calloc(1, sizeof *e);
  if (e == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  e->h.type = type;
  e->h.framework = framework_of(c, type);
  if (e->h.framework == NULL) goto error;
  e->h.traced = is_traced(c, type, e->h.framework);
  if (e->h.traced < 0) goto error;
  int read_buffer = 0;
  if (framework_traits(c, e->h.framework, &e->h.immutable, &read_buffer) < 0)
    goto error;
  classify(st, c, type, read_buffer, &e->h);
  if (PyErr_Occurred()) goto error; /* classify's numpy check failed */
  /* Read last: the classification's own lookups may have tagged it. */
  e->version = version_of(c, type);
  e->immutable = all_immutable(type);
  return e;
error:
  entry_free(e);
  return NULL;
}

/* The live entry of type, or NULL (no exception).  Lock held. */
static handler_entry *cache_find(struct dlb_handler_cache *c, PyTypeObject *type) {
  size_t i = hash_type(type) & c->mask;
  for (;;) {
    handler_entry *e = c->slots[i];
    if (e == NULL) return NULL;
    if (e->h.type == type) return e;
    i = (i + 1) & c->mask;
  }
}

/* Whether e's answer stands for type now: the class cannot change, or it
 * has the version tag it was classified under (a moved tag means the class
 * changed since). */
static int entry_current(const handler_entry *e, PyTypeObject *type) {
  return e->immutable ||
         (e->version != 0 && e->version == DLB_FT_LOAD_UINT(&type->tp_version_tag));
}

static int same_answer(const dlb_handler *a, const dlb_handler *b) {
  return a->kind == b->kind && a->traced == b->traced &&
         a->immutable == b->immutable && a->api == b->api &&
         a->api_owner == b->api_owner && a->to_capsule == b->to_capsule &&
         PyUnicode_Compare(a->framework, b->framework) == 0;
}

/* ---- free-threaded builds: each thread's front of the cache ----------------------
 *
 * Without the GIL the table is read and changed under its lock (c->lock).
 * The answers a thread uses call after call are remembered in front of it,
 * per thread: a direct-mapped array of (type, cache, generation, handler,
 * tag), read with no lock and no write to shared memory.  A remembered
 * answer stands while the cache has freed no entry since (generation: an
 * entry is freed only when its type died, so a type at a reused address
 * never finds another's handler) and the type has the tag it was
 * classified under -- the checks a Function's per-parameter memo makes on
 * GIL builds (dlb_handler_memo), which on these builds would be shared
 * mutable memory and are not used.  The handler itself lives as long as
 * its type, which the caller holds. */
#ifdef Py_GIL_DISABLED
/* Pairs of entries, the pair chosen by the type's hash, the most recently
 * remembered first: two types a call keeps meeting do not evict each
 * other when they hash alike. */
#define FRONT_PAIRS 32
typedef struct {
  PyTypeObject *type;
  const struct dlb_handler_cache *cache;
  uint64_t generation;
  const dlb_handler *h;
  unsigned int tag; /* 0: the type cannot change, no tag to check */
} front_entry;
static _Thread_local front_entry front[FRONT_PAIRS][2];

static inline int front_stands(const front_entry *f,
                               const struct dlb_handler_cache *c,
                               PyTypeObject *type) {
  return f->type == type && f->cache == c && c != NULL &&
         f->generation == DLB_FT_LOAD_U64(&c->generation) &&
         (f->tag == 0 || f->tag == DLB_FT_LOAD_UINT(&type->tp_version_tag));
}

const dlb_handler *dlb__handler_front(const dlb_module_state *st,
                                      PyTypeObject *type) {
  const struct dlb_handler_cache *c = st->handlers;
  const front_entry *pair = front[hash_type(type) & (FRONT_PAIRS - 1)];
  if (front_stands(&pair[0], c, type)) return pair[0].h;
  if (front_stands(&pair[1], c, type)) return pair[1].h;
  return NULL;
}

/* Remember e (current for type, found under the lock, with the cache's
 * generation then) in this thread's front. */
static void front_remember(const struct dlb_handler_cache *c,
                           PyTypeObject *type, const handler_entry *e,
                           uint64_t generation) {
  front_entry *pair = front[hash_type(type) & (FRONT_PAIRS - 1)];
  if (pair[0].type != type) pair[1] = pair[0];
  pair[0].type = type;
  pair[0].cache = c;
  pair[0].generation = generation;
  pair[0].h = &e->h;
  pair[0].tag = e->immutable ? 0 : e->version;
}
#define FRONT_REMEMBER(c, type, e) \
  front_remember((c), (type), (e), DLB_FT_LOAD_U64(&(c)->generation))
#else
#define FRONT_REMEMBER(c, type, e) ((void)0)
#endif

/* Classify type (new, or stale: its tag moved) and return its live entry.
 * Runs Python code (*ran_python is set). */
static const dlb_handler *classify_and_insert(dlb_module_state *st,
                                              struct dlb_handler_cache *c,
                                              PyTypeObject *type,
                                              int *ran_python) {
  *ran_python = 1;
  handler_entry *fresh = entry_new(st, c, type);
  if (fresh == NULL) return NULL;
  /* Python code ran: the table may have changed under us (other types
   * added or dropped, this one classified by a re-entrant call or, without
   * the GIL, by another thread). */
  if (st->handlers != c) {
    entry_free(fresh);
    PyErr_SetString(PyExc_RuntimeError, "dlbridge._core has been cleared");
    return NULL;
  }
  /* Made before the lock is taken (it allocates); dropped unused when the
   * type turns out to have an entry already. */
  PyObject *weakref = PyWeakref_NewRef((PyObject *)type, c->callback);
  if (weakref == NULL) {
    entry_free(fresh);
    return NULL;
  }
  handler_entry *unused = NULL, *answer;
  int failed = 0;
  DLB_FT_LOCK(&c->lock);
  handler_entry *old = cache_find(c, type);
  if (old == NULL) {
    fresh->weakref = weakref;
    weakref = NULL;
    if (cache_insert(c, fresh) < 0) {
      failed = 1;
      unused = fresh;
    }
    answer = fresh;
  } else if (same_answer(&old->h, &fresh->h)) {
    old->version = fresh->version;
    old->immutable = fresh->immutable;
    unused = fresh;
    answer = old;
  } else {
    /* A new answer: fresh takes old's slot and weakref; old is retired (a
     * caller may still hold it) and freed with fresh, when the type dies. */
    size_t i = hash_type(type) & c->mask;
    while (c->slots[i] != old) i = (i + 1) & c->mask;
    fresh->weakref = old->weakref;
    old->weakref = NULL;
    fresh->retired = old;
    c->slots[i] = fresh;
    answer = fresh;
  }
  if (!failed && entry_current(answer, type)) FRONT_REMEMBER(c, type, answer);
  DLB_FT_UNLOCK(&c->lock);
  entry_free(unused);
  Py_XDECREF(weakref);
  return failed ? NULL : &answer->h;
}

/* dlb__handler_for, saying in *ran_python whether Python code may have run
 * (a classification).  Without the GIL the table's lock is waited for
 * attached (dlb_ft_lock): the thread is not stopped there, so another
 * thread cannot change the class of an object the caller holds meanwhile
 * -- that needs every thread stopped. */
static const dlb_handler *handler_for(dlb_module_state *st,
                                      PyTypeObject *type, int *ran_python) {
  struct dlb_handler_cache *c = st->handlers;
  if (c == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "dlbridge._core has been cleared");
    return NULL;
  }
#ifdef Py_GIL_DISABLED
  const dlb_handler *h = dlb__handler_front(st, type);
  if (h != NULL) return h;
  DLB_FT_LOCK(&c->lock);
  handler_entry *e = cache_find(c, type);
  if (e != NULL && entry_current(e, type)) {
    FRONT_REMEMBER(c, type, e);
    h = &e->h;
  }
  DLB_FT_UNLOCK(&c->lock);
  if (h != NULL) return h;
#else
  size_t i = hash_type(type) & c->mask;
  for (;;) {
    handler_entry *e = c->slots[i];
    if (e == NULL) break;
    if (e->h.type == type) {
      if (entry_current(e, type)) return &e->h;
      break;
    }
    i = (i + 1) & c->mask;
  }
  const dlb_handler *h;
#endif
  /* Held while Python code classifies it, on every build: that code (a
   * metaclass's __module__, the registry), or another thread meanwhile,
   * may give the object the caller read type from another class, and only
   * this reference then keeps type alive until the entry is made.  The
   * answer lives as long as type: a caller that does not hold type itself
   * (or an object that still has it) must not use it after this returns
   * -- dlb__handler_held is for those. */
  Py_INCREF(type);
  h = classify_and_insert(st, c, type, ran_python);
  dlb__clear_keep_error((PyObject **)&type);
  return h;
}

const dlb_handler *dlb__handler_for(dlb_module_state *st, PyTypeObject *type) {
  int ran_python = 0;
  return handler_for(st, type, &ran_python);
}

const dlb_handler *dlb__handler_for_memo(dlb_module_state *st,
                                         dlb_handler_memo *m,
                                         PyTypeObject *type, int *ran_python) {
  const dlb_handler *h = handler_for(st, type, ran_python);
#ifdef Py_GIL_DISABLED
  /* Left alone: the memo is the Function's, shared by every thread that
   * calls it, and never read on these builds (dlb__handler_memo_get). */
  (void)m;
#else
  memset(m, 0, sizeof *m);
  if (h == NULL) return NULL;
  /* The entry dlb__handler_for answered from: its version is the tag the
   * answer belongs to (a type classified while Python code modified it
   * keeps the older tag, and is not remembered). */
  const handler_entry *e = (const handler_entry *)h;
  if (e->version != 0 && e->version == type->tp_version_tag) {
    m->type = type;
    m->cache = st->handlers;
    m->generation = st->handlers->generation;
    m->handler = h;
    m->tag = e->version;
  }
#endif
  return h;
}

/* Classifications tried before an object whose class changes every time
 * it is classified is refused (dlb__handler_held), and reads tried before
 * one whose class changes every time it is read is (dlb__reread). */
#define CLASS_TRIES 4

const dlb_handler *dlb__handler_held(dlb_module_state *st, PyObject *obj,
                                     PyTypeObject **held) {
  *held = NULL;
  for (int tries = 0; tries < CLASS_TRIES; tries++) {
    PyTypeObject *type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(obj));
    int ran_python = 0;
    const dlb_handler *h = handler_for(st, type, &ran_python);
    if (h == NULL) {
      dlb__clear_keep_error((PyObject **)&type);
      return NULL;
    }
    if (!ran_python || Py_TYPE(obj) == type) {
      *held = type;
      return h;
    }
    /* The classification gave obj another class: h is the old class's
     * answer, which may die with it here.  The new class is classified. */
    Py_DECREF(type);
  }
  PyErr_Format(PyExc_TypeError,
               "an object of type '%.200s' changed its class every time "
               "dlbridge classified it (%d times): it cannot be read",
               Py_TYPE(obj)->tp_name, CLASS_TRIES);
  return NULL;
}

int dlb__reread(PyObject *obj, PyTypeObject *routed_by, int *tries) {
  if (Py_TYPE(obj) == routed_by) return 0; /* the route still stands */
  if (!PyErr_ExceptionMatches(PyExc_AttributeError) &&
      !PyErr_ExceptionMatches(PyExc_TypeError) &&
      !PyErr_ExceptionMatches(PyExc_BufferError))
    return 0; /* MemoryError, KeyboardInterrupt, ...: no route's doing */
  if (++*tries < CLASS_TRIES) {
    PyErr_Clear();
    return 1;
  }
  /* Out of tries.  The error is a stale route's (an AttributeError: a
   * method the old class had and the new one lacks; "not tensor-like" of
   * a class obj no longer has), no answer of either class: it becomes
   * dlbridge's own TypeError saying why, the route's as its context. */
  dlb__saved_error first;
  dlb__error_save(&first);
  PyErr_Format(PyExc_TypeError,
               "an object of type '%.200s' changed its class every time "
               "dlbridge read it (%d times): it cannot be read",
               Py_TYPE(obj)->tp_name, CLASS_TRIES);
  dlb__error_chain_context(&first);
  return 0;
}

PyObject *dlb__py_type_framework(PyObject *module, PyObject *type) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  if (!PyType_Check(type)) {
    PyErr_Format(PyExc_TypeError, "_type_framework() takes a type, not %.200s",
                 Py_TYPE(type)->tp_name);
    return NULL;
  }
  const dlb_handler *h = dlb__handler_for(st, (PyTypeObject *)type);
  return h == NULL ? NULL : Py_NewRef(h->framework);
}

/* ---- init / clear ----------------------------------------------------------------- */

int dlb__handlers_init(dlb_module_state *st) {
  struct dlb_handler_cache *c = PyMem_Calloc(1, sizeof *c);
  if (c == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  st->handlers = c;
  DLB_FT_LOCK_INIT(&c->lock);
  /* Distinct from every other cache of the process, so that a memo of a
   * cache freed since (at the same address) can never match. */
  static uint64_t caches_made;
  DLB_FT_ADD_U64(&caches_made, 1);
  c->generation = DLB_FT_LOAD_U64(&caches_made) << 40;
  c->mask = CACHE_MIN_CAPACITY - 1;
  c->slots = PyMem_Calloc(c->mask + 1, sizeof *c->slots);
  if (c->slots == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  const char *skip = getenv("DLBRIDGE_SKIP_EXCHANGE_API");
  c->skip_exchange = skip != NULL && skip[0] != '\0' && strcmp(skip, "0") != 0;
  c->converters = PyDict_New();
  c->targets = PyDict_New();
  c->str_tag_probe = PyUnicode_InternFromString("__dlbridge_tag_probe__");
  c->str_exchange = PyUnicode_InternFromString("__dlpack_c_exchange_api__");
  c->str_exchange_legacy = PyUnicode_InternFromString("__c_dlpack_exchange_api__");
  c->str_registry = PyUnicode_InternFromString("dlbridge._frameworks");
  c->str_type_framework = PyUnicode_InternFromString("_type_framework");
  c->str_is_traced = PyUnicode_InternFromString("_is_traced");
  c->str_traits = PyUnicode_InternFromString("_c_traits");
  if (c->converters == NULL || c->targets == NULL || c->str_tag_probe == NULL || c->str_exchange == NULL ||
      c->str_exchange_legacy == NULL || c->str_registry == NULL ||
      c->str_type_framework == NULL || c->str_is_traced == NULL ||
      c->str_traits == NULL)
    return -1;
  /* The weakref callback reaches the cache through a capsule's context,
   * not the module: no reference cycle through module state. */
  c->cache_capsule = PyCapsule_New(c, "dlbridge._handler_cache", NULL);
  if (c->cache_capsule == NULL || PyCapsule_SetContext(c->cache_capsule, c) < 0)
    return -1;
  c->callback = PyCFunction_New(&on_type_dead_def, c->cache_capsule);
  if (c->callback == NULL) return -1;
  return 0;
}

void dlb__handlers_clear(dlb_module_state *st) {
  struct dlb_handler_cache *c = st->handlers;
  if (c == NULL) return;
  st->handlers = NULL;
  if (c->cache_capsule != NULL) {
    /* A callback still pending somewhere finds no cache. */
    PyCapsule_SetContext(c->cache_capsule, NULL);
  }
  if (c->slots != NULL) {
    for (size_t i = 0; i <= c->mask; i++) {
      if (c->slots[i] != NULL) entry_free(c->slots[i]);
      c->slots[i] = NULL;
    }
    PyMem_Free(c->slots);
  }
  dlb__numpy_descr_cache_clear(c->dtypes);
  Py_CLEAR(c->callback);
  Py_CLEAR(c->cache_capsule);
  Py_CLEAR(c->converters);
  Py_CLEAR(c->framework_stream);
  Py_CLEAR(c->targets);
  Py_CLEAR(c->str_tag_probe);
  Py_CLEAR(c->target_memo_key);
  Py_CLEAR(c->target_memo);
  Py_CLEAR(c->str_module);
  Py_CLEAR(c->str_exchange);
  Py_CLEAR(c->str_exchange_legacy);
  Py_CLEAR(c->str_registry);
  Py_CLEAR(c->str_type_framework);
  Py_CLEAR(c->str_is_traced);
  Py_CLEAR(c->str_traits);
  DLB_FT_LOCK_DESTROY(&c->lock);
  PyMem_Free(c);
}
