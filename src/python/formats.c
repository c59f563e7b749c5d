/*
 * formats.c -- the element-type vocabularies of other protocols, to and
 * from DLDataType: struct-module formats (the buffer protocol), array
 * interface typestrs, NumPy dtype descriptors; native byte order only
 * (DLPack describes nothing else); and a Py_buffer read as a DLTensor.
 *
 * Not yet one rule each (issue 7, section 2): a Py_buffer is read into a
 * DLTensor here for owning imports (dlb__dltensor_from_buffer, called by
 * readers.c) and a second time by views.c's view_buffer for borrowed views,
 * with a different request strategy.  Both convert its byte strides with
 * the one rule every reader of byte strides shares (dlb__elem_strides,
 * dlbridge_py.h).
 */
#include "dlbridge_py.h"

#include <string.h>

/* ---- dtype -> struct format / typestr (what dlb.Tensor publishes) ---------------- */

/* struct-module format of a kind (buffer protocol); NULL when none. */
const char *dlb__buffer_format(scalar_kind k) {
  switch (k) {
    case K_BOOL: return "?";
    case K_I8: return "b";
    case K_U8: return "B";
    case K_I16: return "h";
    case K_U16: return "H";
    case K_I32: return "i";
    case K_U32: return "I";
    case K_I64: return "q";
    case K_U64: return "Q";
    case K_F16: return "e";
    case K_F32: return "f";
    case K_F64: return "d";
    case K_C64: return "Zf";
    case K_C128: return "Zd";
    default: return NULL;
  }
}

#if PY_LITTLE_ENDIAN
#define NATIVE_ORDER "<"
#else
#define NATIVE_ORDER ">"
#endif

/* __array_interface__ typestr of a kind; NULL when NumPy has no name for it
 * (the caller then uses "|V<itemsize>"). */
const char *dlb__array_typestr(scalar_kind k) {
  switch (k) {
    case K_BOOL: return "|b1";
    case K_I8: return "|i1";
    case K_U8: return "|u1";
    case K_I16: return NATIVE_ORDER "i2";
    case K_U16: return NATIVE_ORDER "u2";
    case K_I32: return NATIVE_ORDER "i4";
    case K_U32: return NATIVE_ORDER "u4";
    case K_I64: return NATIVE_ORDER "i8";
    case K_U64: return NATIVE_ORDER "u8";
    case K_F16: return NATIVE_ORDER "f2";
    case K_F32: return NATIVE_ORDER "f4";
    case K_F64: return NATIVE_ORDER "f8";
    case K_C64: return NATIVE_ORDER "c8";
    case K_C128: return NATIVE_ORDER "c16";
    default: return NULL;
  }
}

/* ---- struct format / typestr -> dtype (what we import) ---------------------------- */

/* dtype of one struct-module format (native byte order only), parsed by
 * the core (dlb_dtype_from_buffer_format).  Shared by owning buffer
 * imports (readers.c) and buffer views (views.c). */
int dlb__buffer_format_dtype(const char *fmt, Py_ssize_t itemsize, DLDataType *out) {
  dlb_error err;
  if (dlb_dtype_from_buffer_format(fmt, (int64_t)itemsize, out, &err) == DLB_OK)
    return 0;
  PyErr_Format(PyExc_BufferError, "from_dlpack: %s", err.message);
  return -1;
}

/* dtype from a typestr such as '<f4', '|b1', '=i8', parsed by the core
 * (dlb_dtype_from_typestr): a malformed one is a ValueError, one DLPack
 * cannot describe a BufferError. */
int dlb__typestr_dtype(PyObject *ts, DLDataType *out) {
  dlb_error err;
  const char *s = PyUnicode_Check(ts) ? dlb__text_of_name(ts, "typestr") : NULL;
  if (s == NULL) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_TypeError,
                   "from_dlpack: array interface 'typestr' must be a str, "
                   "not %.200s",
                   Py_TYPE(ts)->tp_name);
    return -1;
  }
  int rc = dlb_dtype_from_typestr(s, out, &err);
  if (rc == DLB_OK) return 0;
  if (rc == DLB_EINVAL)
    PyErr_Format(PyExc_ValueError,
                 "from_dlpack: malformed array interface typestr '%s'", s);
  else
    PyErr_Format(PyExc_BufferError, "from_dlpack: %s", err.message);
  return -1;
}

/* ---- Py_buffer -> DLTensor ------------------------------------------------------- */

int dlb__raise_stride_not_multiple(const char *what, const int64_t *bstrides,
                                   int dim, int64_t itemsize) {
  PyErr_Format(PyExc_BufferError,
               "%s stride %lld of dimension %d is not a multiple of the "
               "itemsize %lld; DLPack strides count elements",
               what, (long long)bstrides[dim], dim, (long long)itemsize);
  return -1;
}

/* Build the DLTensor for a Py_buffer (CPU). */
int dlb__dltensor_from_buffer(const Py_buffer *b, DLTensor *t, int64_t *shape,
                              int64_t *strides) {
  memset(t, 0, sizeof *t);
  if (b->ndim < 0 || b->ndim > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_BufferError, "from_dlpack: buffer ndim %d is out of "
                 "range (at most %d)", b->ndim, DLB_MAX_NDIM);
    return -1;
  }
  if (b->suboffsets != NULL) {
    for (int i = 0; i < b->ndim; i++) {
      if (b->suboffsets[i] >= 0) {
        PyErr_SetString(PyExc_BufferError,
                        "from_dlpack: indirect (PIL-style) buffers with "
                        "suboffsets cannot be described by DLPack");
        return -1;
      }
    }
  }
  if (dlb__buffer_format_dtype(b->format, b->itemsize, &t->dtype) < 0) return -1;
  t->ndim = b->ndim;
  if (b->ndim > 0) {
    if (b->shape != NULL) {
      for (int i = 0; i < b->ndim; i++) shape[i] = b->shape[i];
    } else if (b->ndim == 1) {
      shape[0] = b->len / b->itemsize; /* the protocol's rule for NULL */
    } else {
      PyErr_SetString(PyExc_BufferError,
                      "from_dlpack: buffer has ndim > 1 but no shape");
      return -1;
    }
    t->shape = shape;
    if (b->strides != NULL) {
      const int64_t *bs = (const int64_t *)b->strides;
      int bad = dlb__elem_strides(b->ndim, shape, bs, b->itemsize, strides);
      if (bad >= 0)
        return dlb__raise_stride_not_multiple("from_dlpack: buffer", bs, bad,
                                              b->itemsize);
      t->strides = strides;
    } /* else: C-contiguous, which NULL strides mean */
  }
  t->data = b->buf;
  t->device.device_type = kDLCPU;
  t->device.device_id = 0;
  return 0;
}

/* ---- NumPy dtype descriptors -------------------------------------------------------- */

/* The DLDataType of a NumPy descr, from the cache or, the first time,
 * from descr.kind / .itemsize / .byteorder. */
#ifdef Py_GIL_DISABLED
/* Without the GIL: entries are read with no lock (an acquire load of
 * descr, then its dtype, written before it was published) and written
 * under this lock, each once -- an entry that could be emptied and filled
 * again would let a reader pair one descr with another's dtype.  A full
 * cache then stays as it is, and further descrs are read each time. */
static dlb_ft_lock descr_cache_lock = DLB_FT_LOCK_STATIC;
#endif

int dlb__numpy_descr_dtype(dlb_descr_entry *cache, PyObject *descr,
                           DLDataType *out) {
  size_t slot = dlb__descr_home(descr);
  for (size_t n = 0; n < DLB_DESCR_CACHE_SIZE; n++) {
    dlb_descr_entry *d = &cache[(slot + n) % DLB_DESCR_CACHE_SIZE];
    PyObject *known = DLB_FT_LOAD_PTR(&d->descr);
    if (known == descr) {
      *out = d->dtype;
      return 0;
    }
    if (known == NULL) break;
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
#ifdef Py_GIL_DISABLED
  DLB_FT_LOCK(&descr_cache_lock);
  for (size_t n = 0; n < DLB_DESCR_CACHE_SIZE; n++) {
    dlb_descr_entry *d = &cache[(slot + n) % DLB_DESCR_CACHE_SIZE];
    if (d->descr == descr) break; /* another thread was first */
    if (d->descr == NULL) {
      d->dtype = dt;
      DLB_FT_STORE_PTR(&d->descr, Py_NewRef(descr));
      break;
    }
  }
  DLB_FT_UNLOCK(&descr_cache_lock);
#else
  /* Remember it (strong ref); a full cache is emptied and refilled, which
   * is safe because nothing outside holds its entries. */
  if (cache[slot].descr != NULL) {
    size_t n;
    for (n = 0; n < DLB_DESCR_CACHE_SIZE; n++)
      if (cache[(slot + n) % DLB_DESCR_CACHE_SIZE].descr == NULL) break;
    if (n == DLB_DESCR_CACHE_SIZE) {
      for (size_t i = 0; i < DLB_DESCR_CACHE_SIZE; i++) Py_CLEAR(cache[i].descr);
      n = 0;
    }
    slot = (slot + n) % DLB_DESCR_CACHE_SIZE;
  }
  cache[slot].descr = Py_NewRef(descr);
  cache[slot].dtype = dt;
#endif
  *out = dt;
  rc = 0;
done:
  Py_XDECREF(kind);
  Py_XDECREF(size);
  Py_XDECREF(order);
  return rc;
}

void dlb__numpy_descr_cache_clear(dlb_descr_entry *cache) {
  for (size_t i = 0; i < DLB_DESCR_CACHE_SIZE; i++) Py_CLEAR(cache[i].descr);
}
