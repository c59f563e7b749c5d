/*
 * function.h -- what the files of dlbridge.Function share (not installed,
 * not part of dlbridge_py.h's layering: a private header of the five
 * function_*.c / function.c files, included after dlbridge_py.h).
 *
 * A Function is six concerns, lowest first in the file map:
 *   function_sig.c   the signature: its parse into the records below, the
 *                    messages of a mismatch with it, its one spelling and
 *                    the identity compiled graphs name it by
 *   function_mut.c   what the reading marked: the refusal of an argument
 *                    that requires grad, the copies a `mut` argument of an
 *                    immutable framework gets, torch's version counters,
 *                    the hand-back of results and new values
 *   function_call.c  the eager call: reading the arguments (borrowed
 *                    views, handler memos), the checks, the kernel
 *   function_ops.c   what graph compilers ask of a Function (src/ops,
 *                    python/dlbridge/_ops_*.py): its records, the kernel
 *                    run without the GIL, the shape function
 *   function_grad.c  its derivatives: the vjp/jvp Functions bound to it by
 *                    name (the core's dlb_signature_bind), what each of
 *                    their parameters receives
 *   function.c       the Python type: construction, load(), attributes
 * This header holds the object, the per-call frame, and the checks against
 * the signature that every caller makes inline.
 */
#ifndef DLB_PYTHON_FUNCTION_H_
#define DLB_PYTHON_FUNCTION_H_

#include "dlbridge_py.h"

/* Parameters and results together (the signature language's limit). */
#define FN_MAX_PARAMS DLB_SIGNATURE_MAX_PARAMS

/* ---- the compiled signature --------------------------------------------------- */

/* The parse of the core (dlb_signature_parse, src/core/signature.c): a
 * parameter is a dtype, a rank and its first dim record; a dim record
 * binds a name, checks a literal, or checks against the (parameter, axis)
 * that bound its name. */
typedef dlb_signature_param fn_param;
typedef dlb_signature_dim fn_dim;
#define DIM_LITERAL DLB_SIGNATURE_DIM_LITERAL
#define DIM_BIND DLB_SIGNATURE_DIM_BIND
#define DIM_CHECK DLB_SIGNATURE_DIM_CHECK

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  dlb_kernel kernel;
  dlb_module_state *st; /* alive as long as our type, which we hold */
  int32_t nin, nout;
  int32_t nmut;         /* `mut` inputs: a call compares their memory with
                           the other inputs' (dlb__fn_refuse_overlap) */
  int32_t nbatch;       /* parameters and results with `...`: 0 means no
                           call has batch dims to broadcast */
  fn_param *params;     /* nin inputs then nout outputs; owns dims too */
  fn_dim *dims;
  /* [nin]: the last handler each input's type had (the common call passes
   * the same types every time) */
  dlb_handler_memo *memos;
  PyObject *name;        /* str */
  char *cname;           /* the name in UTF-8, for messages made without
                            the GIL (dlb__function_run) */
  PyObject *identity;    /* str "<name>_<hash>", made on first use */
  PyObject *signature;   /* str, as given */
  PyObject *param_names; /* tuple of str, the inputs */
  PyObject *sym_names;   /* tuple of str */
  PyObject *owner;       /* keeps the kernel's code alive, or NULL */
  PyObject *result_names; /* tuple of str: each result's label */
  uint64_t named_results; /* bit o: result o was named in the signature */
  PyObject *diff_inputs;  /* tuple of int: the differentiable inputs */
  PyObject *diff_results; /* tuple of int: the differentiable results */
  /* The derivatives (function_grad.c), NULL when not declared: the vjp and
   * jvp Functions, and per derivative parameter what it receives -- a
   * tuple of (kind, index), kind "input", "result", "cotangent" or
   * "tangent" -- and per derivative result the primal input (vjp) or
   * result (jvp) it is the derivative of. */
  PyObject *vjp, *vjp_args, *vjp_results;
  PyObject *jvp, *jvp_args, *jvp_results;
  PyObject *weakreflist;
} fn_object;

static inline PyObject *pname(const fn_object *fn, int i) {
  return PyTuple_GET_ITEM(fn->param_names, i);
}

/* Error paths, kept out of line: inlined they tripled the size of the hot
 * function (see the core's internal.h for the idiom). */
#define DLB__OUT_OF_LINE(ret, name, params) \
  static ret (*const volatile name##_out_of_line) params = name

/* ---- the signature's checks, shared by every caller ---------------------------
 *
 * The eager call (function_call), the compiled calls' shape function
 * (Function._result_specs, at trace time) and their run time
 * (dlb__function_run) check tensors against the signature with these, so
 * a mismatch is found by the same rule everywhere. */

#if defined(__GNUC__)
#define FN_HOT_INLINE __attribute__((always_inline)) inline
#else
#define FN_HOT_INLINE inline
#endif

/* Whether t has parameter p's dtype and rank: exactly its core rank, or
 * (`...`) at least that, the leading axes being batch dims. */
static FN_HOT_INLINE int type_matches(const fn_param *p, const DLTensor *t) {
  return t->dtype.code == p->dtype.code && t->dtype.bits == p->dtype.bits &&
         t->dtype.lanes == p->dtype.lanes &&
         (t->ndim == p->ndim || (p->batch && t->ndim > p->ndim));
}

/* The extent of core axis `axis` of parameter i's tensor t: its core dims
 * are its last params[i].ndim axes. */
static FN_HOT_INLINE int64_t core_extent(const fn_object *fn, int i,
                                         const DLTensor *t, int axis) {
  return t->shape[t->ndim - fn->params[i].ndim + axis];
}

/* The first core axis of t (parameter p, of the right rank) whose extent
 * is not the signature's -- a literal, or the extent of the argument that
 * bound its name (argv[d->from_param], checked before) -- or -1.  Core
 * axes are the last p->ndim (`...` ones lead); the axis returned counts
 * them, so t's extent there is t->shape[t->ndim - p->ndim + axis].  With
 * some_unknown (a constant at each call site), an extent of -1 stands for
 * one not known yet (a compiler's dynamic dimension) and matches
 * anything. */
static FN_HOT_INLINE int dim_mismatch_in(const fn_object *fn,
                                         const fn_param *p, const DLTensor *t,
                                         DLTensor *const *argv,
                                         int some_unknown) {
  const fn_dim *d = &fn->dims[p->dim0];
  const int64_t *shape = t->shape + (t->ndim - p->ndim);
  for (int a = 0; a < p->ndim; a++, d++) {
    if (d->kind == DIM_BIND) continue;
    int64_t want = d->kind == DIM_LITERAL
                       ? d->value
                       : core_extent(fn, d->from_param, argv[d->from_param],
                                     d->from_axis);
    if (some_unknown && (want < 0 || shape[a] < 0)) continue;
    if (shape[a] != want) return a;
  }
  return -1;
}

static FN_HOT_INLINE int dim_mismatch(const fn_object *fn, const fn_param *p,
                                      const DLTensor *t,
                                      DLTensor *const *argv) {
  return dim_mismatch_in(fn, p, t, argv, 0);
}

/* Result p's core extents (p->ndim of them; a `...` result's batch dims
 * go before), from the inputs in argv that bound their names. */
static FN_HOT_INLINE void result_shape(const fn_object *fn, const fn_param *p,
                                       DLTensor *const *argv, int64_t *shape) {
  const fn_dim *d = &fn->dims[p->dim0];
  for (int a = 0; a < p->ndim; a++, d++)
    shape[a] = d->kind == DIM_LITERAL
                   ? d->value
                   : core_extent(fn, d->from_param, argv[d->from_param],
                                 d->from_axis);
}

/* Result p's shape into shape[]: the call's batch shape (nb extents
 * bshape, B; nb 0 at batch rank 0) first for a `...` result, then its
 * core extents.  Returns its rank; the caller made sure it is at most
 * DLB_MAX_NDIM (nb + p->ndim, checked when B was found). */
static FN_HOT_INLINE int result_shape_batched(const fn_object *fn,
                                              const fn_param *p,
                                              DLTensor *const *argv, int nb,
                                              const int64_t *bshape,
                                              int64_t *shape) {
  if (!p->batch) nb = 0;
  for (int k = 0; k < nb; k++) shape[k] = bshape[k];
  result_shape(fn, p, argv, shape + nb);
  return nb + p->ndim;
}

/* The first of argv[0..n) (parameters then results) that has batch dims
 * (more axes than its parameter's core rank), or -1.  The eager call pads
 * and broadcasts batch parts (function_call.c); until the compiled runs
 * do (issue 25), a run that has some is refused rather than handed to a
 * kernel that would see unequal batch ranks and results without them. */
static inline int first_with_batch_dims(const fn_object *fn,
                                        DLTensor *const *argv, int n) {
  for (int i = 0; i < n; i++)
    if (fn->params[i].batch && argv[i] != NULL &&
        argv[i]->ndim > fn->params[i].ndim)
      return i;
  return -1;
}

/* Where an argument is in the call's reading (fn_frame.state). */
enum {
  ARG_PENDING = 0, /* not read yet */
  ARG_SCALAR,      /* a Python number, stored in scalars[i] */
  ARG_BORROWED,    /* a borrowed view (owns nothing): valid only while no
                      Python code runs, taken again if some does */
  ARG_FOREIGN,     /* the same, from an exchange table: not validated yet
                      (the checking pass does) */
  ARG_VIEW,        /* an owning view, safe across Python code; released at
                      the end.  Its handler is not: looked up again before
                      use (resolve_handlers) */
  ARG_UNREAD       /* Python code ran while it was read, before its view
                      was taken: the next pass reads it */
};

/* The per-call arrays.  On the stack for signatures of up to FN_INLINE
 * parameters and results (a dlb_view is ~670 bytes: 64 of them made a
 * 46 KB frame), in one heap block for larger ones. */
#define FN_INLINE 8

/* What the reading found out about an argument (fn_frame.marks). */
enum {
  MARK_AUTOGRAD = 1u << 0, /* a torch tensor autograd may have touched:
                              whether it requires grad is asked in step 3
                              (refuse_grad) */
  MARK_COPY = 1u << 1, /* `mut`, of a framework whose arrays are immutable:
                          the kernel writes a copy, returned as a result */
  MARK_WRITTEN = 1u << 2, /* `mut`, a torch tensor: its version counter
                             moves after the kernel (tell_written) */
  MARK_OWNING = 1u << 3 /* read owning (ARG_VIEW); in fn_frame.marked only */
};

typedef struct {
  dlb_view *views;                 /* [nin] */
  dlb_scalar *scalars;             /* [nin] */
  PyObject **ordered;              /* [nin], keyword calls */
  uint8_t *state;                  /* [nin], ARG_* */
  uint8_t *marks;                  /* [nin], MARK_*, set by each read */
  uint8_t marked;                  /* every mark set in this call (some may
                                      have been read again since): the
                                      fast path looks at nothing else */
  DLTensor **argv;                 /* [nin + nout] */
  /* [nout + copies]: the results, then the copies of MARK_COPY arguments */
  DLManagedTensorVersioned **outs;
  /* [nin + 1]: types held while their handlers are in use (a handler
   * lives as long as its type) */
  PyObject **pins;
  /* In the frame, not locals of function_call, which they would crowd for
   * the sake of the rare calls that use them. */
  int npins;                       /* pins[0..npins) */
  int ncopy;                       /* MARK_COPY arguments */
#ifdef Py_GIL_DISABLED
  /* [nin]: each argument's type, held from its reading to the end of the
   * call.  With a GIL an argument's class changes only when this call runs
   * Python code, which makes it read again; without one, another thread
   * may change it (and drop the last reference to the old class, handler
   * and all) whenever this thread waits for anything -- a lock of
   * CPython's, of a framework's, of ours.  NULL: not read yet. */
  PyObject **tpins;
#endif
  /* A call of a Function with `...` whose batch rank is not 0: its batch
   * shape and the padded headers of its `...` inputs (function_call.c's
   * batch step), one heap block freed at the end of the call; NULL in
   * every other call. */
  struct fn_batch *batch;
} fn_frame;

/* ---- across the files (dlb__fn_: private to the Function's files) ------------ */

/* function_sig.c.  Parse sig into fn (fields params/dims/memos/nin/nout/
 * nmut/nbatch/name/cname/param_names/sym_names/signature): 0, or -1 with ValueError/
 * TypeError/MemoryError. */
int dlb__fn_compile_signature(fn_object *fn, PyObject *sig);
/* The parse of signature text sig (a str) by the core, on the heap
 * (PyMem_Free it); its names point into sig's UTF-8, valid while sig
 * lives.  NULL with ValueError (a caret under the bad byte), TypeError or
 * MemoryError. */
dlb_signature *dlb__fn_parse(PyObject *sig);
/* The signature in one spelling (new reference). */
PyObject *dlb__fn_normalized_signature(const fn_object *fn);
/* What the identity hashes and the registry compares: the normalised
 * signature, then the vjp's and the jvp's when declared (new reference). */
PyObject *dlb__fn_identity_text(const fn_object *fn);
/* The messages of a mismatch with the signature, named as the eager call
 * names them; each returns -1 (NULL) with the exception set. */
void dlb__fn_prefix_error(const fn_object *fn, int i);
/* axis: the core axis (dim_mismatch's), got: t's extent there. */
int dlb__fn_dim_error(const fn_object *fn, int i, int axis, int64_t got,
                      const fn_dim *d, DLTensor *const *argv);
/* The batch parts of a call do not broadcast, or a `mut` input / result
 * is not the whole of them (b from dlb_signature_batch_shape over
 * fn->params and argv): ValueError naming both tensors' batch shapes,
 * -1.  ninputs: argv's inputs (a result is named by its label). */
int dlb__fn_batch_error(const fn_object *fn, const dlb_signature_batch *b,
                        DLTensor *const *argv);
int dlb__fn_check_error(const fn_object *fn, int i, const DLTensor *t,
                        const fn_param *p, const DLTensor *first, int ifirst);
PyObject *dlb__fn_nargs_error(const fn_object *fn, Py_ssize_t nargs);
int dlb__fn_mut_number_error(const fn_object *fn, int i, PyObject *obj);

/* function_mut.c (each off the call's fast path). */
int dlb__fn_tell_written(const fn_object *fn, const fn_frame *f,
                         PyObject *const *args);
/* 0; -1 with an exception; 1: the call needs torch's autograd or forward
 * AD (a Function with derivatives), handed to the torch route. */
int dlb__fn_marked(const fn_object *fn, fn_frame *f, PyObject *const *args);
int dlb__fn_copy_immutable(const fn_object *fn, fn_frame *f, void *stream,
                           int *nalloc);
PyObject *dlb__fn_hand_back(const fn_object *fn, fn_frame *f,
                            const dlb_handler *h, int nres);
/* A `mut` input whose memory overlaps another input's, unless the two are
 * the same view (dlb_tensor_overlap): BufferError naming both, -1.  argv:
 * the nin inputs as the kernel would get them; group: NULL to compare
 * every pair, or [nin] -- a tensor is compared only with those of its
 * group (one storage of a compiler's), none when its group is < 0.  0
 * when none overlaps. */
int dlb__fn_refuse_overlap(const fn_object *fn, DLTensor *const *argv,
                           const int64_t *group);

/* function_call.c: the type's vectorcall. */
PyObject *dlb__fn_vectorcall(PyObject *self, PyObject *const *args,
                             size_t nargsf, PyObject *kwnames);

/* function_grad.c.  The signature of kind (DLB_DERIVATIVE_VJP/JVP) derived
 * from fn's (new reference), or NULL with ValueError. */
PyObject *dlb__fn_derived_signature(const fn_object *fn, int kind);
/* Bind deriv (a Function) as fn's derivative of kind: checked by name
 * against fn's signature; 0, or -1 with ValueError naming the parameter
 * (TypeError when deriv is not a Function). */
int dlb__fn_bind_derivative(fn_object *fn, int kind, PyObject *deriv);

/* function_ops.c: Function._result_specs and Function._refuse_overlap
 * (METH_O methods). */
PyObject *dlb__fn_result_specs(PyObject *self, PyObject *specs);
PyObject *dlb__fn_refuse_overlap_specs(PyObject *self, PyObject *specs);

#endif /* DLB_PYTHON_FUNCTION_H_ */
