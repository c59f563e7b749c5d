/*
 * _dlb_testproducer -- a DLPack producer used only by dlbridge's tests.
 *
 * It is deliberately independent of libdlbridge: it includes nothing but the
 * ABI header and CPython, so a mistake in dlbridge's layout maths, validation
 * or ownership code cannot be shared by the producer that is meant to catch
 * it.  It emits well-formed tensors and every hostile corner case on demand
 * (NULL shape, huge or negative ndim, overflowing extents, future major
 * versions, NULL deleters, consumed and misnamed capsules) and counts every
 * deleter call so a test can assert "exactly once" on every path.
 *
 * Ownership model
 *   A Producer owns its data buffer.  Every export is one malloc'd block:
 *   the managed struct (sized for a future, larger major version), a strong
 *   reference to the Producer, and the shape and strides arrays.  The deleter
 *   takes the GIL, counts, poisons the block, parks it in a quarantine ring
 *   (so that a second call on the same block is detected and counted as a
 *   stray call instead of corrupting the heap) and drops the Producer
 *   reference.  An export made with deleter_null=True holds no reference and
 *   is freed with the Producer instead: the consumer must keep the Producer
 *   alive, as the DLPack header says of NULL deleters.
 *
 * All memory the deleter frees comes from malloc, never from the Python
 * allocators, so a deleter that runs during finalization can still free the
 * block; it only leaks the Producer reference then.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dlpack/dlpack.h"

/* ------------------------------------------------------------------------ */
/* Version shims.  The build uses -Werror, so deprecated calls are avoided.  */

#if PY_VERSION_HEX >= 0x030D0000
#define TP_IS_FINALIZING() Py_IsFinalizing()
#else
#define TP_IS_FINALIZING() _Py_IsFinalizing()
#endif

/* Saves and restores the error indicator around code that may run Python
 * (a DECREF that deallocates) from a context that must not lose or clobber
 * an exception in flight. */
typedef struct {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject *exc;
#else
  PyObject *type, *value, *tb;
#endif
} saved_error;

static void save_error(saved_error *s) {
#if PY_VERSION_HEX >= 0x030C0000
  s->exc = PyErr_GetRaisedException();
#else
  PyErr_Fetch(&s->type, &s->value, &s->tb);
#endif
}

static void restore_error(saved_error *s) {
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(s->exc);
#else
  PyErr_Restore(s->type, s->value, s->tb);
#endif
}

/* ------------------------------------------------------------------------ */
/* Module state and process-wide diagnostics.                               */

typedef struct {
  PyTypeObject *producer_type;
  PyTypeObject *legacy_type;
  /* Deleter calls on tensors of every Producer of this module, including
   * Producers nobody can reach any more (make_capsule). */
  long long deleter_calls;
} module_state;

/* Calls of a deleter on a block that was already deleted, and calls of the
 * deleter of the static dummy tensor behind used/misnamed capsules.  These
 * are process-wide statics, not module state, because such a call may come
 * after the Producer (and with it the way to the module) is gone.  Only
 * touched with the GIL held. */
static long long g_stray_deleter_calls;

/* Caps on what a Producer will allocate or describe for real: anything
 * larger is described faithfully but backed by a small dummy buffer. */
#define TP_MAX_ALLOC ((uint64_t)1 << 30)
#define TP_MAX_SHAPE_LEN 1024
#define TP_DUMMY_BYTES 64
#define TP_FUTURE_STRUCT_BYTES 512

/* ------------------------------------------------------------------------ */
/* The export block.                                                        */

#define BLOCK_LIVE UINT64_C(0x4c49564554454e53)  /* "LIVETENS" */
#define BLOCK_DEAD UINT64_C(0x4445414454454e53)  /* "DEADTENS" */

typedef struct export_block {
  /* First member, so the pointer handed to the consumer (and back to the
   * deleter) is the block's own address.  Sized for a future major whose
   * struct is larger: only the fields up to flags keep their offsets. */
  union {
    DLManagedTensor legacy;
    DLManagedTensorVersioned versioned;
    unsigned char future[TP_FUTURE_STRUCT_BYTES];
  } m;
  uint64_t magic;
  PyObject *producer;         /* strong; NULL for deleter_null blocks */
  void *own_data;             /* copy=True exports own their bytes */
  struct export_block *next;  /* deleter_null blocks, owned by the Producer */
  int64_t dims[];             /* shape[nshape] then strides[nshape] */
} export_block;

/* Quarantine of deleted blocks: keeping the last few allocated lets a second
 * deleter call read BLOCK_DEAD instead of freed memory.  GIL-protected. */
#define QUARANTINE_LEN 4096
static export_block *g_quarantine[QUARANTINE_LEN];
static size_t g_quarantine_next;

static void quarantine_push(export_block *b) {
  export_block *old = g_quarantine[g_quarantine_next];
  g_quarantine[g_quarantine_next] = b;
  g_quarantine_next = (g_quarantine_next + 1) % QUARANTINE_LEN;
  free(old);
}

/* ------------------------------------------------------------------------ */
/* Producer.                                                                */

enum data_mode { DATA_OWNED, DATA_NULL, DATA_ADDRESS };

typedef struct {
  PyObject_HEAD
  /* Layout as given.  nshape is the real length of shape/strides; ndim is
   * what the tensor reports (differs only for the hostile ndim override). */
  Py_ssize_t nshape;
  int64_t *shape;
  int64_t *strides;  /* NULL: export NULL strides */
  int32_t ndim;
  DLDataType dtype;
  DLDevice device;
  uint64_t byte_offset;
  enum data_mode mode;
  char *base;        /* owned allocation (DATA_OWNED), malloc'd */
  size_t alloc_size;
  int oversize;      /* layout too large: base is a small dummy */
  void *data;        /* DLTensor.data */
  int readonly, legacy_only, shape_null, deleter_null;
  DLPackVersion version;
  uint64_t flags;
  PyObject *raise_on_kwargs;  /* frozenset of str */
  PyObject *refuse;           /* exception type or NULL */
  /* Counters and logs. */
  long long deleter_calls;
  long long live_exports;
  PyObject *calls;     /* dict: "total" and each kwarg name -> count */
  PyObject *call_log;  /* list of dicts: the kwargs of each __dlpack__ call */
  export_block *orphans;
} ProducerObject;

/* Converts an int to int64, turning OverflowError into ValueError so that a
 * bad argument is always ValueError or TypeError. */
static int as_int64(PyObject *o, const char *what, int64_t *out) {
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", what,
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (overflow) {
    PyErr_Format(PyExc_ValueError, "%s out of int64 range", what);
    return -1;
  }
  *out = (int64_t)v;
  return 0;
}

static int as_ranged(PyObject *o, const char *what, int64_t lo, int64_t hi,
                     int64_t *out) {
  if (as_int64(o, what, out) < 0) return -1;
  if (*out < lo || *out > hi) {
    PyErr_Format(PyExc_ValueError, "%s must be in [%lld, %lld], got %lld",
                 what, (long long)lo, (long long)hi, (long long)*out);
    return -1;
  }
  return 0;
}

static int as_uint64(PyObject *o, const char *what, uint64_t *out) {
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", what,
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "%s out of uint64 range", what);
    }
    return -1;
  }
  *out = (uint64_t)v;
  return 0;
}

/* Parses a tuple/list of exactly n ints (n < 0: any length up to the cap)
 * into a PyMem array; *len gets the length. */
static int parse_int_seq(PyObject *o, const char *what, Py_ssize_t n,
                         int64_t **out, Py_ssize_t *len) {
  int rc = -1;
  int64_t *arr = NULL;
  if (!PyTuple_Check(o) && !PyList_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be a tuple of ints, not %.100s",
                 what, Py_TYPE(o)->tp_name);
    goto done;
  }
  Py_ssize_t m = PySequence_Size(o);
  if (m < 0) goto done;
  if (n >= 0 && m != n) {
    PyErr_Format(PyExc_ValueError, "%s must have %zd entries, got %zd", what,
                 n, m);
    goto done;
  }
  if (m > TP_MAX_SHAPE_LEN) {
    PyErr_Format(PyExc_ValueError, "%s longer than %d", what,
                 TP_MAX_SHAPE_LEN);
    goto done;
  }
  /* +1: PyMem_Malloc(0) may return NULL, which is not an error here. */
  arr = PyMem_Malloc(sizeof(int64_t) * ((size_t)m + 1));
  if (arr == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < m; i++) {
    /* The sequence may be a list mutated by a hostile __index__; take a
     * strong reference to each item. */
    PyObject *item = PySequence_GetItem(o, i);
    if (item == NULL) goto done;
    int r = as_int64(item, what, &arr[i]);
    Py_DECREF(item);
    if (r < 0) goto done;
  }
  *out = arr;
  arr = NULL;
  *len = m;
  rc = 0;
done:
  PyMem_Free(arr);
  return rc;
}

/* Parses a tuple of exactly n ints into int64 values with a range each. */
static int parse_fixed(PyObject *o, const char *what, Py_ssize_t n,
                       const int64_t *lo, const int64_t *hi, int64_t *vals) {
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != n) {
    PyErr_Format(PyExc_TypeError, "%s must be a tuple of %zd ints", what, n);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    if (as_ranged(PyTuple_GET_ITEM(o, i), what, lo[i], hi[i], &vals[i]) < 0)
      return -1;
  }
  return 0;
}

/* Bytes one element takes in our own buffer: whole bytes per element, an
 * upper bound of the packed size for sub-byte types. */
static uint64_t element_bytes(DLDataType t) {
  return ((uint64_t)t.bits * t.lanes + 7) / 8;
}

/* Works out the range of element offsets [lo, hi] the layout touches, in
 * elements relative to element 0.  Returns 0 when the tensor has no
 * elements (any extent <= 0), 1 when it has, -1 when the arithmetic would
 * overflow (the caller then backs it with a dummy). */
static int layout_extent(const ProducerObject *p, int64_t *lo, int64_t *hi) {
  int64_t l = 0, h = 0;
  for (Py_ssize_t i = 0; i < p->nshape; i++)
    if (p->shape[i] <= 0) return 0;
  for (Py_ssize_t i = 0; i < p->nshape; i++) {
    int64_t stride;
    if (p->strides != NULL) {
      stride = p->strides[i];
    } else {
      /* Row-major: product of the later extents. */
      stride = 1;
      for (Py_ssize_t j = i + 1; j < p->nshape; j++)
        if (__builtin_mul_overflow(stride, p->shape[j], &stride)) return -1;
    }
    int64_t step;
    if (__builtin_mul_overflow(p->shape[i] - 1, stride, &step)) return -1;
    if (step < 0) {
      if (__builtin_add_overflow(l, step, &l)) return -1;
    } else {
      if (__builtin_add_overflow(h, step, &h)) return -1;
    }
  }
  *lo = l;
  *hi = h;
  return 1;
}

static int64_t producer_numel(const ProducerObject *p, int *overflow) {
  int64_t n = 1;
  *overflow = 0;
  for (Py_ssize_t i = 0; i < p->nshape; i++) {
    if (p->shape[i] <= 0) return 0;
    if (__builtin_mul_overflow(n, p->shape[i], &n)) {
      *overflow = 1;
      return 0;
    }
  }
  return n;
}

/* float -> IEEE binary16, round to nearest even; finite non-negative
 * integers are all the fill ever needs, but any float is handled. */
static uint16_t float_to_half(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = ((uint32_t)exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
  return (uint16_t)(sign | half);
}

static uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Whether fill knows how to write this dtype. */
static int fill_supported(DLDataType t) {
  if (t.lanes == 0 || t.bits == 0 || t.bits % 8 != 0) return 0;
  switch (t.code) {
    case kDLInt: case kDLUInt: case kDLOpaqueHandle:
      return t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64;
    case kDLFloat:
      return t.bits == 16 || t.bits == 32 || t.bits == 64;
    case kDLBfloat:
      return t.bits == 16;
    case kDLComplex:
      return t.bits == 64 || t.bits == 128;
    case kDLBool:
      return t.bits == 8;
    default:
      /* fp8 codes: the raw byte k & 0xff. */
      return t.code >= kDLFloat8_e3m4 && t.code <= kDLFloat8_e8m0fnu &&
             t.bits == 8;
  }
}

/* Writes the value k (in the dtype's own encoding) into one lane. */
static void store_lane(char *dst, DLDataType t, int64_t k) {
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 16) {
        uint16_t h = float_to_half((float)k);
        memcpy(dst, &h, 2);
      } else if (t.bits == 32) {
        float f = (float)k;
        memcpy(dst, &f, 4);
      } else {
        double d = (double)k;
        memcpy(dst, &d, 8);
      }
      return;
    case kDLBfloat: {
      uint16_t h = float_to_bf16((float)k);
      memcpy(dst, &h, 2);
      return;
    }
    case kDLComplex:
      if (t.bits == 64) {
        float f[2] = {(float)k, 0.0f};
        memcpy(dst, f, sizeof f);
      } else {
        double d[2] = {(double)k, 0.0};
        memcpy(dst, d, sizeof d);
      }
      return;
    case kDLBool:
      *dst = (char)(k & 1);
      return;
    default: {
      /* Integers (two's complement truncation) and raw bytes, in native
       * order: copy the low-order bytes of a uint64. */
      uint64_t v = (uint64_t)k;
      switch (t.bits) {
        case 8: { uint8_t x = (uint8_t)v; memcpy(dst, &x, 1); break; }
        case 16: { uint16_t x = (uint16_t)v; memcpy(dst, &x, 2); break; }
        case 32: { uint32_t x = (uint32_t)v; memcpy(dst, &x, 4); break; }
        default: memcpy(dst, &v, 8); break;
      }
      return;
    }
  }
}

/* Writes element k (row-major logical index) at its strided location for
 * every element.  Caller checked fill_supported and that the layout is
 * backed by real memory. */
static void fill_elements(ProducerObject *p, int64_t numel) {
  uint64_t esz = element_bytes(p->dtype);
  uint64_t lane = p->dtype.bits / 8u;
  char *elem0 = (char *)p->data + p->byte_offset;
  int64_t idx[TP_MAX_SHAPE_LEN];
  for (Py_ssize_t i = 0; i < p->nshape; i++) idx[i] = 0;
  for (int64_t k = 0; k < numel; k++) {
    int64_t off = 0;
    int64_t rowstride = 1;
    for (Py_ssize_t i = p->nshape - 1; i >= 0; i--) {
      int64_t s = p->strides ? p->strides[i] : rowstride;
      off += idx[i] * s;
      rowstride *= p->shape[i];
    }
    char *dst = elem0 + off * (int64_t)esz;
    for (uint16_t l = 0; l < p->dtype.lanes; l++)
      store_lane(dst + l * lane, p->dtype, k);
    for (Py_ssize_t i = p->nshape - 1; i >= 0; i--) {
      if (++idx[i] < p->shape[i]) break;
      idx[i] = 0;
    }
  }
}

/* Allocates the owned buffer so that every element the layout touches, the
 * data pointer and element 0 all lie inside it:
 *   base .. data = base + (-lo)*esz .. element0 = data + byte_offset
 *   .. element0 + hi*esz + esz.
 * Elements at negative offsets sit below element 0 (and possibly below
 * data), as numpy's reversed views do. */
static int producer_allocate(ProducerObject *p, int want_fill) {
  int64_t lo = 0, hi = 0;
  int has = layout_extent(p, &lo, &hi);
  uint64_t esz = element_bytes(p->dtype);
  uint64_t below = 0, above = 0, total = 0;
  int fits = has >= 0;
  if (fits && has == 1) {
    fits = !__builtin_mul_overflow((uint64_t)(-lo), esz, &below) &&
           !__builtin_mul_overflow((uint64_t)hi + 1, esz, &above);
  }
  if (fits) {
    fits = !__builtin_add_overflow(below, p->byte_offset, &total) &&
           !__builtin_add_overflow(total, above, &total) &&
           total <= TP_MAX_ALLOC;
  }
  if (!fits) {
    /* Hostile layouts (overflowing extents, enormous offsets) are described
     * as given but backed by a dummy; a consumer must reject them before
     * touching memory. */
    if (want_fill) {
      PyErr_SetString(PyExc_ValueError,
                      "fill needs a layout that fits in memory");
      return -1;
    }
    p->oversize = 1;
    below = 0;
    total = TP_DUMMY_BYTES;
  }
  if (total == 0) total = 1;  /* zero-size: still a real, non-NULL pointer */
  p->base = calloc(1, (size_t)total);
  if (p->base == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  p->alloc_size = (size_t)total;
  p->data = p->base + below;
  return 0;
}

static PyObject *exception_type_named(PyObject *name) {
  PyObject *builtins = PyEval_GetBuiltins();  /* borrowed */
  PyObject *t = builtins ? PyDict_GetItemWithError(builtins, name) : NULL;
  if (t == NULL) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_ValueError, "refuse: no builtin named %R", name);
    return NULL;
  }
  if (!PyType_Check(t) ||
      !PyType_IsSubtype((PyTypeObject *)t, (PyTypeObject *)PyExc_Exception)) {
    PyErr_Format(PyExc_ValueError, "refuse: %R is not an exception type",
                 name);
    return NULL;
  }
  return Py_NewRef(t);
}

static PyObject *Producer_new(PyTypeObject *type, PyObject *args,
                              PyObject *kwargs) {
  static char *kwlist[] = {"shape", "strides", "dtype", "device",
                           "byte_offset", "data", "fill", "readonly",
                           "version", "flags", "legacy_only",
                           "raise_on_kwargs", "refuse", "shape_null", "ndim",
                           "deleter_null", NULL};
  PyObject *shape = NULL, *strides = Py_None, *dtype = NULL, *device = NULL;
  PyObject *byte_offset = NULL, *data = Py_None, *version = NULL;
  PyObject *flags = NULL, *raise_on = NULL, *refuse = Py_None;
  PyObject *ndim = Py_None;
  int fill = 0, readonly = 0, legacy_only = 0, shape_null = 0;
  int deleter_null = 0;
  ProducerObject *p = NULL;
  PyObject *result = NULL;

  if (!PyArg_ParseTupleAndKeywords(
          args, kwargs, "|$OOOOOOppOOpOOpOp:Producer", kwlist, &shape,
          &strides, &dtype, &device, &byte_offset, &data, &fill, &readonly,
          &version, &flags, &legacy_only, &raise_on, &refuse, &shape_null,
          &ndim, &deleter_null))
    goto done;

  p = (ProducerObject *)type->tp_alloc(type, 0);
  if (p == NULL) goto done;
  p->readonly = readonly;
  p->legacy_only = legacy_only;
  p->shape_null = shape_null;
  p->deleter_null = deleter_null;

  /* shape (default: a 0-d tensor) */
  if (shape == NULL) {
    p->shape = PyMem_Malloc(sizeof(int64_t));
    if (p->shape == NULL) {
      PyErr_NoMemory();
      goto done;
    }
    p->nshape = 0;
  } else if (parse_int_seq(shape, "shape", -1, &p->shape, &p->nshape) < 0) {
    goto done;
  }
  p->ndim = (int32_t)p->nshape;

  if (strides != Py_None) {
    Py_ssize_t n;
    if (parse_int_seq(strides, "strides", p->nshape, &p->strides, &n) < 0)
      goto done;
  }

  /* dtype (default float32) */
  p->dtype.code = kDLFloat;
  p->dtype.bits = 32;
  p->dtype.lanes = 1;
  if (dtype != NULL) {
    const int64_t lo[3] = {0, 0, 0}, hi[3] = {255, 255, 65535};
    int64_t v[3];
    if (parse_fixed(dtype, "dtype (code, bits, lanes)", 3, lo, hi, v) < 0)
      goto done;
    p->dtype.code = (uint8_t)v[0];
    p->dtype.bits = (uint8_t)v[1];
    p->dtype.lanes = (uint16_t)v[2];
  }

  p->device.device_type = kDLCPU;
  p->device.device_id = 0;
  if (device != NULL) {
    const int64_t lo[2] = {INT32_MIN, INT32_MIN}, hi[2] = {INT32_MAX,
                                                           INT32_MAX};
    int64_t v[2];
    if (parse_fixed(device, "device (type, id)", 2, lo, hi, v) < 0) goto done;
    p->device.device_type = (DLDeviceType)v[0];
    p->device.device_id = (int32_t)v[1];
  }

  if (byte_offset != NULL &&
      as_uint64(byte_offset, "byte_offset", &p->byte_offset) < 0)
    goto done;

  p->version.major = 1;
  p->version.minor = 3;
  if (version != NULL) {
    const int64_t lo[2] = {0, 0}, hi[2] = {UINT32_MAX, UINT32_MAX};
    int64_t v[2];
    if (parse_fixed(version, "version (major, minor)", 2, lo, hi, v) < 0)
      goto done;
    p->version.major = (uint32_t)v[0];
    p->version.minor = (uint32_t)v[1];
  }
  if (flags != NULL && as_uint64(flags, "flags", &p->flags) < 0) goto done;

  if (ndim != Py_None) {
    int64_t v;
    if (as_ranged(ndim, "ndim", INT32_MIN, INT32_MAX, &v) < 0) goto done;
    p->ndim = (int32_t)v;
  }

  /* raise_on_kwargs: any iterable of str */
  if (raise_on == NULL || raise_on == Py_None) {
    p->raise_on_kwargs = PyFrozenSet_New(NULL);
  } else if (PyUnicode_Check(raise_on)) {
    /* A lone string would iterate over its characters: refuse it. */
    PyErr_SetString(PyExc_TypeError,
                    "raise_on_kwargs must be an iterable of names, not str");
    goto done;
  } else {
    p->raise_on_kwargs = PyFrozenSet_New(raise_on);
  }
  if (p->raise_on_kwargs == NULL) goto done;
  {
    PyObject *it = PyObject_GetIter(p->raise_on_kwargs), *name;
    if (it == NULL) goto done;
    while ((name = PyIter_Next(it)) != NULL) {
      int ok = PyUnicode_Check(name);
      Py_DECREF(name);
      if (!ok) {
        Py_DECREF(it);
        PyErr_SetString(PyExc_TypeError, "raise_on_kwargs names must be str");
        goto done;
      }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) goto done;
  }

  if (refuse != Py_None) {
    if (!PyUnicode_Check(refuse)) {
      PyErr_SetString(PyExc_TypeError, "refuse must be an exception name");
      goto done;
    }
    p->refuse = exception_type_named(refuse);
    if (p->refuse == NULL) goto done;
  }

  /* data */
  if (data == Py_None) {
    p->mode = DATA_OWNED;
    if (fill && !fill_supported(p->dtype)) {
      PyErr_SetString(PyExc_ValueError, "fill does not support this dtype");
      goto done;
    }
    if (producer_allocate(p, fill) < 0) goto done;
    if (fill) {
      int overflow;
      int64_t numel = producer_numel(p, &overflow);
      /* Sentinel everywhere first, so a consumer that reads a byte the
       * layout does not name sees a value no element has. */
      memset(p->base, 0x7f, p->alloc_size);
      fill_elements(p, numel);
    }
  } else if (PyUnicode_Check(data) &&
             PyUnicode_CompareWithASCIIString(data, "null") == 0) {
    p->mode = DATA_NULL;
    p->data = NULL;
  } else if (PyLong_Check(data)) {
    uint64_t addr;
    if (as_uint64(data, "data address", &addr) < 0) goto done;
    p->mode = DATA_ADDRESS;
    p->data = (void *)(uintptr_t)addr;
  } else {
    PyErr_SetString(PyExc_TypeError,
                    "data must be None, \"null\" or an int address");
    goto done;
  }
  if (fill && p->mode != DATA_OWNED) {
    PyErr_SetString(PyExc_ValueError, "fill needs data=None");
    goto done;
  }

  p->calls = PyDict_New();
  if (p->calls == NULL) goto done;
  p->call_log = PyList_New(0);
  if (p->call_log == NULL) goto done;

  result = (PyObject *)p;
  p = NULL;
done:
  Py_XDECREF(p);
  return result;
}

static int Producer_traverse(ProducerObject *self, visitproc visit,
                             void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(self->raise_on_kwargs);
  Py_VISIT(self->refuse);
  Py_VISIT(self->calls);
  Py_VISIT(self->call_log);
  return 0;
}

static int Producer_clear(ProducerObject *self) {
  Py_CLEAR(self->raise_on_kwargs);
  Py_CLEAR(self->refuse);
  Py_CLEAR(self->calls);
  Py_CLEAR(self->call_log);
  return 0;
}

static void Producer_dealloc(ProducerObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Producer_clear(self);
  /* Exports with a NULL deleter held no reference; they die with us. */
  while (self->orphans != NULL) {
    export_block *b = self->orphans;
    self->orphans = b->next;
    free(b->own_data);
    free(b);
  }
  free(self->base);
  PyMem_Free(self->shape);
  PyMem_Free(self->strides);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

/* The one deleter behind both struct kinds. */
static void block_delete(export_block *b) {
  if (TP_IS_FINALIZING()) {
    /* Python may be half torn down and taking the GIL can hang a daemon
     * thread: free the C memory and leak the Producer reference. */
    free(b->own_data);
    free(b);
    return;
  }
  PyGILState_STATE g = PyGILState_Ensure();
  if (b->magic != BLOCK_LIVE) {
    /* Second call on a block (or a block we never made): count it. */
    g_stray_deleter_calls++;
    PyGILState_Release(g);
    return;
  }
  PyObject *producer = b->producer;
  b->producer = NULL;
  b->magic = BLOCK_DEAD;
  free(b->own_data);
  b->own_data = NULL;
  if (producer != NULL) {
    ProducerObject *p = (ProducerObject *)producer;
    module_state *st = PyType_GetModuleState(Py_TYPE(producer));
    p->deleter_calls++;
    p->live_exports--;
    if (st != NULL) st->deleter_calls++;
  }
  quarantine_push(b);
  saved_error e;
  save_error(&e);
  PyErr_Clear();
  Py_XDECREF(producer);
  restore_error(&e);
  PyGILState_Release(g);
}

static void deleter_legacy(DLManagedTensor *self) {
  block_delete((export_block *)(void *)self);
}

static void deleter_versioned(DLManagedTensorVersioned *self) {
  block_delete((export_block *)(void *)self);
}

static const char NAME_LEGACY[] = "dltensor";
static const char NAME_VERSIONED[] = "dltensor_versioned";
static const char NAME_USED_LEGACY[] = "used_dltensor";
static const char NAME_WRONG[] = "not_a_dltensor";

/* Capsule destructors: a capsule still carrying its unused name was never
 * consumed, so the producer frees it; a renamed one belongs to the consumer.
 * Neither touches an exception already in flight. */
static void capsule_destructor_legacy(PyObject *cap) {
  if (!PyCapsule_IsValid(cap, NAME_LEGACY)) return;
  saved_error e;
  save_error(&e);
  DLManagedTensor *m = PyCapsule_GetPointer(cap, NAME_LEGACY);
  if (m != NULL && m->deleter != NULL) m->deleter(m);
  PyErr_Clear();
  restore_error(&e);
}

static void capsule_destructor_versioned(PyObject *cap) {
  if (!PyCapsule_IsValid(cap, NAME_VERSIONED)) return;
  saved_error e;
  save_error(&e);
  DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, NAME_VERSIONED);
  if (m != NULL && m->deleter != NULL) m->deleter(m);
  PyErr_Clear();
  restore_error(&e);
}

/* Builds one export of p; NULL with an exception on failure. */
static export_block *make_block(ProducerObject *p, int versioned, int copy) {
  size_t n = (size_t)p->nshape;
  export_block *b = calloc(1, sizeof(export_block) + 2 * n * sizeof(int64_t));
  if (b == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  b->magic = BLOCK_LIVE;
  int64_t *shape = b->dims, *strides = b->dims + n;
  memcpy(shape, p->shape, n * sizeof(int64_t));
  if (p->strides != NULL) memcpy(strides, p->strides, n * sizeof(int64_t));

  void *data = p->data;
  if (copy) {
    b->own_data = malloc(p->alloc_size);
    if (b->own_data == NULL) {
      free(b);
      PyErr_NoMemory();
      return NULL;
    }
    memcpy(b->own_data, p->base, p->alloc_size);
    data = (char *)b->own_data + ((char *)p->data - p->base);
  }

  DLTensor *t = versioned ? &b->m.versioned.dl_tensor : &b->m.legacy.dl_tensor;
  t->data = data;
  t->device = p->device;
  t->ndim = p->ndim;
  t->dtype = p->dtype;
  t->shape = p->shape_null ? NULL : shape;
  t->strides = p->strides != NULL ? strides : NULL;
  t->byte_offset = p->byte_offset;

  if (p->deleter_null) {
    b->next = p->orphans;
    p->orphans = b;
  } else {
    b->producer = Py_NewRef((PyObject *)p);
    p->live_exports++;
  }
  if (versioned) {
    b->m.versioned.version = p->version;
    b->m.versioned.manager_ctx = p;
    b->m.versioned.deleter = p->deleter_null ? NULL : deleter_versioned;
    b->m.versioned.flags = p->flags |
                           (p->readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0) |
                           (copy ? DLPACK_FLAG_BITMASK_IS_COPIED : 0);
  } else {
    b->m.legacy.manager_ctx = p;
    b->m.legacy.deleter = p->deleter_null ? NULL : deleter_legacy;
  }
  return b;
}

static PyObject *make_capsule_of(ProducerObject *p, int versioned, int copy) {
  export_block *b = make_block(p, versioned, copy);
  if (b == NULL) return NULL;
  PyObject *cap = PyCapsule_New(
      b, versioned ? NAME_VERSIONED : NAME_LEGACY,
      versioned ? capsule_destructor_versioned : capsule_destructor_legacy);
  if (cap == NULL && !p->deleter_null) {
    /* Nobody else will ever see this block: run its deleter now (counted,
     * as every export's deleter is). */
    saved_error e;
    save_error(&e);
    if (versioned)
      b->m.versioned.deleter(&b->m.versioned);
    else
      b->m.legacy.deleter(&b->m.legacy);
    restore_error(&e);
  }
  return cap;
}

/* dict[key] += 1 */
static int bump(PyObject *dict, PyObject *key) {
  PyObject *old = PyDict_GetItemWithError(dict, key);  /* borrowed */
  if (old == NULL && PyErr_Occurred()) return -1;
  long long n = old ? PyLong_AsLongLong(old) : 0;
  if (n == -1 && PyErr_Occurred()) return -1;
  PyObject *nv = PyLong_FromLongLong(n + 1);
  if (nv == NULL) return -1;
  int r = PyDict_SetItem(dict, key, nv);
  Py_DECREF(nv);
  return r;
}

/* Records a __dlpack__ call before anything can fail, so that tests see the
 * calls that raised too (the retry logic is what they check). */
static int log_call(ProducerObject *p, PyObject *kwargs) {
  int rc = -1;
  PyObject *total = NULL, *k, *v;
  Py_ssize_t pos = 0;
  PyObject *entry = kwargs ? PyDict_Copy(kwargs) : PyDict_New();
  if (entry == NULL) goto done;
  if (PyList_Append(p->call_log, entry) < 0) goto done;
  total = PyUnicode_FromString("total");
  if (total == NULL || bump(p->calls, total) < 0) goto done;
  while (kwargs && PyDict_Next(kwargs, &pos, &k, &v))
    if (bump(p->calls, k) < 0) goto done;
  rc = 0;
done:
  Py_XDECREF(total);
  Py_XDECREF(entry);
  return rc;
}

static PyObject *Producer_dlpack(ProducerObject *self, PyObject *args,
                                 PyObject *kwargs) {
  static const char *const known[] = {"stream", "max_version", "dl_device",
                                      "copy"};
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  int versioned = 0, copy = 0;

  if (log_call(self, kwargs) < 0) return NULL;
  if (PyTuple_GET_SIZE(args) != 0) {
    PyErr_SetString(PyExc_TypeError,
                    "__dlpack__() takes no positional arguments");
    return NULL;
  }
  while (kwargs && PyDict_Next(kwargs, &pos, &k, &v)) {
    /* An old producer: any keyword at all is unexpected. */
    if (self->legacy_only) {
      PyErr_Format(PyExc_TypeError,
                   "__dlpack__() got an unexpected keyword argument %R", k);
      return NULL;
    }
    int hit = PySet_Contains(self->raise_on_kwargs, k);
    if (hit < 0) return NULL;
    if (hit) {
      PyErr_Format(PyExc_TypeError,
                   "__dlpack__() got an unexpected keyword argument %R", k);
      return NULL;
    }
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
      if (PyUnicode_Check(k) &&
          PyUnicode_CompareWithASCIIString(k, known[i]) == 0)
        ok = 1;
    if (!ok) {
      PyErr_Format(PyExc_TypeError,
                   "__dlpack__() got an unexpected keyword argument %R", k);
      return NULL;
    }
  }
  if (self->refuse != NULL) {
    PyErr_SetString(self->refuse, "test producer refuses to export");
    return NULL;
  }

  PyObject *max_version = kwargs ? PyDict_GetItemString(kwargs, "max_version")
                                 : NULL;
  if (max_version != NULL && max_version != Py_None) {
    const int64_t lo[2] = {0, 0}, hi[2] = {UINT32_MAX, UINT32_MAX};
    int64_t mv[2];
    if (parse_fixed(max_version, "max_version", 2, lo, hi, mv) < 0) {
      if (PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "max_version out of range");
      }
      return NULL;
    }
    versioned = mv[0] >= 1;
  }

  PyObject *dl_device = kwargs ? PyDict_GetItemString(kwargs, "dl_device")
                               : NULL;
  if (dl_device != NULL && dl_device != Py_None) {
    const int64_t lo[2] = {INT32_MIN, INT32_MIN}, hi[2] = {INT32_MAX,
                                                           INT32_MAX};
    int64_t dv[2];
    if (parse_fixed(dl_device, "dl_device", 2, lo, hi, dv) < 0) return NULL;
    if (dv[0] != self->device.device_type || dv[1] != self->device.device_id) {
      PyErr_SetString(PyExc_BufferError,
                      "test producer cannot export to another device");
      return NULL;
    }
  }

  PyObject *copy_o = kwargs ? PyDict_GetItemString(kwargs, "copy") : NULL;
  if (copy_o != NULL && copy_o != Py_None) {
    if (!PyBool_Check(copy_o)) {
      PyErr_SetString(PyExc_TypeError, "copy must be None or bool");
      return NULL;
    }
    copy = copy_o == Py_True;
  }
  if (copy && (self->mode != DATA_OWNED || self->oversize)) {
    PyErr_SetString(PyExc_BufferError,
                    "test producer can only copy memory it owns");
    return NULL;
  }
  if (!versioned && self->readonly) {
    /* The legacy struct cannot say read-only; well-behaved producers refuse
     * (use capsule(False) for the hostile variant). */
    PyErr_SetString(PyExc_BufferError,
                    "read-only data cannot be exported as a legacy capsule");
    return NULL;
  }
  return make_capsule_of(self, versioned, copy);
}

static PyObject *Producer_dlpack_device(ProducerObject *self,
                                        PyObject *Py_UNUSED(ignored)) {
  return Py_BuildValue("(ii)", (int)self->device.device_type,
                       (int)self->device.device_id);
}

static PyObject *Producer_capsule(ProducerObject *self, PyObject *args,
                                  PyObject *kwargs) {
  static char *kwlist[] = {"versioned", NULL};
  int versioned = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:capsule", kwlist,
                                   &versioned))
    return NULL;
  return make_capsule_of(self, versioned, 0);
}

static PyObject *Producer_legacy_capsule(ProducerObject *self,
                                         PyObject *Py_UNUSED(ignored)) {
  return make_capsule_of(self, 0, 0);
}

static PyObject *Producer_get_deleter_calls(ProducerObject *self,
                                            void *Py_UNUSED(c)) {
  return PyLong_FromLongLong(self->deleter_calls);
}

static PyObject *Producer_get_live_exports(ProducerObject *self,
                                           void *Py_UNUSED(c)) {
  return PyLong_FromLongLong(self->live_exports);
}

static PyObject *Producer_get_data_ptr(ProducerObject *self,
                                       void *Py_UNUSED(c)) {
  return PyLong_FromUnsignedLongLong(
      (unsigned long long)((uintptr_t)self->data + self->byte_offset));
}

static PyObject *Producer_get_calls(ProducerObject *self, void *Py_UNUSED(c)) {
  return PyDict_Copy(self->calls);
}

static PyObject *Producer_get_call_log(ProducerObject *self,
                                       void *Py_UNUSED(c)) {
  return PyList_GetSlice(self->call_log, 0, PyList_GET_SIZE(self->call_log));
}

static PyObject *Producer_get_nbytes_allocated(ProducerObject *self,
                                               void *Py_UNUSED(c)) {
  return PyLong_FromSize_t(self->mode == DATA_OWNED ? self->alloc_size : 0);
}

static PyMethodDef Producer_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))Producer_dlpack,
     METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, "
     "copy=None)\n--\n\nExport as a capsule; every call is logged."},
    {"__dlpack_device__", (PyCFunction)Producer_dlpack_device, METH_NOARGS,
     "Return (device_type, device_id)."},
    {"capsule", (PyCFunction)(void (*)(void))Producer_capsule,
     METH_VARARGS | METH_KEYWORDS,
     "capsule(versioned=True)\n--\n\nA raw capsule, with no negotiation and "
     "no checks (read-only legacy allowed)."},
    {"legacy_capsule", (PyCFunction)Producer_legacy_capsule, METH_NOARGS,
     "A raw \"dltensor\" capsule."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Producer_getset[] = {
    {"deleter_calls", (getter)Producer_get_deleter_calls, NULL,
     "How many times deleters of this producer's exports ran.", NULL},
    {"live_exports", (getter)Producer_get_live_exports, NULL,
     "Exports whose deleter has not run yet.", NULL},
    {"data_ptr", (getter)Producer_get_data_ptr, NULL,
     "Address of element 0 (data + byte_offset).", NULL},
    {"calls", (getter)Producer_get_calls, NULL,
     "Dict: 'total' __dlpack__ calls, and per keyword name how many calls "
     "passed it.",
     NULL},
    {"call_log", (getter)Producer_get_call_log, NULL,
     "List of the keyword dicts of each __dlpack__ call, in order.", NULL},
    {"nbytes_allocated", (getter)Producer_get_nbytes_allocated, NULL,
     "Size of the owned buffer (0 when data is not owned).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Producer_slots[] = {
    {Py_tp_doc,
     "Producer(*, shape=(), strides=None, dtype=(2, 32, 1), device=(1, 0), "
     "byte_offset=0, data=None, fill=False, readonly=False, version=(1, 3), "
     "flags=0, legacy_only=False, raise_on_kwargs=(), refuse=None, "
     "shape_null=False, ndim=None, deleter_null=False)\n\n"
     "A DLPack producer for tests."},
    {Py_tp_new, Producer_new},
    {Py_tp_dealloc, Producer_dealloc},
    {Py_tp_traverse, Producer_traverse},
    {Py_tp_clear, Producer_clear},
    {Py_tp_methods, Producer_methods},
    {Py_tp_getset, Producer_getset},
    {0, NULL},
};

static PyType_Spec Producer_spec = {
    .name = "_dlb_testproducer.Producer",
    .basicsize = sizeof(ProducerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Producer_slots,
};

/* ------------------------------------------------------------------------ */
/* Legacy: an old CuPy-style object with toDlpack() and no __dlpack__.      */

typedef struct {
  PyObject_HEAD
  PyObject *producer;
} LegacyObject;

static PyObject *Legacy_new(PyTypeObject *type, PyObject *args,
                            PyObject *kwargs) {
  PyObject *result = NULL;
  LegacyObject *self = NULL;
  module_state *st = PyType_GetModuleState(type);
  if (st == NULL) goto done;
  if (PyTuple_GET_SIZE(args) != 0) {
    PyErr_SetString(PyExc_TypeError, "Legacy takes keyword arguments only");
    goto done;
  }
  self = (LegacyObject *)type->tp_alloc(type, 0);
  if (self == NULL) goto done;
  self->producer = PyObject_Call((PyObject *)st->producer_type, args, kwargs);
  if (self->producer == NULL) goto done;
  result = (PyObject *)self;
  self = NULL;
done:
  Py_XDECREF(self);
  return result;
}

static int Legacy_traverse(LegacyObject *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(self->producer);
  return 0;
}

static int Legacy_clear(LegacyObject *self) {
  Py_CLEAR(self->producer);
  return 0;
}

static void Legacy_dealloc(LegacyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Legacy_clear(self);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

static PyObject *Legacy_toDlpack(LegacyObject *self,
                                 PyObject *Py_UNUSED(ignored)) {
  if (self->producer == NULL) {
    PyErr_SetString(PyExc_ValueError, "Legacy object was cleared");
    return NULL;
  }
  return make_capsule_of((ProducerObject *)self->producer, 0, 0);
}

static PyMethodDef Legacy_methods[] = {
    {"toDlpack", (PyCFunction)Legacy_toDlpack, METH_NOARGS,
     "Return a legacy \"dltensor\" capsule (old CuPy API)."},
    {NULL, NULL, 0, NULL},
};

static PyObject *Legacy_get_producer(LegacyObject *self, void *Py_UNUSED(c)) {
  return Py_NewRef(self->producer ? self->producer : Py_None);
}

static PyGetSetDef Legacy_getset[] = {
    {"producer", (getter)Legacy_get_producer, NULL,
     "The Producer whose tensors toDlpack exports (for its counters).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Legacy_slots[] = {
    {Py_tp_doc, "Legacy(**Producer keywords): only toDlpack()."},
    {Py_tp_new, Legacy_new},
    {Py_tp_dealloc, Legacy_dealloc},
    {Py_tp_traverse, Legacy_traverse},
    {Py_tp_clear, Legacy_clear},
    {Py_tp_methods, Legacy_methods},
    {Py_tp_getset, Legacy_getset},
    {0, NULL},
};

static PyType_Spec Legacy_spec = {
    .name = "_dlb_testproducer.Legacy",
    .basicsize = sizeof(LegacyObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Legacy_slots,
};

/* ------------------------------------------------------------------------ */
/* Module functions.                                                        */

/* The tensor behind used and misnamed capsules: static, so it outlives any
 * capsule; its deleter only counts, because nobody may call it. */
static float g_dummy_data[4] = {1.0f, 2.0f, 3.0f, 4.0f};
static int64_t g_dummy_shape[1] = {4};
static int64_t g_dummy_strides[1] = {1};

static void dummy_deleter(DLManagedTensor *self) {
  (void)self;
  PyGILState_STATE g = PyGILState_Ensure();
  g_stray_deleter_calls++;
  PyGILState_Release(g);
}

static DLManagedTensor g_dummy = {
    .dl_tensor = {.data = g_dummy_data,
                  .device = {kDLCPU, 0},
                  .ndim = 1,
                  .dtype = {kDLFloat, 32, 1},
                  .shape = g_dummy_shape,
                  .strides = g_dummy_strides,
                  .byte_offset = 0},
    .manager_ctx = NULL,
    .deleter = dummy_deleter,
};

static PyObject *mod_deleter_calls(PyObject *module,
                                   PyObject *Py_UNUSED(ignored)) {
  module_state *st = PyModule_GetState(module);
  return PyLong_FromLongLong(st->deleter_calls);
}

static PyObject *mod_stray_deleter_calls(PyObject *Py_UNUSED(module),
                                         PyObject *Py_UNUSED(ignored)) {
  return PyLong_FromLongLong(g_stray_deleter_calls);
}

static PyObject *mod_reset_counts(PyObject *module,
                                  PyObject *Py_UNUSED(ignored)) {
  module_state *st = PyModule_GetState(module);
  st->deleter_calls = 0;
  g_stray_deleter_calls = 0;
  Py_RETURN_NONE;
}

static PyObject *mod_make_capsule(PyObject *module, PyObject *args,
                                  PyObject *kwargs) {
  module_state *st = PyModule_GetState(module);
  PyObject *kw = NULL, *producer = NULL, *result = NULL;
  int versioned = 1;
  if (PyTuple_GET_SIZE(args) != 0) {
    PyErr_SetString(PyExc_TypeError, "make_capsule takes keywords only");
    goto done;
  }
  kw = kwargs ? PyDict_Copy(kwargs) : PyDict_New();
  if (kw == NULL) goto done;
  PyObject *v = PyDict_GetItemString(kw, "versioned");  /* borrowed */
  if (v != NULL) {
    versioned = PyObject_IsTrue(v);
    if (versioned < 0 || PyDict_DelItemString(kw, "versioned") < 0) goto done;
  }
  producer = PyObject_Call((PyObject *)st->producer_type, args, kw);
  if (producer == NULL) goto done;
  /* The capsule's block now holds the only reference to the producer. */
  result = make_capsule_of((ProducerObject *)producer, versioned, 0);
done:
  Py_XDECREF(kw);
  Py_XDECREF(producer);
  return result;
}

static PyObject *mod_used_capsule(PyObject *Py_UNUSED(module),
                                  PyObject *Py_UNUSED(ignored)) {
  /* No destructor: a consumed capsule is the consumer's business. */
  return PyCapsule_New(&g_dummy, NAME_USED_LEGACY, NULL);
}

static PyObject *mod_wrong_name_capsule(PyObject *Py_UNUSED(module),
                                        PyObject *Py_UNUSED(ignored)) {
  return PyCapsule_New(&g_dummy, NAME_WRONG, NULL);
}

static PyMethodDef module_methods[] = {
    {"deleter_calls", mod_deleter_calls, METH_NOARGS,
     "Deleter calls across every Producer since the last reset."},
    {"stray_deleter_calls", mod_stray_deleter_calls, METH_NOARGS,
     "Deleter calls that must never happen: a second call on one tensor, or "
     "the deleter of a used/misnamed capsule's tensor."},
    {"reset_counts", mod_reset_counts, METH_NOARGS,
     "Zero the module-wide counters."},
    {"make_capsule", (PyCFunction)(void (*)(void))mod_make_capsule,
     METH_VARARGS | METH_KEYWORDS,
     "make_capsule(*, versioned=True, **Producer keywords): a one-off "
     "capsule whose producer nobody else holds."},
    {"used_capsule", mod_used_capsule, METH_NOARGS,
     "An already consumed \"used_dltensor\" capsule."},
    {"wrong_name_capsule", mod_wrong_name_capsule, METH_NOARGS,
     "A capsule named \"not_a_dltensor\"."},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module) {
  module_state *st = PyModule_GetState(module);
  st->deleter_calls = 0;
  st->producer_type =
      (PyTypeObject *)PyType_FromModuleAndSpec(module, &Producer_spec, NULL);
  if (st->producer_type == NULL) return -1;
  if (PyModule_AddType(module, st->producer_type) < 0) return -1;
  st->legacy_type =
      (PyTypeObject *)PyType_FromModuleAndSpec(module, &Legacy_spec, NULL);
  if (st->legacy_type == NULL) return -1;
  if (PyModule_AddType(module, st->legacy_type) < 0) return -1;
  if (PyModule_AddIntConstant(module, "FLAG_READ_ONLY",
                              (long)DLPACK_FLAG_BITMASK_READ_ONLY) < 0 ||
      PyModule_AddIntConstant(module, "FLAG_IS_COPIED",
                              (long)DLPACK_FLAG_BITMASK_IS_COPIED) < 0 ||
      PyModule_AddIntConstant(
          module, "FLAG_IS_SUBBYTE_TYPE_PADDED",
          (long)DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) < 0)
    return -1;
  return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg) {
  module_state *st = PyModule_GetState(module);
  if (st == NULL) return 0;
  Py_VISIT(st->producer_type);
  Py_VISIT(st->legacy_type);
  return 0;
}

static int module_clear(PyObject *module) {
  module_state *st = PyModule_GetState(module);
  if (st == NULL) return 0;
  Py_CLEAR(st->producer_type);
  Py_CLEAR(st->legacy_type);
  return 0;
}

static void module_free(void *module) { module_clear((PyObject *)module); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef testproducer_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_dlb_testproducer",
    .m_doc = "A DLPack producer of every corner case, for dlbridge's tests.",
    .m_size = sizeof(module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__dlb_testproducer(void) {
  return PyModuleDef_Init(&testproducer_module);
}
