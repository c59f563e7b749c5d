/*
 * function_call.c -- the eager call of a dlbridge.Function: its arguments
 * read (borrowed where they can be), checked against the signature, its
 * outputs allocated, its kernel run (the dlb_kernel ABI in dlbridge.h).
 *
 * The call path is built for overhead, not generality: every check that can
 * be decided from the signature alone is decided at parse time
 * (function_sig.c): a call compares each extent with a literal or with the
 * shape of the view that bound its name, no symbol table.  Views
 * of the arguments are borrowed (dlb__view_get_with) into per-call arrays
 * that live on the stack for up to FN_INLINE (8) parameters and results,
 * in one heap block beyond; Python numbers for 0-d parameters are stored
 * there too.  Nothing else is allocated unless the signature has outputs,
 * or the call has batch dims (`...`: one block for the padded headers of
 * its `...` inputs, see "batch dimensions" below).
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
 *    (OverflowError out of range, TypeError for a float into an integer).
 *    A kernel's negative status maps as dlb__raise does (DLB_EINVAL -> ValueError, ...) with message
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
 */
#include "dlbridge_py.h"
#include "function.h"
#include "../core/validate_fast.h"

#include <string.h>

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

/* Argument i's tensor t, read borrowed from obj's exchange table, failed
 * the inline validator: the full one says why (-1), or accepts what the
 * fast path would not decide (0). */
static int invalid_error(const fn_object *fn, int i, PyObject *obj,
                         const DLTensor *t) {
  dlb_error err;
  if (dlb_tensor_validate(t, 0, &err) == DLB_OK) return 0;
  dlb__raise_view_error("an object", obj, &err);
  dlb__fn_prefix_error(fn, i);
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

DLB__OUT_OF_LINE(int, invalid_error,
                 (const fn_object *, int, PyObject *, const DLTensor *));
DLB__OUT_OF_LINE(PyObject *, kernel_error,
                 (const fn_object *, int, dlb_error *));
DLB__OUT_OF_LINE(int, order_keywords,
                 (const fn_object *, PyObject *const *, Py_ssize_t,
                  PyObject *, PyObject **));

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

/* fn_frame.marked only: a TensorFlow argument's tape check ran in this call
 * and found nothing recording -- it is asked once per call, not per
 * tensor. */
#define MARK_TAPE_ASKED (1u << 7)
_Static_assert((MARK_TAPE_ASKED & (MARK_AUTOGRAD | MARK_COPY | MARK_WRITTEN |
                                   MARK_OWNING)) == 0,
               "MARK_TAPE_ASKED collides with a mark of function.h");

/* Whether a TensorFlow GradientTape or ForwardAccumulator records on this
 * thread (h: a TF eager tensor's handler, whose tape_empty is TF's own
 * TFE_Py_TapeSetIsEmpty: a C function reading thread state, no Python code;
 * True as well inside tape.stop_recording()).  A kernel run directly is
 * nothing a tape can see -- tape.gradient would be None, silently -- so such
 * a call goes to python/dlbridge/_ops_tf.py, which records it with the
 * Function's vjp or refuses it.  1, 0, or -1 with an exception. */
static int tf_recording(const dlb_handler *h) {
  PyObject *empty;
  if (h->tape_empty_c != NULL) {
    empty = h->tape_empty_c(); /* Py_True or Py_False, a new reference */
  } else {
    PyObject *check = Py_NewRef(h->tape_empty);
    empty = PyObject_CallNoArgs(check);
    Py_DECREF(check);
  }
  if (empty == NULL) return -1;
  int recording = empty == Py_False;
  Py_DECREF(empty);
  return recording;
}

DLB__OUT_OF_LINE(int, tf_recording, (const dlb_handler *));

#ifdef Py_GIL_DISABLED
/* fn_frame.tpins[i] of a class that needs no reference to outlive the
 * call: a static type (never freed) or dlbridge's own Tensor type (held by
 * the module state, which the Function holds; it cannot be subclassed).
 * Held, its reference count would be written twice per argument by every
 * thread calling with dlb.Tensors -- one cache line for all of them (issue
 * 26 item 5).  The low bit marks the entry as not a reference; it is still
 * compared, so a class change is seen as for a held one. */
#define TPIN_UNHELD(type) ((PyObject *)((uintptr_t)(type) | 1u))
static inline int type_outlives_call(const dlb_module_state *st,
                                     PyTypeObject *type) {
  return type == st->TensorType || !PyType_HasFeature(type, Py_TPFLAGS_HEAPTYPE);
}
static inline int tpin_held(const PyObject *pin) {
  return ((uintptr_t)pin & 1u) == 0;
}

/* Hold obj's class as argument i's type for the rest of the call
 * (fn_frame.tpins), letting go of the one held before: obj's class changed
 * since its last reading, so Python code ran (*python is set). */
static void pin_type(const dlb_module_state *st, fn_frame *f, int i,
                     PyObject *obj, int *python) {
  PyObject *old = f->tpins[i];
  PyTypeObject *type = Py_TYPE(obj);
  if (type_outlives_call(st, type))
    f->tpins[i] = TPIN_UNHELD(type);
  else
    f->tpins[i] = Py_NewRef((PyObject *)type);
  if (old != NULL) {
    *python = 1;
    if (tpin_held(old)) unpin(&old);
  }
}
DLB__OUT_OF_LINE(void, pin_type,
                 (const dlb_module_state *, fn_frame *, int, PyObject *,
                  int *));
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
 * compiler's placeholder, or a TF tensor while a tape records (nothing
 * read; views[i].handler is its handler): the call belongs to the
 * compiler's route (dlbridge._compiled). */
static FN_HOT_INLINE int read_arg(fn_object *fn, fn_frame *f, PyObject *obj,
                                  int i, int *python) {
  dlb_module_state *st = fn->st;
  unsigned opts = 0;
  f->marks[i] = 0;
#ifdef Py_GIL_DISABLED
  if (f->tpins[i] != (PyObject *)Py_TYPE(obj) &&
      f->tpins[i] != TPIN_UNHELD(Py_TYPE(obj)))
    pin_type_out_of_line(st, f, i, obj, python);
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
      /* Before the read (which runs no Python code: the answer holds
       * after it): a functorch wrapper's key bit makes it 1 too, and such
       * a tensor is not read at all -- its failed read costs torch a C++
       * exception with a symbolised backtrace, ~3 ms (torchbits.c). */
      const int maybe = dlb__bits_maybe_set(st, obj);
      if (maybe && dlb__torch_wrapper_bit(st, obj) &&
          dlb__torch_functorch_wrapped(st, obj)) {
        f->views[i].handler = h;
        return 1;
      }
      if (dlb__view_exchange_borrowed(h, obj, &f->views[i]) < 0) {
        /* A functorch transform's tensor has no memory to read: the call
         * is torch's (_ops_torch, by the hand-over), as a placeholder's. */
        if (!dlb__torch_functorch_wrapped(st, obj)) return -1;
        f->views[i].handler = h;
        return 1;
      }
      if (maybe) {
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
  if (h->tape_empty != NULL && !(f->marked & MARK_TAPE_ASKED)) {
    /* a TF eager tensor; the kinds above never are */
    int recording = tf_recording_out_of_line(h);
    if (recording < 0) return -1;
    if (recording) {
      f->views[i].handler = h; /* the call is TF's route's, as a trace's */
      return 1;
    }
    f->marked |= MARK_TAPE_ASKED;
  }
  *python = 1;
  /* obj's class, held while h is used: reading runs Python code
   * (__dlpack_device__, __dlpack__), which may give obj another class and
   * free this one with its handler.  A reading that failed after the class
   * changed is no answer of either class: obj is read again next round
   * (read_again bounds the rounds). */
  PyObject *routed = Py_NewRef((PyObject *)Py_TYPE(obj));
  int tries = 0;
  if (dlb__view_get_with(st, h, obj, opts, &f->views[i]) < 0) {
    if (dlb__reread(obj, (PyTypeObject *)routed, &tries)) {
      Py_DECREF(routed);
      f->state[i] = ARG_UNREAD;
      return 0;
    }
    dlb__clear_keep_error(&routed);
    return -1;
  }
  f->state[i] = ARG_VIEW;
  f->marked |= MARK_OWNING;
  if ((opts & DLB_VIEW_WRITABLE) && h->framework == st->str_torch) {
    /* torch's, read another way (its __dlpack__): told as well */
    f->marks[i] |= MARK_WRITTEN;
    f->marked |= MARK_WRITTEN;
  }
  Py_DECREF(routed);
  return 0;
}


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
        dlb__fn_prefix_error(fn, i);
        return -1;
      }
    }
  }
}

DLB__OUT_OF_LINE(int, read_again,
                 (fn_object *, fn_frame *, PyObject *const *, int,
                  PyObject **));

/* ---- batch dimensions (`...`): off the fast path --------------------------------
 *
 * A call of a Function with `...` parameters whose arguments have batch
 * dims: B is found after the per-argument checks (batch_shape), the
 * `...` results are allocated at B + core (result_shape_batched), and
 * after the copies of immutable `mut` arguments each `...` input is
 * handed to the kernel as a header left-padded to B's rank (batch_pad:
 * extent 1, stride 0; no copy) -- Python numbers for 0-d `...`
 * parameters too.  The headers' shape and stride storage is one heap
 * block (fn_frame.batch), freed in function_call's cleanup.  A call
 * whose batch rank is 0 allocates nothing and runs as any other. */
struct fn_batch {
  int32_t ndim;    /* R = len(B), > 0 */
  int64_t *shape;  /* [R]: B */
  DLTensor *hdr;   /* [nin]: the padded headers (of `...` inputs) */
  int64_t *dims;   /* per `...` input: shape then strides, R + core each */
};

/* B of the call (argv: the nin inputs, checked), into f->batch when its
 * rank is not 0.  0, or -1 with ValueError (the batch parts do not
 * broadcast, a `mut` input is not the whole of B, a result would have
 * more than DLB_MAX_NDIM dims) or MemoryError. */
static int batch_shape(const fn_object *fn, fn_frame *f,
                       DLTensor *const *argv) {
  dlb_signature_batch b;
  dlb_error err;
  const int nin = fn->nin;
  if (dlb_signature_batch_shape(fn->params, nin, nin, argv, &b, &err) !=
      DLB_OK)
    return dlb__fn_batch_error(fn, &b, argv);
  if (b.ndim == 0) return 0;
  size_t ndims = 0;
  for (int i = 0; i < nin + fn->nout; i++) {
    const fn_param *p = &fn->params[i];
    if (!p->batch) continue;
    if (b.ndim + p->ndim > DLB_MAX_NDIM) {
      PyErr_Format(PyExc_ValueError,
                   "%U() %s '%U': %d batch and %d core dimensions; at most "
                   "%d are supported",
                   fn->name, i < nin ? "argument" : "result",
                   i < nin ? pname(fn, i)
                           : PyTuple_GET_ITEM(fn->result_names, i - nin),
                   (int)b.ndim, (int)p->ndim, DLB_MAX_NDIM);
      return -1;
    }
    if (i < nin) ndims += 2 * (size_t)(b.ndim + p->ndim);
  }
  /* the struct, B, the headers, then their extents: each part aligned
   * for what follows it (DLTensor and int64_t both need 8 at most).  Only
   * B's R extents are kept, not the whole dlb_signature_batch: a few
   * hundred bytes, which pymalloc serves without malloc. */
  size_t bytes = sizeof(struct fn_batch) + (size_t)b.ndim * sizeof(int64_t) +
                 (size_t)nin * sizeof(DLTensor) + ndims * sizeof(int64_t);
  struct fn_batch *blk = PyMem_Malloc(bytes);
  if (blk == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  blk->ndim = b.ndim;
  blk->shape = (int64_t *)(blk + 1);
  memcpy(blk->shape, b.shape, (size_t)b.ndim * sizeof(int64_t));
  blk->hdr = (DLTensor *)(blk->shape + b.ndim);
  blk->dims = (int64_t *)(blk->hdr + nin);
  f->batch = blk;
  return 0;
}

/* Each `...` input in argv (a view, a Python number's 0-d tensor, or the
 * copy of an immutable `mut` argument) replaced by its header padded to
 * B's rank.  0, or -1 with an exception (a shape batch_shape accepted
 * always pads: this is a broken invariant, said as one). */
static int batch_pad(const fn_object *fn, fn_frame *f) {
  struct fn_batch *blk = f->batch;
  int64_t *dims = blk->dims;
  dlb_signature_batch b;
  b.ndim = blk->ndim;
  memcpy(b.shape, blk->shape, (size_t)blk->ndim * sizeof(int64_t));
  for (int i = 0; i < fn->nin; i++) {
    const fn_param *p = &fn->params[i];
    if (!p->batch) continue;
    int n = b.ndim + p->ndim;
    dlb_error err;
    if (dlb_signature_batch_pad(p, f->argv[i], &b, dims, dims + n,
                                &blk->hdr[i], &err) != DLB_OK) {
      dlb__raise(&err);
      dlb__fn_prefix_error(fn, i);
      return -1;
    }
    f->argv[i] = &blk->hdr[i];
    dims += 2 * n;
  }
  return 0;
}

DLB__OUT_OF_LINE(int, batch_shape,
                 (const fn_object *, fn_frame *, DLTensor *const *));
DLB__OUT_OF_LINE(int, batch_pad, (const fn_object *, fn_frame *));

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
    return dlb__fn_nargs_error(fn, nargs);
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
        dlb__fn_mut_number_error(fn, i, obj);
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
      dlb__fn_prefix_error(fn, i);
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
      (r = dlb__fn_marked(fn, f, args)) != 0) {
    /* 1: torch's autograd takes the call (_ops_torch, by the hand-over) */
    if (r > 0) traced = Py_NewRef(st->str_torch);
    goto cleanup;
  }
  for (int i = 0; i < nin; i++) {
    const fn_param *p = &fn->params[i];
    DLTensor *t = &views[i].t;
    if (state[i] == ARG_SCALAR) continue;
    if (!type_matches(p, t)) {
      dlb__fn_check_error(fn, i, t, p, NULL, -1);
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
      dlb__fn_check_error(fn, i, t, p, &views[ifirst].t, ifirst);
      goto cleanup;
    }
    int axis = dim_mismatch(fn, p, t, argv);
    if (axis >= 0) {
      /* axis counts core axes (a `...` argument's last p->ndim) */
      dlb__fn_dim_error(fn, i, axis, core_extent(fn, i, t, axis),
                        &fn->dims[p->dim0 + axis], argv);
      goto cleanup;
    }
  }

  /* B, when the Function has `...` (f->batch: NULL at batch rank 0) */
  if (fn->nbatch > 0 && batch_shape_out_of_line(fn, f, argv) < 0)
    goto cleanup;

  /* Where results live and which stream the kernel runs on: the first
   * tensor argument's framework and device decide both. */
  if (ifirst >= 0) {
    h = views[ifirst].handler;
    proto.device = views[ifirst].t.device;
    if ((nout > 0 || proto.device.device_type != kDLCPU)
#ifdef Py_GIL_DISABLED
        && !type_outlives_call(st, h->type) /* no shared write (pin_type) */
#endif
    )
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
    const struct fn_batch *bt = f->batch;
    proto.ndim = result_shape_batched(fn, p, argv, bt != NULL ? bt->ndim : 0,
                                      bt != NULL ? bt->shape : NULL, shape);
    proto.data = NULL;
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
      dlb__fn_copy_immutable(fn, f, stream, &nalloc) < 0)
    goto cleanup;
  /* After the copies (made at the argument's own shape): the `...` inputs
   * padded to B's rank */
  if (f->batch != NULL && batch_pad_out_of_line(fn, f) < 0) goto cleanup;
  /* After the copies: what the kernel gets is what is compared (a copy
   * overlaps nothing). */
  if (fn->nmut > 0 && dlb__fn_refuse_overlap(fn, argv, NULL) < 0)
    goto cleanup;

  err.code = DLB_OK;
  err.message[0] = '\0';
  int rc = fn->kernel(argv, nin + nout, stream, &err);
  if ((marked & MARK_WRITTEN) && dlb__fn_tell_written(fn, f, args) < 0) {
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
    result = dlb__fn_hand_back(fn, f, h, nout + f->ncopy);
  }

cleanup:
  for (int i = 0; i < nseen; i++)
    if (state[i] == ARG_VIEW) dlb__view_release(&views[i]);
  for (int o = 0; o < nalloc; o++)
    if (f->outs[o] != NULL) dlb_managed_delete(f->outs[o]);
  while (f->npins > 0) unpin(&f->pins[--f->npins]);
  if (f->batch != NULL) PyMem_Free(f->batch);
#ifdef Py_GIL_DISABLED
  for (int i = 0; i < nin; i++)
    if (f->tpins[i] != NULL && tpin_held(f->tpins[i])) unpin(&f->tpins[i]);
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

PyObject *dlb__fn_vectorcall(PyObject *self, PyObject *const *args,
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
                0, 0, tpins, NULL};
#else
  fn_frame f = {views, scalars, ordered, state, marks, 0, argv, outs, pins,
                0, 0, NULL};
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
