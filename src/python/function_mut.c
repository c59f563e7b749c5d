/*
 * function_mut.c -- what the reading of a call's arguments marked
 * (fn_frame.marks, function.h), acted on around the kernel: an argument
 * autograd may have touched (when it requires grad or may carry a
 * tangent: the call goes to torch's autograd, or is refused), a `mut`
 * argument of a framework whose arrays are immutable (the kernel writes a
 * copy, returned after the results), a `mut` torch tensor (its version
 * counter moves after the kernel); and the hand-back of the results and
 * new values.  Off the call's fast path: each runs only when the marks
 * ask for it.
 */
#include "dlbridge_py.h"
#include "function.h"

/* After the kernel ran (or failed: it may have written first): torch counts
 * in-place writes -- autograd's version counters -- so a backward that
 * saved a `mut` torch argument (MARK_WRITTEN) raises instead of using the
 * new values, as after torch's own in-place ops.  0, or -1 with an
 * exception. */
int dlb__fn_tell_written(const fn_object *fn, const fn_frame *f,
                        PyObject *const *args) {
  PyObject *written[FN_MAX_PARAMS];
  int n = 0;
  for (int i = 0; i < fn->nin; i++)
    if (f->marks[i] & MARK_WRITTEN) written[n++] = args[i];
  return n > 0 ? dlb__torch_bump_versions(fn->st, written, n) : 0;
}


/* The arguments autograd may have touched (MARK_AUTOGRAD): one that
 * requires grad, with grad mode on, needs a backward -- the call goes to
 * torch's autograd (1: python/dlbridge/_ops_torch.py applies the
 * Function's autograd.Function, whose backward runs the vjp) when the
 * Function has a vjp, and is refused otherwise (a result with no grad_fn
 * would give a loss using it a silently wrong gradient; the compiled
 * routes raise the same).  With grad mode off (no_grad, inference mode)
 * reading is fine, writing is not.  Forward-mode AD reads these tensors
 * too: while a dual level is entered (torch.autograd.forward_ad,
 * torch.func.jvp) any of them may carry a tangent, which the kernel would
 * drop -- a silently zero tangent -- so the call goes to autograd as well
 * (its jvp, or the refusal of a Function without one).  Each question only
 * when its answer matters: grad mode and the forward-AD level once, before
 * the first read-only argument is asked whether it requires grad (a view
 * of a tensor autograd never touched has autograd metadata, so reads under
 * no_grad ask nothing else).  No Python code runs.  0, 1 (route the call
 * to autograd), or -1 with an exception. */
static int refuse_grad(const fn_object *fn, const fn_frame *f,
                       PyObject *const *args) {
  dlb_module_state *st = fn->st;
  int on = -1; /* grad mode, once asked */
  int fw = -1; /* a forward-AD level, once asked */
  for (int i = 0; i < fn->nin; i++) {
    if (!(f->marks[i] & MARK_AUTOGRAD)) continue;
    if (fw < 0 && (fw = dlb__torch_forward_ad_on(st)) < 0) return -1;
    if (fw) return 1;
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
      /* A `mut` Function never has a vjp (refused when it is made). */
      if (fn->vjp != NULL) return 1;
      PyErr_Format(PyExc_RuntimeError,
                   "%U: dlbridge Function has no backward (declare vjp= to "
                   "differentiate through it)",
                   fn->name);
      return -1;
    }
    dlb__refuse_grad_write(args[i]);
    dlb__fn_prefix_error(fn, i);
    return -1;
  }
  return 0;
}

/* What the marks ask for, before the signature's checks: the refusal of
 * an argument that requires grad, or the hand-over of the call to torch's
 * autograd (refuse_grad); the copies of the MARK_COPY arguments counted
 * (f->ncopy) and their handlers held (f->pins) for the copies'
 * allocation and hand-over.  0, 1 (the call is autograd's: nothing was
 * held), or -1 with an exception. */
int dlb__fn_marked(const fn_object *fn, fn_frame *f, PyObject *const *args) {
  if (f->marked & MARK_AUTOGRAD) {
    int r = refuse_grad(fn, f, args);
    if (r != 0) return r;
  }
  for (int i = 0; i < fn->nin; i++)
    if (f->marks[i] & MARK_COPY) {
      f->ncopy++;
      f->pins[f->npins++] =
          Py_NewRef((PyObject *)f->views[i].handler->type);
    }
  return 0;
}


/* The copies of the MARK_COPY arguments, for the kernel to write: each
 * allocated by its own framework's allocation path, like a result
 * (dlb__alloc_like, with its handler, whose type the caller holds), filled
 * from the argument (on stream for device memory) and put in its place in
 * the kernel's arguments; outs[*nalloc..] receives them, *nalloc counting
 * what is there to free.  0, or -1 with an exception. */
int dlb__fn_copy_immutable(const fn_object *fn, fn_frame *f, void *stream,
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
      dlb__fn_prefix_error(fn, i);
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
PyObject *dlb__fn_hand_back(const fn_object *fn, fn_frame *f,
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


/* Refused, as torch refuses its own in-place ops on partly overlapping
 * arguments: a kernel writing a `mut` argument while it reads another
 * that shares memory sees what it wrote (or not) depending on its order
 * of work -- and a compiler that copies `mut` inputs (torch's
 * functionalisation) gives another answer.  The same view twice (y
 * passed as x and y) is allowed: an elementwise kernel reads each element
 * before it writes it.  The rule is the core's (byte ranges: interleaved
 * views are refused too, docs/function.md). */
int dlb__fn_refuse_overlap(const fn_object *fn, DLTensor *const *argv,
                           const int64_t *group) {
  for (int i = 0; i < fn->nin; i++) {
    if (!fn->params[i].mut || (group != NULL && group[i] < 0)) continue;
    for (int j = 0; j < fn->nin; j++) {
      if (j == i || (group != NULL && group[j] != group[i])) continue;
      int how;
      dlb_error err;
      if (dlb_tensor_overlap(argv[i], argv[j], &how, &err) != DLB_OK) {
        dlb__raise(&err);
        dlb__fn_prefix_error(fn, i);
        return -1;
      }
      if (how != DLB_OVERLAP_PARTIAL) continue;
      PyErr_Format(PyExc_BufferError,
                   "%U() argument '%U' is 'mut' and its memory overlaps "
                   "argument '%U' (not the same view): the kernel would "
                   "write memory it reads; pass a copy of one of them",
                   fn->name, pname(fn, i), pname(fn, j));
      return -1;
    }
  }
  return 0;
}
