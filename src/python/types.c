/*
 * types.c -- the DType and Device heap types, dlb.dtype() and dlb.device().
 *
 * Both types are small immutable value objects.  They cannot be constructed
 * from Python directly (dlb.dtype() / dlb.device() are the constructors),
 * which keeps every instance canonical: a DType always has a known
 * (code, bits, lanes) and its canonical name.
 *
 * Equality rules (DESIGN.md "Public Python API"):
 *   DType  == DType with the same (code, bits, lanes), and == its canonical
 *            name string ("float32").  hash(DType) == hash(name), so a DType
 *            and its name are interchangeable as dict keys.
 *   Device == Device with the same (type, id), == a string that parses to
 *            the same device ("cuda:1"; "cpu" and "cpu:0" are both CPU 0),
 *            and == a (type, id) tuple.  A hash cannot agree with two
 *            different kinds of equal object at once, so hash(Device) ==
 *            hash((type, id)): the tuple is DLPack's own form, the one
 *            __dlpack_device__() returns.
 *
 * Framework dtypes are recognised by their type's name, never by importing
 * the framework: numpy.dtype instances (and subclasses), numpy scalar types
 * (through the already-imported numpy module's dtype()), and torch.dtype
 * (through str(), "torch.float32").
 */
#include "dlbridge_py.h"

#include <string.h>

/* ---- helpers ------------------------------------------------------------- */

/* True when type or one of its bases has tp_name exactly name.  Used to
 * recognise framework types without importing the framework. */
static int type_has_base_named(PyTypeObject *type, const char *name) {
  PyObject *mro = type->tp_mro;
  if (mro == NULL || !PyTuple_Check(mro))
    return strcmp(type->tp_name, name) == 0;
  Py_ssize_t n = PyTuple_GET_SIZE(mro);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
    if (strcmp(base->tp_name, name) == 0) return 1;
  }
  return 0;
}

/* s as UTF-8 text for a C parser, or NULL with an exception.  A name with
 * an embedded NUL is refused (ValueError): the C parsers stop at the first
 * NUL, so "float32\0junk" would otherwise be read as "float32". */
const char *dlb__text_of_name(PyObject *s, const char *what) {
  Py_ssize_t len = 0;
  const char *text = PyUnicode_AsUTF8AndSize(s, &len);
  if (text == NULL) return NULL;
  if (strlen(text) != (size_t)len) {
    PyErr_Format(PyExc_ValueError, "%s %R contains a NUL character", what, s);
    return NULL;
  }
  return text;
}

/* ---- DType ------------------------------------------------------------------ */

static void dtype_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  Py_CLEAR(((dlb_DTypeObject *)self)->name);
  tp->tp_free(self);
  Py_DECREF(tp); /* instances of heap types own a reference to the type */
}

/* A new DType for dtype (its canonical name interned), or NULL with an
 * exception. */
static PyObject *dtype_make(dlb_module_state *st, DLDataType dtype) {
  char buf[48];
  dlb_error err;
  if (dlb_dtype_name(dtype, buf, sizeof buf, &err) != DLB_OK)
    return dlb__raise(&err);
  PyTypeObject *tp = st->DTypeType;
  dlb_DTypeObject *self = (dlb_DTypeObject *)tp->tp_alloc(tp, 0);
  if (self == NULL) return NULL;
  self->dtype = dtype;
  /* Not interned: on 3.13t two threads interning the same new name at
   * once race inside CPython's intern_common (it marks the string
   * immortal after publishing it; ThreadSanitizer saw it from two
   * threads' cache misses here), and nothing compares DType names by
   * identity. */
  self->name = PyUnicode_FromString(buf);
  if (self->name == NULL) {
    Py_DECREF(self);
    return NULL;
  }
  return (PyObject *)self;
}

static size_t dtype_cache_slot(dlb_module_state *st, DLDataType dtype) {
  size_t h = (size_t)dtype.code * 131u + (size_t)dtype.bits * 7u +
             (size_t)dtype.lanes;
  return h % (sizeof st->dtype_cache / sizeof *st->dtype_cache);
}

static int same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

#ifndef Py_GIL_DISABLED
PyObject *dlb__dtype_new(dlb_module_state *st, DLDataType dtype) {
  size_t slot = dtype_cache_slot(st, dtype);
  dlb_DTypeObject *cached = (dlb_DTypeObject *)st->dtype_cache[slot];
  if (cached != NULL && same_dtype(cached->dtype, dtype))
    return Py_NewRef((PyObject *)cached);
  PyObject *self = dtype_make(st, dtype);
  /* A collision just replaces the older entry: the cache is a shortcut,
   * never the only reference anyone holds. */
  if (self != NULL) Py_XSETREF(st->dtype_cache[slot], Py_NewRef(self));
  return self;
}
#else
/* Without the GIL (dlbridge_py.h, dtype_cache): a slot, once filled, holds
 * the same immortal DType until the module goes, so a hit is a few
 * acquire loads and takes its reference without a write.  A dtype lives
 * in the first empty slot of the DTYPE_PROBES from its home; the first
 * thread to miss fills it under dtype_lock, with a DType made immortal
 * before it is published.  When those slots hold other dtypes, every call
 * gets a new DType.  The common dtypes are put in at module init
 * (dlb__types_init), so a program's first dtypes cannot crowd them out. */
#define DTYPE_PROBES 8
#define DTYPE_SLOTS (sizeof st->dtype_cache / sizeof *st->dtype_cache)

/* The cached DType of dtype (borrowed: immortal), or NULL; *free_slot is
 * the first empty slot of its run, or -1 when the run is full. */
static PyObject *dtype_probe(dlb_module_state *st, DLDataType dtype,
                             size_t home, long *free_slot) {
  *free_slot = -1;
  for (size_t k = 0; k < DTYPE_PROBES; k++) {
    size_t i = (home + k) % DTYPE_SLOTS;
    dlb_DTypeObject *d = DLB_FT_LOAD_PTR(&st->dtype_cache[i]);
    if (d == NULL) {
      *free_slot = (long)i;
      return NULL;
    }
    if (same_dtype(d->dtype, dtype)) return (PyObject *)d;
  }
  return NULL;
}

PyObject *dlb__dtype_new(dlb_module_state *st, DLDataType dtype) {
  size_t home = dtype_cache_slot(st, dtype);
  long free_slot;
  PyObject *d = dtype_probe(st, dtype, home, &free_slot);
  if (d != NULL) return Py_NewRef(d); /* immortal: nothing written */
  if (free_slot < 0) return dtype_make(st, dtype);
  PyObject *self = NULL;
  DLB_FT_MUTEX_LOCK(&st->dtype_lock);
  d = dtype_probe(st, dtype, home, &free_slot); /* another thread's, now? */
  if (d == NULL && free_slot >= 0) {
    self = dtype_make(st, dtype); /* runs no Python code */
    if (self != NULL) {
      dlb__ft_immortalize(self);
      DLB_FT_STORE_PTR(&st->dtype_cache[free_slot], self);
    }
  }
  DLB_FT_MUTEX_UNLOCK(&st->dtype_lock);
  if (d != NULL) return Py_NewRef(d);
  if (free_slot < 0) return dtype_make(st, dtype);
  return self;
}
#endif

static PyObject *dtype_get_code(PyObject *self, void *closure) {
  (void)closure;
  return PyLong_FromLong(((dlb_DTypeObject *)self)->dtype.code);
}

static PyObject *dtype_get_bits(PyObject *self, void *closure) {
  (void)closure;
  return PyLong_FromLong(((dlb_DTypeObject *)self)->dtype.bits);
}

static PyObject *dtype_get_lanes(PyObject *self, void *closure) {
  (void)closure;
  return PyLong_FromLong(((dlb_DTypeObject *)self)->dtype.lanes);
}

static PyObject *dtype_get_name(PyObject *self, void *closure) {
  (void)closure;
  return Py_NewRef(((dlb_DTypeObject *)self)->name);
}

static PyObject *dtype_get_itemsize(PyObject *self, void *closure) {
  (void)closure;
  return PyLong_FromLongLong(
      dlb_dtype_itemsize(((dlb_DTypeObject *)self)->dtype));
}

static PyGetSetDef dtype_getset[] = {
    {"code", dtype_get_code, NULL, "DLDataTypeCode value (int).", NULL},
    {"bits", dtype_get_bits, NULL, "Bits per lane.", NULL},
    {"lanes", dtype_get_lanes, NULL, "Lanes (1 except for vector types).",
     NULL},
    {"name", dtype_get_name, NULL, "Canonical name, e.g. 'float32'.", NULL},
    {"itemsize", dtype_get_itemsize, NULL,
     "Bytes per element, rounded up to whole bytes for sub-byte types.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *dtype_str(PyObject *self) {
  return Py_NewRef(((dlb_DTypeObject *)self)->name);
}

static PyObject *dtype_repr(PyObject *self) {
  return PyUnicode_FromFormat("dlbridge.dtype('%U')",
                              ((dlb_DTypeObject *)self)->name);
}

static Py_hash_t dtype_hash(PyObject *self) {
  /* Equal to hash(name) because the DType compares equal to its name. */
  return PyObject_Hash(((dlb_DTypeObject *)self)->name);
}

static PyObject *dtype_richcompare(PyObject *self, PyObject *other, int op) {
  if (op != Py_EQ && op != Py_NE) Py_RETURN_NOTIMPLEMENTED;
  dlb_DTypeObject *a = (dlb_DTypeObject *)self;
  int eq;
  if (Py_IS_TYPE(other, Py_TYPE(self))) {
    DLDataType x = a->dtype, y = ((dlb_DTypeObject *)other)->dtype;
    eq = x.code == y.code && x.bits == y.bits && x.lanes == y.lanes;
  } else if (PyUnicode_Check(other)) {
    /* Names are canonical, so string equality is dtype equality, and it
     * agrees with the hash. */
    eq = PyUnicode_Compare(a->name, other) == 0;
    if (eq == 0 && PyErr_Occurred()) return NULL;
  } else {
    Py_RETURN_NOTIMPLEMENTED;
  }
  if (op == Py_NE) eq = !eq;
  return Py_NewRef(eq ? Py_True : Py_False);
}

static PyType_Slot dtype_slots[] = {
    {Py_tp_dealloc, dtype_dealloc},
    {Py_tp_repr, dtype_repr},
    {Py_tp_str, dtype_str},
    {Py_tp_hash, dtype_hash},
    {Py_tp_richcompare, dtype_richcompare},
    {Py_tp_getset, dtype_getset},
    {Py_tp_doc,
     "A DLPack element type.  Made by dlbridge.dtype(); compares equal to its "
     "name ('float32')."},
    {0, NULL},
};

static PyType_Spec dtype_spec = {
    .name = "dlbridge.DType",
    .basicsize = sizeof(dlb_DTypeObject),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = dtype_slots,
};

/* Parse a UTF-8 name with the core, ValueError naming it on failure. */
static int dtype_from_str(PyObject *s, DLDataType *out) {
  const char *name = dlb__text_of_name(s, "dtype name");
  if (name == NULL) return -1;
  dlb_error err;
  if (dlb_dtype_from_name(name, out, &err) != DLB_OK) {
    PyErr_SetString(PyExc_ValueError, err.message);
    return -1;
  }
  return 0;
}

static int dtype_from_str_c(const char *name, DLDataType *out) {
  dlb_error err;
  if (dlb_dtype_from_name(name, out, &err) != DLB_OK) {
    PyErr_SetString(PyExc_ValueError, err.message);
    return -1;
  }
  return 0;
}

/* torch.dtype names we map.  torch's names coincide with ours for these;
 * the table keeps torch-only dtypes (quint8, bits16, float4_e2m1fn_x2, ...)
 * from being accepted by accident if the core ever learns a similar name. */
static const char *const torch_dtype_names[] = {
    "bool",          "int8",          "int16",           "int32",
    "int64",         "uint8",         "uint16",          "uint32",
    "uint64",        "float16",       "float32",         "float64",
    "bfloat16",      "complex32",     "complex64",       "complex128",
    "float8_e4m3fn", "float8_e5m2",   "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e8m0fnu",
};

static int dtype_from_torch(PyObject *obj, DLDataType *out) {
  int rc = -1;
  PyObject *s = PyObject_Str(obj); /* "torch.float32" */
  if (s == NULL) goto cleanup;
  const char *full = PyUnicode_AsUTF8(s);
  if (full == NULL) goto cleanup;
  const char *name = strncmp(full, "torch.", 6) == 0 ? full + 6 : full;
  if (strcmp(name, "chalf") == 0) name = "complex32";
  for (size_t i = 0;
       i < sizeof torch_dtype_names / sizeof torch_dtype_names[0]; i++) {
    if (strcmp(name, torch_dtype_names[i]) == 0) {
      dlb_error err;
      if (dlb_dtype_from_name(name, out, &err) != DLB_OK) {
        PyErr_SetString(PyExc_ValueError, err.message);
        goto cleanup;
      }
      rc = 0;
      goto cleanup;
    }
  }
  PyErr_Format(PyExc_ValueError,
               "torch dtype %s has no DLPack equivalent that dlbridge knows",
               full);

cleanup:
  Py_XDECREF(s);
  return rc;
}

static int dtype_from_numpy_dtype(PyObject *obj, DLDataType *out) {
  int rc = -1;
  PyObject *byteorder = NULL, *name = NULL;
  /* ">f4" is also named "float32": refuse non-native byte order rather than
   * read swapped bytes as native. */
  byteorder = PyObject_GetAttrString(obj, "byteorder");
  if (byteorder == NULL) goto cleanup;
  if (PyUnicode_Check(byteorder)) {
    const char *bo = PyUnicode_AsUTF8(byteorder);
    if (bo == NULL) goto cleanup;
#if PY_LITTLE_ENDIAN
    const char foreign = '>';
#else
    const char foreign = '<';
#endif
    if (bo[0] == foreign) {
      PyErr_Format(PyExc_ValueError,
                   "numpy dtype %R has non-native byte order; DLPack data "
                   "is always native-endian (use .newbyteorder('=') on a "
                   "byte-swapped copy)",
                   obj);
      goto cleanup;
    }
  }
  name = PyObject_GetAttrString(obj, "name");
  if (name == NULL) goto cleanup;
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "numpy dtype %R has a non-str name", obj);
    goto cleanup;
  }
  {
    const char *s = PyUnicode_AsUTF8(name);
    if (s == NULL) goto cleanup;
    dlb_error err;
    if (strcmp(s, "bool_") == 0) s = "bool"; /* NumPy 1.x spelling */
    if (dlb_dtype_from_name(s, out, &err) != DLB_OK) {
      PyErr_Format(PyExc_ValueError,
                   "numpy dtype %R has no DLPack equivalent (%s)", obj,
                   err.message);
      goto cleanup;
    }
  }
  rc = 0;

cleanup:
  Py_XDECREF(byteorder);
  Py_XDECREF(name);
  return rc;
}

/* numpy.float32 and friends: numpy is necessarily imported already (the
 * object exists), so ask its dtype() without importing anything. */
static int dtype_from_numpy_scalar_type(PyObject *obj, DLDataType *out) {
  int rc = -1;
  PyObject *np = NULL, *descr = NULL;
  {
    PyObject *modname = PyUnicode_FromString("numpy");
    if (modname == NULL) goto cleanup;
    np = PyImport_GetModule(modname); /* never imports */
    Py_DECREF(modname);
  }
  if (np == NULL) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_TypeError,
                   "cannot interpret %R as a dtype: numpy is not imported",
                   obj);
    goto cleanup;
  }
  descr = PyObject_CallMethod(np, "dtype", "O", obj);
  if (descr == NULL) goto cleanup;
  rc = dtype_from_numpy_dtype(descr, out);

cleanup:
  Py_XDECREF(np);
  Py_XDECREF(descr);
  return rc;
}

int dlb__dtype_converter(dlb_module_state *st, PyObject *obj,
                         DLDataType *out) {
  if (PyObject_TypeCheck(obj, st->DTypeType)) {
    *out = ((dlb_DTypeObject *)obj)->dtype;
    return 0;
  }
  if (PyUnicode_Check(obj)) return dtype_from_str(obj, out);
  /* Python's own number types, as NumPy reads them. */
  if (obj == (PyObject *)&PyBool_Type) return dtype_from_str_c("bool", out);
  if (obj == (PyObject *)&PyLong_Type) return dtype_from_str_c("int64", out);
  if (obj == (PyObject *)&PyFloat_Type)
    return dtype_from_str_c("float64", out);
  if (obj == (PyObject *)&PyComplex_Type)
    return dtype_from_str_c("complex128", out);
  PyTypeObject *tp = Py_TYPE(obj);
  if (strcmp(tp->tp_name, "torch.dtype") == 0)
    return dtype_from_torch(obj, out);
  if (type_has_base_named(tp, "numpy.dtype"))
    return dtype_from_numpy_dtype(obj, out);
  if (PyType_Check(obj) &&
      type_has_base_named((PyTypeObject *)obj, "numpy.generic"))
    return dtype_from_numpy_scalar_type(obj, out);
  PyErr_Format(PyExc_TypeError,
               "cannot interpret %.200s object %R as a dtype: expected a "
               "dlbridge.DType, a name such as 'float32', a NumPy or PyTorch "
               "dtype, or bool/int/float/complex",
               tp->tp_name, obj);
  return -1;
}

PyObject *dlb__py_dtype(PyObject *module, PyObject *arg) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  if (PyObject_TypeCheck(arg, st->DTypeType)) return Py_NewRef(arg);
  DLDataType dt;
  if (dlb__dtype_converter(st, arg, &dt) < 0) return NULL;
  return dlb__dtype_new(st, dt);
}

/* ---- Device ----------------------------------------------------------------- */

static void device_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyObject *dlb__device_new(dlb_module_state *st, DLDevice device) {
  PyTypeObject *tp = st->DeviceType;
  dlb_DeviceObject *self = (dlb_DeviceObject *)tp->tp_alloc(tp, 0);
  if (self == NULL) return NULL;
  self->device = device;
  return (PyObject *)self;
}

/* Device.name; a foreign type (one the header has no name for) gets the
 * generic name dlb_device_describe uses and dlb.device() parses back,
 * "device99". */
static PyObject *device_type_name_obj(DLDevice d) {
  const char *name = dlb_device_type_name((int32_t)d.device_type);
  if (name != NULL) return PyUnicode_FromString(name);
  return PyUnicode_FromFormat("device%d", (int)d.device_type);
}

static PyObject *device_get_type(PyObject *self, void *closure) {
  (void)closure;
  return PyLong_FromLong((long)((dlb_DeviceObject *)self)->device.device_type);
}

static PyObject *device_get_id(PyObject *self, void *closure) {
  (void)closure;
  return PyLong_FromLong((long)((dlb_DeviceObject *)self)->device.device_id);
}

static PyObject *device_get_name(PyObject *self, void *closure) {
  (void)closure;
  return device_type_name_obj(((dlb_DeviceObject *)self)->device);
}

static PyGetSetDef device_getset[] = {
    {"type", device_get_type, NULL, "DLDeviceType value (int).", NULL},
    {"id", device_get_id, NULL, "Device index.", NULL},
    {"name", device_get_name, NULL, "Device type name, e.g. 'cuda'.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyObject *dlb__device_text(DLDevice d) {
  char buf[DLB_DESCRIBE_MAX];
  return PyUnicode_FromString(dlb_device_describe(d, buf, sizeof buf));
}

/* The same into a caller's buffer: dlb_device_describe, the core's one
 * spelling.  Returns buf. */
const char *dlb__device_str(DLDevice d, char *buf, size_t n) {
  return dlb_device_describe(d, buf, n);
}

int dlb__same_device(DLDevice a, DLDevice b) {
  return a.device_type == b.device_type && a.device_id == b.device_id;
}

/* dlb_dtype_describe: a dtype's name, or "(code C, bits B, lanes L)". */
void dlb__dtype_str(DLDataType dt, char *buf, size_t n) {
  (void)dlb_dtype_describe(dt, buf, n);
}

static PyObject *device_str(PyObject *self) {
  return dlb__device_text(((dlb_DeviceObject *)self)->device);
}

static PyObject *device_repr(PyObject *self) {
  PyObject *s = device_str(self);
  if (s == NULL) return NULL;
  PyObject *res = PyUnicode_FromFormat("dlbridge.device('%U')", s);
  Py_DECREF(s);
  return res;
}

static Py_hash_t device_hash(PyObject *self) {
  DLDevice d = ((dlb_DeviceObject *)self)->device;
  PyObject *t = Py_BuildValue("(ii)", (int)d.device_type, (int)d.device_id);
  if (t == NULL) return -1;
  Py_hash_t h = PyObject_Hash(t);
  Py_DECREF(t);
  return h;
}

/* Read an int that must fit int32; 1 ok, 0 not an int / out of range (no
 * exception), -1 error. */
PyObject *dlb__device_type_int(PyObject *o) {
  if (PyLong_Check(o) || PyIndex_Check(o)) return PyNumber_Index(o);
  /* enum is never imported here: an Enum member exists only once it is. */
  PyObject *name = PyUnicode_FromString("enum");
  if (name == NULL) return NULL;
  PyObject *mod = PyImport_GetModule(name);
  Py_DECREF(name);
  if (mod == NULL) return NULL;
  PyObject *enum_type = PyObject_GetAttrString(mod, "Enum");
  Py_DECREF(mod);
  if (enum_type == NULL) return NULL;
  int is_enum = PyObject_IsInstance(o, enum_type);
  Py_DECREF(enum_type);
  if (is_enum <= 0) return NULL;
  PyObject *value = PyObject_GetAttrString(o, "value");
  if (value == NULL) return NULL;
  PyObject *res = PyLong_Check(value) || PyIndex_Check(value)
                      ? PyNumber_Index(value)
                      : NULL;
  Py_DECREF(value);
  return res;
}

static int as_int32(PyObject *o, int32_t *out) {
  if (!PyLong_Check(o)) return 0;
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (overflow != 0 || v < INT32_MIN || v > INT32_MAX) return 0;
  *out = (int32_t)v;
  return 1;
}

static PyObject *device_richcompare(PyObject *self, PyObject *other, int op) {
  if (op != Py_EQ && op != Py_NE) Py_RETURN_NOTIMPLEMENTED;
  DLDevice a = ((dlb_DeviceObject *)self)->device;
  int eq;
  if (Py_IS_TYPE(other, Py_TYPE(self))) {
    DLDevice b = ((dlb_DeviceObject *)other)->device;
    eq = a.device_type == b.device_type && a.device_id == b.device_id;
  } else if (PyUnicode_Check(other)) {
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(other, &len);
    if (s == NULL) {
      /* Not UTF-8 (a lone surrogate): no device has that name. */
      if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return NULL;
      PyErr_Clear();
      eq = 0;
    } else {
      DLDevice b;
      /* An unparsable string is simply not equal, and so is one with a NUL
       * in it: the parser would read only the text before the NUL
       * ("cpu\0anything" is not "cpu"), which construction refuses too. */
      eq = strlen(s) == (size_t)len &&
           dlb_device_from_name(s, &b, NULL) == DLB_OK &&
           a.device_type == b.device_type && a.device_id == b.device_id;
    }
  } else if (PyTuple_Check(other)) {
    eq = 0;
    if (PyTuple_GET_SIZE(other) == 2) {
      int32_t t, i;
      int r1 = as_int32(PyTuple_GET_ITEM(other, 0), &t);
      if (r1 < 0) return NULL;
      int r2 = r1 ? as_int32(PyTuple_GET_ITEM(other, 1), &i) : 0;
      if (r2 < 0) return NULL;
      eq = r1 && r2 && t == (int32_t)a.device_type && i == a.device_id;
    }
  } else {
    Py_RETURN_NOTIMPLEMENTED;
  }
  if (op == Py_NE) eq = !eq;
  return Py_NewRef(eq ? Py_True : Py_False);
}

static PyType_Slot device_slots[] = {
    {Py_tp_dealloc, device_dealloc},
    {Py_tp_repr, device_repr},
    {Py_tp_str, device_str},
    {Py_tp_hash, device_hash},
    {Py_tp_richcompare, device_richcompare},
    {Py_tp_getset, device_getset},
    {Py_tp_doc,
     "A DLPack device.  Made by dlbridge.device(); compares equal to "
     "'cuda:1' and to (2, 1)."},
    {0, NULL},
};

static PyType_Spec device_spec = {
    .name = "dlbridge.Device",
    .basicsize = sizeof(dlb_DeviceObject),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = device_slots,
};

int dlb__copy_converter(PyObject *obj, const char *fn, int *out) {
  if (obj == Py_True) {
    *out = 1;
  } else if (obj == Py_False) {
    *out = 0;
  } else if (obj == Py_None) {
    *out = -1;
  } else {
    PyErr_Format(PyExc_TypeError,
                 "%s(): copy must be True, False or None, not %.200s", fn,
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  return 0;
}

int dlb__device_converter(dlb_module_state *st, PyObject *obj,
                          DLDevice *out) {
  if (obj == Py_None) {
    out->device_type = kDLCPU;
    out->device_id = 0;
    return 0;
  }
  if (PyObject_TypeCheck(obj, st->DeviceType)) {
    *out = ((dlb_DeviceObject *)obj)->device;
    return 0;
  }
  if (PyUnicode_Check(obj)) {
    const char *s = dlb__text_of_name(obj, "device name");
    if (s == NULL) return -1;
    dlb_error err;
    if (dlb_device_from_name(s, out, &err) != DLB_OK) {
      PyErr_SetString(PyExc_ValueError, err.message);
      return -1;
    }
    return 0;
  }
  if (PyTuple_Check(obj)) {
    if (PyTuple_GET_SIZE(obj) != 2) {
      PyErr_Format(PyExc_ValueError,
                   "a device tuple has 2 items (device_type, device_id), "
                   "got %zd",
                   PyTuple_GET_SIZE(obj));
      return -1;
    }
    PyObject *ot = PyTuple_GET_ITEM(obj, 0), *oi = PyTuple_GET_ITEM(obj, 1);
    /* The type as __dlpack_device__() gives it (an Enum member too), so
     * dlb.device(x.__dlpack_device__()) names x's device. */
    PyObject *tv = dlb__device_type_int(ot);
    if (tv == NULL && PyErr_Occurred()) return -1;
    if (tv == NULL || !PyLong_Check(oi)) {
      Py_XDECREF(tv);
      PyErr_Format(PyExc_TypeError,
                   "a device tuple holds two ints (device_type, device_id), "
                   "got (%.100s, %.100s)",
                   Py_TYPE(ot)->tp_name, Py_TYPE(oi)->tp_name);
      return -1;
    }
    int32_t t = 0, i = 0; /* gcc 12 -O3 cannot see as_int32 set them */
    int r = as_int32(tv, &t);
    Py_DECREF(tv);
    if (r < 0) return -1;
    /* Any type >= 1: one without a name is a foreign device ("device99"),
     * as a tensor on it is. */
    if (r == 0 || !dlb_device_type_valid(t)) {
      PyErr_Format(PyExc_ValueError,
                   "device type %R in device tuple %R is not a DLPack device "
                   "type (types are ints >= 1)",
                   ot, obj);
      return -1;
    }
    r = as_int32(oi, &i);
    if (r < 0) return -1;
    if (r == 0 || i < 0) {
      PyErr_Format(PyExc_ValueError,
                   "device id %R in %R must be in [0, 2**31)", oi, obj);
      return -1;
    }
    out->device_type = (DLDeviceType)t;
    out->device_id = i;
    return 0;
  }
  PyErr_Format(PyExc_TypeError,
               "cannot interpret %.200s object as a device: expected a "
               "dlbridge.Device, a string such as 'cpu' or 'cuda:1', a "
               "(device_type, device_id) tuple, or None",
               Py_TYPE(obj)->tp_name);
  return -1;
}

PyObject *dlb__py_device(PyObject *module, PyObject *arg) {
  dlb_module_state *st = (dlb_module_state *)PyModule_GetState(module);
  if (PyObject_TypeCheck(arg, st->DeviceType)) return Py_NewRef(arg);
  DLDevice d;
  if (dlb__device_converter(st, arg, &d) < 0) return NULL;
  return dlb__device_new(st, d);
}

/* ---- registration ------------------------------------------------------------ */

int dlb__types_init(PyObject *module, dlb_module_state *st) {
  st->DTypeType =
      (PyTypeObject *)PyType_FromModuleAndSpec(module, &dtype_spec, NULL);
  if (st->DTypeType == NULL) return -1;
  dlb__ft_share_type(st->DTypeType);
  if (PyModule_AddType(module, st->DTypeType) < 0) return -1;
#ifdef Py_GIL_DISABLED
  /* The dtypes programs use most, cached first (dlb__dtype_new). */
  static const DLDataType common[] = {
      {kDLFloat, 32, 1}, {kDLFloat, 64, 1},   {kDLInt, 64, 1},
      {kDLInt, 32, 1},   {kDLFloat, 16, 1},   {kDLBfloat, 16, 1},
      {kDLUInt, 8, 1},   {kDLInt, 8, 1},      {kDLBool, 8, 1},
      {kDLInt, 16, 1},   {kDLUInt, 16, 1},    {kDLUInt, 32, 1},
      {kDLUInt, 64, 1},  {kDLComplex, 64, 1}, {kDLComplex, 128, 1}};
  for (size_t i = 0; i < sizeof common / sizeof *common; i++) {
    PyObject *d = dlb__dtype_new(st, common[i]);
    if (d == NULL) return -1;
    Py_DECREF(d);
  }
#endif
  st->DeviceType =
      (PyTypeObject *)PyType_FromModuleAndSpec(module, &device_spec, NULL);
  if (st->DeviceType == NULL) return -1;
  dlb__ft_share_type(st->DeviceType);
  if (PyModule_AddType(module, st->DeviceType) < 0) return -1;
  return 0;
}
