/*
 * pycompat.h -- what differs between the CPython versions and builds
 * dlbridge._core supports (3.11+, with or without the GIL), in one place.
 *
 * 1. Private CPython API.  Every use of a private (underscore) CPython name
 *    in the extension is here, behind a function of ours, each with a
 *    public fallback; scripts/check-layering refuses `_Py[A-Z]...` anywhere
 *    else in src/python and src/ops.  Building with DLB_PYCOMPAT_PUBLIC_ONLY
 *    defined (meson -Dpycompat_public_only=true; `make test-pycompat`) uses
 *    the public fallbacks everywhere, so they are tested and ready for a
 *    CPython that renames or removes the private names.  Each function
 *    says what it uses on each version and, on a "3.14/3.15:" line, what
 *    those versions' headers say of it (checked against sid's 3.14.10 and
 *    3.15.2 -dev packages and the free-threaded 3.13.5t build; the table
 *    is in docs/python-versions.md).  A CPython newer than the last one
 *    checked (DLB_PYCOMPAT_CHECKED_BELOW) gets the public fallbacks.
 *
 * 2. Strong references from shared containers: the *Ref functions of 3.13
 *    (PyDict_GetItemRef, ...), with the borrow-then-incref fallback 3.11 and
 *    3.12 allow -- those have a GIL, so nothing runs between the two.
 *
 * 3. Free threading.  On a free-threaded build (Py_GIL_DISABLED) caches
 *    shared by threads are published with C11 atomics and filled under a
 *    PyMutex; on a GIL build the same calls compile to plain loads and
 *    stores and the locks to nothing, so the GIL build's code is what it
 *    was.  The atomics act on plain fields through a cast to _Atomic, as
 *    CPython's own pyatomic_std.h does: the fields keep their types, and
 *    code that only ever runs with the GIL reads them directly.
 */
#ifndef DLB_PYTHON_PYCOMPAT_H_
#define DLB_PYTHON_PYCOMPAT_H_

#ifndef PY_SSIZE_T_CLEAN
#define PY_SSIZE_T_CLEAN
#endif
#include <Python.h>

#include <stdint.h>
#ifdef Py_GIL_DISABLED
#include <stdatomic.h>
#endif

/* Private and unstable names are used only where they are known to exist:
 * before the version that made them public, not when the public fallbacks
 * are forced, and not on a CPython newer than the last one whose headers
 * were checked for them (the first version not checked: raise it after
 * checking the next one's headers and adding its line to each function
 * below).  Such a CPython builds with the fallbacks -- a rename or a
 * removal there cannot break the build -- and runs what `make
 * test-pycompat` tests. */
#define DLB_PYCOMPAT_CHECKED_BELOW 0x03100000 /* 3.16: checked up to 3.15 */
#if defined(DLB_PYCOMPAT_PUBLIC_ONLY) || PY_VERSION_HEX >= DLB_PYCOMPAT_CHECKED_BELOW
#define DLB_PYCOMPAT_PRIVATE 0
#else
#define DLB_PYCOMPAT_PRIVATE 1
#endif

/* ---- 1. private API, each with its public fallback --------------------------- */

/* Whether the calling thread has an attached thread state (holds the GIL
 * of the interpreter it belongs to), asked without the fatal error that
 * PyThreadState_Get() raises when there is none.
 *   3.13+: PyThreadState_GetUnchecked (public; the thread state is
 *          thread-local and non-NULL only while attached).
 *   3.12:  _PyThreadState_UncheckedGet (the same, private).
 *   3.11:  _PyThreadState_UncheckedGet is the process-wide GIL holder: it is
 *          this thread's only when it equals this thread's own state.
 *   Public fallback before 3.13: PyGILState_Check().  Weaker: on 3.11 it
 *   answers 1 for every thread once a sub-interpreter was made (dlbridge
 *   refuses to be imported in one, but another module may make one).
 *   3.14/3.15: PyThreadState_GetUnchecked unchanged (pystate.h);
 *   _PyThreadState_UncheckedGet is a Py_DEPRECATED(3.14) inline alias of
 *   it there (not used: -Werror would refuse it). */
static inline int dlb__py_attached(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyThreadState_GetUnchecked() != NULL;
#elif DLB_PYCOMPAT_PRIVATE && PY_VERSION_HEX >= 0x030C0000
  return _PyThreadState_UncheckedGet() != NULL;
#elif DLB_PYCOMPAT_PRIVATE
  PyThreadState *ts = _PyThreadState_UncheckedGet();
  return ts != NULL && ts == PyGILState_GetThisThreadState();
#else
  return PyGILState_Check();
#endif
}

/* Whether the interpreter is finalizing (or already gone).
 *   3.13+: Py_IsFinalizing (public).
 *   3.11/3.12: _Py_IsFinalizing (private).
 *   Public fallback: !Py_IsInitialized().  Py_FinalizeEx clears
 *   "initialized" at the moment it marks the runtime finalizing, after the
 *   threading module's shutdown, so the two answers differ only for a
 *   process that never initialised Python at all (where both mean "do not
 *   touch Python").
 *   3.14/3.15: Py_IsFinalizing unchanged (pylifecycle.h); _Py_IsFinalizing
 *   is gone from their headers (as from 3.13's). */
static inline int dlb__py_finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#elif DLB_PYCOMPAT_PRIVATE
  return !Py_IsInitialized() || _Py_IsFinalizing();
#else
  return !Py_IsInitialized();
#endif
}

/* Look up an attribute that may be missing: 1 found (*out a new
 * reference), 0 missing (no exception), -1 error.
 *   3.13+: PyObject_GetOptionalAttr (public).
 *   3.11/3.12: _PyObject_LookupAttr (private; the same function): it does
 *   not create the AttributeError of a miss, which matters because most
 *   objects miss several of the attributes dlbridge probes.
 *   Public fallback: PyObject_GetAttr, an AttributeError cleared.
 *   3.14/3.15: PyObject_GetOptionalAttr unchanged (abstract.h);
 *   _PyObject_LookupAttr is gone from their headers (as from 3.13's). */
static inline int dlb__py_get_optional_attr(PyObject *obj, PyObject *name,
                                            PyObject **out) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyObject_GetOptionalAttr(obj, name, out);
#elif DLB_PYCOMPAT_PRIVATE
  return _PyObject_LookupAttr(obj, name, out);
#else
  *out = PyObject_GetAttr(obj, name);
  if (*out != NULL) return 1;
  if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
  PyErr_Clear();
  return 0;
#endif
}

/* name (an interned str) looked up through type's MRO, as Python looks up
 * special methods: the metaclass is not consulted and no descriptor is
 * bound.  A new reference, or NULL when no class on the MRO defines it; no
 * exception either way (as the private functions behave).
 *   3.13+: _PyType_LookupRef: a strong reference, which a free-threaded
 *          build needs (another thread may replace the attribute and free
 *          what a borrowed answer pointed at).
 *   3.11/3.12: _PyType_Lookup, borrowed, taken at once (GIL builds only:
 *          nothing can run between the lookup and the INCREF).
 *   Public fallback: the same walk by hand -- type.__mro__ (a new
 *   reference to the tuple, which a concurrent __bases__ assignment may
 *   replace) and each class's own dict (PyType_GetDict on 3.12+, tp_dict
 *   on 3.11), looked up with a strong reference.  Slower (no method
 *   cache), same answers.
 *   3.14/3.15: _PyType_LookupRef still private and unchanged
 *   (cpython/object.h, same signature, not deprecated), and neither has a
 *   public replacement: PyObject_GetOptionalAttr on the type consults the
 *   metaclass and binds descriptors.  _PyType_Lookup is still there too,
 *   borrowed: used only before 3.13, where no build is free-threaded.
 *   PyType_GetDict unchanged. */
static inline PyObject *dlb__py_type_lookup(PyTypeObject *type,
                                            PyObject *name) {
#if DLB_PYCOMPAT_PRIVATE && PY_VERSION_HEX >= 0x030D0000
  return _PyType_LookupRef(type, name);
#elif DLB_PYCOMPAT_PRIVATE
  return Py_XNewRef(_PyType_Lookup(type, name));
#else
  PyObject *found = NULL, *mro = NULL;
  /* An interned name: a plain str made here would cost CPython a lasting
   * allocation per distinct type asked (seen on 3.11). */
  PyObject *mro_name = PyUnicode_InternFromString("__mro__");
  if (mro_name != NULL) {
    mro = PyObject_GetAttr((PyObject *)type, mro_name);
    Py_DECREF(mro_name);
  }
  if (mro == NULL || !PyTuple_Check(mro)) {
    Py_XDECREF(mro);
    PyErr_Clear();
    return NULL;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro) && found == NULL; i++) {
    PyObject *base = PyTuple_GET_ITEM(mro, i); /* the tuple is immutable */
    if (!PyType_Check(base)) continue;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *dict = PyType_GetDict((PyTypeObject *)base);
#else
    PyObject *dict = Py_XNewRef(((PyTypeObject *)base)->tp_dict);
#endif
    if (dict == NULL) continue;
#if PY_VERSION_HEX >= 0x030D0000
    if (PyDict_GetItemRef(dict, name, &found) < 0) found = NULL;
#else
    found = Py_XNewRef(PyDict_GetItemWithError(dict, name));
#endif
    Py_DECREF(dict);
  }
  Py_DECREF(mro);
  PyErr_Clear();
  return found;
#endif
}

/* Give type a version tag if it has none; 1 when it has one, 0 when
 * CPython will not tag it (after very many modifications).
 *   3.12+: PyUnstable_Type_AssignVersionTag (public, unstable tier: it
 *          may change in any minor release).
 *   3.11:  a _PyType_Lookup of an interned name tags the type through the
 *          method cache (3.11 has no call for it).
 *   Public fallback: an attribute lookup on the type of an interned name
 *   that no metaclass defines (probe) does the same _PyType_Lookup inside
 *   type.__getattribute__ (its AttributeError cleared); whether a tag came
 *   of it is Py_TPFLAGS_VALID_VERSION_TAG on 3.11, a non-zero
 *   tp_version_tag on 3.12+ (where that flag is "Unused. Legacy flag").
 *   3.14/3.15: PyUnstable_Type_AssignVersionTag unchanged
 *   (cpython/object.h); tp_version_tag still an unsigned int, 0 meaning
 *   none ("the cache is invalid"); free-threaded builds write it
 *   atomically, so it is read with an atomic load (DLB_FT_LOAD_UINT). */
static inline int dlb__py_type_tag(PyTypeObject *type, PyObject *probe) {
#if DLB_PYCOMPAT_PRIVATE && PY_VERSION_HEX >= 0x030C0000
  (void)probe;
  return PyUnstable_Type_AssignVersionTag(type);
#else
#if DLB_PYCOMPAT_PRIVATE
  (void)_PyType_Lookup(type, probe);
#else
  PyObject *r = PyObject_GetAttr((PyObject *)type, probe);
  Py_XDECREF(r);
  PyErr_Clear();
#endif
#if PY_VERSION_HEX >= 0x030C0000
#ifdef Py_GIL_DISABLED
  return atomic_load_explicit((_Atomic(unsigned int) *)&type->tp_version_tag,
                              memory_order_relaxed) != 0;
#else
  return type->tp_version_tag != 0;
#endif
#else
  return PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG);
#endif
#endif
}

/* A C function of a C type, called on obj without a bound method: descr
 * is a getset descriptor (its getter) or a method descriptor of a
 * METH_NOARGS or METH_VARARGS method (called with no arguments), found on
 * a base of obj's type (dlb__py_c_descr_usable said so).
 *   Private: the C function read out of the descriptor's PyGetSetDef /
 *   PyMethodDef (the "cpython/descrobject.h" structs) and called
 *   directly: no argument tuple, no vectorcall dispatch.
 *   Public fallback: the descriptor's own tp_descr_get for a getter (the
 *   type slot every descriptor has), a vectorcall of the method
 *   descriptor with obj as self otherwise -- the same C function, reached
 *   through the descriptor protocol.  NULL with an exception.
 *   3.14/3.15: cpython/descrobject.h is byte for byte 3.13's
 *   (PyDescrObject's d_type, PyMethodDescrObject's d_method,
 *   PyGetSetDescrObject's d_getset, PyDescr_TYPE), and a descriptor's
 *   fields are set once when it is made, so reading them takes no lock on
 *   a free-threaded build.  No public call reads a method's ml_flags or
 *   calls its C function without a bound method.  Exercised on every
 *   interpreter with a stand-in C type (test_pycompat.py's torch-like
 *   tests; torch itself is on 3.11 only). */
static inline PyObject *dlb__py_c_descr_call(PyObject *descr, PyObject *obj) {
#if DLB_PYCOMPAT_PRIVATE
  if (Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
    PyGetSetDef *gs = ((PyGetSetDescrObject *)descr)->d_getset;
    return gs->get(obj, gs->closure);
  }
  PyMethodDef *m = ((PyMethodDescrObject *)descr)->d_method;
  if ((m->ml_flags & ~(unsigned)METH_COEXIST) == METH_NOARGS)
    return m->ml_meth(obj, NULL);
  PyObject *none = PyTuple_New(0); /* the shared empty tuple */
  if (none == NULL) return NULL;
  PyObject *r = m->ml_meth(obj, none);
  Py_DECREF(none);
  return r;
#else
  if (Py_IS_TYPE(descr, &PyGetSetDescr_Type))
    return Py_TYPE(descr)->tp_descr_get(descr, obj, (PyObject *)Py_TYPE(obj));
  return PyObject_CallOneArg(descr, obj);
#endif
}

/* Whether descr (a getset or method descriptor) can be called by
 * dlb__py_c_descr_call on instances of type: a getter, or a method taking
 * no arguments (METH_NOARGS or METH_VARARGS), defined by a base of type.
 *   Private: the descriptor's PyGetSetDef / PyMethodDef and d_type read.
 *   Public fallback: the descriptor's type and its __objclass__ (the
 *   class that defined it).  How many arguments a method takes cannot be
 *   read publicly: one that needs some fails when called, as an error of
 *   the call (torch's, the only user, takes none). */
static inline int dlb__py_c_descr_usable(PyObject *descr, PyTypeObject *type) {
#if DLB_PYCOMPAT_PRIVATE
  if (Py_IS_TYPE(descr, &PyGetSetDescr_Type))
    return ((PyGetSetDescrObject *)descr)->d_getset->get != NULL &&
           PyType_IsSubtype(type, PyDescr_TYPE(descr));
  if (Py_IS_TYPE(descr, &PyMethodDescr_Type)) {
    unsigned flags = (unsigned)((PyMethodDescrObject *)descr)->d_method->ml_flags &
                     ~(unsigned)METH_COEXIST;
    return (flags == METH_NOARGS || flags == METH_VARARGS) &&
           PyType_IsSubtype(type, PyDescr_TYPE(descr));
  }
  return 0;
#else
  if (!Py_IS_TYPE(descr, &PyGetSetDescr_Type) &&
      !Py_IS_TYPE(descr, &PyMethodDescr_Type))
    return 0;
  PyObject *owner = PyObject_GetAttrString(descr, "__objclass__");
  int ok = owner != NULL && PyType_Check(owner) &&
           PyType_IsSubtype(type, (PyTypeObject *)owner);
  Py_XDECREF(owner);
  PyErr_Clear();
  return ok;
#endif
}

/* Not here, being the full (non-limited) API rather than private names:
 * the other files read PyTypeObject fields (tp_mro, tp_version_tag,
 * tp_flags, tp_base, tp_basicsize, tp_as_buffer, tp_vectorcall, tp_name,
 * tp_alloc/tp_free, and tp_dict of dlbridge's own types at creation) and
 * use sizeof(PyObject) for the object header, never a fixed size (it is
 * larger on free-threaded builds).
 *   3.14/3.15: every one of those fields is still there with its type;
 *   3.14 added tp_versions_used, 3.15 _tp_iteritem after them.  One
 *   free-threading caveat, unchanged: tp_mro is read borrowed
 *   (handlers.c, types.c, torchbits.c), and a concurrent assignment to the
 *   class's __bases__ replaces it and drops the old tuple at once (3.13t's
 *   typeobject.c; 3.14t's source is not served here), with no public
 *   strong getter but type.__mro__ -- and 3.13t's own PyType_IsSubtype
 *   walks a->tp_mro borrowed the same way, so every PyObject_TypeCheck
 *   has that exposure already; these walks (miss paths) add none.  The
 *   trashcan macros are not used: 3.14 and 3.15 define Py_TRASHCAN_BEGIN/END empty (the trashcan moved
 *   into _Py_Dealloc and bounds by C stack left, not by depth); tensor.c
 *   bounds its own chains (its comment on destruction). */

/* ---- 2. strong references from containers another thread may change ----------- */

/* 3.14/3.15: PyDict_GetItemRef, PyDict_GetItemStringRef and
 * PyDict_SetDefaultRef unchanged (public since 3.13). */

/* PyDict_GetItemRef: 1 found (*out new reference), 0 missing, -1 error. */
static inline int dlb__dict_get_ref(PyObject *dict, PyObject *key,
                                    PyObject **out) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyDict_GetItemRef(dict, key, out);
#else
  *out = Py_XNewRef(PyDict_GetItemWithError(dict, key));
  if (*out != NULL) return 1;
  return PyErr_Occurred() ? -1 : 0;
#endif
}

/* PyDict_GetItemStringRef: the same with a C string key.  Unlike
 * PyDict_GetItemString it reports a failure to make the key. */
static inline int dlb__dict_get_string_ref(PyObject *dict, const char *key,
                                           PyObject **out) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyDict_GetItemStringRef(dict, key, out);
#else
  PyObject *k = PyUnicode_FromString(key);
  if (k == NULL) {
    *out = NULL;
    return -1;
  }
  int rc = dlb__dict_get_ref(dict, k, out);
  Py_DECREF(k);
  return rc;
#endif
}

/* PyDict_SetDefaultRef: *out is a new reference to the value now in the
 * dict under key (value, or what another thread put there first); 0 when
 * value was inserted, 1 when one was there, -1 error. */
static inline int dlb__dict_setdefault_ref(PyObject *dict, PyObject *key,
                                           PyObject *value, PyObject **out) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyDict_SetDefaultRef(dict, key, value, out);
#else
  PyObject *cur = PyDict_GetItemWithError(dict, key);
  if (cur != NULL) {
    *out = Py_NewRef(cur);
    return 1;
  }
  if (PyErr_Occurred() || PyDict_SetItem(dict, key, value) < 0) {
    *out = NULL;
    return -1;
  }
  *out = Py_NewRef(value);
  return 0;
#endif
}

/* ---- 3. free threading: atomics and a lock that cost nothing with a GIL ------- */

/* Make op immortal on a free-threaded build: its reference count is never
 * written again (Py_INCREF and Py_DECREF of it are a load and a compare),
 * so threads that all use it do not fight over its cache line -- and it is
 * never freed.  For objects shared by every thread for the life of the
 * process (dlbridge's types on 3.13, its cached DType objects); CPython
 * 3.13t does the same to its own functions, classes and code objects once
 * a second thread starts (gh-117783).  op must be new, made by the calling
 * thread (which owns its reference count), and not yet seen by any other.
 * The collector untracks an immortal object at its next pass.  Nothing on
 * GIL builds.
 *   3.15+: PyUnstable_SetImmortal (public, unstable tier).
 *   3.13/3.14: Py_SET_REFCNT past UINT32_MAX on an object the calling
 *   thread owns, which those versions' object.h / refcount.h define as
 *   "On overflow, make the object immortal" (public). */
static inline void dlb__ft_immortalize(PyObject *op) {
#if defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030F0000
  (void)PyUnstable_SetImmortal(op);
#elif defined(Py_GIL_DISABLED)
  Py_SET_REFCNT(op, (Py_ssize_t)UINT32_MAX + 1);
#else
  (void)op;
#endif
}

/* Give op -- a new garbage-collected object of ours that the program keeps
 * for long and calls from many threads, as it does its functions (a
 * dlbridge.Function) -- the reference counting a free-threaded CPython
 * gives its own module-level functions, so that threads calling it do not
 * all write its reference count: every call's load of the callee (3.13's
 * LOAD_FAST / LOAD_GLOBAL) takes and drops a reference, atomically on one
 * shared counter from any thread that does not own op.  Such an object is
 * then freed by the collector, not at its last Py_DECREF, and on 3.13 once
 * a second thread has started it is never freed, as CPython's own are
 * there.  op must be made by the calling thread and seen by no other yet;
 * witness is our module object, which CPython marks the same way.  Nothing
 * on GIL builds.
 *   3.14+: PyUnstable_Object_EnableDeferredRefcount (public, unstable tier;
 *   3.14's interpreter does not count its frames' references to such an
 *   object).
 *   3.13: what CPython's _PyObject_SetDeferredRefcount does (a hidden
 *   symbol, not callable from an extension): the deferred mark
 *   (_PyGC_BITS_DEFERRED, 64, in ob_gc_bits) with the one extra local
 *   reference it stands for and the shared count marked queued; the sweep
 *   the first non-main thread's start runs (_PyGC_ImmortalizeDeferredObjects,
 *   gh-117783) makes every marked object immortal.  Once that sweep has run
 *   -- the witness, marked by CPython, is immortal then -- op is made
 *   immortal at once, as CPython does to what it marks after the sweep.
 *   3.14/3.15: 3.13's internals are not used there.  Public fallback on
 *   3.13 (DLB_PYCOMPAT_PUBLIC_ONLY): nothing (each call writes the shared
 *   count, as before). */
static inline void dlb__ft_defer_refcount(PyObject *op, PyObject *witness) {
#if defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030E0000
  (void)witness;
  (void)PyUnstable_Object_EnableDeferredRefcount(op);
#elif defined(Py_GIL_DISABLED) && DLB_PYCOMPAT_PRIVATE
  /* Only an object this thread owns, untouched by any other, not already
   * immortal or marked (a Function given as another's vjp is marked once),
   * and tracked: the sweep and the collector only see tracked ones. */
  if (!_Py_IsOwnedByCurrentThread(op) || _Py_IsImmortal(op) ||
      (op->ob_gc_bits & 64) != 0 || op->ob_ref_shared != 0 ||
      !PyObject_GC_IsTracked(op))
    return;
  if (_Py_IsImmortal(witness)) {
    dlb__ft_immortalize(op);
    return;
  }
  op->ob_gc_bits |= 64;
  op->ob_ref_local += 1;
  op->ob_ref_shared = _Py_REF_QUEUED;
#else
  (void)op;
  (void)witness;
#endif
}


#ifdef Py_GIL_DISABLED
#include <stdatomic.h>
#define DLB__A(type, p) ((_Atomic(type) *)(p))
#define DLB_FT_LOAD_PTR(p) \
  atomic_load_explicit(DLB__A(void *, (void *)(p)), memory_order_acquire)
#define DLB_FT_STORE_PTR(p, v) \
  atomic_store_explicit(DLB__A(void *, (void *)(p)), (void *)(v), \
                        memory_order_release)
#define DLB_FT_LOAD_U64(p) \
  atomic_load_explicit(DLB__A(uint64_t, p), memory_order_acquire)
#define DLB_FT_STORE_U64(p, v) \
  atomic_store_explicit(DLB__A(uint64_t, p), (v), memory_order_release)
#define DLB_FT_ADD_U64(p, v) \
  ((void)atomic_fetch_add_explicit(DLB__A(uint64_t, p), (v), \
                                   memory_order_acq_rel))
#define DLB_FT_LOAD_UINT(p) \
  atomic_load_explicit(DLB__A(unsigned int, p), memory_order_relaxed)
#define DLB_FT_LOAD_INT(p) \
  atomic_load_explicit(DLB__A(int, p), memory_order_acquire)
#define DLB_FT_STORE_INT(p, v) \
  atomic_store_explicit(DLB__A(int, p), (v), memory_order_release)
#define DLB_FT_LOAD_ULONG(p) \
  atomic_load_explicit(DLB__A(unsigned long, p), memory_order_relaxed)
#define DLB_FT_STORE_ULONG(p, v) \
  atomic_store_explicit(DLB__A(unsigned long, p), (v), memory_order_relaxed)
#define DLB_FT_ADD_SSIZE(p, v) \
  ((void)atomic_fetch_add_explicit(DLB__A(Py_ssize_t, p), (v), \
                                   memory_order_relaxed))
#define DLB_FT_LOAD_SSIZE(p) \
  atomic_load_explicit(DLB__A(Py_ssize_t, p), memory_order_relaxed)
/* Compare-and-set of a pointer slot from NULL: 1 when v went in. */
static inline int dlb__ft_set_once(void *slot, void *v) {
  void *expected = NULL;
  return atomic_compare_exchange_strong_explicit(
      DLB__A(void *, slot), &expected, v, memory_order_acq_rel,
      memory_order_acquire);
}
/* Two kinds of lock for what threads share.
 *
 * dlb_ft_mutex, a PyMutex: may be held while Python code runs.  A thread
 * that waits for one detaches its thread state meanwhile (so a
 * stop-the-world pause, which the holder's Python code may need, can
 * proceed); zero-initialised.
 *
 * dlb_ft_lock, a pthread mutex: held only around a few loads and stores --
 * never while Python code runs, an object is freed or anything else waits.
 * A thread waits for it attached, so it cannot be stopped there: a caller
 * holding borrowed views or handlers, which stay valid only while it does
 * not detach (an object's class changes only while every thread is
 * stopped), keeps them valid across it.  Initialised and destroyed
 * explicitly (DLB_FT_LOCK_INIT), or statically (DLB_FT_LOCK_STATIC). */
/* 3.14/3.15: PyMutex, PyMutex_Lock and PyMutex_Unlock unchanged; 3.15
 * moved them from cpython/lock.h to cpython/pylock.h, which Python.h
 * includes either way. */
typedef PyMutex dlb_ft_mutex;
#define DLB_FT_MUTEX_LOCK(m) PyMutex_Lock(m)
#define DLB_FT_MUTEX_UNLOCK(m) PyMutex_Unlock(m)
#include <pthread.h>
typedef pthread_mutex_t dlb_ft_lock;
#define DLB_FT_LOCK_STATIC PTHREAD_MUTEX_INITIALIZER
#define DLB_FT_LOCK_INIT(m) ((void)pthread_mutex_init((m), NULL))
#define DLB_FT_LOCK_DESTROY(m) ((void)pthread_mutex_destroy(m))
#define DLB_FT_LOCK(m) ((void)pthread_mutex_lock(m))
#define DLB_FT_UNLOCK(m) ((void)pthread_mutex_unlock(m))
#else
#define DLB_FT_LOAD_PTR(p) ((void *)*(p))
#define DLB_FT_STORE_PTR(p, v) ((void)(*(p) = (void *)(v)))
#define DLB_FT_LOAD_U64(p) (*(p))
#define DLB_FT_STORE_U64(p, v) ((void)(*(p) = (v)))
#define DLB_FT_ADD_U64(p, v) ((void)(*(p) += (v)))
#define DLB_FT_LOAD_UINT(p) (*(p))
#define DLB_FT_LOAD_INT(p) (*(p))
#define DLB_FT_STORE_INT(p, v) ((void)(*(p) = (v)))
#define DLB_FT_LOAD_ULONG(p) (*(p))
#define DLB_FT_STORE_ULONG(p, v) ((void)(*(p) = (v)))
#define DLB_FT_ADD_SSIZE(p, v) ((void)(*(p) += (v)))
#define DLB_FT_LOAD_SSIZE(p) (*(p))
static inline int dlb__ft_set_once(void *slot, void *v) {
  void **s = (void **)slot;
  if (*s != NULL) return 0;
  *s = v;
  return 1;
}
typedef char dlb_ft_mutex; /* unused: the GIL serialises */
#define DLB_FT_MUTEX_LOCK(m) ((void)(m))
#define DLB_FT_MUTEX_UNLOCK(m) ((void)(m))
typedef char dlb_ft_lock;
#define DLB_FT_LOCK_STATIC 0
#define DLB_FT_LOCK_INIT(m) ((void)(m))
#define DLB_FT_LOCK_DESTROY(m) ((void)(m))
#define DLB_FT_LOCK(m) ((void)(m))
#define DLB_FT_UNLOCK(m) ((void)(m))
#endif

#endif /* DLB_PYTHON_PYCOMPAT_H_ */
