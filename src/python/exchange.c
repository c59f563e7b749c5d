/*
 * exchange.c -- the fast path: dlb.Tensor's DLPack C exchange table
 * (producer), and the per-type handlers and borrowed views every consumer
 * of tensors in dlbridge goes through (from_dlpack, Function, the C API).
 *
 * Producer.  dlb__tensor_exchange_api is a process-lifetime table, version
 * 1.3, prev_api NULL, all five entries set.  It is published on dlb.Tensor
 * as the class attribute __dlpack_c_exchange_api__, a PyCapsule named
 * "dlpack_exchange_api" with no destructor (the table is static).  Tensor
 * is an immutable heap type, so the attribute goes into tp_dict from C,
 * followed by PyType_Modified.  Every entry must be called with the GIL
 * held (as for every table); none leaves an exception set on success.
 *
 * Decisions written down here (known-bugs section 3):
 *  3.8 managed_tensor_to_py_object_no_sync STEALS the tensor on success AND
 *      on failure: when it returns -1 the tensor's deleter has already run.
 *      The header says only "stolen"; the alternative (ownership returns to
 *      the caller on failure) cannot be told apart by a caller from a
 *      producer that did steal, so a caller that deleted on failure would
 *      double-free with half the producers.  As a consumer we assume the
 *      same of every foreign table (the callee took it) and never delete
 *      after a failed call: at worst a non-stealing producer leaks one
 *      tensor on an error path, never frees it twice.
 *  -   The allocator makes CPU tensors only (dlbridge has no device
 *      runtime yet); any other device is a BufferError through SetError.
 *  -   current_work_stream writes NULL for every device: a dlb.Tensor has no
 *      stream of its own; its producer's stream is whatever the caller uses.
 *  -   Borrowed views through a foreign table's dltensor_from_py_object_no_sync
 *      carry flags 0: the table has no way to say read-only on that path.
 *      A framework whose tensors can be read-only must leave that entry NULL
 *      (we then take the managed path, whose flags we honour).
 *
 * Consumer: the handler cache.  A small open-addressing table (linear
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
 * by that rule.  A type that gains or loses __dlpack_c_exchange_api__
 * after it was first seen keeps its first classification (tables are
 * class-level, process-lifetime constants by the spec).
 */
#include "dlbridge_py.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(Py_ssize_t) == sizeof(int64_t),
               "dlbridge's borrowed views point DLTensor.shape at Py_ssize_t "
               "arrays: a 64-bit platform is required");

static const char EXCHANGE_CAPSULE_NAME[] = "dlpack_exchange_api";

/* The state of the module whose Tensor type the static table produces and
 * consumes (the first module created in the process; tables are process
 * wide, module states are not).  NULL once that module is cleared. */
static dlb_module_state *g_state = NULL;

/* ---- the producer: dlb.Tensor's table ----------------------------------------- */

/* o as a dlb.Tensor, or NULL with TypeError. */
static dlb_TensorObject *as_our_tensor(PyObject *o, const char *entry) {
  if (o == NULL) {
    PyErr_Format(PyExc_ValueError, "%s: py_object is NULL", entry);
    return NULL;
  }
  if (g_state != NULL && PyObject_TypeCheck(o, g_state->TensorType))
    return (dlb_TensorObject *)o;
  /* Another module instance (a sub-interpreter) has its own Tensor type. */
  dlb_module_state *st = dlb__state_from_type(Py_TYPE(o));
  if (st != NULL && dlb__is_tensor(st, o)) return (dlb_TensorObject *)o;
  PyErr_Format(PyExc_TypeError,
               "%s: expected a dlbridge.Tensor, got '%.200s' (this table "
               "belongs to dlbridge.Tensor)",
               entry, Py_TYPE(o)->tp_name);
  return NULL;
}

static int tx_allocator(DLTensor *prototype, DLManagedTensorVersioned **out,
                        void *error_ctx,
                        void (*SetError)(void *error_ctx, const char *kind,
                                         const char *message)) {
  char msg[DLB_ERROR_MESSAGE_SIZE + 96];
  dlb_error err;
  if (prototype == NULL || out == NULL) {
    SetError(error_ctx, "ValueError",
             "dlbridge managed_tensor_allocator: prototype and out must not "
             "be NULL");
    return -1;
  }
  if (prototype->device.device_type != kDLCPU) {
    const char *name = dlb_device_type_name((int32_t)prototype->device.device_type);
    PyOS_snprintf(msg, sizeof msg,
                  "dlbridge.Tensor can only be allocated on the CPU, not on "
                  "%s (device type %d): dlbridge has no device runtime yet",
                  name != NULL ? name : "an unknown device",
                  (int)prototype->device.device_type);
    SetError(error_ctx, "BufferError", msg);
    return -1;
  }
  int rc = dlb_managed_empty(prototype->ndim, prototype->shape,
                             prototype->dtype, prototype->device, false, out,
                             &err);
  if (rc != DLB_OK) {
    const char *kind = rc == DLB_ENOMEM   ? "MemoryError"
                       : rc == DLB_EINVAL || rc == DLB_EOVERFLOW ? "ValueError"
                                                                 : "BufferError";
    PyOS_snprintf(msg, sizeof msg, "dlbridge managed_tensor_allocator: %s",
                  err.message);
    SetError(error_ctx, kind, msg);
    return -1;
  }
  return 0;
}

static int tx_from_py(void *py_object, DLManagedTensorVersioned **out) {
  dlb_error err;
  dlb_TensorObject *self =
      as_our_tensor((PyObject *)py_object, "managed_tensor_from_py_object_no_sync");
  if (self == NULL) return -1;
  if (out == NULL) {
    PyErr_SetString(PyExc_ValueError,
                    "managed_tensor_from_py_object_no_sync: out is NULL");
    return -1;
  }
  if (dlb__tensor_export_managed(self, out, &err) != DLB_OK) {
    dlb__raise(&err);
    return -1;
  }
  return 0;
}

/* Run m's deleter keeping any pending exception (a deleter may run Python). */
static void delete_keep_error(DLManagedTensorVersioned *m) {
  if (m == NULL) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  dlb_managed_delete(m);
  PyErr_Restore(type, value, tb);
}

/* Check an owned tensor from outside: its major, then its DLTensor.  On
 * failure m has been deleted and BufferError is set (decision 3.8 applied to
 * our own inputs: whatever we were given is ours to free). */
static int check_owned(DLManagedTensorVersioned *m, const char *what) {
  dlb_error err;
  if (dlb_managed_check_version(m, &err) != DLB_OK) {
    delete_keep_error(m);
    PyErr_Format(PyExc_BufferError, "%s: %s", what, err.message);
    return -1;
  }
  if (dlb_tensor_validate(&m->dl_tensor, 0, &err) != DLB_OK) {
    delete_keep_error(m);
    PyErr_Format(PyExc_BufferError, "%s: the tensor cannot be used: %s", what,
                 err.message);
    return -1;
  }
  return 0;
}

static int tx_to_py(DLManagedTensorVersioned *tensor, void **out_py_object) {
  static const char what[] = "dlbridge managed_tensor_to_py_object_no_sync";
  if (tensor == NULL || out_py_object == NULL) {
    dlb_managed_delete(tensor);
    PyErr_Format(PyExc_ValueError, "%s: tensor and out must not be NULL", what);
    return -1;
  }
  if (g_state == NULL) {
    delete_keep_error(tensor);
    PyErr_Format(PyExc_RuntimeError, "%s: dlbridge._core has been unloaded",
                 what);
    return -1;
  }
  if (check_owned(tensor, what) < 0) return -1;
  PyObject *obj = dlb__tensor_from_managed(g_state, tensor); /* steals */
  if (obj == NULL) return -1;
  *out_py_object = obj;
  return 0;
}

static int tx_dltensor(void *py_object, DLTensor *out) {
  dlb_TensorObject *self =
      as_our_tensor((PyObject *)py_object, "dltensor_from_py_object_no_sync");
  if (self == NULL) return -1;
  if (out == NULL) {
    PyErr_SetString(PyExc_ValueError, "dltensor_from_py_object_no_sync: out is NULL");
    return -1;
  }
  *out = self->t; /* shape/strides point into our managed block: no copy */
  return 0;
}

static int tx_stream(DLDeviceType device_type, int32_t device_id,
                     void **out_current_stream) {
  (void)device_type;
  (void)device_id;
  if (out_current_stream == NULL) {
    PyErr_SetString(PyExc_ValueError, "current_work_stream: out is NULL");
    return -1;
  }
  *out_current_stream = NULL;
  return 0;
}

const DLPackExchangeAPI dlb__tensor_exchange_api = {
    .header = {.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION},
               .prev_api = NULL},
    .managed_tensor_allocator = tx_allocator,
    .managed_tensor_from_py_object_no_sync = tx_from_py,
    .managed_tensor_to_py_object_no_sync = tx_to_py,
    .dltensor_from_py_object_no_sync = tx_dltensor,
    .current_work_stream = tx_stream,
};

/* ---- NumPy's array struct, mirrored ------------------------------------------- *
 * The leading fields of NumPy's PyArrayObject_fields, unchanged from 1.7
 * through 2.x (NumPy keeps them stable for its own ABI: PyArray_DATA and
 * friends are macros reading them).  We read nothing past flags, so we need
 * no NumPy headers and no NumPy at build time. */
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

#define NP_ARRAY_WRITEABLE 0x0400

/* descr -> DLDataType, filled once per descr through Python attributes. */
#define DTYPE_CACHE_SIZE 32
typedef struct {
  PyObject *descr; /* strong; NULL when the slot is free */
  DLDataType dtype;
} dtype_entry;

/* ---- the handler cache ---------------------------------------------------------- */

typedef struct {
  dlb_handler h;     /* must be first: we hand out &entry->h */
  PyObject *weakref; /* to h.type; its callback removes this entry */
} handler_entry;

struct dlb_handler_cache {
  handler_entry **slots;
  size_t mask;   /* capacity - 1, capacity a power of two */
  size_t count;
  PyObject *callback; /* weakref callback; self = cache_capsule */
  PyObject *cache_capsule;
  int skip_exchange;  /* DLBRIDGE_SKIP_EXCHANGE_API */
  dtype_entry dtypes[DTYPE_CACHE_SIZE];
  PyObject *converters; /* dict framework name -> from_dlpack callable */
  PyObject *str_module; /* "__module__" */
  PyObject *str_exchange;        /* "__dlpack_c_exchange_api__" */
  PyObject *str_exchange_legacy; /* "__c_dlpack_exchange_api__" */
};

static size_t hash_type(const PyTypeObject *t) {
  uint64_t x = (uint64_t)(uintptr_t)t;
  x ^= x >> 17;
  x *= UINT64_C(0x9E3779B97F4A7C15);
  return (size_t)(x >> 29);
}

static void entry_free(handler_entry *e) {
  /* The weakref first: once it is gone its callback can no longer run. */
  Py_CLEAR(e->weakref);
  Py_CLEAR(e->h.api_owner);
  Py_CLEAR(e->h.framework);
  PyMem_Free(e);
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

/* The weakref callback: a cached type is being destroyed. */
static PyObject *on_type_dead(PyObject *capsule, PyObject *wr) {
  struct dlb_handler_cache *c = PyCapsule_GetContext(capsule);
  if (c == NULL) {
    PyErr_Clear();
    Py_RETURN_NONE; /* the cache is gone already */
  }
  for (size_t i = 0; i <= c->mask; i++) {
    handler_entry *e = c->slots[i];
    if (e != NULL && e->weakref == wr) {
      cache_remove_at(c, i);
      entry_free(e);
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
    hdr = PyCapsule_GetPointer(attr, EXCHANGE_CAPSULE_NAME);
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

/* Interned framework name from the type's __module__ root. */
static PyObject *framework_of(struct dlb_handler_cache *c, PyTypeObject *type) {
  PyObject *mod = PyObject_GetAttr((PyObject *)type, c->str_module);
  const char *s = NULL;
  if (mod != NULL && PyUnicode_Check(mod)) s = PyUnicode_AsUTF8(mod);
  if (s == NULL) {
    Py_XDECREF(mod);
    /* Out of memory must propagate: the answer is cached for the type's
     * life, and "builtins" would be a wrong one (results would come back in
     * the wrong framework).  A type with no usable __module__ is treated as
     * a builtin. */
    if (PyErr_ExceptionMatches(PyExc_MemoryError)) return NULL;
    PyErr_Clear();
    return PyUnicode_InternFromString("builtins");
  }
  size_t n = strcspn(s, ".");
  char root[64];
  if (n >= sizeof root) n = sizeof root - 1;
  memcpy(root, s, n);
  root[n] = '\0';
  Py_DECREF(mod);
  const char *name = root;
  if (strcmp(root, "jaxlib") == 0) name = "jax";
  return PyUnicode_InternFromString(name);
}

static int type_has(PyTypeObject *type, PyObject *name) {
  return _PyType_Lookup(type, name) != NULL;
}

static void classify(dlb_module_state *st, struct dlb_handler_cache *c,
                     PyTypeObject *type, dlb_handler *h) {
  if (PyType_IsSubtype(type, st->TensorType)) {
    h->kind = DLB_KIND_TENSOR;
    h->api = &dlb__tensor_exchange_api;
    return;
  }
  if (!c->skip_exchange) {
    /* On the type, through its MRO (torch.nn.Parameter inherits it). */
    PyObject *attr = _PyType_Lookup(type, c->str_exchange);
    const DLPackExchangeAPI *api = attr ? table_from_attr(attr, 0) : NULL;
    if (api == NULL) {
      attr = _PyType_Lookup(type, c->str_exchange_legacy);
      api = attr ? table_from_attr(attr, 1) : NULL;
    }
    if (api != NULL) {
      h->kind = DLB_KIND_EXCHANGE;
      h->api = api;
      h->api_owner = Py_NewRef(attr);
      return;
    }
  }
  if (strcmp(type->tp_name, "numpy.ndarray") == 0 &&
      PyUnicode_CompareWithASCIIString(h->framework, "numpy") == 0 &&
      type->tp_basicsize >= (Py_ssize_t)sizeof(np_array_head)) {
    h->kind = DLB_KIND_NUMPY;
    return;
  }
  if (type_has(type, st->str_dlpack)) {
    h->kind = DLB_KIND_DLPACK;
  } else if (type->tp_as_buffer != NULL &&
             type->tp_as_buffer->bf_getbuffer != NULL) {
    h->kind = DLB_KIND_BUFFER;
  } else if (type_has(type, st->str_array_interface)) {
    h->kind = DLB_KIND_ARRAY_INTERFACE;
  } else if (type_has(type, st->str_cuda_array_interface)) {
    h->kind = DLB_KIND_CUDA_ARRAY_INTERFACE;
  } else {
    h->kind = DLB_KIND_NONE;
  }
}

static const dlb_handler *classify_and_insert(dlb_module_state *st,
                                              struct dlb_handler_cache *c,
                                              PyTypeObject *type) {
  handler_entry *e = PyMem_Calloc(1, sizeof *e);
  if (e == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  e->h.type = type;
  e->h.framework = framework_of(c, type);
  if (e->h.framework == NULL) goto error;
  classify(st, c, type, &e->h);
  e->weakref = PyWeakref_NewRef((PyObject *)type, c->callback);
  if (e->weakref == NULL) goto error;
  if (cache_insert(c, e) < 0) goto error;
  return &e->h;
error:
  entry_free(e);
  return NULL;
}

const dlb_handler *dlb__handler_for(dlb_module_state *st, PyTypeObject *type) {
  struct dlb_handler_cache *c = st->handlers;
  if (c == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "dlbridge._core has been cleared");
    return NULL;
  }
  size_t i = hash_type(type) & c->mask;
  for (;;) {
    handler_entry *e = c->slots[i];
    if (e == NULL) break;
    if (e->h.type == type) return &e->h;
    i = (i + 1) & c->mask;
  }
  return classify_and_insert(st, c, type);
}

/* ---- views ---------------------------------------------------------------------- */

static int set_view_error(const char *what, PyObject *obj, const dlb_error *err) {
  if (err->code == DLB_ENOMEM) {
    PyErr_NoMemory();
    return -1;
  }
  PyErr_Format(PyExc_BufferError, "%s of type '%.200s' cannot be described: %s",
               what, Py_TYPE(obj)->tp_name, err->message);
  return -1;
}

/* The DLDataType of a NumPy descr, from the cache or, the first time,
 * from descr.kind / .itemsize / .byteorder. */
static int numpy_dtype(struct dlb_handler_cache *c, PyObject *descr,
                       DLDataType *out) {
  size_t slot = (size_t)(((uintptr_t)descr >> 4) % DTYPE_CACHE_SIZE);
  for (size_t n = 0; n < DTYPE_CACHE_SIZE; n++) {
    dtype_entry *d = &c->dtypes[(slot + n) % DTYPE_CACHE_SIZE];
    if (d->descr == descr) {
      *out = d->dtype;
      return 0;
    }
    if (d->descr == NULL) break;
  }
  PyObject *kind = NULL, *size = NULL, *order = NULL;
  int rc = -1;
  kind = PyObject_GetAttrString(descr, "kind");
  size = kind ? PyObject_GetAttrString(descr, "itemsize") : NULL;
  order = size ? PyObject_GetAttrString(descr, "byteorder") : NULL;
  if (order == NULL) goto done;
  const char *k = PyUnicode_Check(kind) ? PyUnicode_AsUTF8(kind) : NULL;
  const char *o = PyUnicode_Check(order) ? PyUnicode_AsUTF8(order) : NULL;
  long itemsize = PyLong_AsLong(size);
  if (k == NULL || o == NULL || (itemsize == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    PyErr_SetString(PyExc_BufferError, "unrecognised numpy dtype object");
    goto done;
  }
#if PY_LITTLE_ENDIAN
  int foreign = o[0] == '>';
#else
  int foreign = o[0] == '<';
#endif
  if (foreign) {
    PyErr_Format(PyExc_BufferError,
                 "numpy array with byte order '%s' cannot be described: "
                 "DLPack describes only native byte order (byteswap it first)",
                 o);
    goto done;
  }
  uint8_t code;
  switch (k[0]) {
    case 'b': code = kDLBool; break;
    case 'i': code = kDLInt; break;
    case 'u': code = kDLUInt; break;
    case 'f': code = kDLFloat; break;
    case 'c': code = kDLComplex; break;
    default: code = 255; break;
  }
  DLDataType dt = {code, (uint8_t)(itemsize * 8), 1};
  if (code == 255 || itemsize <= 0 || itemsize > 16 ||
      dlb_dtype_check(dt, NULL) != DLB_OK) {
    PyErr_Format(PyExc_BufferError,
                 "numpy dtype %R (kind '%s') has no DLPack dtype; supported: "
                 "bool, integers, floats and complex",
                 descr, k);
    goto done;
  }
  /* Remember it (strong ref); a full cache is emptied and refilled, which
   * is safe because nothing outside holds its entries. */
  if (c->dtypes[slot].descr != NULL) {
    size_t n;
    for (n = 0; n < DTYPE_CACHE_SIZE; n++)
      if (c->dtypes[(slot + n) % DTYPE_CACHE_SIZE].descr == NULL) break;
    if (n == DTYPE_CACHE_SIZE) {
      for (size_t i = 0; i < DTYPE_CACHE_SIZE; i++) Py_CLEAR(c->dtypes[i].descr);
      n = 0;
    }
    slot = (slot + n) % DTYPE_CACHE_SIZE;
  }
  c->dtypes[slot].descr = Py_NewRef(descr);
  c->dtypes[slot].dtype = dt;
  *out = dt;
  rc = 0;
done:
  Py_XDECREF(kind);
  Py_XDECREF(size);
  Py_XDECREF(order);
  return rc;
}

static int view_numpy(struct dlb_handler_cache *c, PyObject *obj, dlb_view *v) {
  const np_array_head *a = (const np_array_head *)obj;
  if (numpy_dtype(c, a->descr, &v->t.dtype) < 0) return -1;
  int64_t itemsize = v->t.dtype.bits / 8;
  int nd = a->nd;
  if (nd < 0 || nd > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_BufferError, "numpy array ndim %d is out of range", nd);
    return -1;
  }
  for (int i = 0; i < nd; i++) {
    int64_t s = a->strides[i];
    if (s % itemsize != 0) {
      PyErr_Format(PyExc_BufferError,
                   "numpy array stride %lld of dimension %d is not a multiple "
                   "of the itemsize %lld; DLPack strides count elements",
                   (long long)s, i, (long long)itemsize);
      return -1;
    }
    v->strides_storage[i] = s / itemsize;
  }
  v->t.data = a->data;
  v->t.device.device_type = kDLCPU;
  v->t.device.device_id = 0;
  v->t.ndim = nd;
  v->t.shape = nd > 0 ? (int64_t *)a->dimensions : NULL;
  v->t.strides = nd > 0 ? v->strides_storage : NULL;
  v->t.byte_offset = 0;
  v->flags = (a->flags & NP_ARRAY_WRITEABLE) ? 0 : DLPACK_FLAG_BITMASK_READ_ONLY;
  return 0;
}

static int view_buffer(PyObject *obj, unsigned options, dlb_view *v) {
  int flags = (options & DLB_VIEW_WRITABLE) ? PyBUF_RECORDS : PyBUF_RECORDS_RO;
  if (PyObject_GetBuffer(obj, &v->buffer, flags) < 0) return -1;
  v->has_buffer = 1;
  Py_buffer *b = &v->buffer;
  if (b->ndim < 0 || b->ndim > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_BufferError, "buffer ndim %d is out of range (at most %d)",
                 b->ndim, DLB_MAX_NDIM);
    return -1;
  }
  if (b->suboffsets != NULL) {
    for (int i = 0; i < b->ndim; i++) {
      if (b->suboffsets[i] >= 0) {
        PyErr_SetString(PyExc_BufferError,
                        "indirect (PIL-style) buffers with suboffsets cannot "
                        "be described by DLPack");
        return -1;
      }
    }
  }
  if (dlb__buffer_format_dtype(b->format, b->itemsize, &v->t.dtype) < 0)
    return -1;
  v->t.ndim = b->ndim;
  v->t.shape = NULL;
  v->t.strides = NULL;
  if (b->ndim > 0) {
    if (b->shape == NULL) {
      /* PyBUF_RECORDS always asks for the shape; a 1-d exporter that
       * ignores it is described by len. */
      if (b->ndim != 1) {
        PyErr_SetString(PyExc_BufferError, "buffer has ndim > 1 but no shape");
        return -1;
      }
      v->strides_storage[DLB_MAX_NDIM - 1] = b->len / b->itemsize;
      v->t.shape = &v->strides_storage[DLB_MAX_NDIM - 1];
    } else {
      v->t.shape = (int64_t *)b->shape;
    }
    if (b->strides != NULL) {
      for (int i = 0; i < b->ndim; i++) {
        if (b->strides[i] % b->itemsize != 0) {
          PyErr_Format(PyExc_BufferError,
                       "buffer stride %zd of dimension %d is not a multiple "
                       "of the itemsize %zd; DLPack strides count elements",
                       b->strides[i], i, b->itemsize);
          return -1;
        }
        v->strides_storage[i] = b->strides[i] / b->itemsize;
      }
    } else if (dlb_strides_row_major(b->ndim, v->t.shape, v->strides_storage,
                                     NULL) != DLB_OK) {
      PyErr_SetString(PyExc_BufferError, "buffer shape is invalid");
      return -1;
    }
    v->t.strides = v->strides_storage;
  }
  v->t.data = b->buf;
  v->t.device.device_type = kDLCPU;
  v->t.device.device_id = 0;
  v->t.byte_offset = 0;
  v->flags = b->readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
  return 0;
}

static int view_exchange(const dlb_handler *h, PyObject *obj, dlb_view *v) {
  const DLPackExchangeAPI *api = h->api;
  if (api->dltensor_from_py_object_no_sync != NULL) {
    if (api->dltensor_from_py_object_no_sync(obj, &v->t) != 0) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_BufferError,
                     "the exchange table of '%.200s' failed to describe the "
                     "object without saying why",
                     Py_TYPE(obj)->tp_name);
      return -1;
    }
    v->flags = 0; /* the borrowed entry cannot say read-only (see top) */
    return 0;
  }
  DLManagedTensorVersioned *m = NULL;
  if (api->managed_tensor_from_py_object_no_sync(obj, &m) != 0 || m == NULL) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_BufferError,
                   "the exchange table of '%.200s' failed to export the "
                   "object without saying why",
                   Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (check_owned(m, "exchange API export") < 0) return -1;
  v->owned = m;
  v->t = m->dl_tensor;
  v->flags = m->flags;
  return 0;
}

/* Fill v reading obj as kind (h's own kind, or a forced one for the
 * benchmarks). */
static int view_fill(dlb_module_state *st, PyObject *obj, unsigned options,
                     const dlb_handler *h, dlb_kind kind, dlb_view *v) {
  dlb_error err;
  int rc;
  v->handler = h;
  v->owned = NULL;
  v->has_buffer = 0;
  v->flags = 0;
  switch (kind) {
    case DLB_KIND_TENSOR: {
      /* Trusted: validated when the Tensor was made. */
      dlb_TensorObject *self = (dlb_TensorObject *)obj;
      v->t = self->t;
      v->flags = self->flags;
      goto check_writable;
    }
    case DLB_KIND_EXCHANGE:
      rc = view_exchange(h, obj, v);
      break;
    case DLB_KIND_NUMPY:
      rc = view_numpy(st->handlers, obj, v);
      break;
    case DLB_KIND_BUFFER:
      rc = view_buffer(obj, options, v);
      break;
    case DLB_KIND_DLPACK:
      rc = dlb__dunder_dlpack_managed(st, obj, NULL, -1, &v->owned);
      if (rc == 0) {
        v->t = v->owned->dl_tensor;
        v->flags = v->owned->flags;
      }
      break;
    case DLB_KIND_ARRAY_INTERFACE:
    case DLB_KIND_CUDA_ARRAY_INTERFACE:
      rc = dlb__array_interface_managed(
          st, obj, kind == DLB_KIND_CUDA_ARRAY_INTERFACE, &v->owned);
      if (rc == 0) {
        v->t = v->owned->dl_tensor;
        v->flags = v->owned->flags;
      }
      break;
    default:
      PyErr_Format(PyExc_TypeError,
                   "an object of type '%.200s' is not tensor-like: it has no "
                   "DLPack exchange table, no __dlpack__, no buffer protocol "
                   "and no __array_interface__",
                   Py_TYPE(obj)->tp_name);
      return -1;
  }
  if (rc < 0) goto error;
  /* Untrusted from here on: every path but our own Tensor and NumPy.  An
   * ndarray's extents, strides and data were checked by NumPy when it was
   * made (its sizes fit in npy_intp by construction); what NumPy allows and
   * DLPack does not -- dtype, byte order, ndim, byte strides -- view_numpy
   * checked.  Skipping the overflow walk here is a third of the cost of a
   * NumPy view. */
  if (kind != DLB_KIND_NUMPY && dlb_tensor_validate(&v->t, 0, &err) != DLB_OK) {
    set_view_error("an object", obj, &err);
    goto error;
  }
check_writable:
  if ((options & DLB_VIEW_WRITABLE) &&
      (v->flags & DLPACK_FLAG_BITMASK_READ_ONLY)) {
    PyErr_Format(PyExc_BufferError,
                 "the tensor of type '%.200s' is read-only, but this argument "
                 "must be writable (it is written to)",
                 Py_TYPE(obj)->tp_name);
    goto error;
  }
  return 0;
error:
  dlb__view_release(v);
  return -1;
}

int dlb__view_get(dlb_module_state *st, PyObject *obj, unsigned options,
                  dlb_view *view) {
  const dlb_handler *h = dlb__handler_for(st, Py_TYPE(obj));
  if (h == NULL) return -1;
  return view_fill(st, obj, options, h, h->kind, view);
}

int dlb__view_get_with(dlb_module_state *st, const dlb_handler *h,
                       PyObject *obj, unsigned options, dlb_view *view) {
  return view_fill(st, obj, options, h, h->kind, view);
}

void dlb__view_release(dlb_view *view) {
  if (view->owned == NULL && !view->has_buffer) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  if (view->owned != NULL) {
    DLManagedTensorVersioned *m = view->owned;
    view->owned = NULL;
    dlb_managed_delete(m);
  }
  if (view->has_buffer) {
    view->has_buffer = 0;
    PyBuffer_Release(&view->buffer);
  }
  PyErr_Restore(type, value, tb);
}

/* ---- streams, allocation, conversion back --------------------------------------- */

int dlb__current_stream(dlb_module_state *st, const dlb_handler *h,
                        DLDevice device, void **stream) {
  (void)st;
  *stream = NULL;
  if (device.device_type == kDLCPU || device.device_type == kDLCUDAHost ||
      device.device_type == kDLROCMHost)
    return 0;
  if (h->kind != DLB_KIND_EXCHANGE || h->api->current_work_stream == NULL)
    return 0;
  void *s = NULL;
  if (h->api->current_work_stream(device.device_type, device.device_id, &s) != 0) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_RuntimeError,
                   "the exchange table of '%.200s' could not give its current "
                   "stream",
                   h->type->tp_name);
    return -1;
  }
  *stream = s;
  return 0;
}

/* What a producer's allocator told SetError. */
typedef struct {
  int calls;
  char kind[64];
  char message[512];
} alloc_error;

static void collect_error(void *ctx, const char *kind, const char *message) {
  alloc_error *e = (alloc_error *)ctx;
  /* Copied, not kept: the producer's strings may be temporaries.  Called
   * with the GIL held (we hold it around the allocator), but it touches no
   * Python anyway. */
  if (e->calls++ > 0) return; /* the first report wins */
  PyOS_snprintf(e->kind, sizeof e->kind, "%s", kind ? kind : "RuntimeError");
  PyOS_snprintf(e->message, sizeof e->message, "%s",
                message ? message : "allocation failed");
}

/* Raise the exception a SetError call named: a builtin exception class of
 * that name, else RuntimeError. */
static void raise_named(const alloc_error *e, PyTypeObject *type) {
  PyObject *exc = PyExc_RuntimeError;
  PyObject *builtins = PyEval_GetBuiltins(); /* borrowed */
  PyObject *cls = builtins ? PyDict_GetItemString(builtins, e->kind) : NULL;
  if (cls != NULL && PyType_Check(cls) &&
      PyType_IsSubtype((PyTypeObject *)cls, (PyTypeObject *)PyExc_BaseException))
    exc = cls;
  if (exc == PyExc_RuntimeError && strcmp(e->kind, "RuntimeError") != 0)
    PyErr_Format(exc, "allocation by '%.200s' failed (%s): %s", type->tp_name,
                 e->kind, e->message);
  else
    PyErr_SetString(exc, e->message);
}

int dlb__alloc_like(dlb_module_state *st, const dlb_handler *h,
                    const DLTensor *prototype, DLManagedTensorVersioned **out) {
  (void)st;
  dlb_error err;
  if ((h->kind == DLB_KIND_EXCHANGE || h->kind == DLB_KIND_TENSOR) &&
      h->api->managed_tensor_allocator != NULL) {
    alloc_error e = {0, "", ""};
    DLManagedTensorVersioned *m = NULL;
    DLTensor proto = *prototype;
    int rc = h->api->managed_tensor_allocator(&proto, &m, &e, collect_error);
    if (rc != 0) {
      if (e.calls > 0) {
        PyErr_Clear();
        raise_named(&e, h->type);
      } else if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_RuntimeError,
                     "the allocator of '%.200s' failed without saying why",
                     h->type->tp_name);
      }
      return -1;
    }
    if (m == NULL) {
      PyErr_Format(PyExc_RuntimeError,
                   "the allocator of '%.200s' returned success but no tensor",
                   h->type->tp_name);
      return -1;
    }
    if (check_owned(m, "exchange API allocator") < 0) return -1;
    *out = m;
    return 0;
  }
  if (prototype->device.device_type != kDLCPU) {
    const char *name = dlb_device_type_name((int32_t)prototype->device.device_type);
    PyErr_Format(PyExc_BufferError,
                 "cannot allocate an output on %s for '%.200s': dlbridge "
                 "allocates only on the CPU and the type publishes no "
                 "DLPack exchange table with an allocator",
                 name ? name : "an unknown device", h->type->tp_name);
    return -1;
  }
  if (dlb_managed_empty(prototype->ndim, prototype->shape, prototype->dtype,
                        prototype->device, false, out, &err) != DLB_OK) {
    dlb__raise(&err);
    return -1;
  }
  return 0;
}

/* The callable that turns a dlb.Tensor into framework fw's type, cached. */
static PyObject *converter_for(struct dlb_handler_cache *c, PyObject *fw) {
  PyObject *conv = PyDict_GetItemWithError(c->converters, fw);
  if (conv != NULL) return conv;
  if (PyErr_Occurred()) return NULL;
  const char *mod = NULL, *attr = "from_dlpack";
  const char *name = PyUnicode_AsUTF8(fw);
  if (name == NULL) return NULL;
  if (strcmp(name, "numpy") == 0) mod = "numpy";
  else if (strcmp(name, "torch") == 0) mod = "torch";
  else if (strcmp(name, "cupy") == 0) mod = "cupy";
  else if (strcmp(name, "jax") == 0) mod = "jax.dlpack";
  else if (strcmp(name, "tensorflow") == 0) mod = "tensorflow.experimental.dlpack";
  else if (strcmp(name, "paddle") == 0) mod = "paddle.utils.dlpack";
  else return Py_None; /* unknown: results stay dlb.Tensor */
  PyObject *m = PyImport_ImportModule(mod);
  if (m == NULL) return NULL;
  conv = PyObject_GetAttrString(m, attr);
  Py_DECREF(m);
  if (conv == NULL) return NULL;
  int rc = PyDict_SetItem(c->converters, fw, conv);
  Py_DECREF(conv); /* the dict keeps it */
  return rc < 0 ? NULL : conv;
}

int dlb__to_framework(dlb_module_state *st, const dlb_handler *h,
                      DLManagedTensorVersioned *m, PyObject **out) {
  if (h->kind == DLB_KIND_EXCHANGE || h->kind == DLB_KIND_TENSOR) {
    void *obj = NULL;
    /* Steals m on success and failure (decision 3.8). */
    if (h->api->managed_tensor_to_py_object_no_sync(m, &obj) != 0 || obj == NULL) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError,
                     "the exchange table of '%.200s' could not import a "
                     "tensor without saying why",
                     h->type->tp_name);
      return -1;
    }
    *out = (PyObject *)obj;
    return 0;
  }
  PyObject *conv = converter_for(st->handlers, h->framework);
  if (conv == NULL) {
    delete_keep_error(m);
    return -1;
  }
  PyObject *t = dlb__tensor_from_managed(st, m); /* steals m */
  if (t == NULL) return -1;
  if (conv == Py_None) {
    *out = t;
    return 0;
  }
  Py_INCREF(conv); /* borrowed from the dict; the call below runs Python */
  PyObject *arg = t, *res;
  if (PyUnicode_CompareWithASCIIString(h->framework, "tensorflow") == 0) {
    /* TensorFlow takes only a legacy capsule, not an object. */
    arg = PyObject_CallMethodNoArgs(t, st->str_dlpack);
    if (arg == NULL) {
      Py_DECREF(conv);
      Py_DECREF(t);
      return -1;
    }
  }
  res = PyObject_CallOneArg(conv, arg);
  if (arg != t) Py_DECREF(arg);
  Py_DECREF(conv);
  Py_DECREF(t);
  if (res == NULL) return -1;
  *out = res;
  return 0;
}

/* ---- private hooks for tests and benchmarks ------------------------------------- */

static dlb_module_state *mod_state(PyObject *module) {
  return (dlb_module_state *)PyModule_GetState(module);
}

/* _exchange_handler(obj) -> (kind, framework, table address or None) */
static PyObject *py_handler(PyObject *module, PyObject *obj) {
  const dlb_handler *h = dlb__handler_for(mod_state(module), Py_TYPE(obj));
  if (h == NULL) return NULL;
  PyObject *api = h->api ? PyLong_FromVoidPtr((void *)h->api) : Py_NewRef(Py_None);
  if (api == NULL) return NULL;
  return Py_BuildValue("(iON)", (int)h->kind, h->framework, api);
}

static PyObject *int64_tuple(int32_t n, const int64_t *v) {
  PyObject *t = PyTuple_New(n);
  for (int32_t i = 0; t != NULL && i < n; i++) {
    PyObject *x = PyLong_FromLongLong((long long)v[i]);
    if (x == NULL) Py_CLEAR(t);
    else PyTuple_SET_ITEM(t, i, x);
  }
  return t;
}

/* args: (obj, options, forced kind or 0) */
static int parse_view_args(PyObject *const *args, Py_ssize_t nargs,
                           const char *fn, unsigned *options, int *kind) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "%s(obj, options, kind) takes 3 arguments", fn);
    return -1;
  }
  long o = PyLong_AsLong(args[1]);
  long k = PyLong_AsLong(args[2]);
  if ((o == -1 || k == -1) && PyErr_Occurred()) return -1;
  *options = (unsigned)o;
  *kind = (int)k;
  return 0;
}

static int get_view(dlb_module_state *st, PyObject *obj, unsigned options,
                    int kind, dlb_view *v) {
  const dlb_handler *h = dlb__handler_for(st, Py_TYPE(obj));
  if (h == NULL) return -1;
  dlb_kind k = kind ? (dlb_kind)kind : h->kind;
  if (k == DLB_KIND_TENSOR && h->kind != DLB_KIND_TENSOR) {
    PyErr_SetString(PyExc_TypeError, "not a dlbridge.Tensor");
    return -1;
  }
  if (k == DLB_KIND_NUMPY && h->kind != DLB_KIND_NUMPY) {
    PyErr_SetString(PyExc_TypeError, "not a numpy.ndarray");
    return -1;
  }
  if (k == DLB_KIND_EXCHANGE && h->api == NULL) {
    PyErr_SetString(PyExc_TypeError, "the type has no exchange table");
    return -1;
  }
  return view_fill(st, obj, options, h, k, v);
}

/* _exchange_view(obj, options, kind) -> dict describing the view */
static PyObject *py_view(PyObject *module, PyObject *const *args,
                         Py_ssize_t nargs) {
  unsigned options;
  int kind;
  dlb_view v;
  if (parse_view_args(args, nargs, "_exchange_view", &options, &kind) < 0)
    return NULL;
  if (get_view(mod_state(module), args[0], options, kind, &v) < 0) return NULL;
  int64_t scratch[DLB_MAX_NDIM];
  const int64_t *strides = dlb_tensor_strides(&v.t, scratch);
  PyObject *res = Py_BuildValue(
      "{s:i,s:N,s:N,s:(iii),s:K,s:n,s:K,s:(ii),s:O,s:O}", "kind",
      (int)v.handler->kind, "shape", int64_tuple(v.t.ndim, v.t.shape),
      "strides", strides ? int64_tuple(v.t.ndim, strides) : PyTuple_New(0),
      "dtype", (int)v.t.dtype.code, (int)v.t.dtype.bits, (int)v.t.dtype.lanes,
      "flags", (unsigned long long)v.flags, "data", (Py_ssize_t)(intptr_t)v.t.data,
      "byte_offset", (unsigned long long)v.t.byte_offset, "device",
      (int)v.t.device.device_type, (int)v.t.device.device_id, "owned",
      v.owned ? Py_True : Py_False, "buffer", v.has_buffer ? Py_True : Py_False);
  dlb__view_release(&v);
  return res;
}

/* _exchange_view_loop(obj, options, kind, n) -> None: n get/release cycles */
static PyObject *py_view_loop(PyObject *module, PyObject *const *args,
                              Py_ssize_t nargs) {
  unsigned options;
  int kind;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "_exchange_view_loop(obj, options, kind, n)");
    return NULL;
  }
  if (parse_view_args(args, 3, "_exchange_view_loop", &options, &kind) < 0)
    return NULL;
  Py_ssize_t n = PyLong_AsSsize_t(args[3]);
  if (n == -1 && PyErr_Occurred()) return NULL;
  dlb_module_state *st = mod_state(module);
  for (Py_ssize_t i = 0; i < n; i++) {
    dlb_view v;
    if (get_view(st, args[0], options, kind, &v) < 0) return NULL;
    dlb__view_release(&v);
  }
  Py_RETURN_NONE;
}

/* _exchange_alloc_like(obj, shape, dtype, device) -> object of obj's
 * framework made by dlb__alloc_like + dlb__to_framework */
static PyObject *py_alloc_like(PyObject *module, PyObject *const *args,
                               Py_ssize_t nargs) {
  dlb_module_state *st = mod_state(module);
  int64_t shape[DLB_MAX_NDIM];
  DLTensor proto;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "_exchange_alloc_like(obj, shape, dtype, device)");
    return NULL;
  }
  const dlb_handler *h = dlb__handler_for(st, Py_TYPE(args[0]));
  if (h == NULL) return NULL;
  memset(&proto, 0, sizeof proto);
  if (!PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) > DLB_MAX_NDIM) {
    PyErr_SetString(PyExc_TypeError, "shape must be a short tuple");
    return NULL;
  }
  proto.ndim = (int32_t)PyTuple_GET_SIZE(args[1]);
  for (int32_t i = 0; i < proto.ndim; i++) {
    shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[1], i));
    if (shape[i] == -1 && PyErr_Occurred()) return NULL;
  }
  proto.shape = shape;
  if (dlb__dtype_converter(st, args[2], &proto.dtype) < 0) return NULL;
  if (dlb__device_converter(st, args[3], &proto.device) < 0) return NULL;
  DLManagedTensorVersioned *m = NULL;
  if (dlb__alloc_like(st, h, &proto, &m) < 0) return NULL;
  PyObject *res = NULL;
  if (dlb__to_framework(st, h, m, &res) < 0) return NULL;
  return res;
}

/* _exchange_to_framework(like, tensor) -> tensor exported and re-imported
 * as like's framework (tests the stealing paths). */
static PyObject *py_to_framework(PyObject *module, PyObject *const *args,
                                 Py_ssize_t nargs) {
  dlb_module_state *st = mod_state(module);
  dlb_error err;
  if (nargs != 2 || !dlb__is_tensor(st, args[1])) {
    PyErr_SetString(PyExc_TypeError, "_exchange_to_framework(like, dlb.Tensor)");
    return NULL;
  }
  const dlb_handler *h = dlb__handler_for(st, Py_TYPE(args[0]));
  if (h == NULL) return NULL;
  DLManagedTensorVersioned *m = NULL;
  if (dlb__tensor_export_managed((dlb_TensorObject *)args[1], &m, &err) != DLB_OK)
    return dlb__raise(&err);
  PyObject *res = NULL;
  if (dlb__to_framework(st, h, m, &res) < 0) return NULL;
  return res;
}

/* _exchange_current_stream(obj, device) -> int address or None */
static PyObject *py_current_stream(PyObject *module, PyObject *const *args,
                                   Py_ssize_t nargs) {
  dlb_module_state *st = mod_state(module);
  DLDevice d;
  void *s = NULL;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "_exchange_current_stream(obj, device)");
    return NULL;
  }
  const dlb_handler *h = dlb__handler_for(st, Py_TYPE(args[0]));
  if (h == NULL) return NULL;
  if (dlb__device_converter(st, args[1], &d) < 0) return NULL;
  if (dlb__current_stream(st, h, d, &s) < 0) return NULL;
  if (s == NULL) Py_RETURN_NONE;
  return PyLong_FromVoidPtr(s);
}

static PyObject *py_cache_size(PyObject *module, PyObject *unused) {
  (void)unused;
  struct dlb_handler_cache *c = mod_state(module)->handlers;
  if (c == NULL) return PyLong_FromLong(0);
  return Py_BuildValue("(nn)", (Py_ssize_t)c->count, (Py_ssize_t)(c->mask + 1));
}

static PyMethodDef private_methods[] = {
    {"_exchange_handler", (PyCFunction)py_handler, METH_O,
     "Private (tests): (kind, framework, table address) of type(obj)."},
    {"_exchange_view", (PyCFunction)(void (*)(void))py_view, METH_FASTCALL,
     "Private (tests): a borrowed view of obj as a dict."},
    {"_exchange_view_loop", (PyCFunction)(void (*)(void))py_view_loop,
     METH_FASTCALL, "Private (benchmarks): n view get/release cycles."},
    {"_exchange_alloc_like", (PyCFunction)(void (*)(void))py_alloc_like,
     METH_FASTCALL, "Private (tests): allocate like obj, in obj's framework."},
    {"_exchange_to_framework", (PyCFunction)(void (*)(void))py_to_framework,
     METH_FASTCALL, "Private (tests): a Tensor as like's framework."},
    {"_exchange_current_stream", (PyCFunction)(void (*)(void))py_current_stream,
     METH_FASTCALL, "Private (tests): the current stream for obj's type."},
    {"_exchange_cache_size", (PyCFunction)py_cache_size, METH_NOARGS,
     "Private (tests): (entries, capacity) of the handler cache."},
    {NULL, NULL, 0, NULL},
};

/* ---- init / clear ----------------------------------------------------------------- */

int dlb__exchange_init(PyObject *module, dlb_module_state *st) {
  struct dlb_handler_cache *c = PyMem_Calloc(1, sizeof *c);
  if (c == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  st->handlers = c;
  c->mask = CACHE_MIN_CAPACITY - 1;
  c->slots = PyMem_Calloc(c->mask + 1, sizeof *c->slots);
  if (c->slots == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  const char *skip = getenv("DLBRIDGE_SKIP_EXCHANGE_API");
  c->skip_exchange = skip != NULL && skip[0] != '\0' && strcmp(skip, "0") != 0;
  c->converters = PyDict_New();
  c->str_module = PyUnicode_InternFromString("__module__");
  c->str_exchange = PyUnicode_InternFromString("__dlpack_c_exchange_api__");
  c->str_exchange_legacy = PyUnicode_InternFromString("__c_dlpack_exchange_api__");
  if (c->converters == NULL || c->str_module == NULL || c->str_exchange == NULL ||
      c->str_exchange_legacy == NULL)
    return -1;
  /* The weakref callback reaches the cache through a capsule's context,
   * not the module: no reference cycle through module state. */
  c->cache_capsule = PyCapsule_New(c, "dlbridge._handler_cache", NULL);
  if (c->cache_capsule == NULL || PyCapsule_SetContext(c->cache_capsule, c) < 0)
    return -1;
  c->callback = PyCFunction_New(&on_type_dead_def, c->cache_capsule);
  if (c->callback == NULL) return -1;

  /* Publish the table on Tensor (immutable type: through tp_dict). */
  PyObject *cap = PyCapsule_New((void *)&dlb__tensor_exchange_api,
                                EXCHANGE_CAPSULE_NAME, NULL);
  if (cap == NULL) return -1;
  int rc = PyDict_SetItem(st->TensorType->tp_dict, c->str_exchange, cap);
  Py_DECREF(cap);
  if (rc < 0) return -1;
  PyType_Modified(st->TensorType);
  if (g_state == NULL) g_state = st;
  return PyModule_AddFunctions(module, private_methods);
}

void dlb__exchange_clear(dlb_module_state *st) {
  struct dlb_handler_cache *c = st->handlers;
  if (g_state == st) g_state = NULL;
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
  for (size_t i = 0; i < DTYPE_CACHE_SIZE; i++) Py_CLEAR(c->dtypes[i].descr);
  Py_CLEAR(c->callback);
  Py_CLEAR(c->cache_capsule);
  Py_CLEAR(c->converters);
  Py_CLEAR(c->str_module);
  Py_CLEAR(c->str_exchange);
  Py_CLEAR(c->str_exchange_legacy);
  PyMem_Free(c);
}
