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

/* Checked arithmetic in plain C11 (no compiler builtins): each returns 1
 * when the exact result does not fit, leaving *out untouched. */
static int mul_i64(int64_t a, int64_t b, int64_t *out) {
  int ovf;
  if (a > 0)
    ovf = b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a;
  else
    ovf = b > 0 ? a < INT64_MIN / b : (a != 0 && b < INT64_MAX / a);
  if (!ovf) *out = a * b;
  return ovf;
}

static int add_i64(int64_t a, int64_t b, int64_t *out) {
  int ovf = (b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b);
  if (!ovf) *out = a + b;
  return ovf;
}

static int mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
  int ovf = a != 0 && b > UINT64_MAX / a;
  if (!ovf) *out = a * b;
  return ovf;
}

static int add_u64(uint64_t a, uint64_t b, uint64_t *out) {
  int ovf = b > UINT64_MAX - a;
  if (!ovf) *out = a + b;
  return ovf;
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
        if (mul_i64(stride, p->shape[j], &stride)) return -1;
    }
    int64_t step;
    if (mul_i64(p->shape[i] - 1, stride, &step)) return -1;
    if (step < 0) {
      if (add_i64(l, step, &l)) return -1;
    } else {
      if (add_i64(h, step, &h)) return -1;
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
    if (mul_i64(n, p->shape[i], &n)) {
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
    fits = !mul_u64(0u - (uint64_t)lo, esz, &below) &&
           !mul_u64((uint64_t)hi + 1, esz, &above);
  }
  if (fits) {
    fits = !add_u64(below, p->byte_offset, &total) &&
           !add_u64(total, above, &total) &&
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

/* kwargs[key], borrowed, in *v (NULL when absent or kwargs is NULL): 0, or
 * -1 with an exception.  Not PyDict_GetItemString: it cannot report a
 * failure to make the key, and 3.13 turns one into an "Exception ignored"
 * report whose traceback keeps the caller's arguments alive. */
static int kwarg(PyObject *kwargs, const char *key, PyObject **v) {
  *v = NULL;
  if (kwargs == NULL) return 0;
  PyObject *k = PyUnicode_FromString(key);
  if (k == NULL) return -1;
  *v = PyDict_GetItemWithError(kwargs, k); /* kwargs is private to the call */
  Py_DECREF(k);
  return *v == NULL && PyErr_Occurred() ? -1 : 0;
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

  PyObject *max_version, *dl_device, *copy_o;
  if (kwarg(kwargs, "max_version", &max_version) < 0 ||
      kwarg(kwargs, "dl_device", &dl_device) < 0 ||
      kwarg(kwargs, "copy", &copy_o) < 0)
    return NULL;
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
  PyObject *v;
  if (kwarg(kw, "versioned", &v) < 0) goto done;
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

/* ------------------------------------------------------------------------ */
/* The C exchange API, both ways (added for test_exchange.py).
 *
 * CountingTable is a tensor type publishing its own DLPackExchangeAPI whose
 * entries count their calls, so a test can prove dlbridge takes the fast
 * path and how often each entry runs.  Its instances are 1-d float32
 * tensors over their own buffer, or (when made by
 * managed_tensor_to_py_object_no_sync) views of an imported tensor, which
 * they own and delete once.  exchange_capsule()/exchange_address() hand out
 * variants of the table (managed-only, a major-2 table with and without a
 * major-1 prev_api, a misnamed capsule) for classification tests, and
 * consume_exchange(obj) plays a third-party consumer of any type's table. */

enum { CT_ALLOC, CT_FROM_PY, CT_TO_PY, CT_DLTENSOR, CT_STREAM, CT_DUNDER,
       CT_DELETER, CT_NCOUNTS };
static const char *const ct_count_names[CT_NCOUNTS] = {
    "alloc", "from_py", "to_py", "dltensor", "stream", "dunder", "deleter"};
static long long g_ct_counts[CT_NCOUNTS];
static char g_ct_fail_alloc_kind[64]; /* non-empty: the allocator fails */
static int g_ct_fail_to_py;           /* to_py deletes the tensor and fails */
/* Non-empty: dltensor_from_py_object_no_sync describes the tensor wrongly
 * this way (counting_corrupt), as a broken or hostile producer might. */
static char g_ct_corrupt[32];
static int64_t g_ct_bad_shape[2], g_ct_bad_strides[2];
static PyTypeObject *g_ct_type;       /* CountingTable (module lifetime) */

typedef struct {
  PyObject_HEAD
  DLTensor view;
  int readonly;
  int64_t shape1, stride1;
  float *own;                          /* malloc'd, or NULL */
  DLManagedTensorVersioned *imported;  /* owned, or NULL */
} CountingObject;

typedef struct {
  DLManagedTensorVersioned m;
  PyObject *owner; /* strong */
} ct_export;

static void ct_export_deleter(DLManagedTensorVersioned *m) {
  ct_export *e = (ct_export *)m->manager_ctx;
  g_ct_counts[CT_DELETER]++;
  if (TP_IS_FINALIZING()) {
    free(e);
    return;
  }
  PyGILState_STATE g = PyGILState_Ensure();
  saved_error s;
  save_error(&s);
  Py_XDECREF(e->owner);
  restore_error(&s);
  PyGILState_Release(g);
  free(e);
}

static int ct_export_of(CountingObject *o, DLManagedTensorVersioned **out) {
  ct_export *e = calloc(1, sizeof *e);
  if (e == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  e->m.version.major = 1;
  e->m.version.minor = 3;
  e->m.manager_ctx = e;
  e->m.deleter = ct_export_deleter;
  e->m.flags = o->readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
  e->m.dl_tensor = o->view;
  Py_INCREF(o);
  e->owner = (PyObject *)o;
  *out = &e->m;
  return 0;
}

static int ct_check(void *py_object, const char *entry) {
  PyObject *o = (PyObject *)py_object;
  if (o != NULL && g_ct_type != NULL && PyObject_TypeCheck(o, g_ct_type))
    return 0;
  PyErr_Format(PyExc_TypeError, "CountingTable %s: not a CountingTable (%.200s)",
               entry, o ? Py_TYPE(o)->tp_name : "NULL");
  return -1;
}

/* Allocations: one malloc holding the struct, shape, strides and data. */
static void ct_alloc_deleter(DLManagedTensorVersioned *m) {
  g_ct_counts[CT_DELETER]++;
  free(m);
}

static int ct_allocator(DLTensor *proto, DLManagedTensorVersioned **out,
                        void *ctx,
                        void (*SetError)(void *, const char *, const char *)) {
  g_ct_counts[CT_ALLOC]++;
  if (g_ct_fail_alloc_kind[0] != '\0') {
    SetError(ctx, g_ct_fail_alloc_kind, "CountingTable allocator told to fail");
    return -1;
  }
  if (proto->device.device_type != kDLCPU) {
    SetError(ctx, "BufferError", "CountingTable allocates on the CPU only");
    return -1;
  }
  if (proto->ndim < 0 || proto->ndim > 64) {
    SetError(ctx, "ValueError", "CountingTable: bad ndim");
    return -1;
  }
  int64_t n = 1;
  for (int i = 0; i < proto->ndim; i++) n *= proto->shape[i];
  size_t item = ((size_t)proto->dtype.bits * proto->dtype.lanes + 7) / 8;
  size_t meta = sizeof(DLManagedTensorVersioned) + 2 * sizeof(int64_t) * (size_t)proto->ndim;
  meta = (meta + 63) & ~(size_t)63;
  char *blk = calloc(1, meta + item * (size_t)n + 1);
  if (blk == NULL) {
    SetError(ctx, "MemoryError", "CountingTable: out of memory");
    return -1;
  }
  DLManagedTensorVersioned *m = (DLManagedTensorVersioned *)blk;
  int64_t *shape = (int64_t *)(blk + sizeof *m);
  int64_t *strides = shape + proto->ndim;
  int64_t run = 1;
  for (int i = proto->ndim - 1; i >= 0; i--) {
    shape[i] = proto->shape[i];
    strides[i] = run;
    run *= shape[i] > 0 ? shape[i] : 1;
  }
  m->version.major = 1;
  m->version.minor = 3;
  m->deleter = ct_alloc_deleter;
  m->dl_tensor.data = blk + meta;
  m->dl_tensor.device = proto->device;
  m->dl_tensor.ndim = proto->ndim;
  m->dl_tensor.dtype = proto->dtype;
  m->dl_tensor.shape = proto->ndim ? shape : NULL;
  m->dl_tensor.strides = proto->ndim ? strides : NULL;
  *out = m;
  return 0;
}

static int ct_from_py(void *py_object, DLManagedTensorVersioned **out) {
  g_ct_counts[CT_FROM_PY]++;
  if (ct_check(py_object, "managed_tensor_from_py_object_no_sync") < 0) return -1;
  return ct_export_of((CountingObject *)py_object, out);
}

static int ct_to_py(DLManagedTensorVersioned *m, void **out) {
  g_ct_counts[CT_TO_PY]++;
  if (g_ct_fail_to_py) {
    if (m->deleter) m->deleter(m); /* stolen on failure too */
    PyErr_SetString(PyExc_RuntimeError, "CountingTable to_py told to fail");
    return -1;
  }
  CountingObject *o = (CountingObject *)g_ct_type->tp_alloc(g_ct_type, 0);
  if (o == NULL) {
    if (m->deleter) m->deleter(m);
    return -1;
  }
  o->imported = m;
  o->view = m->dl_tensor;
  o->readonly = (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
  *out = o;
  return 0;
}

static int ct_dltensor(void *py_object, DLTensor *out) {
  g_ct_counts[CT_DLTENSOR]++;
  if (ct_check(py_object, "dltensor_from_py_object_no_sync") < 0) return -1;
  *out = ((CountingObject *)py_object)->view;
  if (g_ct_corrupt[0] == '\0') return 0;
  g_ct_bad_shape[0] = out->shape[0];
  g_ct_bad_strides[0] = out->strides[0];
  out->shape = g_ct_bad_shape;
  out->strides = g_ct_bad_strides;
  if (strcmp(g_ct_corrupt, "negative_extent") == 0) {
    g_ct_bad_shape[0] = -4;
  } else if (strcmp(g_ct_corrupt, "null_data") == 0) {
    out->data = NULL;
  } else if (strcmp(g_ct_corrupt, "span_overflow") == 0) {
    g_ct_bad_strides[0] = INT64_C(1) << 62;
  } else if (strcmp(g_ct_corrupt, "unknown_device") == 0) {
    /* 0 is no device at all (a type >= 1 without a name is a foreign
     * device, which is held). */
    out->device.device_type = (DLDeviceType)0;
  } else if (strcmp(g_ct_corrupt, "negative_device_id") == 0) {
    out->device.device_id = -1;
  } else if (strcmp(g_ct_corrupt, "huge_offset") == 0) {
    out->byte_offset = UINT64_C(1) << 63;
  } else if (strcmp(g_ct_corrupt, "null_shape") == 0) {
    out->shape = NULL;
  }
  return 0;
}

static int ct_stream(DLDeviceType type, int32_t id, void **out) {
  (void)id;
  g_ct_counts[CT_STREAM]++;
  /* A recognisable fake stream on devices that have streams. */
  *out = type == kDLCPU ? NULL : (void *)(uintptr_t)0x1234;
  return 0;
}

static const DLPackExchangeAPI ct_table = {
    {{1, 3}, NULL}, ct_allocator, ct_from_py, ct_to_py, ct_dltensor, ct_stream};
static const DLPackExchangeAPI ct_table_managed_only = {
    {{1, 3}, NULL}, ct_allocator, ct_from_py, ct_to_py, NULL, ct_stream};
/* A future major whose prev_api is the major-1 table. */
static DLPackExchangeAPI ct_table_major2 = {
    {{2, 0}, (DLPackExchangeAPIHeader *)&ct_table.header}, NULL, NULL, NULL,
    NULL, NULL};
static const DLPackExchangeAPI ct_table_major2_only = {
    {{2, 0}, NULL}, NULL, NULL, NULL, NULL, NULL};

static const DLPackExchangeAPI *ct_variant(const char *v) {
  if (strcmp(v, "counting") == 0) return &ct_table;
  if (strcmp(v, "managed_only") == 0) return &ct_table_managed_only;
  if (strcmp(v, "major2_prev1") == 0) return &ct_table_major2;
  if (strcmp(v, "major2_only") == 0) return &ct_table_major2_only;
  PyErr_Format(PyExc_ValueError, "unknown table variant '%s'", v);
  return NULL;
}

static PyObject *mod_exchange_capsule(PyObject *m, PyObject *arg) {
  (void)m;
  const char *v = PyUnicode_AsUTF8(arg);
  if (v == NULL) return NULL;
  if (strcmp(v, "wrong_name") == 0)
    return PyCapsule_New((void *)&ct_table, "not_an_exchange_api", NULL);
  const DLPackExchangeAPI *t = ct_variant(v);
  return t ? PyCapsule_New((void *)t, "dlpack_exchange_api", NULL) : NULL;
}

static PyObject *mod_exchange_address(PyObject *m, PyObject *arg) {
  (void)m;
  const char *v = PyUnicode_AsUTF8(arg);
  if (v == NULL) return NULL;
  const DLPackExchangeAPI *t = ct_variant(v);
  return t ? PyLong_FromVoidPtr((void *)t) : NULL;
}

static PyObject *mod_counting_counts(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  PyObject *d = PyDict_New();
  for (int i = 0; d != NULL && i < CT_NCOUNTS; i++) {
    PyObject *v = PyLong_FromLongLong(g_ct_counts[i]);
    if (v == NULL || PyDict_SetItemString(d, ct_count_names[i], v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  return d;
}

static PyObject *mod_counting_reset(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  memset(g_ct_counts, 0, sizeof g_ct_counts);
  g_ct_fail_alloc_kind[0] = '\0';
  g_ct_fail_to_py = 0;
  g_ct_corrupt[0] = '\0';
  Py_RETURN_NONE;
}

/* counting_corrupt(case or None): see g_ct_corrupt. */
static PyObject *mod_counting_corrupt(PyObject *m, PyObject *arg) {
  (void)m;
  const char *c = "";
  if (arg != Py_None && (c = PyUnicode_AsUTF8(arg)) == NULL) return NULL;
  PyOS_snprintf(g_ct_corrupt, sizeof g_ct_corrupt, "%s", c);
  Py_RETURN_NONE;
}

/* counting_fail(alloc_kind=None or str, to_py=False) */
static PyObject *mod_counting_fail(PyObject *m, PyObject *args) {
  (void)m;
  const char *kind = NULL;
  int to_py = 0;
  if (!PyArg_ParseTuple(args, "zp", &kind, &to_py)) return NULL;
  PyOS_snprintf(g_ct_fail_alloc_kind, sizeof g_ct_fail_alloc_kind, "%s",
                kind ? kind : "");
  g_ct_fail_to_py = to_py;
  Py_RETURN_NONE;
}

static PyObject *CountingObject_new(PyTypeObject *type, PyObject *args,
                                    PyObject *kwds) {
  static char *kwlist[] = {"n", "readonly", NULL};
  Py_ssize_t n = 4;
  int readonly = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|np", kwlist, &n, &readonly))
    return NULL;
  if (n < 0) {
    PyErr_SetString(PyExc_ValueError, "n must be >= 0");
    return NULL;
  }
  CountingObject *o = (CountingObject *)type->tp_alloc(type, 0);
  if (o == NULL) return NULL;
  o->own = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (o->own == NULL) {
    Py_DECREF(o);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; i++) o->own[i] = (float)i;
  o->shape1 = n;
  o->stride1 = 1;
  o->readonly = readonly;
  o->view.data = o->own;
  o->view.device.device_type = kDLCPU;
  o->view.device.device_id = 0;
  o->view.ndim = 1;
  o->view.dtype.code = kDLFloat;
  o->view.dtype.bits = 32;
  o->view.dtype.lanes = 1;
  o->view.shape = &o->shape1;
  o->view.strides = &o->stride1;
  o->view.byte_offset = 0;
  return (PyObject *)o;
}

static void CountingObject_dealloc(PyObject *self) {
  CountingObject *o = (CountingObject *)self;
  PyTypeObject *tp = Py_TYPE(self);
  if (o->imported != NULL && o->imported->deleter != NULL) {
    saved_error s;
    save_error(&s);
    o->imported->deleter(o->imported);
    restore_error(&s);
  }
  free(o->own);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static void ct_capsule_destructor(PyObject *cap) {
  if (!PyCapsule_IsValid(cap, NAME_VERSIONED)) return; /* consumed */
  DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, NAME_VERSIONED);
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}

/* __dlpack__(**anything): the slow path, counted. */
static PyObject *CountingObject_dlpack(PyObject *self, PyObject *args,
                                       PyObject *kwds) {
  (void)args;
  (void)kwds;
  DLManagedTensorVersioned *m = NULL;
  g_ct_counts[CT_DUNDER]++;
  if (ct_export_of((CountingObject *)self, &m) < 0) return NULL;
  PyObject *cap = PyCapsule_New(m, NAME_VERSIONED, ct_capsule_destructor);
  if (cap == NULL) m->deleter(m);
  return cap;
}

static PyObject *CountingObject_dlpack_device(PyObject *self, PyObject *unused) {
  (void)unused;
  CountingObject *o = (CountingObject *)self;
  return Py_BuildValue("(ii)", (int)o->view.device.device_type,
                       (int)o->view.device.device_id);
}

static PyObject *CountingObject_tolist(PyObject *self, PyObject *unused) {
  (void)unused;
  CountingObject *o = (CountingObject *)self;
  if (o->view.ndim != 1 || o->view.dtype.code != kDLFloat || o->view.dtype.bits != 32) {
    PyErr_SetString(PyExc_TypeError, "tolist: only 1-d float32");
    return NULL;
  }
  PyObject *l = PyList_New(o->view.shape[0]);
  for (int64_t i = 0; l != NULL && i < o->view.shape[0]; i++) {
    float *p = (float *)((char *)o->view.data + o->view.byte_offset) +
               i * (o->view.strides ? o->view.strides[0] : 1);
    PyObject *x = PyFloat_FromDouble(*p);
    if (x == NULL) Py_CLEAR(l);
    else PyList_SET_ITEM(l, i, x);
  }
  return l;
}

static PyObject *CountingObject_info(PyObject *self, void *c) {
  (void)c;
  CountingObject *o = (CountingObject *)self;
  PyObject *shape = PyTuple_New(o->view.ndim);
  for (int i = 0; shape != NULL && i < o->view.ndim; i++)
    PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(o->view.shape[i]));
  if (shape == NULL) return NULL;
  return Py_BuildValue("{s:N,s:(iii),s:(ii),s:O,s:O}", "shape", shape, "dtype",
                       (int)o->view.dtype.code, (int)o->view.dtype.bits,
                       (int)o->view.dtype.lanes, "device",
                       (int)o->view.device.device_type,
                       (int)o->view.device.device_id, "imported",
                       o->imported ? Py_True : Py_False, "readonly",
                       o->readonly ? Py_True : Py_False);
}

static PyMethodDef CountingObject_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))CountingObject_dlpack,
     METH_VARARGS | METH_KEYWORDS, "A versioned capsule (counted)."},
    {"__dlpack_device__", CountingObject_dlpack_device, METH_NOARGS, NULL},
    {"tolist", CountingObject_tolist, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef CountingObject_getset[] = {
    {"info", CountingObject_info, NULL, "shape, dtype, device, imported", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot CountingObject_slots[] = {
    {Py_tp_new, CountingObject_new},
    {Py_tp_dealloc, CountingObject_dealloc},
    {Py_tp_methods, CountingObject_methods},
    {Py_tp_getset, CountingObject_getset},
    {Py_tp_doc, "CountingTable(n=4, readonly=False): a 1-d float32 tensor "
                "whose type publishes a counting DLPack exchange table."},
    {0, NULL},
};

static PyType_Spec CountingObject_spec = {
    .name = "_dlb_testproducer.CountingTable",
    .basicsize = sizeof(CountingObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = CountingObject_slots,
};

/* What a SetError call said. */
typedef struct {
  int calls;
  char kind[64];
  char msg[512];
} ce_error;

static void ce_set_error(void *ctx, const char *kind, const char *msg) {
  ce_error *e = ctx;
  e->calls++;
  PyOS_snprintf(e->kind, sizeof e->kind, "%s", kind);
  PyOS_snprintf(e->msg, sizeof e->msg, "%s", msg);
}

static PyObject *shape_tuple(const DLTensor *t, int strides) {
  const int64_t *v = strides ? t->strides : t->shape;
  if (v == NULL) Py_RETURN_NONE;
  PyObject *r = PyTuple_New(t->ndim);
  for (int i = 0; r != NULL && i < t->ndim; i++)
    PyTuple_SET_ITEM(r, i, PyLong_FromLongLong(v[i]));
  return r;
}

static int put(PyObject *d, const char *k, PyObject *v) {
  if (v == NULL) return -1;
  int rc = PyDict_SetItemString(d, k, v);
  Py_DECREF(v);
  return rc;
}

/* The pending exception as "Type: message", cleared; None when none. */
static PyObject *take_error(void) {
  if (!PyErr_Occurred()) Py_RETURN_NONE;
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  PyErr_NormalizeException(&t, &v, &tb);
  PyObject *r = PyUnicode_FromFormat("%s: %S", ((PyTypeObject *)t)->tp_name,
                                     v ? v : Py_None);
  Py_XDECREF(t);
  Py_XDECREF(v);
  Py_XDECREF(tb);
  return r;
}

/* consume_exchange(obj): find type(obj)'s table as any third-party consumer
 * would, call every entry, and report what each did. */
static PyObject *mod_consume_exchange(PyObject *module, PyObject *obj) {
  (void)module;
  PyObject *res = PyDict_New(), *attr = NULL;
  if (res == NULL) return NULL;
  attr = PyObject_GetAttrString((PyObject *)Py_TYPE(obj),
                                "__dlpack_c_exchange_api__");
  if (attr == NULL) goto error;
  const DLPackExchangeAPIHeader *h =
      PyCapsule_GetPointer(attr, "dlpack_exchange_api");
  if (h == NULL) goto error;
  while (h != NULL && h->version.major != 1) h = h->prev_api;
  if (h == NULL) {
    PyErr_SetString(PyExc_BufferError, "no major-1 table");
    goto error;
  }
  const DLPackExchangeAPI *api = (const DLPackExchangeAPI *)h;
  int nonnull = (api->managed_tensor_allocator != NULL) +
                (api->managed_tensor_from_py_object_no_sync != NULL) +
                (api->managed_tensor_to_py_object_no_sync != NULL) +
                (api->dltensor_from_py_object_no_sync != NULL) +
                (api->current_work_stream != NULL);
  if (put(res, "version", Py_BuildValue("(II)", api->header.version.major,
                                        api->header.version.minor)) < 0 ||
      put(res, "entries", PyLong_FromLong(nonnull)) < 0 ||
      put(res, "prev_api_null", PyBool_FromLong(api->header.prev_api == NULL)) < 0)
    goto error;
  int leaked = 0;

  /* 1. the borrowed DLTensor */
  if (api->dltensor_from_py_object_no_sync != NULL) {
    DLTensor t;
    memset(&t, 0, sizeof t);
    int rc = api->dltensor_from_py_object_no_sync(obj, &t);
    if (rc == 0) {
      leaked |= PyErr_Occurred() != NULL;
      if (put(res, "dltensor", Py_BuildValue(
                  "{s:i,s:N,s:N,s:(iii),s:K,s:n,s:(ii)}", "ndim", (int)t.ndim,
                  "shape", shape_tuple(&t, 0), "strides", shape_tuple(&t, 1),
                  "dtype", (int)t.dtype.code, (int)t.dtype.bits, (int)t.dtype.lanes,
                  "byte_offset", (unsigned long long)t.byte_offset, "data",
                  (Py_ssize_t)(intptr_t)t.data, "device", (int)t.device.device_type,
                  (int)t.device.device_id)) < 0)
        goto error;
    } else if (put(res, "dltensor_error", take_error()) < 0) {
      goto error;
    }
  }
  /* 2. owning export, then back through to_py */
  {
    DLManagedTensorVersioned *m = NULL;
    int rc = api->managed_tensor_from_py_object_no_sync(obj, &m);
    if (rc == 0 && m != NULL) {
      leaked |= PyErr_Occurred() != NULL;
      if (put(res, "managed", Py_BuildValue(
                  "{s:(II),s:K,s:N,s:n}", "version", m->version.major,
                  m->version.minor, "flags", (unsigned long long)m->flags,
                  "shape", shape_tuple(&m->dl_tensor, 0), "data",
                  (Py_ssize_t)(intptr_t)((char *)m->dl_tensor.data +
                                         m->dl_tensor.byte_offset))) < 0) {
        m->deleter(m);
        goto error;
      }
      void *back = NULL;
      rc = api->managed_tensor_to_py_object_no_sync(m, &back); /* steals */
      if (rc == 0) {
        leaked |= PyErr_Occurred() != NULL;
        if (put(res, "roundtrip", (PyObject *)back) < 0) goto error;
      } else if (put(res, "roundtrip_error", take_error()) < 0) {
        goto error;
      }
    } else if (put(res, "managed_error", take_error()) < 0) {
      goto error;
    }
  }
  /* 3. the current stream on the CPU */
  {
    void *s = (void *)(uintptr_t)1;
    int rc = api->current_work_stream(kDLCPU, 0, &s);
    if (put(res, "stream", rc == 0 ? (s ? PyLong_FromVoidPtr(s) : Py_NewRef(Py_None))
                                   : take_error()) < 0)
      goto error;
  }
  /* 4. allocate a (2, 3) float32 CPU tensor and import it */
  {
    int64_t shape[2] = {2, 3};
    DLTensor proto;
    memset(&proto, 0, sizeof proto);
    proto.ndim = 2;
    proto.shape = shape;
    proto.dtype.code = kDLFloat;
    proto.dtype.bits = 32;
    proto.dtype.lanes = 1;
    proto.device.device_type = kDLCPU;
    ce_error e = {0, "", ""};
    DLManagedTensorVersioned *m = NULL;
    int rc = api->managed_tensor_allocator(&proto, &m, &e, ce_set_error);
    if (rc == 0 && m != NULL) {
      leaked |= PyErr_Occurred() != NULL;
      void *obj2 = NULL;
      if (put(res, "alloc_shape", shape_tuple(&m->dl_tensor, 0)) < 0) {
        m->deleter(m);
        goto error;
      }
      rc = api->managed_tensor_to_py_object_no_sync(m, &obj2);
      if (put(res, "allocated", rc == 0 ? (PyObject *)obj2 : take_error()) < 0)
        goto error;
    } else if (put(res, "alloc_error", Py_BuildValue("(iss)", e.calls, e.kind,
                                                     e.msg)) < 0) {
      goto error;
    }
    /* 5. a device dlbridge never allocates on: refused via SetError */
    proto.device.device_type = kDLVulkan;
    e.calls = 0;
    m = NULL;
    rc = api->managed_tensor_allocator(&proto, &m, &e, ce_set_error);
    if (rc == 0 && m != NULL) {
      m->deleter(m);
      if (put(res, "cuda_alloc", Py_NewRef(Py_True)) < 0) goto error;
    } else {
      if (put(res, "cuda_alloc_error",
              Py_BuildValue("(iiss)", rc, e.calls, e.kind, e.msg)) < 0)
        goto error;
      leaked |= PyErr_Occurred() != NULL;
      PyErr_Clear();
    }
  }
  if (put(res, "exception_left", PyBool_FromLong(leaked)) < 0) goto error;
  Py_DECREF(attr);
  return res;
error:
  Py_XDECREF(attr);
  Py_DECREF(res);
  return NULL;
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
    {"exchange_capsule", mod_exchange_capsule, METH_O,
     "exchange_capsule(variant): a \"dlpack_exchange_api\" capsule of a "
     "CountingTable table variant: counting, managed_only, major2_prev1, "
     "major2_only; wrong_name gives a misnamed capsule."},
    {"exchange_address", mod_exchange_address, METH_O,
     "exchange_address(variant): the table's address as an int (DLPack "
     "1.2's __c_dlpack_exchange_api__)."},
    {"counting_counts", mod_counting_counts, METH_NOARGS,
     "Calls of each CountingTable table entry since counting_reset()."},
    {"counting_reset", mod_counting_reset, METH_NOARGS,
     "Zero the CountingTable counters and failure modes."},
    {"counting_corrupt", mod_counting_corrupt, METH_O,
     "counting_corrupt(case): dltensor_from_py_object_no_sync describes "
     "every CountingTable wrongly (negative_extent, null_data, "
     "span_overflow, unknown_device, negative_device_id, huge_offset, "
     "null_shape) until counting_reset() or counting_corrupt(None)."},
    {"counting_fail", mod_counting_fail, METH_VARARGS,
     "counting_fail(alloc_kind, to_py): make the allocator fail with "
     "SetError(kind) (None: do not) and to_py delete and fail."},
    {"consume_exchange", mod_consume_exchange, METH_O,
     "consume_exchange(obj): call every entry of type(obj)'s exchange table "
     "as a third-party consumer would; returns what each did."},
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
  {
    PyTypeObject *ct =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, &CountingObject_spec, NULL);
    if (ct == NULL) return -1;
    PyObject *cap = PyCapsule_New((void *)&ct_table, "dlpack_exchange_api", NULL);
    int rc = cap ? PyDict_SetItemString(ct->tp_dict, "__dlpack_c_exchange_api__", cap)
                 : -1;
    Py_XDECREF(cap);
    PyType_Modified(ct);
    if (rc < 0 || PyModule_AddType(module, ct) < 0) {
      Py_DECREF(ct);
      return -1;
    }
    /* Kept for the module's lifetime by the module attribute; the table
     * entries need it without a module at hand. */
    Py_XSETREF(g_ct_type, ct);
  }
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
#ifdef Py_GIL_DISABLED
    /* Declared so that importing it leaves the GIL off on free-threaded
     * builds, where the suite tests dlbridge without a GIL.  Its counters
     * and quarantine are plain globals: a test that drives it from several
     * threads at once would have to lock them first (none does; the thread
     * hammer, tests/threads, does not use it). */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
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
