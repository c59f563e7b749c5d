/*
 * torchbits.c -- what a producer's exchange table cannot say about a
 * tensor, asked of the tensor itself: torch's lazy conjugate and negative
 * bits (the table's DLTensor silently drops them: wrong values) and
 * whether it requires grad (dlbridge must not write into it behind
 * autograd's back).  Used wherever a torch-like tensor is read through its
 * table: borrowed views (views.c), from_dlpack (import.c), Function.
 *
 * Asking (is_neg(), is_conj(), requires_grad) costs 25-50 ns a question,
 * more than the rest of reading a Function argument; the answers are two
 * bits and one pointer of torch's TensorImpl, so they are read there, at
 * offsets found once per process by an experiment (below) -- and asked
 * whenever the experiment did not succeed.
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

/* obj.<name>, looked up as Python does but called without a bound method:
 * a C getter or METH_NOARGS method of a C base type is called directly
 * (still 25-50 ns with torch: the fallback when the experiment below did
 * not succeed).  Anything else (a Python override) is called the ordinary
 * way.  1 / 0 for its truth,
 * 0 when the type has no such attribute, -1 with an exception. */
static int ask_bool(PyObject *obj, PyObject *name, int *ran_python) {
  PyTypeObject *type = Py_TYPE(obj);
  PyObject *descr = _PyType_Lookup(type, name); /* borrowed; no exception */
  PyObject *r;
  if (descr == NULL) return 0;
  if (Py_IS_TYPE(descr, &PyMethodDescr_Type) &&
      (((PyMethodDescrObject *)descr)->d_method->ml_flags &
       ~(unsigned)METH_COEXIST) == METH_NOARGS &&
      PyObject_TypeCheck(obj, PyDescr_TYPE(descr))) {
    r = ((PyMethodDescrObject *)descr)->d_method->ml_meth(obj, NULL);
  } else if (Py_IS_TYPE(descr, &PyGetSetDescr_Type) &&
             ((PyGetSetDescrObject *)descr)->d_getset->get != NULL &&
             PyObject_TypeCheck(obj, PyDescr_TYPE(descr))) {
    PyGetSetDef *gs = ((PyGetSetDescrObject *)descr)->d_getset;
    r = gs->get(obj, gs->closure);
  } else {
    *ran_python = 1;
    r = PyObject_GetAttr(obj, name);
    if (r != NULL && PyCallable_Check(r)) Py_SETREF(r, PyObject_CallNoArgs(r));
  }
  /* torch answers directly for torch.Tensor itself (a direct subclass of
   * its C base); for its subclasses it runs __torch_function__, Python. */
  if (type->tp_base != PyDescr_TYPE(descr)) *ran_python = 1;
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
    "set_neg, set_conj = torch._C._set_neg, torch._C._set_conj\n";

static const char *torch_impl_of(const dlb_module_state *st, PyObject *obj) {
  const char *o = (const char *)obj;
  if (st->torch_flag_off >= 0 && o[st->torch_flag_off] != 0) return NULL;
  const char *impl;
  memcpy(&impl, o + st->torch_impl_off, sizeof impl);
  return impl;
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
  st->torch_bits = DLB_TORCH_BITS_ASK; /* unless everything below holds */
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
  Py_INCREF(base);
  Py_XSETREF(st->torch_base, base);
  st->torch_bits = DLB_TORCH_BITS_READ;
  st->torch_found = 1;
  ok = 1;
done:
  /* A failed experiment is not an error: the tensor is asked instead. */
  if (!ok && PyErr_Occurred()) PyErr_Clear();
  Py_XDECREF(cd);
  Py_XDECREF(r);
  Py_XDECREF(g);
  return ok;
}

/* The lazy bits of obj: 1 read from its TensorImpl (*neg, *conj set), 0 to
 * be asked.  The first torch tensor seen runs the experiment (Python). */
static int torch_bits_read(dlb_module_state *st, PyObject *obj, int *neg,
                           int *conj, int *ran_python) {
  if (st->torch_bits == DLB_TORCH_BITS_UNTRIED) {
    /* Only for torch's own base type, and only once torch is imported: the
     * experiment must never import it (nor judge another library). */
    PyObject *descr = _PyType_Lookup(Py_TYPE(obj), st->str_is_neg);
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMethodDescr_Type) ||
        strcmp(PyDescr_TYPE(descr)->tp_name, "torch._C.TensorBase") != 0)
      return 0;
    PyObject *torch = PyImport_GetModule(st->str_torch);
    if (torch == NULL) {
      PyErr_Clear();
      return 0;
    }
    Py_DECREF(torch);
    *ran_python = 1;
    torch_calibrate(st, PyDescr_TYPE(descr), obj);
  }
  /* torch.Tensor itself derives from the base directly: one compare. */
  if (st->torch_bits != DLB_TORCH_BITS_READ ||
      (Py_TYPE(obj)->tp_base != st->torch_base &&
       !PyObject_TypeCheck(obj, st->torch_base)))
    return 0;
  const char *impl = torch_impl_of(st, obj);
  if (impl == NULL) return 0;
  uint64_t key;
  memcpy(&key, impl + st->torch_key_off, sizeof key);
  *neg = (key & st->torch_neg_mask) != 0;
  *conj = (key & st->torch_conj_mask) != 0;
  return 1;
}

/* Whether obj is a torch tensor autograd never touched (its
 * autograd_meta_ is NULL): then it does not require grad. */
static int torch_no_autograd(const dlb_module_state *st, PyObject *obj) {
  if (st->torch_bits != DLB_TORCH_BITS_READ || st->torch_meta_off < 0 ||
      (Py_TYPE(obj)->tp_base != st->torch_base &&
       !PyObject_TypeCheck(obj, st->torch_base)))
    return 0;
  const char *impl = torch_impl_of(st, obj);
  if (impl == NULL) return 0;
  uint64_t meta;
  memcpy(&meta, impl + st->torch_meta_off, sizeof meta);
  return meta == 0;
}

int dlb__bits_free(const dlb_module_state *st, PyObject *obj) {
  return st->torch_bits == DLB_TORCH_BITS_READ &&
         Py_TYPE(obj)->tp_base == st->torch_base &&
         torch_impl_of(st, obj) != NULL;
}

int dlb__check_bits(dlb_module_state *st, PyObject *obj, unsigned options,
                    DLDataType dtype, int *readonly, int *ran_python) {
  int neg = 0, conj = 0;
  if (!torch_bits_read(st, obj, &neg, &conj, ran_python)) {
    neg = ask_bool(obj, st->str_is_neg, ran_python);
    if (neg < 0) return -1;
    /* torch.conj() of a real tensor is the tensor itself: only a complex
     * one can carry the bit, so only one is asked. */
    conj = neg || dtype.code != kDLComplex
               ? 0
               : ask_bool(obj, st->str_is_conj, ran_python);
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
  int grad = ask_bool(obj, st->str_requires_grad, ran_python);
  if (grad < 0) return -1;
  if (grad && (options & DLB_VIEW_WRITABLE)) {
    PyErr_Format(PyExc_BufferError,
                 "the '%.200s' requires grad: writing into it would go behind "
                 "autograd's back; pass .detach() (or a tensor that does not "
                 "require grad) to write into its memory",
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (grad && readonly != NULL) *readonly = 1;
  return 0;
}
