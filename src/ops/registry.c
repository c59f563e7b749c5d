/*
 * ops/registry.c -- the Functions that graph compilers know, by identity.
 *
 * A compiled graph names the Function each of its dlbridge ops runs by the
 * Function's identity ("matmul_e2eb632f", dlb__function_identity), not by
 * an address: the name survives serialisation (jax.export, a saved graph)
 * and means the same in every process that made the same Function.  The op
 * handlers (xla.c, tf.c) find the Function here on every call, on the
 * compiler's own threads and without the GIL, so the table is read without
 * a lock:
 *  - a slot is written once, under the mutex, by a release store of a
 *    complete entry, and never cleared or moved: a reader that sees the
 *    pointer sees the entry, and a pointer it saw stays valid;
 *  - so an entry, and the strong reference to its Function, live until the
 *    process exits (documented in docs/compiled.md): a compiled graph may
 *    run at any time after it was made, and nothing tells us when the last
 *    one is gone;
 *  - the table has a fixed size, DLB_OPS_MAX identities; registering one
 *    more is a RuntimeError saying so.
 * Registration is idempotent per identity: the same Function again, or
 * another Function object with the same signature and the same kernel,
 * gets the registered one.  The identity is a hash, so an entry keeps the
 * whole normalised signature and a registration under a taken identity is
 * compared with it: another signature (the hashes collided) or another
 * kernel is a ValueError (two Functions cannot answer to one name in a
 * graph), never the registered Function serving the other's calls.
 */
#include "../python/dlbridge_py.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

typedef struct {
  PyObject *fn;     /* strong, until exit */
  size_t len;
  const char *normalized; /* fn's normalised signature, UTF-8, NUL-
                             terminated: in the same block, after identity */
  size_t normalized_len;
  char identity[];  /* UTF-8, NUL-terminated */
} ops_entry;

static _Atomic(ops_entry *) slots[DLB_OPS_MAX];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t slot_of(const char *s, size_t len) {
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (size_t k = 0; k < len; k++) {
    h ^= (unsigned char)s[k];
    h *= UINT64_C(0x100000001b3);
  }
  return (size_t)(h ^ (h >> 32)) & (DLB_OPS_MAX - 1);
}

PyObject *dlb__ops_find(const char *identity, size_t len) {
  size_t i = slot_of(identity, len);
  for (size_t probes = 0; probes < DLB_OPS_MAX; probes++) {
    ops_entry *e = atomic_load_explicit(&slots[i], memory_order_acquire);
    if (e == NULL) return NULL;
    if (e->len == len && memcmp(e->identity, identity, len) == 0) return e->fn;
    i = (i + 1) & (DLB_OPS_MAX - 1);
  }
  return NULL;
}

/* An entry's Function and fn are one: the same object, or the same
 * normalised signature (sig, len bytes) and the same kernel.  1; 0 with a
 * ValueError saying which differs. */
static int same_function(const ops_entry *e, PyObject *fn, PyObject *identity,
                         const char *sig, size_t len) {
  if (e->fn == fn) return 1;
  if (e->normalized_len != len || memcmp(e->normalized, sig, len) != 0) {
    PyErr_Format(PyExc_ValueError,
                 "%U: a Function with another signature is registered for "
                 "compiled graphs under this identity in this process (%s; "
                 "this one is %s): their identity hashes collide; give one "
                 "of them another name",
                 identity, e->normalized, sig);
    return 0;
  }
  if (!dlb__function_same_kernel(e->fn, fn)) {
    PyErr_Format(PyExc_ValueError,
                 "%U: another kernel is registered for compiled graphs "
                 "under this name and signature in this process; give "
                 "the new kernel another name",
                 identity);
    return 0;
  }
  return 1;
}

int dlb__ops_register(PyObject *fn, PyObject **registered) {
  int rc = -1;
  PyObject *normalized = NULL;
  PyObject *identity = dlb__function_identity(fn);
  if (identity == NULL) return -1;
  Py_ssize_t len, slen;
  const char *text = PyUnicode_AsUTF8AndSize(identity, &len);
  if (text == NULL) goto cleanup;
  /* The common case, fn registered already, asks for nothing more. */
  ops_entry *found = NULL;
  PyObject *known = dlb__ops_find(text, (size_t)len);
  if (known == fn) {
    *registered = fn;
    rc = 0;
    goto cleanup;
  }
  normalized = dlb__function_normalized(fn);
  if (normalized == NULL) goto cleanup;
  const char *sig = PyUnicode_AsUTF8AndSize(normalized, &slen);
  if (sig == NULL) goto cleanup;
  pthread_mutex_lock(&registry_lock);
  size_t i = slot_of(text, (size_t)len);
  size_t probes = 0;
  for (; probes < DLB_OPS_MAX; probes++, i = (i + 1) & (DLB_OPS_MAX - 1)) {
    found = atomic_load_explicit(&slots[i], memory_order_relaxed);
    if (found == NULL) break;
    if (found->len == (size_t)len &&
        memcmp(found->identity, text, (size_t)len) == 0)
      break;
  }
  if (probes == DLB_OPS_MAX) {
    pthread_mutex_unlock(&registry_lock);
    PyErr_Format(PyExc_RuntimeError,
                 "%U: dlbridge can register at most %d Functions for "
                 "compiled graphs in one process",
                 identity, DLB_OPS_MAX);
    goto cleanup;
  }
  if (found != NULL) {
    /* An entry is never changed: it is read out of the lock. */
    pthread_mutex_unlock(&registry_lock);
    if (!same_function(found, fn, identity, sig, (size_t)slen)) goto cleanup;
    *registered = found->fn;
    rc = 0;
    goto cleanup;
  }
  ops_entry *e = (ops_entry *)PyMem_RawMalloc(sizeof *e + (size_t)len + 1 +
                                              (size_t)slen + 1);
  if (e == NULL) {
    pthread_mutex_unlock(&registry_lock);
    PyErr_NoMemory();
    goto cleanup;
  }
  e->fn = Py_NewRef(fn); /* until exit: see the header comment */
  e->len = (size_t)len;
  memcpy(e->identity, text, (size_t)len + 1);
  char *copy = e->identity + len + 1;
  memcpy(copy, sig, (size_t)slen + 1);
  e->normalized = copy;
  e->normalized_len = (size_t)slen;
  atomic_store_explicit(&slots[i], e, memory_order_release);
  pthread_mutex_unlock(&registry_lock);
  *registered = fn;
  rc = 0;
cleanup:
  Py_XDECREF(normalized);
  Py_DECREF(identity);
  return rc;
}

/* _core._ops_register(fn) -> the Function registered under fn's identity
 * (fn itself the first time). */
static PyObject *py_ops_register(PyObject *module, PyObject *fn) {
  (void)module;
  if (!dlb__function_check(fn)) {
    PyErr_Format(PyExc_TypeError,
                 "_ops_register() takes a dlbridge.Function, not %.100s",
                 Py_TYPE(fn)->tp_name);
    return NULL;
  }
  PyObject *registered;
  if (dlb__ops_register(fn, &registered) < 0) return NULL;
  return Py_NewRef(registered);
}

/* _core._ops_find(identity) -> the registered Function, or None. */
static PyObject *py_ops_find(PyObject *module, PyObject *identity) {
  (void)module;
  Py_ssize_t len;
  if (!PyUnicode_Check(identity)) {
    PyErr_Format(PyExc_TypeError, "_ops_find() takes a str, not %.100s",
                 Py_TYPE(identity)->tp_name);
    return NULL;
  }
  const char *text = PyUnicode_AsUTF8AndSize(identity, &len);
  if (text == NULL) return NULL;
  PyObject *fn = dlb__ops_find(text, (size_t)len);
  return Py_NewRef(fn != NULL ? fn : Py_None);
}

static PyMethodDef registry_methods[] = {
    {"_ops_register", py_ops_register, METH_O,
     "_ops_register(fn) -> Function\n\nRegister fn for compiled graphs "
     "under its identity (kept alive until exit); returns the Function "
     "registered under it.  ValueError when a Function with another "
     "signature or another kernel holds it."},
    {"_ops_find", py_ops_find, METH_O,
     "_ops_find(identity) -> Function or None"},
    {NULL, NULL, 0, NULL},
};

int dlb__ops_registry_init(PyObject *module) {
  return PyModule_AddFunctions(module, registry_methods);
}
