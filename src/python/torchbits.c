/*
 * torchbits.c -- what a producer's exchange table cannot say about a
 * tensor, asked of the tensor itself: torch's lazy conjugate and negative
 * bits (the table's DLTensor silently drops them: wrong values) and
 * whether it requires grad (dlbridge must not write into it behind
 * autograd's back).  Used wherever a torch tensor is read through its
 * table: borrowed views (views.c), from_dlpack (import.c), Function.
 *
 * Asking (is_neg(), is_conj(), requires_grad) costs 25-50 ns a question,
 * more than the rest of reading a Function argument; the answers are two
 * bits and one pointer of torch's TensorImpl, so they are read there, at
 * offsets found once per process by an experiment (below) -- and asked
 * whenever the experiment did not succeed.
 *
 * Neither way runs Python code, except the first torch tensor's visit
 * (torch_meet: the experiment, and what asking needs): asking calls the C
 * functions of torch's base type with torch's __torch_function__ handling
 * switched off, so a subclass's override or an active TorchFunctionMode
 * does not run, and the answer is the TensorImpl's -- what the exchange
 * table reads.  That is what lets Function check every tensor again after
 * the last Python code of a call ran (function_call.c).  Only torch tensors
 * (instances of torch._C.TensorBase) are checked: no other framework has
 * these bits.
 */
#include "dlbridge_py.h"

#include <string.h>

#if defined(__GLIBC__)
#include <malloc.h>
#define DLB_HAVE_MALLOC_USABLE_SIZE 1
#else
/* Never called: torch_calibrate gives up first. */
#define malloc_usable_size(p) ((size_t)0 * (size_t)(p != NULL))
#endif

/* descr's C function called on obj directly, with no bound method: a
 * METH_NOARGS or METH_VARARGS method (called with no arguments) or a
 * getter, of a C type obj is an instance of; NULL with an exception.  The
 * descriptors are checked to be of these shapes when they are kept
 * (c_callable).  How the function is reached is pycompat.h's business
 * (descriptor internals, with a public fallback). */
static PyObject *call_c(PyObject *descr, PyObject *obj) {
  return dlb__py_c_descr_call(descr, obj);
}

/* Whether descr (a new reference, consumed) can be called by call_c on
 * instances of type: returned, else NULL (and it is released). */
static PyObject *c_callable(PyObject *descr, PyTypeObject *type) {
  if (descr != NULL && !dlb__py_c_descr_usable(descr, type)) Py_CLEAR(descr);
  return descr;
}

enum { ASK_NEG, ASK_CONJ, ASK_GRAD };

/* torch's answer to a question (ASK_*) about obj, a torch tensor: the C
 * function of torch's base type, called with __torch_function__ switched
 * off (torch._C.DisableTorchFunction's __enter__ and __exit__, C too) --
 * no Python code runs.  A torch without that route is asked the ordinary
 * way (*ran_python set).  1 / 0 for its truth, -1 with an exception. */
static int torch_ask(dlb_module_state *st, PyObject *obj, int question,
                     int *ran_python) {
  PyObject *r;
  if (st->torch_ask[question] != NULL && st->torch_quiet[0] != NULL) {
    PyObject *quiet = st->torch_quiet[0];
    PyObject *on = call_c(st->torch_quiet[1], quiet);
    if (on == NULL) return -1;
    Py_DECREF(on);
    r = call_c(st->torch_ask[question], obj);
    /* Back on whatever the answer: the question's error, if any, kept. */
    dlb__saved_error e;
    if (r == NULL) dlb__error_save(&e);
    PyObject *off = call_c(st->torch_quiet[2], quiet);
    if (off == NULL) PyErr_Clear();
    Py_XDECREF(off);
    if (r == NULL) dlb__error_restore(&e);
  } else {
    PyObject *name = question == ASK_NEG    ? st->str_is_neg
                     : question == ASK_CONJ ? st->str_is_conj
                                            : st->str_requires_grad;
    *ran_python = 1;
    r = PyObject_GetAttr(obj, name);
    if (r != NULL && PyCallable_Check(r)) Py_SETREF(r, PyObject_CallNoArgs(r));
  }
  if (r == NULL) return -1;
  int b = PyObject_IsTrue(r);
  Py_DECREF(r);
  return b;
}

/* Asking a torch tensor is_neg() and is_conj() costs ~50 ns each (torch
 * releases and retakes the GIL in them): three times the rest of a
 * Function argument.  The bits are two bits of the dispatch key set in
 * torch's TensorImpl, so they are read there -- at an offset found by
 * experiment once per process, never assumed:
 *   - the TensorImpl * is the word of the tensor object that equals
 *     tensor._cdata (right after the object header, or after MaybeOwned's
 *     "borrowed" flag, which must then be 0);
 *   - torch._C._set_neg / _set_conj on private sample tensors must flip
 *     exactly one bit of exactly one word of the TensorImpl (its words up
 *     to TORCH_SCAN, within the block malloc gave it -- never past it),
 *     the same word for both, and flip it back;
 *   - fresh neg views, conj views and plain tensors must then read as such;
 *   - requires_grad: torch answers it from TensorImpl's autograd_meta_,
 *     which is NULL for a tensor autograd never touched.  That word is the
 *     only one of a sample to go from 0 to non-zero on requires_grad_();
 *     while it is 0 the tensor does not require grad (asked otherwise).
 * Anything unexpected (another layout, a torch without these functions)
 * leaves torch_bits at DLB_TORCH_BITS_ASK and the tensor is asked, slowly
 * but correctly (a test can force that too: testing.c's _torch_bits_force,
 * so the checks are tested both ways). */
#define TORCH_SCAN 32 /* at most this many words of a TensorImpl looked at */

static const char torch_samples[] =
    "import torch\n"
    "p = torch.zeros(3)\n"
    "c = torch.zeros(3, dtype=torch.complex64)\n"
    "n = torch._neg_view(torch.ones(2))\n"
    "k = torch.ones(2, dtype=torch.complex64).conj()\n"
    "g = torch.ones(2, requires_grad=True)\n"
    "q = torch.zeros(3)\n"
    "set_neg, set_conj = torch._C._set_neg, torch._C._set_conj\n"
    /* functorch's wrappers, made outside any transform (optional) */
    "b = w = None\n"
    "try:\n"
    "    ft = torch._C._functorch\n"
    "    z = torch.zeros(3)\n" /* made outside: inside grad it is wrapped */
    "    lv = ft._vmap_increment_nesting(3, 'error')\n"
    "    try:\n"
    "        b = ft._add_batch_dim(z, 0, lv)\n"
    "    finally:\n"
    "        ft._vmap_decrement_nesting()\n"
    "    lv = ft._grad_increment_nesting()\n"
    "    try:\n"
    "        w = ft._wrap_for_grad(z, lv)\n"
    "    finally:\n"
    "        ft._grad_decrement_nesting()\n"
    "except Exception:\n"
    "    b = w = None\n";

static const char *torch_impl_of(const dlb_module_state *st, PyObject *obj) {
  return dlb__torch_impl(st, obj);
}

/* The mask of the bit flip(obj, True) sets in the key word (which is
 * *key_off, found when -1), 0 when no single bit moved. */
static uint64_t torch_flip(PyObject *flip, PyObject *obj, const char *impl,
                           int *key_off) {
  uint64_t before[TORCH_SCAN], after[TORCH_SCAN], back[TORCH_SCAN];
  /* The TensorImpl is the start of a block of operator new (malloc):
   * nothing past its usable size is read. */
  size_t words = malloc_usable_size((void *)impl) / 8;
  if (words > TORCH_SCAN) words = TORCH_SCAN;
  size_t bytes = words * 8;
  memcpy(before, impl, bytes);
  PyObject *r = PyObject_CallFunctionObjArgs(flip, obj, Py_True, NULL);
  if (r == NULL) return 0;
  Py_DECREF(r);
  memcpy(after, impl, bytes);
  r = PyObject_CallFunctionObjArgs(flip, obj, Py_False, NULL);
  if (r == NULL) return 0;
  Py_DECREF(r);
  memcpy(back, impl, bytes);
  uint64_t mask = 0;
  for (int w = 0; w < (int)words; w++) {
    uint64_t d = before[w] ^ after[w];
    if (d == 0) continue;
    if ((d & (d - 1)) != 0 || back[w] != before[w] || mask != 0) return 0;
    if (*key_off >= 0 && *key_off != w * 8) return 0;
    *key_off = w * 8;
    mask = d;
  }
  return mask;
}

static int torch_calibrate(dlb_module_state *st, PyTypeObject *base,
                           PyObject *obj) {
  PyObject *g = NULL, *r = NULL, *cd = NULL;
  int ok = 0;
  /* Asked, unless everything below holds: other threads ask meanwhile. */
  DLB_FT_STORE_INT(&st->torch_bits, DLB_TORCH_BITS_ASK);
  st->torch_found = 0;
#ifndef DLB_HAVE_MALLOC_USABLE_SIZE
  (void)base;
  (void)obj;
  return 0; /* no way to bound the experiment's reads */
#endif
  g = PyDict_New();
  if (g == NULL ||
      PyDict_SetItemString(g, "__builtins__", PyEval_GetBuiltins()) < 0)
    goto done;
  r = PyRun_String(torch_samples, Py_file_input, g, g);
  if (r == NULL) goto done;
  PyObject *p = PyDict_GetItemString(g, "p"), *c = PyDict_GetItemString(g, "c"),
           *n = PyDict_GetItemString(g, "n"), *k = PyDict_GetItemString(g, "k");
  PyObject *set_neg = PyDict_GetItemString(g, "set_neg"),
           *set_conj = PyDict_GetItemString(g, "set_conj");
  if (!p || !c || !n || !k || !set_neg || !set_conj ||
      !PyObject_TypeCheck(p, base) || !PyObject_TypeCheck(obj, base))
    goto done;
  /* The TensorImpl pointer in the object. */
  cd = PyObject_GetAttrString(p, "_cdata");
  if (cd == NULL) goto done;
  void *want = PyLong_AsVoidPtr(cd);
  if (want == NULL) goto done;
  const char *o = (const char *)p;
  void *w16, *w24;
  memcpy(&w16, o + sizeof(PyObject), sizeof w16);
  memcpy(&w24, o + sizeof(PyObject) + 8, sizeof w24);
  if (w16 == want) {
    st->torch_impl_off = (int)sizeof(PyObject);
    st->torch_flag_off = -1;
  } else if (w24 == want && o[sizeof(PyObject)] == 0) {
    st->torch_impl_off = (int)sizeof(PyObject) + 8;
    st->torch_flag_off = (int)sizeof(PyObject);
  } else {
    goto done;
  }
  /* The key word and the two bits. */
  int key_off = -1;
  const char *ip = torch_impl_of(st, p), *ic = torch_impl_of(st, c);
  if (ip == NULL || ic == NULL) goto done;
  uint64_t neg = torch_flip(set_neg, p, ip, &key_off);
  uint64_t conj = neg ? torch_flip(set_conj, c, ic, &key_off) : 0;
  if (neg == 0 || conj == 0 || neg == conj) goto done;
  st->torch_key_off = key_off;
  st->torch_neg_mask = neg;
  st->torch_conj_mask = conj;
  /* What fresh tensors must read as. */
  uint64_t kp, kc, kn, kk;
  const char *in = torch_impl_of(st, n), *ik = torch_impl_of(st, k);
  if (in == NULL || ik == NULL) goto done;
  memcpy(&kp, ip + key_off, 8);
  memcpy(&kc, ic + key_off, 8);
  memcpy(&kn, in + key_off, 8);
  memcpy(&kk, ik + key_off, 8);
  if ((kp & (neg | conj)) || (kc & (neg | conj)) || (kn & (neg | conj)) != neg ||
      (kk & (neg | conj)) != conj)
    goto done;
  /* autograd_meta_ (optional: without it requires_grad is asked). */
  st->torch_meta_off = -1;
  {
    PyObject *q = PyDict_GetItemString(g, "q"),
             *gt = PyDict_GetItemString(g, "g");
    const char *iq = q ? torch_impl_of(st, q) : NULL,
               *ig = gt ? torch_impl_of(st, gt) : NULL;
    if (iq != NULL && ig != NULL) {
      size_t words = malloc_usable_size((void *)iq) / 8;
      if (words > TORCH_SCAN) words = TORCH_SCAN;
      uint64_t before[TORCH_SCAN], after[TORCH_SCAN];
      memcpy(before, iq, words * 8);
      PyObject *rr = PyObject_CallMethod(q, "requires_grad_", "O", Py_True);
      Py_XDECREF(rr);
      if (rr != NULL) {
        memcpy(after, iq, words * 8);
        int found = -1, many = 0;
        for (int w = 0; w < (int)words; w++)
          if (before[w] == 0 && after[w] != 0) {
            many += found >= 0;
            found = w;
          }
        uint64_t mg, mp;
        if (found >= 0 && !many) {
          memcpy(&mg, ig + found * 8, 8);
          memcpy(&mp, ip + found * 8, 8);
          if (mg != 0 && mp == 0) st->torch_meta_off = found * 8;
        }
      }
      PyErr_Clear();
    }
  }
  /* functorch's wrappers (optional: without the mask a wrapper is found
   * when its read fails, at the cost of torch's C++ exception): the key
   * bits both samples have and no plain sample has, which
   * is_functorch_wrapped_tensor must confirm on both -- a false positive
   * only costs that question, never a wrong answer. */
  st->torch_wrap_mask = 0;
  {
    PyObject *b = PyDict_GetItemString(g, "b"),
             *w = PyDict_GetItemString(g, "w");
    const char *ib = b && b != Py_None && PyObject_TypeCheck(b, base)
                         ? torch_impl_of(st, b) : NULL;
    const char *iw = w && w != Py_None && PyObject_TypeCheck(w, base)
                         ? torch_impl_of(st, w) : NULL;
    if (ib != NULL && iw != NULL && st->torch_wrapped != NULL) {
      uint64_t kb, kw;
      memcpy(&kb, ib + key_off, 8);
      memcpy(&kw, iw + key_off, 8);
      uint64_t plain = kp | kc | kn | kk;
      uint64_t mb = kb & ~plain, mw = kw & ~plain;
      PyObject *rb = PyObject_CallOneArg(st->torch_wrapped, b);
      PyObject *rw = rb ? PyObject_CallOneArg(st->torch_wrapped, w) : NULL;
      if (mb != 0 && mw != 0 && rb == Py_True && rw == Py_True)
        st->torch_wrap_mask = mb | mw;
      Py_XDECREF(rb);
      Py_XDECREF(rw);
      PyErr_Clear();
    }
  }
  st->torch_found = 1;
  /* Last: a thread that reads READ finds the offsets above in place. */
  DLB_FT_STORE_INT(&st->torch_bits, DLB_TORCH_BITS_READ);
  ok = 1;
done:
  /* A failed experiment is not an error: the tensor is asked instead. */
  if (!ok && PyErr_Occurred()) PyErr_Clear();
  Py_XDECREF(cd);
  Py_XDECREF(r);
  Py_XDECREF(g);
  return ok;
}

/* What asking needs, looked up once: TensorBase's descriptors and torch's
 * switch for __torch_function__ (each NULL when torch has no usable one:
 * that question is then asked the ordinary way). */
static void torch_keep_calls(dlb_module_state *st, PyTypeObject *base) {
  PyObject *names[3] = {st->str_is_neg, st->str_is_conj, st->str_requires_grad};
  for (int q = 0; q < 3; q++)
    st->torch_ask[q] = c_callable(PyObject_GetAttr((PyObject *)base, names[q]),
                                  base);
  PyObject *c = PyImport_ImportModule("torch._C"); /* imported with torch */
  PyObject *cls = c ? PyObject_GetAttrString(c, "DisableTorchFunction") : NULL;
  PyObject *quiet = cls && PyType_Check(cls) ? PyObject_CallNoArgs(cls) : NULL;
  if (quiet != NULL) {
    PyObject *on = c_callable(PyObject_GetAttrString(cls, "__enter__"),
                              Py_TYPE(quiet));
    PyObject *off = c_callable(PyObject_GetAttrString(cls, "__exit__"),
                               Py_TYPE(quiet));
    if (on != NULL && off != NULL) {
      st->torch_quiet[0] = Py_NewRef(quiet);
      st->torch_quiet[1] = Py_NewRef(on);
      st->torch_quiet[2] = Py_NewRef(off);
    }
    Py_XDECREF(on);
    Py_XDECREF(off);
  }
  Py_XDECREF(quiet);
  Py_XDECREF(cls);
  /* Grad mode, and the version counters: torch.autograd.graph's public
   * increment_version is a Python wrapper (~0.5 us) around the C function
   * behind it, which is used when there is one. */
  PyObject *torch = PyImport_GetModule(st->str_torch);
  st->torch_grad_enabled =
      torch ? PyObject_GetAttrString(torch, "is_grad_enabled") : NULL;
  PyErr_Clear();
  st->torch_bump = c ? PyObject_GetAttrString(c, "_increment_version") : NULL;
  if (st->torch_bump == NULL) {
    PyErr_Clear();
    PyObject *graph = PyImport_ImportModule("torch.autograd.graph");
    st->torch_bump =
        graph ? PyObject_GetAttrString(graph, "increment_version") : NULL;
    Py_XDECREF(graph);
  }
  /* Forward AD and functorch, for a Function's routing to autograd
   * (function_mut.c): torch.autograd is imported with torch. */
  st->torch_fwad = PyImport_ImportModule("torch.autograd.forward_ad");
  st->torch_fw_level =
      st->torch_fwad ? PyUnicode_InternFromString("_current_level") : NULL;
  if (st->torch_fw_level == NULL) Py_CLEAR(st->torch_fwad);
  PyErr_Clear();
  st->torch_fw_enabled =
      c ? PyObject_GetAttrString(c, "_is_fwd_grad_enabled") : NULL;
  PyErr_Clear();
  PyObject *functorch = c ? PyObject_GetAttrString(c, "_functorch") : NULL;
  PyErr_Clear();
  st->torch_wrapped =
      functorch ? PyObject_GetAttrString(functorch,
                                         "is_functorch_wrapped_tensor")
                : NULL;
  Py_XDECREF(functorch);
  Py_XDECREF(torch);
  Py_XDECREF(c);
  PyErr_Clear(); /* whatever is missing is asked the ordinary way */
}

/* torch._C.TensorBase when it is on type's MRO (a static type of that
 * name: a Python class could call itself so), else NULL. */
static PyTypeObject *torch_base_of(PyTypeObject *type) {
  PyObject *mro = type->tp_mro;
  if (mro == NULL || !PyTuple_Check(mro)) return NULL;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
    PyTypeObject *t = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
    if (PyType_Check(t) && !(t->tp_flags & Py_TPFLAGS_HEAPTYPE) &&
        strcmp(t->tp_name, "torch._C.TensorBase") == 0)
      return t;
  }
  return NULL;
}

/* Whether obj is a torch tensor.  The first one seen meets torch (Python
 * code runs: *ran_python is set): its base type is kept, what asking needs
 * is looked up and the experiment runs.  Only once torch is imported: this
 * never imports it. */
/* Free-threaded builds: the first torch tensor's visit and the experiment
 * run in one thread at a time, under st->torch_lock.  What they run may
 * run Python code that meets a torch tensor again on the same thread: that
 * visit must not wait for itself, and finds the work unfinished instead
 * (its tensor is then asked the ordinary way).  0 when the lock is taken
 * (torch_unlock after), -1 when this thread holds it already. */
static int torch_lock(dlb_module_state *st) {
  /* With a GIL the owner is just "someone": only this thread can run. */
#ifdef Py_GIL_DISABLED
  unsigned long me = PyThread_get_thread_ident();
#else
  unsigned long me = 1;
#endif
  if (DLB_FT_LOAD_ULONG(&st->torch_owner) == me) return -1;
  DLB_FT_MUTEX_LOCK(&st->torch_lock);
  DLB_FT_STORE_ULONG(&st->torch_owner, me);
  return 0;
}

static void torch_unlock(dlb_module_state *st) {
  DLB_FT_STORE_ULONG(&st->torch_owner, 0);
  DLB_FT_MUTEX_UNLOCK(&st->torch_lock);
}

static int is_torch(dlb_module_state *st, PyObject *obj, int *ran_python) {
  /* torch.Tensor itself derives from the base directly: one compare. */
  PyTypeObject *known = DLB_FT_LOAD_PTR(&st->torch_base);
  if (known != NULL)
    return Py_TYPE(obj)->tp_base == known || PyObject_TypeCheck(obj, known);
  PyTypeObject *base = torch_base_of(Py_TYPE(obj));
  if (base == NULL) return 0;
  PyObject *torch = PyImport_GetModule(st->str_torch);
  if (torch == NULL) {
    PyErr_Clear();
    return 0;
  }
  Py_DECREF(torch);
  *ran_python = 1;
  if (torch_lock(st) < 0) return 1; /* this thread is meeting torch already */
  if (st->torch_base == NULL) {
    torch_keep_calls(st, base);
    /* Last: a thread that sees torch_base finds what asking needs. */
    DLB_FT_STORE_PTR(&st->torch_base, Py_NewRef((PyObject *)base));
  }
  torch_unlock(st);
  return 1;
}

/* The lazy bits of obj, a torch tensor: 1 read from its TensorImpl (*neg,
 * *conj set), 0 to be asked. */
static int torch_bits_read(dlb_module_state *st, PyObject *obj, int *neg,
                           int *conj) {
  if (DLB_FT_LOAD_INT(&st->torch_bits) != DLB_TORCH_BITS_READ) return 0;
  const char *impl = torch_impl_of(st, obj);
  if (impl == NULL) return 0;
  uint64_t key;
  memcpy(&key, impl + st->torch_key_off, sizeof key);
  *neg = (key & st->torch_neg_mask) != 0;
  *conj = (key & st->torch_conj_mask) != 0;
  return 1;
}

/* Whether obj, a torch tensor, is one autograd never touched (its
 * autograd_meta_ is NULL): then it does not require grad. */
static int torch_no_autograd(const dlb_module_state *st, PyObject *obj) {
  if (DLB_FT_LOAD_INT(&st->torch_bits) != DLB_TORCH_BITS_READ ||
      st->torch_meta_off < 0)
    return 0;
  const char *impl = torch_impl_of(st, obj);
  if (impl == NULL) return 0;
  uint64_t meta;
  memcpy(&meta, impl + st->torch_meta_off, sizeof meta);
  return meta == 0;
}

int dlb__check_bits(dlb_module_state *st, PyObject *obj, unsigned options,
                    DLDataType dtype, int *readonly, int *ran_python) {
  int neg = 0, conj = 0;
  if (!is_torch(st, obj, ran_python)) return 0;
  if (DLB_FT_LOAD_INT(&st->torch_bits) == DLB_TORCH_BITS_UNTRIED) {
    *ran_python = 1;
    PyTypeObject *base = DLB_FT_LOAD_PTR(&st->torch_base);
    if (base != NULL && torch_lock(st) == 0) {
      if (st->torch_bits == DLB_TORCH_BITS_UNTRIED)
        torch_calibrate(st, base, obj);
      torch_unlock(st);
    }
  }
  if (!torch_bits_read(st, obj, &neg, &conj)) {
    neg = torch_ask(st, obj, ASK_NEG, ran_python);
    if (neg < 0) return -1;
    /* torch.conj() of a real tensor is the tensor itself: only a complex
     * one can carry the bit, so only one is asked. */
    conj = neg || dtype.code != kDLComplex
               ? 0
               : torch_ask(st, obj, ASK_CONJ, ran_python);
    if (conj < 0) return -1;
  }
  if (neg || conj) {
    PyErr_Format(PyExc_BufferError,
                 "the '%.200s' has its lazy %s bit set, which DLPack cannot "
                 "describe (its exchange table would drop it and give wrong "
                 "values); call .resolve_conj() / .resolve_neg() first",
                 Py_TYPE(obj)->tp_name, neg ? "negative" : "conjugate");
    return -1;
  }
  /* Only asked when it matters: a write, or a caller keeping the flag
   * (readonly != NULL); a borrowed read for one call does not care. */
  if (readonly == NULL && !(options & DLB_VIEW_WRITABLE)) return 0;
  if (torch_no_autograd(st, obj)) return 0;
  int grad = torch_ask(st, obj, ASK_GRAD, ran_python);
  if (grad < 0) return -1;
  if (grad && (options & DLB_VIEW_WRITABLE)) return dlb__refuse_grad_write(obj);
  if (grad && readonly != NULL) *readonly = 1;
  return 0;
}

int dlb__torch_requires_grad(dlb_module_state *st, PyObject *obj) {
  int unused = 0;
  if (torch_no_autograd(st, obj)) return 0;
  return torch_ask(st, obj, ASK_GRAD, &unused);
}

int dlb__refuse_grad_write(PyObject *obj) {
  PyErr_Format(PyExc_BufferError,
               "the '%.200s' requires grad: writing into it would go behind "
               "autograd's back; pass .detach() (or a tensor that does not "
               "require grad) to write into its memory",
               Py_TYPE(obj)->tp_name);
  return -1;
}

/* ---- grad mode and version counters ------------------------------------------ */

int dlb__torch_grad_enabled(dlb_module_state *st) {
  if (st->torch_grad_enabled == NULL) {
    PyErr_SetString(PyExc_RuntimeError,
                    "dlbridge cannot ask torch whether grad mode is on "
                    "(torch.is_grad_enabled is missing)");
    return -1;
  }
  PyObject *r = PyObject_CallNoArgs(st->torch_grad_enabled);
  if (r == NULL) return -1;
  int on = PyObject_IsTrue(r);
  Py_DECREF(r);
  return on;
}

/* ---- forward AD and functorch ------------------------------------------------- */

int dlb__torch_forward_ad_on(dlb_module_state *st) {
  if (st->torch_fwad == NULL) return 0; /* a torch without forward AD */
  /* forward_ad keeps the level it entered in a module global (-1: none);
   * torch.func.jvp enters one too. */
  PyObject *level = PyObject_GetAttr(st->torch_fwad, st->torch_fw_level);
  if (level == NULL) {
    PyErr_Clear();
    return 0;
  }
  long lv = PyLong_Check(level) ? PyLong_AsLong(level) : -1;
  Py_DECREF(level);
  if (lv == -1 && PyErr_Occurred()) return -1;
  if (lv < 0) return 0;
  if (st->torch_fw_enabled == NULL) return 1;
  PyObject *r = PyObject_CallNoArgs(st->torch_fw_enabled);
  if (r == NULL) return -1;
  int on = PyObject_IsTrue(r);
  Py_DECREF(r);
  return on;
}

int dlb__torch_functorch_wrapped(dlb_module_state *st, PyObject *obj) {
  dlb__saved_error e;
  dlb__error_save(&e);
  /* The first torch tensor dlbridge sees may be a transform's (torch.vmap
   * of a Function before any eager call): its failed read is then what
   * meets torch, which finds is_functorch_wrapped_tensor.  Python code
   * runs, with the read's error kept aside; the caller hands the call
   * over either way or raises that error. */
  int ran = 0;
  if (!is_torch(st, obj, &ran) || st->torch_wrapped == NULL) {
    PyErr_Clear();
    dlb__error_restore(&e);
    return 0;
  }
  PyErr_Clear();
  PyObject *r = PyObject_CallOneArg(st->torch_wrapped, obj);
  int wrapped = r != NULL && PyObject_IsTrue(r) == 1;
  Py_XDECREF(r);
  PyErr_Clear();
  if (wrapped) {
    dlb__error_discard(&e); /* not an error: the call is functorch's */
    return 1;
  }
  dlb__error_restore(&e);
  return 0;
}

int dlb__torch_bump_versions(dlb_module_state *st, PyObject *const *objs,
                             int n) {
  int ntorch = 0, unused = 0;
  for (int i = 0; i < n; i++) ntorch += is_torch(st, objs[i], &unused);
  if (ntorch == 0) return 0;
  if (st->torch_bump == NULL) {
    PyErr_SetString(PyExc_RuntimeError,
                    "dlbridge cannot tell autograd about an in-place write "
                    "(torch.autograd.graph.increment_version is missing)");
    return -1;
  }
  PyObject *written = PyTuple_New(ntorch);
  if (written == NULL) return -1;
  for (int i = 0, k = 0; i < n; i++)
    if (is_torch(st, objs[i], &unused))
      PyTuple_SET_ITEM(written, k++, Py_NewRef(objs[i]));
  PyObject *r = PyObject_CallOneArg(st->torch_bump, written);
  Py_DECREF(written);
  if (r == NULL) return -1;
  Py_DECREF(r);
  return 0;
}

int dlb__torch_traverse(dlb_module_state *st, visitproc visit, void *arg) {
  Py_VISIT(st->torch_base);
  for (int i = 0; i < 3; i++) {
    Py_VISIT(st->torch_ask[i]);
    Py_VISIT(st->torch_quiet[i]);
  }
  Py_VISIT(st->torch_grad_enabled);
  Py_VISIT(st->torch_bump);
  Py_VISIT(st->torch_fwad);
  Py_VISIT(st->torch_fw_enabled);
  Py_VISIT(st->torch_wrapped);
  Py_VISIT(st->torch_fw_level);
  return 0;
}

void dlb__torch_clear(dlb_module_state *st) {
  Py_CLEAR(st->torch_base);
  for (int i = 0; i < 3; i++) {
    Py_CLEAR(st->torch_ask[i]);
    Py_CLEAR(st->torch_quiet[i]);
  }
  Py_CLEAR(st->torch_grad_enabled);
  Py_CLEAR(st->torch_bump);
  Py_CLEAR(st->torch_fwad);
  Py_CLEAR(st->torch_fw_enabled);
  Py_CLEAR(st->torch_wrapped);
  Py_CLEAR(st->torch_fw_level);
  DLB_FT_STORE_INT(&st->torch_bits, DLB_TORCH_BITS_UNTRIED);
  st->torch_found = 0;
}
