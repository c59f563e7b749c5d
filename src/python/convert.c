/*
 * convert.c -- dlbridge.convert(obj, to, *, copy=None, device=None): obj as
 * a tensor of another framework, sharing memory whenever that framework can
 * hold it safely.
 *
 * The one list of frameworks is python/dlbridge/_frameworks.py (REGISTRY).
 * The first convert into a target asks it once (_c_convert_target) and
 * binds the answer here: the target's importer, or its type's DLPack
 * exchange table, and what its tensors can hold.  The binding lives in the
 * handler cache's `targets` dict, keyed by the target's name (and, for a
 * framework that picks its result type by the type passed as `to` --
 * Dr.Jit -- by that type), so a call costs a dict lookup, not Python.
 *
 * A call:
 *   1. `to` -> the bound target (a name, a type, or an object whose
 *      framework to match; anything else is the registry's ValueError);
 *   2. obj already of the target framework is returned as it is, unless
 *      copy=True or device= asks for more;
 *   3. obj is imported (import.c's dlb__import, which carries out device=
 *      and copy=True: a copy is compact, 256-byte aligned and writable);
 *   4. what the target cannot hold at all -- a dtype, a device it has no
 *      backend for, a rank -- is a BufferError whatever copy says; what it
 *      cannot hold safely (read-only data in writable tensors, negative
 *      strides, strided data for an importer of compact data, data less
 *      aligned than its kernels need) is copied (copy=None) or refused
 *      (copy=False), the message saying why;
 *   5. the tensor goes to the target: its exchange table
 *      (managed_tensor_to_py_object_no_sync), an ndarray made through
 *      NumPy's C API over the memory, the importer called with the Tensor,
 *      or with a legacy capsule of it.  An importer's refusal (one of the
 *      target's `errors`) becomes a BufferError naming the target, the
 *      original as __cause__.
 * Rules per target and the reasons: docs/decisions.md, "convert".
 *
 * Ownership: the bound target is a capsule held (strong) for the whole
 * call, since Python code runs in the middle (producers' __dlpack__, the
 * importer) and could in principle clear the cache.  A NumPy array made
 * here holds the Tensor as its base; the Tensor is noted as exported, so
 * dlb.from_dlpack of that array finds the Tensor again (tensor.c; not on
 * free-threaded builds, where that cache is off).
 */
#include "dlbridge_py.h"

#include <string.h>

/* How a target takes a tensor (_frameworks.TAKES_*). */
enum {
  TAKES_DLBRIDGE = 0,
  TAKES_EXCHANGE = 1,
  TAKES_NUMPY = 2,
  TAKES_OBJECT = 3,
  TAKES_CAPSULE = 4
};

#define TARGET_MAX_DTYPES 32

/* Every dtype a framework names -- one lane, a type code below 16, a width
 * of 1, 2, 4, ... 128 bits -- has a slot (code * 8 + log2(bits)), so what a
 * target does with a dtype is one table read on the path of every call;
 * the other dtypes (vector lanes, odd widths) are looked up by a walk of
 * the target's list. */
#define DTYPE_SLOTS 128

static int dtype_slot(DLDataType dt) {
  /* log2 of each width that has a slot, + 1; 0 for the others */
  static const uint8_t width_index[129] = {
      [1] = 1, [2] = 2, [4] = 3, [8] = 4, [16] = 5, [32] = 6, [64] = 7,
      [128] = 8};
  if (dt.lanes != 1 || dt.code >= 16 || dt.bits > 128 ||
      width_index[dt.bits] == 0)
    return -1;
  return dt.code * 8 + width_index[dt.bits] - 1;
}

static int dtype_equal(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

typedef struct {
  PyObject *name;            /* interned str: the registry's name */
  int takes;                 /* TAKES_* */
  PyObject *importer;        /* callable; NULL for dlbridge */
  PyObject *errors;          /* exception types reported as BufferError */
  PyTypeObject *tensor_type; /* strong, or NULL: its exchange table */
  PyObject *numpy_owner;     /* NumPy's _ARRAY_API capsule, or NULL */
  void **numpy_api;          /* NumPy's C API table when usable */
  PyTypeObject *exact;       /* strong: bound for this type passed as `to` */
  int readonly;              /* holds read-only memory safely */
  int negative;              /* takes negative strides */
  int layout;                /* the strides its importer takes: LAYOUT_* */
  int copies;                /* its importer copies every tensor */
  int by_type;               /* a type passed as `to` is the importer */
  int objects;               /* its importers take any object with
                                __dlpack__ (a NumPy array as it is) */
  int min_ndim;
  Py_ssize_t alignment;      /* bytes its kernels need; 0: any */
  int ndtypes;               /* -1: any dtype (its importer decides) */
  DLDataType dtypes[TARGET_MAX_DTYPES];
  uint64_t holds[DTYPE_SLOTS / 64]; /* the slotted ones among dtypes */
  PyObject *dtype_names;     /* str listing them, or NULL */
  int nby_dtype;             /* importers chosen by dtype (Dr.Jit's TensorX
                                types, MLX's float64), tried first */
  DLDataType by_dtype[TARGET_MAX_DTYPES];
  PyObject *by_dtype_importer[TARGET_MAX_DTYPES]; /* strong */
  int8_t by_slot[DTYPE_SLOTS]; /* index into by_dtype + 1; 0: none */
  int any_device;            /* else only the device types in device_mask */
  uint64_t device_mask;
  /* The handler of the last source type converted into this target: a
   * program converts the same kind of tensor call after call.  Written
   * with the GIL (left empty without it: dlb__handler_for_memo). */
  dlb_handler_memo source;
} convert_target;

static void target_free(convert_target *t) {
  Py_XDECREF(t->name);
  Py_XDECREF(t->importer);
  Py_XDECREF(t->errors);
  Py_XDECREF(t->tensor_type);
  Py_XDECREF(t->numpy_owner);
  Py_XDECREF(t->exact);
  Py_XDECREF(t->dtype_names);
  for (int i = 0; i < t->nby_dtype; i++) Py_XDECREF(t->by_dtype_importer[i]);
  PyMem_Free(t);
}

static void target_capsule_destructor(PyObject *cap) {
  convert_target *t = PyCapsule_GetPointer(cap, NULL);
  if (t != NULL)
    target_free(t);
  else
    PyErr_Clear();
}

/* The capsules are ours alone (the handler cache's `targets` dict): their
 * name is NULL, which PyCapsule_GetPointer matches without a strcmp. */
static convert_target *target_of(PyObject *cap) {
  return (convert_target *)PyCapsule_GetPointer(cap, NULL);
}

/* ---- NumPy's C API, without NumPy's headers ----------------------------------
 *
 * NumPy publishes its C API as a table of pointers in the capsule
 * numpy._core._multiarray_umath._ARRAY_API, at indices that NumPy keeps
 * stable for its ABI (they are what every compiled extension uses).  Only
 * tables whose ABI version (entry 0) is NumPy 1.x's (0x01000009) or 2.x's
 * (0x02000000) are used; any other NumPy goes through np.from_dlpack. */
enum {
  NP_ABI_VERSION = 0,      /* unsigned int (*)(void) */
  NP_ARRAY_TYPE = 2,       /* PyTypeObject * */
  NP_DESCR_FROM_TYPE = 45, /* PyObject *(*)(int) */
  NP_NEW_FROM_DESCR = 94,  /* PyObject *(*)(type, descr, nd, dims, strides,
                              data, flags, obj) */
  NP_SET_BASE = 282        /* int (*)(PyObject *, PyObject *) */
};
#define NP_ARRAY_WRITEABLE_FLAG 0x0400

typedef unsigned int (*np_version_fn)(void);
typedef PyObject *(*np_descr_fn)(int);
typedef PyObject *(*np_new_fn)(PyTypeObject *, PyObject *, int,
                               const Py_intptr_t *, const Py_intptr_t *,
                               void *, int, PyObject *);
typedef int (*np_set_base_fn)(PyObject *, PyObject *);

/* Function pointers stored as data in NumPy's table: read through a
 * memcpy, which C allows between object and function pointer types of the
 * same size (checked). */
_Static_assert(sizeof(void *) == sizeof(np_new_fn),
               "NumPy's C API table holds function pointers as void *");
#define NP_FN(api, idx, type, out) memcpy(&(out), &(api)[idx], sizeof(type))

static void **numpy_api_of(PyObject *capsule) {
  if (capsule == NULL || !PyCapsule_CheckExact(capsule)) return NULL;
  void **api = PyCapsule_GetPointer(capsule, NULL);
  if (api == NULL) {
    PyErr_Clear();
    return NULL;
  }
  np_version_fn version;
  NP_FN(api, NP_ABI_VERSION, np_version_fn, version);
  unsigned int v = version();
  return v == 0x01000009u || v == 0x02000000u ? api : NULL;
}

/* NumPy's type number for dtype; -1 when it has none. */
static int numpy_typenum(DLDataType dt) {
  if (dt.lanes != 1) return -1;
  int wide_long = sizeof(long) == 8;
  switch (dt.code) {
    case kDLBool:
      return dt.bits == 8 ? 0 : -1;
    case kDLInt:
      switch (dt.bits) {
        case 8: return 1;
        case 16: return 3;
        case 32: return 5;
        case 64: return wide_long ? 7 : 9;
        default: return -1;
      }
    case kDLUInt:
      switch (dt.bits) {
        case 8: return 2;
        case 16: return 4;
        case 32: return 6;
        case 64: return wide_long ? 8 : 10;
        default: return -1;
      }
    case kDLFloat:
      return dt.bits == 16 ? 23 : dt.bits == 32 ? 11 : dt.bits == 64 ? 12 : -1;
    case kDLComplex:
      return dt.bits == 64 ? 14 : dt.bits == 128 ? 15 : -1;
    default:
      return -1;
  }
}

/* An ndarray over self's memory, self its base; NULL with no exception when
 * this path does not apply (the importer is used then), NULL with one on
 * failure. */
static PyObject *numpy_array(const convert_target *tg, dlb_TensorObject *self) {
  const DLTensor *t = &self->t;
  void **api = tg->numpy_api;
  int typenum = numpy_typenum(t->dtype);
  if (api == NULL || typenum < 0 || t->data == NULL ||
      t->device.device_type != kDLCPU)
    return NULL;
  Py_intptr_t dims[DLB_MAX_NDIM], strides[DLB_MAX_NDIM];
  int64_t scratch[DLB_MAX_NDIM];
  const int64_t *st = t->ndim > 0 ? dlb_tensor_strides(t, scratch) : NULL;
  Py_intptr_t itemsize = t->dtype.bits / 8;
  for (int32_t i = 0; i < t->ndim; i++) {
    dims[i] = (Py_intptr_t)t->shape[i];
    strides[i] = (Py_intptr_t)st[i] * itemsize;
  }
  np_descr_fn descr_from_type;
  np_new_fn new_from_descr;
  np_set_base_fn set_base;
  NP_FN(api, NP_DESCR_FROM_TYPE, np_descr_fn, descr_from_type);
  NP_FN(api, NP_NEW_FROM_DESCR, np_new_fn, new_from_descr);
  NP_FN(api, NP_SET_BASE, np_set_base_fn, set_base);
  PyObject *descr = descr_from_type(typenum);
  if (descr == NULL) return NULL;
  int readonly = (self->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
  /* Steals descr; with data given, flags are the array's (NumPy works out
   * contiguity and alignment itself). */
  PyObject *arr = new_from_descr((PyTypeObject *)api[NP_ARRAY_TYPE], descr,
                                 t->ndim, dims, strides,
                                 (char *)t->data + t->byte_offset,
                                 readonly ? 0 : NP_ARRAY_WRITEABLE_FLAG, NULL);
  if (arr == NULL) return NULL;
  Py_INCREF(self);
  if (set_base(arr, (PyObject *)self) < 0) { /* steals self, failure too */
    Py_DECREF(arr);
    return NULL;
  }
  dlb__tensor_note_exported(self);
  return arr;
}

/* ---- binding a target ---------------------------------------------------------- */

/* What strides a target's importer takes (the registry's Framework.layout). */
enum {
  LAYOUT_STRIDED = 0,   /* any */
  LAYOUT_ROW_MAJOR = 1, /* compact row-major only */
  LAYOUT_DENSE = 2      /* compact in some dimension order (dlb_tensor_is_dense) */
};

/* The registry module (new reference). */
static PyObject *registry(dlb_module_state *st) {
  return PyImport_Import(st->handlers->str_registry);
}

/* Fill t from the registry's tuple (_frameworks._c_convert_target). */
static int parse_target(PyObject *tuple, convert_target *t) {
  int takes, readonly, negative, layout, copies, by_type, objects, min_ndim;
  Py_ssize_t alignment;
  PyObject *importer, *errors, *tensor_type, *numpy_api, *dtypes, *names,
      *devices, *by_dtype;
  if (!PyTuple_Check(tuple) ||
      !PyArg_ParseTuple(tuple, "iOOOOppipppinOOOO:_c_convert_target",
                        &takes, &importer, &errors, &tensor_type, &numpy_api,
                        &readonly, &negative, &layout, &copies, &by_type,
                        &objects, &min_ndim, &alignment, &dtypes, &names,
                        &devices, &by_dtype)) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError,
                      "dlbridge._frameworks._c_convert_target must return a "
                      "tuple");
    return -1;
  }
  if (takes < TAKES_DLBRIDGE || takes > TAKES_CAPSULE ||
      (takes != TAKES_DLBRIDGE && !PyCallable_Check(importer)) ||
      (tensor_type != Py_None && !PyType_Check(tensor_type)) ||
      layout < LAYOUT_STRIDED || layout > LAYOUT_DENSE ||
      alignment < 0 || (alignment & (alignment - 1)) != 0) {
    PyErr_SetString(PyExc_ValueError,
                    "dlbridge._frameworks._c_convert_target returned a "
                    "malformed target");
    return -1;
  }
  t->takes = takes;
  t->importer = importer == Py_None ? NULL : Py_NewRef(importer);
  t->errors = Py_NewRef(errors);
  t->tensor_type =
      tensor_type == Py_None ? NULL : (PyTypeObject *)Py_NewRef(tensor_type);
  if (numpy_api != Py_None) {
    t->numpy_api = numpy_api_of(numpy_api);
    if (t->numpy_api != NULL) t->numpy_owner = Py_NewRef(numpy_api);
  }
  t->readonly = readonly;
  t->negative = negative;
  t->layout = layout;
  t->copies = copies;
  t->by_type = by_type;
  t->objects = objects;
  t->min_ndim = min_ndim;
  t->alignment = alignment;
  t->dtype_names = names == Py_None ? NULL : Py_NewRef(names);
  t->ndtypes = -1;
  if (dtypes != Py_None) {
    if (!PyTuple_Check(dtypes) || PyTuple_GET_SIZE(dtypes) > TARGET_MAX_DTYPES) {
      PyErr_SetString(PyExc_ValueError,
                      "_c_convert_target: dtypes must be a short tuple");
      return -1;
    }
    t->ndtypes = (int)PyTuple_GET_SIZE(dtypes);
    for (int i = 0; i < t->ndtypes; i++) {
      int code, bits, lanes;
      if (!PyArg_ParseTuple(PyTuple_GET_ITEM(dtypes, i), "iii", &code, &bits,
                            &lanes))
        return -1;
      t->dtypes[i].code = (uint8_t)code;
      t->dtypes[i].bits = (uint8_t)bits;
      t->dtypes[i].lanes = (uint16_t)lanes;
      int slot = dtype_slot(t->dtypes[i]);
      if (slot >= 0) t->holds[slot / 64] |= (uint64_t)1 << (slot % 64);
    }
  }
  if (by_dtype != Py_None) {
    if (!PyTuple_Check(by_dtype) ||
        PyTuple_GET_SIZE(by_dtype) > TARGET_MAX_DTYPES) {
      PyErr_SetString(PyExc_ValueError,
                      "_c_convert_target: by_dtype must be a short tuple");
      return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(by_dtype); i++) {
      int code, bits, lanes;
      PyObject *f;
      if (!PyArg_ParseTuple(PyTuple_GET_ITEM(by_dtype, i), "(iii)O", &code,
                            &bits, &lanes, &f))
        return -1;
      if (!PyCallable_Check(f)) {
        PyErr_SetString(PyExc_TypeError,
                        "_c_convert_target: by_dtype importers must be "
                        "callable");
        return -1;
      }
      t->by_dtype[i].code = (uint8_t)code;
      t->by_dtype[i].bits = (uint8_t)bits;
      t->by_dtype[i].lanes = (uint16_t)lanes;
      t->by_dtype_importer[i] = Py_NewRef(f);
      t->nby_dtype = (int)i + 1;
      int slot = dtype_slot(t->by_dtype[i]);
      if (slot >= 0 && t->by_slot[slot] == 0)
        t->by_slot[slot] = (int8_t)(i + 1);
    }
  }
  t->any_device = devices == Py_None;
  if (!t->any_device) {
    if (!PyTuple_Check(devices)) {
      PyErr_SetString(PyExc_ValueError,
                      "_c_convert_target: devices must be a tuple");
      return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(devices); i++) {
      long d = PyLong_AsLong(PyTuple_GET_ITEM(devices, i));
      if (d == -1 && PyErr_Occurred()) return -1;
      if (d >= 0 && d < 64) t->device_mask |= (uint64_t)1 << d;
    }
  }
  return 0;
}

/* Bind target name (a registry name), for the type exact passed as `to`
 * when not NULL, and cache it under key.  New reference to the capsule. */
static PyObject *bind_target(dlb_module_state *st, PyObject *name,
                             PyObject *exact, PyObject *key) {
  struct dlb_handler_cache *c = st->handlers;
  PyObject *reg = registry(st);
  if (reg == NULL) return NULL;
  PyObject *tuple = PyObject_CallMethod(reg, "_c_convert_target", "OO", name,
                                        exact ? exact : Py_None);
  Py_DECREF(reg);
  if (tuple == NULL) return NULL;
  convert_target *t = PyMem_Calloc(1, sizeof *t);
  if (t == NULL) {
    Py_DECREF(tuple);
    return PyErr_NoMemory();
  }
  int rc = parse_target(tuple, t);
  Py_DECREF(tuple);
  if (rc < 0) {
    target_free(t);
    return NULL;
  }
  t->name = Py_NewRef(name);
  PyUnicode_InternInPlace(&t->name);
  t->exact = (PyTypeObject *)Py_XNewRef(exact);
  PyObject *cap = PyCapsule_New(t, NULL, target_capsule_destructor);
  if (cap == NULL) {
    target_free(t);
    return NULL;
  }
  /* The cache may have gone while Python ran (module cleared): then the
   * answer is just not kept.  Another thread's binding, put there first,
   * is the one kept and used. */
  if (st->handlers == c) {
    PyObject *kept = NULL;
    rc = dlb__dict_setdefault_ref(c->targets, key, cap, &kept);
    Py_DECREF(cap);
    return rc < 0 ? NULL : kept;
  }
  return cap;
}

/* The target bound for name (a new reference: the dict is shared by every
 * thread), or NULL: with an exception, or without one when it is not bound
 * yet. */
static PyObject *target_by_name_cached(dlb_module_state *st, PyObject *name) {
  if (st->handlers == NULL) { /* cleared while Python code ran */
    PyErr_SetString(PyExc_RuntimeError, "dlbridge._core has been cleared");
    return NULL;
  }
  PyObject *cap = NULL;
  (void)dlb__dict_get_ref(st->handlers->targets, name, &cap);
  return cap;
}

/* The bound target registry name `name` stands for, cached or bound now
 * (the name already checked). */
static PyObject *target_by_name(dlb_module_state *st, PyObject *name) {
  PyObject *cap = target_by_name_cached(st, name);
  if (cap != NULL) return cap;
  if (PyErr_Occurred()) return NULL;
  return bind_target(st, name, NULL, name);
}

/* The registry's name for `to`, or its ValueError (new reference). */
static PyObject *resolve_name(dlb_module_state *st, PyObject *to) {
  PyObject *reg = registry(st);
  if (reg == NULL) return NULL;
  PyObject *name = PyObject_CallMethod(reg, "_resolve_target", "O", to);
  Py_DECREF(reg);
  if (name != NULL && !PyUnicode_Check(name)) {
    PyErr_SetString(PyExc_TypeError,
                    "dlbridge._frameworks._resolve_target must return a str");
    Py_CLEAR(name);
  }
  return name;
}

static PyObject *resolve_target_slow(dlb_module_state *st, PyObject *to);

/* The bound target `to` stands for: a registry name, a type of a framework,
 * or an object of one.  New reference to its capsule.  The last str or type
 * asked for is remembered (by identity: a literal name is interned).
 * Without the GIL the memo's two fields are read, with the reference taken,
 * and replaced under c->lock (a few loads and stores; the references let
 * go of are dropped after it), so no thread pairs one call's key with
 * another's target or takes a reference to a target being freed. */
#ifdef Py_GIL_DISABLED
/* Without the GIL, each thread also remembers the last target it resolved
 * from a name, so that convert(x, "numpy") in many threads writes nothing
 * shared: neither c->lock (whose cache line every handler lookup reads)
 * nor the capsule's reference count (issue 26 item 5).  The capsule is
 * borrowed: it lives in c->targets, which only grows until the cache is
 * freed with the module (cache_id tells a later cache at the same address
 * apart), and the key is remembered only when it is the target's own
 * interned name -- the object a literal name is -- which the target holds,
 * so no other object can take its address while the memo can match. */
static _Thread_local struct {
  const struct dlb_handler_cache *cache;
  uint64_t cache_id;
  PyObject *key, *cap;
  convert_target *target;
} thread_target;

static uint64_t cache_id(const struct dlb_handler_cache *c) {
  return DLB_FT_LOAD_U64(&c->generation) >> 40; /* handlers.c: its origin */
}

/* cap (target t), resolved from to, remembered for this thread when to is
 * t's own name and cap the one c->targets keeps for it. */
static void remember_thread_target(const struct dlb_handler_cache *c,
                                   PyObject *to, PyObject *cap,
                                   convert_target *t) {
  PyObject *kept = NULL;
  if (to != t->name ||
      dlb__dict_get_ref(c->targets, to, &kept) != 1 || kept != cap) {
    PyErr_Clear(); /* no memo is no error */
    Py_XDECREF(kept);
    return;
  }
  Py_DECREF(kept); /* c->targets holds it */
  thread_target.cache = c;
  thread_target.cache_id = cache_id(c);
  thread_target.key = to;
  thread_target.cap = cap;
  thread_target.target = t;
}
#endif

/* resolve_target's answer, *borrowed set when cap is borrowed (the
 * caller's thread memo, free-threaded builds only) rather than a new
 * reference. */
static PyObject *resolve_target(dlb_module_state *st, PyObject *to,
                                convert_target **target, int *borrowed) {
  struct dlb_handler_cache *c = st->handlers;
  *borrowed = 0;
  if (c == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "dlbridge._core has been cleared");
    return NULL;
  }
#ifdef Py_GIL_DISABLED
  if (to == thread_target.key && to != NULL && thread_target.cache == c &&
      thread_target.cache_id == cache_id(c)) {
    *target = thread_target.target;
    *borrowed = 1;
    return thread_target.cap;
  }
#endif
  PyObject *cap = NULL;
  DLB_FT_LOCK(&c->lock);
  if (to == c->target_memo_key && to != NULL) {
    cap = Py_NewRef(c->target_memo);
    *target = c->target_memo_pointer;
  }
  DLB_FT_UNLOCK(&c->lock);
  if (cap != NULL) {
#ifdef Py_GIL_DISABLED
    remember_thread_target(c, to, cap, *target);
#endif
    return cap;
  }
  cap = resolve_target_slow(st, to);
  if (cap == NULL) return NULL;
  *target = target_of(cap);
  if (*target == NULL) {
    Py_DECREF(cap);
    return NULL;
  }
#ifdef Py_GIL_DISABLED
  if (st->handlers == c) remember_thread_target(c, to, cap, *target);
#endif
  if (st->handlers == c && (PyUnicode_CheckExact(to) || PyType_Check(to))) {
    Py_INCREF(cap);
    Py_INCREF(to);
    DLB_FT_LOCK(&c->lock);
    PyObject *old_memo = c->target_memo, *old_key = c->target_memo_key;
    c->target_memo = cap;
    c->target_memo_key = to;
    c->target_memo_pointer = *target;
    DLB_FT_UNLOCK(&c->lock);
    Py_XDECREF(old_memo);
    Py_XDECREF(old_key);
  }
  return cap;
}

static PyObject *resolve_target_slow(dlb_module_state *st, PyObject *to) {
  struct dlb_handler_cache *c = st->handlers;
  PyObject *cap, *name;
  if (PyUnicode_Check(to) || PyType_Check(to)) {
    /* names, and the types bound by type (Dr.Jit's) */
    if (dlb__dict_get_ref(c->targets, to, &cap) != 0) return cap;
  }
  if (PyUnicode_Check(to)) {
    name = resolve_name(st, to);
    if (name == NULL) return NULL;
    cap = target_by_name(st, name);
    Py_DECREF(name);
    return cap;
  }
  /* A type or an object: its framework is the handler cache's answer.  An
   * object's class is held while its handler is read (classifying it runs
   * Python code, which may give `to` another class and free this one). */
  PyTypeObject *held = NULL;
  const dlb_handler *h = PyType_Check(to)
                             ? dlb__handler_for(st, (PyTypeObject *)to)
                             : dlb__handler_held(st, to, &held);
  if (h == NULL) return NULL;
  name = Py_NewRef(h->framework);
  Py_XDECREF(held);
  /* Classifying a new type ran Python code: the cache is looked up again. */
  cap = target_by_name_cached(st, name);
  if (cap == NULL && !PyErr_Occurred()) {
    /* Not bound yet: the registry checks the name (a framework that is no
     * convert target is its ValueError) and binds it. */
    Py_DECREF(name);
    name = resolve_name(st, to);
    cap = name != NULL ? target_by_name(st, name) : NULL;
  }
  if (cap != NULL && PyType_Check(to) && target_of(cap)->by_type) {
    Py_DECREF(cap);
    cap = bind_target(st, name, to, to);
  }
  Py_XDECREF(name);
  return cap;
}

/* ---- what a target can hold ------------------------------------------------------ */

static int64_t numel(const DLTensor *t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

/* Whether a stride of t addresses memory: that of a dimension of extent
 * 2 or more in a tensor that has elements.  The stride of an extent-1
 * dimension is never multiplied by anything but 0, and a tensor without
 * elements reads nothing: the rules below ignore those strides. */
static int stride_matters(const DLTensor *t, int32_t i, int empty) {
  return !empty && t->shape[i] > 1;
}

static int has_negative_stride(const DLTensor *t) {
  if (t->strides == NULL) return 0;
  int empty = numel(t) == 0;
  for (int32_t i = 0; i < t->ndim; i++)
    if (stride_matters(t, i, empty) && t->strides[i] < 0) return 1;
  return 0;
}

/* Whether t has a negative stride where it addresses nothing (see
 * stride_matters).  An importer that refuses negative strides may count
 * those too (MLX and PyArrow do): such a target gets the tensor with them
 * made positive (restride), the same memory, rather than a refusal. */
static int has_idle_negative_stride(const DLTensor *t) {
  if (t->strides == NULL) return 0;
  int empty = numel(t) == 0;
  for (int32_t i = 0; i < t->ndim; i++)
    if (!stride_matters(t, i, empty) && t->strides[i] < 0) return 1;
  return 0;
}

/* A Tensor over self's memory (self kept alive by it) whose strides that
 * address nothing are those of compact row-major data, the others self's:
 * the same elements at the same addresses.  New reference, NULL with an
 * exception. */
static dlb_TensorObject *restride(dlb_module_state *st,
                                  dlb_TensorObject *self) {
  DLTensor v = self->t;
  int64_t strides[DLB_MAX_NDIM];
  int empty = numel(&v) == 0;
  int64_t compact = 1;
  for (int32_t i = v.ndim - 1; i >= 0; i--) {
    strides[i] = stride_matters(&v, i, empty) || v.strides[i] >= 0
                     ? v.strides[i]
                     : compact;
    if (v.shape[i] > 1 && compact <= INT64_MAX / v.shape[i])
      compact *= v.shape[i];
  }
  v.strides = strides;
  DLManagedTensorVersioned *m = NULL;
  dlb_error err;
  Py_INCREF(self);
  if (dlb_managed_wrap(&v, self->flags, dlb__owner_release, self, &m, &err) !=
      DLB_OK) {
    Py_DECREF(self); /* release is not called on failure */
    return (dlb_TensorObject *)dlb__raise(&err);
  }
  return (dlb_TensorObject *)dlb__tensor_from_managed(st, m); /* steals m */
}

static int holds_dtype(const convert_target *tg, DLDataType dt) {
  if (tg->ndtypes < 0) return 1;
  int slot = dtype_slot(dt);
  if (slot >= 0) return (int)((tg->holds[slot / 64] >> (slot % 64)) & 1);
  for (int i = 0; i < tg->ndtypes; i++)
    if (dtype_equal(tg->dtypes[i], dt)) return 1;
  return 0;
}

static int holds_device(const convert_target *tg, DLDevice device) {
  int type = (int)device.device_type;
  return tg->any_device ||
         (type >= 0 && type < 64 && ((tg->device_mask >> type) & 1));
}

/* Whether tg can hold t at all (a copy would not help): its dtype, its
 * device, its rank.  Apart from the message (raise_not_holdable), so that
 * what every call runs stays small. */
static int holdable(const convert_target *tg, const DLTensor *t) {
  return holds_dtype(tg, t->dtype) && holds_device(tg, t->device) &&
         t->ndim >= tg->min_ndim;
}

/* The BufferError saying why tg cannot hold t.  -1. */
static int raise_not_holdable(const convert_target *tg, const DLTensor *t) {
  char what[64];
  if (!holds_dtype(tg, t->dtype)) {
    dlb__dtype_str(t->dtype, what, sizeof what);
    PyErr_Format(PyExc_BufferError,
                 "convert: %U cannot hold dtype %s; supported dtypes are %U",
                 tg->name, what, tg->dtype_names);
  } else if (!holds_device(tg, t->device)) {
    PyErr_Format(PyExc_BufferError,
                 "convert: %U cannot hold a tensor on %s (this %U build has "
                 "no such device); pass device= to move it to one it has",
                 tg->name, dlb__device_str(t->device, what, sizeof what),
                 tg->name);
  } else {
    PyErr_Format(PyExc_BufferError,
                 "convert: %U tensors have at least %d dimension%s, this one "
                 "has %d",
                 tg->name, tg->min_ndim, tg->min_ndim == 1 ? "" : "s",
                 (int)t->ndim);
  }
  return -1;
}

/* BufferError when tg cannot hold t at all.  0 or -1. */
static int check_holdable(const convert_target *tg, const DLTensor *t) {
  return holdable(tg, t) ? 0 : raise_not_holdable(tg, t);
}

/* Why tg's importer cannot take t's strides (negative ones, a layout it
 * does not import), as a message into buf, or NULL when it can. */
static const char *stride_reason(const convert_target *tg, const DLTensor *t,
                                 char *buf, size_t n) {
  if (!tg->negative && has_negative_stride(t)) {
    PyOS_snprintf(buf, n, "%s tensors cannot have negative strides",
                  PyUnicode_AsUTF8(tg->name));
    return buf;
  }
  if (tg->layout == LAYOUT_ROW_MAJOR && !dlb_tensor_is_contiguous(t)) {
    PyOS_snprintf(buf, n, "%s imports only compact row-major data",
                  PyUnicode_AsUTF8(tg->name));
    return buf;
  }
  if (tg->layout == LAYOUT_DENSE && !dlb_tensor_is_dense(t)) {
    PyOS_snprintf(buf, n,
                  "%s imports only compact data (in any dimension order)",
                  PyUnicode_AsUTF8(tg->name));
    return buf;
  }
  return NULL;
}

/* Why tg cannot share t's memory safely, as a message into buf, or NULL
 * when it can.  row_major: the caller knows t is compact row-major (NumPy's
 * C_CONTIGUOUS flag says so of an array), which every stride rule accepts:
 * they are not walked then. */
static const char *copy_reason(const convert_target *tg, const DLTensor *t,
                               uint64_t flags, int row_major, char *buf,
                               size_t n) {
  if ((flags & DLPACK_FLAG_BITMASK_READ_ONLY) && !tg->readonly &&
      !tg->copies) {
    PyOS_snprintf(buf, n,
                  "the data is read-only and %s tensors cannot be (its "
                  "importer would hand back a writable alias, or asks for a "
                  "legacy capsule, which cannot say read-only)",
                  PyUnicode_AsUTF8(tg->name));
    return buf;
  }
  if (!row_major && stride_reason(tg, t, buf, n) != NULL) return buf;
  if (tg->alignment > 0 && numel(t) > 0 &&
      ((uintptr_t)t->data + t->byte_offset) % (uintptr_t)tg->alignment) {
    PyOS_snprintf(buf, n,
                  "%s needs data aligned to %zd bytes (its kernels abort or "
                  "it copies otherwise)",
                  PyUnicode_AsUTF8(tg->name), tg->alignment);
    return buf;
  }
  return NULL;
}

/* ---- handing the tensor over -------------------------------------------------- */

/* After the target's importer failed: its refusals (tg->errors) become
 * BufferError naming the target and the tensor. */
static void importer_refusal(const convert_target *tg, const DLTensor *t) {
  if (!PyErr_ExceptionMatches(tg->errors) ||
      PyErr_ExceptionMatches(PyExc_MemoryError))
    return;
  char dt[64], dev[64];
  dlb__dtype_str(t->dtype, dt, sizeof dt);
  dlb__device_str(t->device, dev, sizeof dev);
  /* The message is made with no exception pending (repr runs code). */
  dlb__saved_error e;
  dlb__error_save(&e);
  PyObject *prefix = NULL, *shape = dlb__int64_tuple(t->ndim, t->shape);
  if (shape != NULL) {
    prefix = PyUnicode_FromFormat(
        "convert: %U could not import the %s tensor (shape %R, device %s)",
        tg->name, dt, shape, dev);
    Py_DECREF(shape);
  }
  if (prefix == NULL) {
    dlb__error_discard(&e); /* a MemoryError says more now */
    return;
  }
  dlb__error_restore(&e);
  dlb__error_as_buffer_error(tg->errors, prefix);
  Py_DECREF(prefix);
}

static PyObject *call_importer(const convert_target *tg, PyObject *arg,
                               const DLTensor *t) {
  PyObject *importer = tg->importer;
  if (tg->nby_dtype > 0) {
    int slot = dtype_slot(t->dtype);
    if (slot >= 0) {
      if (tg->by_slot[slot] > 0)
        importer = tg->by_dtype_importer[tg->by_slot[slot] - 1];
    } else {
      for (int i = 0; i < tg->nby_dtype; i++) {
        if (dtype_equal(tg->by_dtype[i], t->dtype)) {
          importer = tg->by_dtype_importer[i];
          break;
        }
      }
    }
  }
  PyObject *res;
  if (PyType_Check(importer) &&
      ((PyTypeObject *)importer)->tp_vectorcall != NULL) {
    /* A type as the importer (Dr.Jit's TensorX types): called through its
     * own tp_vectorcall, as CPython's bytecode calls a class.  The generic
     * call goes through the metaclass, which for nanobind's types has no
     * vectorcall slot: a tuple and tp_call, 350 ns more a call. */
    PyObject *args[2] = {NULL, arg};
    res = ((PyTypeObject *)importer)
              ->tp_vectorcall(importer, args + 1,
                              1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
  } else {
    res = PyObject_CallOneArg(importer, arg);
  }
  if (res == NULL) importer_refusal(tg, t);
  return res;
}

/* The exchange table of tg's tensor type, or NULL (no exception) when it
 * has none (or DLBRIDGE_SKIP_EXCHANGE_API turned tables off); NULL with an
 * exception on failure. */
static const DLPackExchangeAPI *target_table(dlb_module_state *st,
                                             const convert_target *tg) {
  if (tg->tensor_type == NULL) return NULL;
  const dlb_handler *h = dlb__handler_for(st, tg->tensor_type);
  if (h == NULL || h->kind != DLB_KIND_EXCHANGE || h->api == NULL ||
      h->api->managed_tensor_to_py_object_no_sync == NULL)
    return NULL;
  return h->api;
}

/* m (owned, stolen on every path) through api; t describes it for
 * messages. */
static PyObject *table_import(const convert_target *tg,
                              const DLPackExchangeAPI *api,
                              DLManagedTensorVersioned *m, const DLTensor *t) {
  if (dlb__is_cuda_device(t->device) && api->current_work_stream != NULL) {
    /* The table imports without synchronising: order dlbridge's current
     * stream (where the tensor's work is) before the framework's. */
    void *consumer = NULL;
    if (api->current_work_stream(t->device.device_type, t->device.device_id,
                                 &consumer) != 0 ||
        dlb__stream_order(t->device, dlb__stream_current(), consumer) < 0) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError,
                     "convert: the exchange table of '%.200s' could not give "
                     "its current stream",
                     tg->tensor_type->tp_name);
      dlb__delete_keep_error(m);
      return NULL;
    }
  }
  void *obj = NULL;
  /* Steals m on success and failure (decision 3.8). */
  if (api->managed_tensor_to_py_object_no_sync(m, &obj) != 0 || obj == NULL) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_BufferError,
                   "convert: the exchange table of '%.200s' could not import "
                   "the tensor without saying why",
                   tg->tensor_type->tp_name);
    importer_refusal(tg, t);
    return NULL;
  }
  return (PyObject *)obj;
}

static PyObject *hand_over(dlb_module_state *st, const convert_target *tg,
                           dlb_TensorObject *self) {
  PyObject *res;
  switch (tg->takes) {
    case TAKES_DLBRIDGE:
      return Py_NewRef((PyObject *)self);
    case TAKES_NUMPY:
      res = numpy_array(tg, self);
      if (res != NULL || PyErr_Occurred()) return res;
      break;
    case TAKES_EXCHANGE: {
      const DLPackExchangeAPI *api = target_table(st, tg);
      if (api == NULL) {
        if (PyErr_Occurred()) return NULL;
        break;
      }
      DLManagedTensorVersioned *m = NULL;
      dlb_error err;
      if (dlb__tensor_export_managed(self, &m, &err) != DLB_OK)
        return dlb__raise(&err);
      return table_import(tg, api, m, &self->t);
    }
    case TAKES_CAPSULE: {
      /* A legacy capsule, what these importers read.  Read-only data gets
       * here only for a target that holds it safely (one that copies every
       * import): it gets the Tensor, whose __dlpack__ it asks for the
       * versioned capsule a legacy one cannot be. */
      if (self->flags & DLPACK_FLAG_BITMASK_READ_ONLY) break;
      PyObject *cap = dlb__tensor_dlpack((PyObject *)self, NULL, 0, NULL);
      if (cap == NULL) return NULL;
      res = call_importer(tg, cap, &self->t);
      Py_DECREF(cap);
      return res;
    }
    default:
      break;
  }
  return call_importer(tg, (PyObject *)self, &self->t);
}

/* The lean path for a writable NumPy array that tg can share as it is:
 * no dlbridge.Tensor in between.  A target that takes a managed tensor
 * (exchange table) or a legacy capsule gets one the array itself owns (one
 * allocation, as np.from_dlpack's own export); an importer that takes any
 * DLPack object gets the array, checked.  *done = 0 when it does not apply
 * (nothing happened, no exception). */
static PyObject *lean_numpy(dlb_module_state *st, const convert_target *tg,
                            const dlb_handler *h, PyObject *obj, int copy,
                            int *done) {
  *done = 0;
  if (tg->takes != TAKES_EXCHANGE && tg->takes != TAKES_CAPSULE &&
      !tg->objects)
    return NULL;
  const DLPackExchangeAPI *api = NULL;
  if (tg->takes == TAKES_EXCHANGE) {
    api = target_table(st, tg);
    if (api == NULL) {
      *done = PyErr_Occurred() != NULL;
      return NULL;
    }
  }
  dlb_view v;
  int row_major;
  /* NUMPY views own nothing and run no Python code: no release needed. */
  if (dlb__view_numpy(st, h, obj, &v, &row_major) < 0) {
    *done = 1;
    return NULL;
  }
  char why[256];
  if (v.t.device.device_type != kDLCPU ||
      (v.flags & DLPACK_FLAG_BITMASK_READ_ONLY) ||
      copy_reason(tg, &v.t, v.flags, row_major, why, sizeof why) != NULL ||
      (tg->copies && copy == 0) ||
      (!tg->negative && has_idle_negative_stride(&v.t)))
    return NULL;
  *done = 1;
  if (check_holdable(tg, &v.t) < 0) return NULL;
  if (tg->objects) return call_importer(tg, obj, &v.t);
  if (tg->takes == TAKES_CAPSULE) {
    PyObject *cap = dlb__legacy_capsule_of(obj, &v.t);
    if (cap == NULL) return NULL;
    PyObject *res = call_importer(tg, cap, &v.t);
    Py_DECREF(cap);
    return res;
  }
  DLManagedTensorVersioned *m = NULL;
  dlb_error err;
  Py_INCREF(obj);
  if (dlb_managed_wrap(&v.t, v.flags, dlb__owner_release, obj, &m, &err) !=
      DLB_OK) {
    Py_DECREF(obj); /* release is not called on failure */
    return dlb__raise(&err);
  }
  return table_import(tg, api, m, &v.t);
}

/* ---- torch tensors DLPack cannot describe ------------------------------------------ */

/* obj.<name>() or obj.<name> as a truth value: 1, 0, or -1 with an
 * exception. */
static int torch_truth(PyObject *obj, const char *name, int call) {
  PyObject *r = call ? PyObject_CallMethod(obj, name, NULL)
                     : PyObject_GetAttrString(obj, name);
  if (r == NULL) return -1;
  int yes = PyObject_IsTrue(r);
  Py_DECREF(r);
  return yes;
}

/* After reading obj failed (the exception pending): what convert does
 * better than torch's exporter.  A torch tensor with its lazy conjugate or
 * negative bit set (which DLPack cannot say) is read again resolved --
 * obj.resolve_conj().resolve_neg(), torch's own copy with the values the
 * tensor stands for -- unless copy=False forbids that copy; a nested one
 * (which has no DLPack form at all: torch raises an internal RuntimeError)
 * is a BufferError saying what to do.  Anything else, or any failure to
 * ask, keeps the original exception.  New reference, or NULL with an
 * exception. */
static PyObject *torch_retry(dlb_module_state *st, PyObject *obj,
                             const DLDevice *device, int copy) {
  if (!PyErr_ExceptionMatches(PyExc_BufferError) &&
      !PyErr_ExceptionMatches(PyExc_RuntimeError))
    return NULL;
  dlb__saved_error e;
  dlb__error_save(&e);
  PyObject *res = NULL, *resolved = NULL;
  PyTypeObject *type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(obj));
  const dlb_handler *h = dlb__handler_for(st, type);
  int nested = -1, conj = -1, neg = -1;
  if (h == NULL || h->framework != st->str_torch) goto keep;
  nested = torch_truth(obj, "is_nested", 0);
  if (nested < 0) goto keep;
  if (nested) {
    PyErr_SetString(PyExc_BufferError,
                    "convert: a nested torch tensor has no DLPack form "
                    "(DLPack describes strided memory); into torch convert "
                    "returns it as it is (copy=None or False, no device=); "
                    "copy or move it with torch (.clone(), .to()) or make it "
                    "strided first (.to_padded_tensor(0), .unbind())");
    dlb__error_chain_cause(&e);
    goto done;
  }
  conj = torch_truth(obj, "is_conj", 1);
  neg = conj < 0 ? -1 : torch_truth(obj, "is_neg", 1);
  if (conj < 0 || neg < 0) goto keep;
  if (!conj && !neg) goto keep_quiet;
  if (copy == 0) {
    PyErr_Format(PyExc_BufferError,
                 "convert: copy=False, but the torch tensor has its lazy %s "
                 "bit set, which DLPack cannot describe: its values need a "
                 "copy (copy=None or True makes it, with the %s resolved)",
                 conj ? "conjugate" : "negative",
                 conj ? "conjugation" : "negation");
    dlb__error_chain_cause(&e);
    goto done;
  }
  dlb__error_discard(&e);
  resolved = PyObject_CallMethod(obj, "resolve_conj", NULL);
  if (resolved != NULL)
    Py_SETREF(resolved, PyObject_CallMethod(resolved, "resolve_neg", NULL));
  /* A copy no one else holds: copy=True is met, so it is shared. */
  if (resolved != NULL) res = dlb__import(st, resolved, device, -1);
  goto done;
keep:
  PyErr_Clear(); /* asking failed: the first answer stands */
keep_quiet:
  dlb__error_restore(&e);
done:
  Py_XDECREF(resolved);
  Py_DECREF(type);
  return res;
}

/* obj read as a Tensor (import.c), torch's tensors DLPack cannot describe
 * handled as torch_retry says.  New reference, or NULL with an exception. */
static PyObject *import_source(dlb_module_state *st, PyObject *obj,
                               const DLDevice *device, int copy) {
  PyObject *res = dlb__import(st, obj, device, copy);
  return res != NULL ? res : torch_retry(st, obj, device, copy);
}

/* ---- convert --------------------------------------------------------------------- */

PyObject *dlb__convert(dlb_module_state *st, PyObject *obj, PyObject *to,
                       const DLDevice *device, int copy) {
  convert_target *tg = NULL;
  int borrowed = 0;
  PyObject *cap = resolve_target(st, to, &tg, &borrowed), *res = NULL;
  dlb_TensorObject *self = NULL;
  PyTypeObject *type = NULL;
  const dlb_handler *h = NULL;
  if (cap == NULL) return NULL;

  if (tg->takes == TAKES_DLBRIDGE) {
    res = import_source(st, obj, device, copy);
    goto done;
  }
  /* Already the target's tensor: as it is.  (NumPy scalars, which are no
   * arrays and have no __dlpack__, are imported as 0-d arrays.) */
  if (copy != 1 && device == NULL) {
    /* Held while its handler is used: classifying a new type runs Python
     * code, which may give obj another class and let the old one die with
     * its handler.  obj is then read by the general path below. */
    type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(obj));
    h = dlb__handler_memo_get(st, &tg->source, type);
    if (h == NULL) {
      int ran_python = 0;
      h = dlb__handler_for_memo(st, &tg->source, type, &ran_python);
      if (h == NULL) goto done;
      if (ran_python && Py_TYPE(obj) != type) h = NULL;
    }
  }
  if (h != NULL) {
    /* A target called with the object whose type names its result type
     * (PyArrow: pyarrow.Tensor; its Arrow arrays are converted into one)
     * returns only objects of that type as they are. */
    if (h->framework == tg->name &&
        (tg->exact == NULL || PyObject_TypeCheck(obj, tg->exact)) &&
        (tg->takes != TAKES_OBJECT || tg->tensor_type == NULL ||
         PyObject_TypeCheck(obj, tg->tensor_type)) &&
        dlb__type_has(Py_TYPE(obj), st->str_dlpack)) {
      res = Py_NewRef(obj);
      goto done;
    }
    if (h->kind == DLB_KIND_NUMPY) {
      int done_lean;
      res = lean_numpy(st, tg, h, obj, copy, &done_lean);
      if (done_lean) goto done;
    }
  }
  /* A target that copies every import makes copy=True's copy itself. */
  self = (dlb_TensorObject *)import_source(
      st, obj, device, copy == 1 && tg->copies ? -1 : copy);
  if (self == NULL) goto done;
  if (check_holdable(tg, &self->t) < 0) goto done;
  if (tg->copies && copy == 0) {
    PyErr_Format(PyExc_BufferError,
                 "convert: copy=False, but %U copies every tensor it imports "
                 "on %s",
                 tg->name, dlb__device_str(self->t.device, (char[64]){0}, 64));
    goto done;
  }
  char why[256];
  if (copy_reason(tg, &self->t, self->flags, 0, why, sizeof why) != NULL) {
    if (copy == 0) {
      PyErr_Format(PyExc_BufferError,
                   "convert: copy=False, but %s: the memory cannot be shared",
                   why);
      goto done;
    }
    /* A compact, writable copy in dlbridge's (256-byte aligned) memory on
     * the same device, on the current stream. */
    DLManagedTensorVersioned *m = NULL;
    if (dlb__copy_managed(&self->t, self->flags, self->t.device, "convert",
                          &m) < 0)
      goto done;
    PyObject *fresh = dlb__tensor_from_managed(st, m); /* steals m */
    if (fresh == NULL) goto done;
    Py_SETREF(self, (dlb_TensorObject *)fresh);
  } else if (!tg->negative && has_idle_negative_stride(&self->t)) {
    dlb_TensorObject *same = restride(st, self);
    if (same == NULL) goto done;
    Py_SETREF(self, same);
  }
  res = hand_over(st, tg, self);
done:
  Py_XDECREF(self);
  Py_XDECREF(type);
  if (!borrowed) Py_DECREF(cap);
  return res;
}

PyObject *dlb__py_convert(PyObject *module, PyObject *const *args,
                          Py_ssize_t nargs, PyObject *kwnames) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  PyObject *obj = NULL, *to = NULL, *copy_obj = Py_None, *device_obj = Py_None;
  DLDevice device;
  int copy = -1;

  if (nargs == 2 && kwnames == NULL) /* convert(obj, to): the usual call */
    return dlb__convert(st, args[0], args[1], NULL, -1);
  if (nargs > 2) {
    PyErr_Format(PyExc_TypeError,
                 "convert() takes 2 positional arguments (%zd given)", nargs);
    return NULL;
  }
  if (nargs > 0) obj = args[0];
  if (nargs > 1) to = args[1];
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; i++) {
    PyObject *name = PyTuple_GET_ITEM(kwnames, i);
    PyObject *value = args[nargs + i];
    if (name == st->str_copy || PyUnicode_CompareWithASCIIString(name, "copy") == 0) {
      copy_obj = value;
    } else if (PyUnicode_CompareWithASCIIString(name, "device") == 0) {
      device_obj = value;
    } else if (to == NULL && PyUnicode_CompareWithASCIIString(name, "to") == 0) {
      to = value;
    } else {
      PyErr_Format(PyExc_TypeError,
                   "convert() got an unexpected keyword argument '%U' (it "
                   "takes obj positionally, to, copy= and device=)",
                   name);
      return NULL;
    }
  }
  if (obj == NULL || to == NULL) {
    PyErr_SetString(PyExc_TypeError,
                    "convert() missing required argument: convert(obj, to, *, "
                    "copy=None, device=None)");
    return NULL;
  }
  if (dlb__copy_converter(copy_obj, "convert", &copy) < 0) return NULL;
  if (device_obj != Py_None) {
    if (dlb__device_converter(st, device_obj, &device) < 0) return NULL;
    return dlb__convert(st, obj, to, &device, copy);
  }
  return dlb__convert(st, obj, to, NULL, copy);
}

int dlb__convert_is_target(dlb_module_state *st, PyObject *name) {
  if (st->handlers == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "dlbridge._core has been cleared");
    return -1;
  }
  PyObject *cap = NULL;
  int found = dlb__dict_get_ref(st->handlers->targets, name, &cap);
  Py_XDECREF(cap);
  if (found != 0) return found;
  PyObject *reg = registry(st);
  if (reg == NULL) return -1;
  PyObject *names = PyObject_GetAttrString(reg, "FRAMEWORKS");
  Py_DECREF(reg);
  if (names == NULL) return -1;
  int rc = PySequence_Contains(names, name);
  Py_DECREF(names);
  return rc;
}
