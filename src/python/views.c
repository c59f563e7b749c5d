/*
 * views.c -- borrowed views: a DLTensor describing a tensor-like object for
 * the length of one call (Function arguments, the C API's dlb_py_view_get),
 * read through the object's handler (handlers.c).
 *
 * A view lives on the caller's stack; nothing in it is allocated for the
 * dlbridge, NumPy, exchange-table (dltensor_from_py_object_no_sync) and
 * buffer paths.  Kinds with no borrowed form (__dlpack__ only, the array
 * interfaces, exchange tables without the borrowed entry) hold an owning
 * export for the view's lifetime (readers.c), freed by dlb__view_release;
 * so do objects whose type has no fast path at all, read through the
 * ladder's owning rungs (dlb__read_owned) exactly as from_dlpack reads
 * them.
 */
#include "dlbridge_py.h"

#include <string.h>

_Static_assert(sizeof(Py_ssize_t) == sizeof(int64_t),
               "dlbridge's borrowed views point DLTensor.shape at Py_ssize_t "
               "arrays: a 64-bit platform is required");

/* dlb__numpy_descr_dtype with its home slot looked at here, inline: an
 * array's descr is nearly always there, and every NumPy argument and
 * source comes this way. */
static int numpy_dtype(dlb_descr_entry *cache, PyObject *descr,
                       DLDataType *out) {
  dlb_descr_entry *home = &cache[dlb__descr_home(descr)];
  if (DLB_FT_LOAD_PTR(&home->descr) == descr) {
    *out = home->dtype;
    return 0;
  }
  return dlb__numpy_descr_dtype(cache, descr, out);
}

static int view_numpy(struct dlb_handler_cache *c, PyObject *obj, dlb_view *v) {
  const np_array_head *a = (const np_array_head *)obj;
  if (numpy_dtype(c->dtypes, a->descr, &v->t.dtype) < 0) return -1;
  int64_t itemsize = v->t.dtype.bits / 8;
  int nd = a->nd;
  if (nd < 0 || nd > DLB_MAX_NDIM) {
    PyErr_Format(PyExc_BufferError, "numpy array ndim %d is out of range", nd);
    return -1;
  }
  const int64_t *bs = (const int64_t *)a->strides;
  int bad = dlb__elem_strides(nd, (const int64_t *)a->dimensions, bs,
                              itemsize, v->strides_storage);
  if (bad >= 0)
    return dlb__raise_stride_not_multiple("numpy array", bs, bad, itemsize);
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
      const int64_t *bs = (const int64_t *)b->strides;
      int bad = dlb__elem_strides(b->ndim, v->t.shape, bs, b->itemsize,
                                  v->strides_storage);
      if (bad >= 0)
        return dlb__raise_stride_not_multiple("buffer", bs, bad, b->itemsize);
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

/* Through the table: the borrowed entry when it has one, else an owning
 * export (both validated by the caller); then what the table cannot say
 * (dlb__check_bits), once its dtype is known.  The check may run Python
 * code (the first torch tensor's experiment), after which a borrowed view
 * is taken again -- through h, whose type is held meanwhile (a handler
 * lives as long as its type). */
static int view_exchange_held(dlb_module_state *st, const dlb_handler *h,
                              PyObject *obj, unsigned options, dlb_view *v) {
  const DLPackExchangeAPI *api = h->api;
  int readonly = 0, ran_python = 0;
  if (api->dltensor_from_py_object_no_sync != NULL) {
    if (dlb__view_exchange_borrowed(h, obj, v) < 0) return -1;
    if (!(options & DLB_VIEW_BITS_CHECKED)) {
      if (dlb__check_bits(st, obj, options, v->t.dtype, &readonly,
                          &ran_python) < 0)
        return -1;
      if (ran_python && dlb__view_exchange_borrowed(h, obj, v) < 0) return -1;
    }
    v->flags = readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
    return 0;
  }
  DLManagedTensorVersioned *m = NULL;
  if (api->managed_tensor_from_py_object_no_sync(obj, &m) != 0 || m == NULL) {
    dlb__error_exchange_refusal(Py_TYPE(obj), "export");
    return -1;
  }
  if (dlb__check_owned(m, "exchange API export") < 0) return -1;
  v->owned = m; /* released by the caller on failure too */
  v->t = m->dl_tensor;
  v->flags = m->flags;
  if (!(options & DLB_VIEW_BITS_CHECKED) &&
      dlb__check_bits(st, obj, options, v->t.dtype, &readonly, &ran_python) <
          0)
    return -1;
  if (readonly) v->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  return 0;
}

static int view_exchange(dlb_module_state *st, const dlb_handler *h,
                         PyObject *obj, unsigned options, dlb_view *v) {
  PyObject *type = Py_NewRef((PyObject *)Py_TYPE(obj));
  int rc = view_exchange_held(st, h, obj, options, v);
  dlb__clear_keep_error(&type);
  return rc;
}

/* No fast path for obj's type: the ladder's owning rungs, the same
 * from_dlpack reads it with (raw capsules, legacy producers,
 * instance-level array interfaces).  0, or -1 with an exception. */
static int view_ladder(dlb_module_state *st, PyObject *obj, dlb_view *v) {
  int rc = dlb__read_owned(st, obj, NULL, -1, &v->owned);
  if (rc == 0) {
    PyErr_Format(PyExc_TypeError,
                 "an object of type '%.200s' is not tensor-like: it has no "
                 "DLPack exchange table, no __dlpack__, is not a DLPack "
                 "capsule nor a legacy producer, and has no buffer protocol "
                 "and no __array_interface__ or __cuda_array_interface__",
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (rc < 0) return -1;
  v->t = v->owned->dl_tensor;
  v->flags = v->owned->flags;
  return 0;
}

/* Called through a volatile pointer so the compiler cannot inline it (the
 * core's DLB__OUT_OF_LINE): inlined, this cold path made the NumPy and
 * Tensor views measurably slower (about 2.5 ns per Function call). */
static int (*const volatile view_ladder_out_of_line)(dlb_module_state *,
                                                     PyObject *, dlb_view *) =
    view_ladder;

/* An owning export through obj.__dlpack__.  A view that will be written
 * must not be a copy: ask for none (copy=False), and refuse one the
 * producer says it made anyway (IS_COPIED, dlb__view_fill) -- the writes
 * would be lost. */
static int view_dlpack(dlb_module_state *st, PyObject *obj, unsigned options,
                       dlb_view *v) {
  int rc = dlb__dunder_dlpack_managed(
      st, obj, NULL, (options & DLB_VIEW_WRITABLE) ? 0 : -1, &v->owned);
  if (rc == 0) {
    v->t = v->owned->dl_tensor;
    v->flags = v->owned->flags;
  }
  return rc;
}

/* The buffer protocol, several times cheaper than a __dlpack__ round trip;
 * what the buffer refuses (BufferError: another device, a dtype with no
 * format, a write) is asked of __dlpack__, whose answer stands. */
static int view_buffer_dlpack(dlb_module_state *st, PyObject *obj,
                              unsigned options, dlb_view *v) {
  if (view_buffer(obj, options, v) == 0) return 0;
  if (!PyErr_ExceptionMatches(PyExc_BufferError)) return -1;
  dlb__view_release(v);
  PyErr_Clear();
  return view_dlpack(st, obj, options, v);
}

/* Out of line, as view_ladder: the NumPy and Tensor views stay as fast. */
static int (*const volatile view_buffer_dlpack_out_of_line)(
    dlb_module_state *, PyObject *, unsigned, dlb_view *) = view_buffer_dlpack;

/* Fill v reading obj as kind (h's own kind, or a forced one for the
 * benchmarks). */
int dlb__view_fill(dlb_module_state *st, PyObject *obj, unsigned options,
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
      rc = view_exchange(st, h, obj, options, v);
      break;
    case DLB_KIND_NUMPY:
      rc = view_numpy(st->handlers, obj, v);
      break;
    case DLB_KIND_BUFFER:
      rc = view_buffer(obj, options, v);
      break;
    case DLB_KIND_DLPACK:
      rc = view_dlpack(st, obj, options, v);
      break;
    case DLB_KIND_BUFFER_DLPACK:
      rc = view_buffer_dlpack_out_of_line(st, obj, options, v);
      break;
    case DLB_KIND_TF_EAGER:
      /* TF's export shares without copying, so a writable view writes the
       * caller's tensor, as DLB_KIND_DLPACK's copy=False asks. */
      rc = dlb__tf_eager_managed(h, obj, &v->owned);
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
      rc = view_ladder_out_of_line(st, obj, v);
      break;
  }
  if (rc < 0) goto error;
  /* Untrusted from here on: every path but our own Tensor and NumPy.  An
   * ndarray's extents, strides and data were checked by NumPy when it was
   * made (its sizes fit in npy_intp by construction); what NumPy allows and
   * DLPack does not -- dtype, byte order, ndim, byte strides -- view_numpy
   * checked.  Skipping the overflow walk here is a third of the cost of a
   * NumPy view. */
  if (kind != DLB_KIND_NUMPY && dlb_tensor_validate(&v->t, 0, &err) != DLB_OK) {
    dlb__raise_view_error("an object", obj, &err);
    goto error;
  }
check_writable:
  if ((options & DLB_VIEW_WRITABLE) && v->owned != NULL &&
      (v->flags & DLPACK_FLAG_BITMASK_IS_COPIED)) {
    PyErr_Format(PyExc_BufferError,
                 "the producer of type '%.200s' exported a copy "
                 "(IS_COPIED), but this argument is written to: the writes "
                 "would be lost",
                 Py_TYPE(obj)->tp_name);
    goto error;
  }
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

/* The route is chosen from obj's class, held while the view is filled
 * (producers' __dlpack__, __dlpack_device__ and properties run Python
 * code, which may give obj another class and free the old one, handler
 * and all).  A view read by a class obj no longer has is read again by its
 * new class (dlb__reread): a failure the stale route made is no answer of
 * either class, and a view that succeeded would carry a handler that dies
 * with the old class. */
int dlb__view_get(dlb_module_state *st, PyObject *obj, unsigned options,
                  dlb_view *view) {
  int tries = 0;
  for (;;) {
    PyTypeObject *type = NULL;
    const dlb_handler *h = dlb__handler_held(st, obj, &type);
    if (h == NULL) return -1;
    int rc = dlb__view_fill(st, obj, options, h, h->kind, view);
    if (rc == 0 && Py_TYPE(obj) != type) {
      dlb__view_release(view);
      PyErr_Format(PyExc_TypeError,
                   "an object of type '%.200s' changed its class while "
                   "dlbridge read it",
                   Py_TYPE(obj)->tp_name);
      rc = -1;
    }
    if (rc < 0 && dlb__reread(obj, type, &tries)) {
      Py_DECREF(type);
      continue;
    }
    dlb__clear_keep_error((PyObject **)&type);
    return rc;
  }
}

int dlb__view_numpy(dlb_module_state *st, const dlb_handler *h,
                    PyObject *obj, dlb_view *view, int *row_major) {
  view->handler = h;
  view->owned = NULL;
  view->has_buffer = 0;
  *row_major =
      (((const np_array_head *)obj)->flags & NP_ARRAY_C_CONTIGUOUS) != 0;
  return view_numpy(st->handlers, obj, view);
}

int dlb__view_get_with(dlb_module_state *st, const dlb_handler *h,
                       PyObject *obj, unsigned options, dlb_view *view) {
  return dlb__view_fill(st, obj, options, h, h->kind, view);
}

void dlb__view_release(dlb_view *view) {
  if (view->owned == NULL && !view->has_buffer) return;
  dlb__saved_error e;
  dlb__error_save(&e);
  if (view->owned != NULL) {
    DLManagedTensorVersioned *m = view->owned;
    view->owned = NULL;
    dlb_managed_delete(m);
  }
  if (view->has_buffer) {
    view->has_buffer = 0;
    PyBuffer_Release(&view->buffer);
  }
  dlb__error_restore(&e);
}
