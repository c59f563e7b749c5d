/*
 * errors.c -- the extension's error policy, in one place: which Python
 * exception a dlb_status becomes, how the pending exception is kept intact
 * around code that may run Python (deleters, destructors, DECREFs), and how
 * exceptions are chained.  PyErr_Fetch / PyErr_GetRaisedException are used
 * here and nowhere else in src/python.
 *
 * Deleters and release functions may run on any thread, with or without the
 * GIL, from non-Python code, and during or after interpreter shutdown; a
 * destructor may run while an exception propagates.  The helpers below (and
 * dlb__gil_held / dlb__python_gone in dlbridge_py.h) are the one place those
 * rules are written down.
 *
 * The lowest file of src/python: it calls nothing else of the extension.
 */
#include "dlbridge_py.h"

#include <string.h>

/* ---- the pending exception, put aside --------------------------------------- */

/* PyErr_Fetch is deprecated from 3.12. */
void dlb__error_save(dlb__saved_error *s) {
#if PY_VERSION_HEX >= 0x030C0000
  s->exc = PyErr_GetRaisedException();
#else
  PyErr_Fetch(&s->type, &s->value, &s->tb);
#endif
}

void dlb__error_restore(dlb__saved_error *s) {
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(s->exc);
#else
  PyErr_Restore(s->type, s->value, s->tb);
#endif
}

void dlb__error_discard(dlb__saved_error *s) {
#if PY_VERSION_HEX >= 0x030C0000
  Py_XDECREF(s->exc);
#else
  Py_XDECREF(s->type);
  Py_XDECREF(s->value);
  Py_XDECREF(s->tb);
#endif
}

/* Make the saved exception prev the __context__ (as `except: raise ...`
 * does in Python) or, cause set, the __cause__ (`raise ... from prev`) of
 * the pending one.  Consumes prev. */
static void chain(dlb__saved_error *prev, int cause) {
  if (!PyErr_Occurred()) {
    dlb__error_restore(prev);
    return;
  }
#if PY_VERSION_HEX >= 0x030C0000
  PyObject *exc = PyErr_GetRaisedException();
  if (prev->exc != NULL && prev->exc != exc) {
    if (cause)
      PyException_SetCause(exc, prev->exc); /* steals */
    else
      PyException_SetContext(exc, prev->exc); /* steals */
  } else
    Py_XDECREF(prev->exc);
  PyErr_SetRaisedException(exc);
#else
  /* Fetch first: normalising calls the exception type, which must not
   * happen with an exception pending. */
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyErr_NormalizeException(&prev->type, &prev->value, &prev->tb);
  if (prev->tb != NULL && prev->value != NULL)
    PyException_SetTraceback(prev->value, prev->tb);
  if (value != NULL && prev->value != NULL && value != prev->value) {
    if (cause)
      PyException_SetCause(value, prev->value); /* steals */
    else
      PyException_SetContext(value, prev->value); /* steals */
    prev->value = NULL;
  }
  PyErr_Restore(type, value, tb);
  dlb__error_discard(prev);
#endif
}

void dlb__error_chain_context(dlb__saved_error *prev) { chain(prev, 0); }

void dlb__error_chain_cause(dlb__saved_error *prev) { chain(prev, 1); }

/* Say which argument the pending exception is about.  dlbridge's own
 * refusals -- the exact built-in types it raises -- are re-raised as
 * "<fname>() argument '<argname>': <message>", the original chained as
 * __cause__.  Anything else came from the argument's own code (a producer's
 * __dlpack__, a property): its type, arguments and attributes must reach
 * the caller untouched (a custom exception may not be rebuildable from a
 * message; SystemExit carries a code), so it only gains a note. */
static int is_own_refusal(PyObject *type) {
  return type == PyExc_TypeError || type == PyExc_ValueError ||
         type == PyExc_BufferError || type == PyExc_OverflowError;
}

/* Make cause (borrowed; NULL: nothing) the __cause__ of the pending
 * exception, as `raise ... from cause` does. */
static void set_cause(PyObject *cause) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value != NULL && cause != NULL)
    PyException_SetCause(value, Py_NewRef(cause)); /* steals */
  PyErr_Restore(type, value, tb);
}

void dlb__error_prefix_argument(PyObject *fname, PyObject *argname) {
  /* PEP 678 notes: 3.11+, the oldest Python dlbridge supports. */
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  if (type == NULL) return;
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
  if (!is_own_refusal(type)) {
    PyObject *r, *note = PyUnicode_FromFormat("in %U() argument '%U'", fname,
                                          argname);
    if (note != NULL) {
      r = PyObject_CallMethod(value, "add_note", "O", note);
      if (r == NULL) PyErr_Clear();
      Py_XDECREF(r);
      Py_DECREF(note);
    } else {
      PyErr_Clear();
    }
    PyErr_Restore(type, value, tb);
    return;
  }
  PyErr_Format(type, "%U() argument '%U': %S", fname, argname,
               value ? value : Py_None);
  set_cause(value);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

/* ---- a producer's exchange table refused ------------------------------------- */

/* s cut at its first newline (torch appends a C++ backtrace of ~1.5 KB
 * there) and at 300 characters.  New reference, NULL with an exception. */
static PyObject *first_line(PyObject *s) {
  Py_ssize_t n = PyUnicode_GET_LENGTH(s);
  Py_ssize_t nl = PyUnicode_FindChar(s, '\n', 0, n, 1);
  if (nl == -2) return NULL;
  if (nl >= 0) n = nl;
  if (n > 300) n = 300;
  return PyUnicode_Substring(s, 0, n);
}

/* Take the pending exception (normalised, its traceback attached) into
 * *type_, *value, *tb, and return the first line of its message ("(no
 * message)" when it has none), or NULL when even that cannot be made. */
static PyObject *take_error_line(PyObject **type_, PyObject **value,
                                 PyObject **tb) {
  PyErr_Fetch(type_, value, tb);
  PyErr_NormalizeException(type_, value, tb);
  if (*tb != NULL && *value != NULL) PyException_SetTraceback(*value, *tb);
  PyObject *text = *value != NULL ? PyObject_Str(*value) : NULL;
  PyObject *line = text != NULL ? first_line(text) : NULL;
  Py_XDECREF(text);
  if (line == NULL) {
    PyErr_Clear();
    line = PyUnicode_FromString("(no message)");
  }
  return line;
}

void dlb__error_exchange_refusal(PyTypeObject *type, const char *what) {
  if (!PyErr_Occurred()) {
    PyErr_Format(PyExc_BufferError,
                 "the exchange table of '%.200s' failed to %s the object "
                 "without saying why",
                 type->tp_name, what);
    return;
  }
  /* Out of memory stays MemoryError, a BufferError is already what we
   * raise, and KeyboardInterrupt / SystemExit are not refusals. */
  if (!PyErr_ExceptionMatches(PyExc_Exception) ||
      PyErr_ExceptionMatches(PyExc_MemoryError) ||
      PyErr_ExceptionMatches(PyExc_BufferError))
    return;
  PyObject *type_, *value, *tb;
  PyObject *line = take_error_line(&type_, &value, &tb);
  if (line != NULL) {
    PyErr_Format(PyExc_BufferError,
                 "'%.200s' cannot be exported through its DLPack exchange "
                 "table (%s): %U",
                 type->tp_name, ((PyTypeObject *)type_)->tp_name, line);
    Py_DECREF(line);
    set_cause(value);
  }
  Py_XDECREF(type_);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

/* ---- an importer refused ------------------------------------------------------ */

void dlb__error_as_buffer_error(PyObject *types, PyObject *prefix) {
  dlb__error_reraise(PyExc_BufferError, types, prefix);
}

void dlb__error_reraise(PyObject *exc, PyObject *types, PyObject *prefix) {
  if (!PyErr_Occurred() || !PyErr_ExceptionMatches(types) ||
      PyErr_ExceptionMatches(PyExc_MemoryError))
    return;
  PyObject *type_, *value, *tb;
  PyObject *line = take_error_line(&type_, &value, &tb);
  if (line != NULL) {
    PyErr_Format(exc, "%U: %U", prefix, line);
    Py_DECREF(line);
    set_cause(value);
  }
  Py_XDECREF(type_);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

/* ---- integers that describe a tensor ------------------------------------------- */

/* An int from a producer's description (a shape entry, a device id, an
 * address) that does not fit in 64 bits describes no tensor dlbridge can
 * hold: that is a BufferError, the error of every other undescribable
 * tensor, not the OverflowError int conversion raises. */
int dlb__read_int64(PyObject *o, const char *what, int64_t *out) {
  long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
    PyErr_Clear();
    PyErr_Format(PyExc_BufferError, "%s %R does not fit in 64 bits", what, o);
    return -1;
  }
  *out = (int64_t)v;
  return 0;
}

/* ---- references and deleters, keeping the pending exception ------------------ */

/* Drop a reference without letting the object's destructor see or clobber
 * the pending exception (B16). */
void dlb__clear_keep_error(PyObject **slot) {
  if (*slot == NULL) return;
  dlb__saved_error e;
  dlb__error_save(&e);
  Py_CLEAR(*slot);
  dlb__error_restore(&e);
}

/* Run m's deleter without disturbing the error indicator: deleters of
 * imported tensors may run Python code (DECREF of a producer's object, a
 * producer's release).  With no error in flight -- every dealloc from
 * ordinary code -- there is nothing to save: one check instead of a fetch
 * and a restore.  A deleter must not leave an error behind; one that does
 * is discarded, exactly as the restore of "no error" did. */
void dlb__delete_keep_error(DLManagedTensorVersioned *m) {
  if (m == NULL) return;
  if (!PyErr_Occurred()) {
    dlb_managed_delete(m);
    if (PyErr_Occurred()) PyErr_Clear();
    return;
  }
#if PY_VERSION_HEX >= 0x030C0000
  PyObject *exc = PyErr_GetRaisedException();
  dlb_managed_delete(m);
  PyErr_SetRaisedException(exc);
#else
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  dlb_managed_delete(m);
  PyErr_Restore(type, value, tb);
#endif
}

/* DECREF obj with the GIL held, leaving any in-flight exception as it was
 * (a consumer may drop our tensor while an error propagates). */
static void decref_keep_error(PyObject *obj) {
  if (PyErr_Occurred()) {
    dlb__saved_error s;
    dlb__error_save(&s);
    Py_DECREF(obj);
    dlb__error_restore(&s);
  } else {
    Py_DECREF(obj); /* the common case: nothing to protect */
  }
}

/* The usual caller already holds the GIL (Python code dropping a tensor)
 * and DECREFs directly; any other thread takes the GIL first.  When Python
 * can no longer be touched safely the reference is leaked -- a few bytes at
 * exit -- rather than risk a dead interpreter or a GIL never handed back. */
void dlb__release_ref(PyObject *obj, int have_gil) {
  if (dlb__python_gone()) return;
  if (have_gil || dlb__gil_held()) {
    decref_keep_error(obj);
    return;
  }
  PyGILState_STATE g = PyGILState_Ensure();
  decref_keep_error(obj);
  PyGILState_Release(g);
}

/* ---- dlb_status -> exception: the one policy ---------------------------------- */

/* The exception a status becomes.  DLB_EDEVICE (a device runtime call
 * failed or is missing) depends on what was asked: device_exc, RuntimeError
 * when NULL -- an allocation on a device fails as torch's and CuPy's do,
 * while a copy or an export that a driver refuses is DLPack's "this move
 * cannot be made", BufferError, which consumers catch. */
static PyObject *status_exception(int code, PyObject *device_exc) {
  switch (code) {
    case DLB_ENOMEM:
      return PyExc_MemoryError;
    case DLB_EINVAL:
    case DLB_EOVERFLOW: /* "too big", as NumPy reports it */
      return PyExc_ValueError;
    case DLB_EUNSUPPORTED:
    case DLB_EVERSION:
    case DLB_EREADONLY:
      return PyExc_BufferError;
    case DLB_EDEVICE:
      return device_exc != NULL ? device_exc : PyExc_RuntimeError;
    case DLB_ESYSTEM:
      return PyExc_OSError;
    default:
      return PyExc_RuntimeError;
  }
}

/* err's message as a str, "<what>: " in front when what is not NULL.  The
 * message may come from outside (a kernel, a C API caller): it is read up
 * to its first NUL and never past its DLB_ERROR_MESSAGE_SIZE bytes, bytes
 * that are not UTF-8 becoming \xNN escapes, so a bad message still becomes
 * the exception its code maps to, never a UnicodeDecodeError.  New
 * reference, NULL with an exception. */
static PyObject *message_text(const char *what, const dlb_error *err) {
  const char *nul = memchr(err->message, '\0', sizeof err->message);
  size_t n = nul != NULL ? (size_t)(nul - err->message) : sizeof err->message;
  PyObject *msg =
      n == 0 ? PyUnicode_FromFormat("dlbridge error %s", dlb_status_name(err->code))
             : PyUnicode_DecodeUTF8(err->message, (Py_ssize_t)n, "backslashreplace");
  if (msg == NULL || what == NULL) return msg;
  PyObject *full = PyUnicode_FromFormat("%s: %U", what, msg);
  Py_DECREF(msg);
  return full;
}

/* Raise exc with err's message (prefixed by what).  Returns NULL. */
static PyObject *raise_with(PyObject *exc, const char *what, const dlb_error *err) {
  PyObject *msg = message_text(what, err);
  if (msg == NULL) return NULL; /* MemoryError */
  PyErr_SetObject(exc, msg);
  Py_DECREF(msg);
  return NULL;
}

PyObject *dlb__raise_status(const char *what, const dlb_error *err,
                            PyObject *device_exc) {
  return raise_with(status_exception(err->code, device_exc), what, err);
}

PyObject *dlb__raise_errno(const char *what, const dlb_error *err,
                           int os_errno) {
  if (err->code != DLB_ESYSTEM || os_errno == 0)
    return dlb__raise_status(what, err, NULL);
  /* OSError(errno, message): Python picks the subclass errno names. */
  PyObject *msg = message_text(what, err);
  if (msg == NULL) return NULL;
  PyObject *args = Py_BuildValue("(iN)", os_errno, msg);
  if (args != NULL) {
    PyErr_SetObject(PyExc_OSError, args);
    Py_DECREF(args);
  }
  return NULL;
}

PyObject *dlb__raise(const dlb_error *err) {
  return dlb__raise_status(NULL, err, NULL);
}

PyObject *dlb__raise_as(PyObject *exc, const char *what, const dlb_error *err) {
  if (err->code == DLB_ENOMEM) exc = PyExc_MemoryError;
  return raise_with(exc, what, err);
}

/* BufferError "from_dlpack: <what>: <core message>" for a failed core call;
 * MemoryError stays MemoryError. */
PyObject *dlb__raise_import(const char *what, const dlb_error *err) {
  if (err->code == DLB_ENOMEM) return PyErr_NoMemory();
  PyErr_Format(PyExc_BufferError, "from_dlpack: %s: %s", what, err->message);
  return NULL;
}

int dlb__raise_view_error(const char *what, PyObject *obj, const dlb_error *err) {
  if (err->code == DLB_ENOMEM) {
    PyErr_NoMemory();
    return -1;
  }
  PyErr_Format(PyExc_BufferError, "%s of type '%.200s' cannot be described: %s",
               what, Py_TYPE(obj)->tp_name, err->message);
  return -1;
}
