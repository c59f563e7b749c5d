/*
 * testing.c -- every private hook of dlbridge._core for dlbridge's own tests
 * and benchmarks: allocation-failure injection through the core allocator,
 * live-block counts, and the _exchange_* hooks that reach handlers, views,
 * allocation and conversion (handlers.c, views.c, outputs.c) directly.
 *
 * The core gets every byte of host memory through the allocator installed
 * with dlb_set_allocator, so installing a counting allocator that refuses
 * the (after+1)-th and every later request reaches every allocation-failure
 * path of the core and of the extension code that calls it.  Counting live
 * blocks turns "nothing leaks" into a number a test can compare.
 *
 * The counters are process-wide, like the core allocator itself, not
 * per-module state: a managed tensor remembers the allocator (functions and
 * ctx) that made it, so a block made while the counting allocator was
 * installed comes back through count_release even after
 * _reset_allocations(), possibly from another module instance or from a
 * deleter run without the GIL by some framework.  Atomics keep the counts
 * right in that case; the tests themselves are single-threaded.
 *
 * None of this is public API: the names start with an underscore and the
 * docstrings say test-only.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dlbridge_py.h"

typedef struct {
  /* Requests since the last _fail_allocations(). */
  atomic_llong attempts;
  /* Requests refused since the last _fail_allocations(). */
  atomic_llong failed;
  /* Blocks handed out by count_alloc and not yet released.  Never reset:
   * blocks outlive the window in which they were made, and resetting would
   * let their later release drive the count negative and hide a leak. */
  atomic_llong live;
  /* Requests still allowed to succeed; negative: no limit (count only). */
  atomic_llong budget;
} alloc_counters;

static alloc_counters counters;

static void *count_alloc(size_t size, void *ctx) {
  alloc_counters *c = (alloc_counters *)ctx;
  void *p;
  atomic_fetch_add(&c->attempts, 1);
  if (atomic_load(&c->budget) >= 0 && atomic_fetch_sub(&c->budget, 1) <= 0) {
    /* Keep the budget pinned at 0 so it cannot wrap to "unlimited" after a
     * very long failing run. */
    atomic_store(&c->budget, 0);
    atomic_fetch_add(&c->failed, 1);
    return NULL;
  }
  /* Same rule as the default allocator: malloc(0) may return NULL. */
  p = malloc(size == 0 ? 1 : size);
  if (p != NULL) atomic_fetch_add(&c->live, 1);
  return p;
}

static void count_release(void *ptr, void *ctx) {
  alloc_counters *c = (alloc_counters *)ctx;
  if (ptr == NULL) return;
  free(ptr);
  atomic_fetch_sub(&c->live, 1);
}

static const dlb_allocator counting_allocator = {count_alloc, count_release,
                                                 &counters};

/* {key: value, ...} of the counters named. */
static PyObject *stats_dict(int with_failed) {
  return with_failed
             ? Py_BuildValue("{sLsLsL}", "attempts",
                             (long long)atomic_load(&counters.attempts), "live",
                             (long long)atomic_load(&counters.live), "failed",
                             (long long)atomic_load(&counters.failed))
             : Py_BuildValue("{sLsL}", "attempts",
                             (long long)atomic_load(&counters.attempts), "live",
                             (long long)atomic_load(&counters.live));
}

static PyObject *py_fail_allocations(PyObject *module, PyObject *arg) {
  long long after;
  (void)module;
  after = PyLong_AsLongLong(arg);
  if (after == -1 && PyErr_Occurred()) return NULL;
  if (after < -1) {
    PyErr_SetString(PyExc_ValueError,
                    "_fail_allocations: after must be >= 0, or -1 to count "
                    "without failing");
    return NULL;
  }
  atomic_store(&counters.attempts, 0);
  atomic_store(&counters.failed, 0);
  atomic_store(&counters.budget, after);
  dlb_set_allocator(&counting_allocator);
  Py_RETURN_NONE;
}

static PyObject *py_reset_allocations(PyObject *module, PyObject *unused) {
  (void)module;
  (void)unused;
  /* Restore first: building the dict below must not be refused. */
  dlb_set_allocator(NULL);
  atomic_store(&counters.budget, -1);
  return stats_dict(0);
}

static PyObject *py_allocation_stats(PyObject *module, PyObject *unused) {
  (void)module;
  (void)unused;
  return stats_dict(1);
}

static PyMethodDef testing_methods[] = {
    {"_fail_allocations", py_fail_allocations, METH_O,
     "_fail_allocations(after) -> None\n\nTEST-ONLY, not API.  Install a "
     "counting core allocator (process-wide) that lets `after` allocations "
     "succeed and refuses every later one until _reset_allocations(); -1 "
     "counts without refusing.  Resets attempts and failed, not live."},
    {"_reset_allocations", py_reset_allocations, METH_NOARGS,
     "_reset_allocations() -> dict\n\nTEST-ONLY, not API.  Restore "
     "malloc/free and return {'attempts', 'live'}: requests since "
     "_fail_allocations() and blocks of the counting allocator not yet "
     "freed (they are still freed through it, so live keeps counting)."},
    {"_allocation_stats", py_allocation_stats, METH_NOARGS,
     "_allocation_stats() -> dict\n\nTEST-ONLY, not API.  "
     "{'attempts', 'live', 'failed'} of the counting allocator."},
    {NULL, NULL, 0, NULL},
};

/* ---- private hooks for tests and benchmarks ------------------------------------- */

static dlb_module_state *mod_state(PyObject *module) {
  return (dlb_module_state *)PyModule_GetState(module);
}

/* _exchange_handler(obj) -> (kind, framework, table address or None) */
static PyObject *py_handler(PyObject *module, PyObject *obj) {
  PyTypeObject *held = NULL;
  PyObject *res = NULL;
  const dlb_handler *h = dlb__handler_held(mod_state(module), obj, &held);
  if (h == NULL) goto cleanup;
  PyObject *api = h->api ? PyLong_FromVoidPtr((void *)h->api) : Py_NewRef(Py_None);
  if (api == NULL) goto cleanup;
  res = Py_BuildValue("(iON)", (int)h->kind, h->framework, api);
cleanup:
  Py_XDECREF(held);
  return res;
}

/* args: (obj, options, forced kind or 0) */
static int parse_view_args(PyObject *const *args, Py_ssize_t nargs,
                           const char *fn, unsigned *options, int *kind) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "%s(obj, options, kind) takes 3 arguments", fn);
    return -1;
  }
  long o = PyLong_AsLong(args[1]);
  long k = PyLong_AsLong(args[2]);
  if ((o == -1 || k == -1) && PyErr_Occurred()) return -1;
  *options = (unsigned)o;
  *kind = (int)k;
  return 0;
}

/* A forced kind's view through dlb__view_fill; *held (the caller drops it
 * after releasing the view) keeps obj's class and so v->handler alive while
 * the view's reads or the caller run Python code. */
static int get_view(dlb_module_state *st, PyObject *obj, unsigned options,
                    int kind, dlb_view *v, PyTypeObject **held) {
  int rc = -1;
  const dlb_handler *h = dlb__handler_held(st, obj, held);
  if (h == NULL) goto cleanup;
  dlb_kind k = kind ? (dlb_kind)kind : h->kind;
  const char *refused = NULL;
  if (k == DLB_KIND_TENSOR && h->kind != DLB_KIND_TENSOR)
    refused = "not a dlbridge.Tensor";
  else if (k == DLB_KIND_NUMPY && h->kind != DLB_KIND_NUMPY)
    refused = "not a numpy.ndarray";
  else if (k == DLB_KIND_EXCHANGE && h->api == NULL)
    refused = "the type has no exchange table";
  else if (k == DLB_KIND_TF_EAGER && h->to_capsule == NULL)
    refused = "not a TensorFlow eager tensor";
  if (refused != NULL) {
    PyErr_SetString(PyExc_TypeError, refused);
    goto cleanup;
  }
  rc = dlb__view_fill(st, obj, options, h, k, v);
cleanup:
  if (rc < 0) Py_CLEAR(*held);
  return rc;
}

/* _exchange_view(obj, options, kind) -> dict describing the view */
static PyObject *py_view(PyObject *module, PyObject *const *args,
                         Py_ssize_t nargs) {
  unsigned options;
  int kind;
  dlb_view v;
  if (parse_view_args(args, nargs, "_exchange_view", &options, &kind) < 0)
    return NULL;
  PyTypeObject *held = NULL;
  if (get_view(mod_state(module), args[0], options, kind, &v, &held) < 0)
    return NULL;
  int64_t scratch[DLB_MAX_NDIM];
  const int64_t *strides = dlb_tensor_strides(&v.t, scratch);
  PyObject *res = Py_BuildValue(
      "{s:i,s:N,s:N,s:(iii),s:K,s:n,s:K,s:(ii),s:O,s:O}", "kind",
      (int)v.handler->kind, "shape", dlb__int64_tuple(v.t.ndim, v.t.shape),
      "strides", strides ? dlb__int64_tuple(v.t.ndim, strides) : PyTuple_New(0),
      "dtype", (int)v.t.dtype.code, (int)v.t.dtype.bits, (int)v.t.dtype.lanes,
      "flags", (unsigned long long)v.flags, "data", (Py_ssize_t)(intptr_t)v.t.data,
      "byte_offset", (unsigned long long)v.t.byte_offset, "device",
      (int)v.t.device.device_type, (int)v.t.device.device_id, "owned",
      v.owned ? Py_True : Py_False, "buffer", v.has_buffer ? Py_True : Py_False);
  dlb__view_release(&v);
  Py_DECREF(held);
  return res;
}

/* _exchange_view_loop(obj, options, kind, n) -> None: n get/release cycles */
static PyObject *py_view_loop(PyObject *module, PyObject *const *args,
                              Py_ssize_t nargs) {
  unsigned options;
  int kind;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "_exchange_view_loop(obj, options, kind, n)");
    return NULL;
  }
  if (parse_view_args(args, 3, "_exchange_view_loop", &options, &kind) < 0)
    return NULL;
  Py_ssize_t n = PyLong_AsSsize_t(args[3]);
  if (n == -1 && PyErr_Occurred()) return NULL;
  dlb_module_state *st = mod_state(module);
  for (Py_ssize_t i = 0; i < n; i++) {
    dlb_view v;
    PyTypeObject *held = NULL;
    if (get_view(st, args[0], options, kind, &v, &held) < 0) return NULL;
    dlb__view_release(&v);
    Py_DECREF(held);
  }
  Py_RETURN_NONE;
}

/* _exchange_alloc_like(obj, shape, dtype, device) -> object of obj's
 * framework made by dlb__alloc_like + dlb__to_framework */
static PyObject *py_alloc_like(PyObject *module, PyObject *const *args,
                               Py_ssize_t nargs) {
  dlb_module_state *st = mod_state(module);
  int64_t shape[DLB_MAX_NDIM];
  DLTensor proto;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "_exchange_alloc_like(obj, shape, dtype, device)");
    return NULL;
  }
  memset(&proto, 0, sizeof proto);
  if (!PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) > DLB_MAX_NDIM) {
    PyErr_SetString(PyExc_TypeError, "shape must be a short tuple");
    return NULL;
  }
  proto.ndim = (int32_t)PyTuple_GET_SIZE(args[1]);
  for (int32_t i = 0; i < proto.ndim; i++) {
    shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[1], i));
    if (shape[i] == -1 && PyErr_Occurred()) return NULL;
  }
  proto.shape = shape;
  if (dlb__dtype_converter(st, args[2], &proto.dtype) < 0) return NULL;
  if (dlb__device_converter(st, args[3], &proto.device) < 0) return NULL;
  /* Looked up last, after the converters' Python code; held while used. */
  PyTypeObject *held = NULL;
  PyObject *res = NULL;
  DLManagedTensorVersioned *m = NULL;
  const dlb_handler *h = dlb__handler_held(st, args[0], &held);
  if (h == NULL) goto cleanup;
  if (dlb__alloc_like(st, h, &proto, &m) < 0) goto cleanup;
  (void)dlb__to_framework(st, h, m, &res);
cleanup:
  Py_XDECREF(held);
  return res;
}

/* _exchange_to_framework(like, tensor) -> tensor exported and re-imported
 * as like's framework (tests the stealing paths). */
static PyObject *py_to_framework(PyObject *module, PyObject *const *args,
                                 Py_ssize_t nargs) {
  dlb_module_state *st = mod_state(module);
  dlb_error err;
  if (nargs != 2 || !dlb__is_tensor(st, args[1])) {
    PyErr_SetString(PyExc_TypeError, "_exchange_to_framework(like, dlb.Tensor)");
    return NULL;
  }
  PyTypeObject *held = NULL;
  PyObject *res = NULL;
  DLManagedTensorVersioned *m = NULL;
  const dlb_handler *h = dlb__handler_held(st, args[0], &held);
  if (h == NULL) goto cleanup;
  if (dlb__tensor_export_managed((dlb_TensorObject *)args[1], &m, &err) != DLB_OK) {
    dlb__raise(&err);
    goto cleanup;
  }
  (void)dlb__to_framework(st, h, m, &res);
cleanup:
  Py_XDECREF(held);
  return res;
}

/* _exchange_current_stream(obj, device) -> int address or None */
static PyObject *py_current_stream(PyObject *module, PyObject *const *args,
                                   Py_ssize_t nargs) {
  dlb_module_state *st = mod_state(module);
  DLDevice d;
  void *s = NULL;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "_exchange_current_stream(obj, device)");
    return NULL;
  }
  if (dlb__device_converter(st, args[1], &d) < 0) return NULL;
  /* Looked up after the converter's Python code; held while used. */
  PyTypeObject *held = NULL;
  PyObject *res = NULL;
  const dlb_handler *h = dlb__handler_held(st, args[0], &held);
  if (h == NULL || dlb__current_stream(st, h, d, &s) < 0) goto cleanup;
  res = s == NULL ? Py_NewRef(Py_None) : PyLong_FromVoidPtr(s);
cleanup:
  Py_XDECREF(held);
  return res;
}

static PyObject *py_cache_size(PyObject *module, PyObject *unused) {
  (void)unused;
  struct dlb_handler_cache *c = mod_state(module)->handlers;
  if (c == NULL) return PyLong_FromLong(0);
  DLB_FT_LOCK(&c->lock);
  Py_ssize_t count = (Py_ssize_t)c->count, capacity = (Py_ssize_t)(c->mask + 1);
  DLB_FT_UNLOCK(&c->lock);
  return Py_BuildValue("(nn)", count, capacity);
}

/* 0: torch's lazy bits not looked for yet; 1: read from its TensorImpl
 * (the fast path); -1: the experiment failed, tensors are asked. */
static PyObject *py_torch_bits_state(PyObject *module, PyObject *unused) {
  (void)unused;
  return PyLong_FromLong(DLB_FT_LOAD_INT(&mod_state(module)->torch_bits));
}

/* _torch_bits_force(state) -> the previous state: -1 asks every tensor
 * from now on (the tests of the lazy bits and requires_grad run both
 * ways), 0 runs the experiment again at the next torch tensor, 1 reads the
 * TensorImpl again -- only where the experiment found it. */
static PyObject *py_torch_bits_force(PyObject *module, PyObject *arg) {
  dlb_module_state *st = mod_state(module);
  long state = PyLong_AsLong(arg);
  if (state == -1 && PyErr_Occurred()) return NULL;
  if (state != DLB_TORCH_BITS_ASK && state != DLB_TORCH_BITS_UNTRIED &&
      state != DLB_TORCH_BITS_READ) {
    PyErr_Format(PyExc_ValueError,
                 "_torch_bits_force: state must be -1, 0 or 1, not %ld",
                 state);
    return NULL;
  }
  if (state == DLB_TORCH_BITS_READ && !st->torch_found) {
    PyErr_SetString(PyExc_ValueError,
                    "_torch_bits_force: the experiment has not found torch's "
                    "bits in this process");
    return NULL;
  }
  long previous = DLB_FT_LOAD_INT(&st->torch_bits);
  DLB_FT_STORE_INT(&st->torch_bits, (int)state);
  return PyLong_FromLong(previous);
}

static PyMethodDef private_methods[] = {
    {"_torch_bits_state", (PyCFunction)py_torch_bits_state, METH_NOARGS,
     "Private (tests): 1 when torch's conj/neg bits are read directly, -1 "
     "when they are asked of each tensor, 0 before the first torch tensor."},
    {"_torch_bits_force", (PyCFunction)py_torch_bits_force, METH_O,
     "Private (tests): set the state _torch_bits_state reports (-1: ask "
     "every tensor); returns the previous one."},
    {"_exchange_handler", (PyCFunction)py_handler, METH_O,
     "Private (tests): (kind, framework, table address) of type(obj)."},
    {"_exchange_view", (PyCFunction)(void (*)(void))py_view, METH_FASTCALL,
     "Private (tests): a borrowed view of obj as a dict."},
    {"_exchange_view_loop", (PyCFunction)(void (*)(void))py_view_loop,
     METH_FASTCALL, "Private (benchmarks): n view get/release cycles."},
    {"_exchange_alloc_like", (PyCFunction)(void (*)(void))py_alloc_like,
     METH_FASTCALL, "Private (tests): allocate like obj, in obj's framework."},
    {"_exchange_to_framework", (PyCFunction)(void (*)(void))py_to_framework,
     METH_FASTCALL, "Private (tests): a Tensor as like's framework."},
    {"_exchange_current_stream", (PyCFunction)(void (*)(void))py_current_stream,
     METH_FASTCALL, "Private (tests): the current stream for obj's type."},
    {"_exchange_cache_size", (PyCFunction)py_cache_size, METH_NOARGS,
     "Private (tests): (entries, capacity) of the handler cache."},
    {NULL, NULL, 0, NULL},
};

/* _function_force_identity(fn, identity): fn's identity made identity
 * before anything made it, so a test gives two Functions of different
 * signatures one identity -- the hash collision the registry refuses
 * (ops/registry.c), which a 64-bit hash no longer lets a test find. */
static PyObject *py_function_force_identity(PyObject *module,
                                            PyObject *const *args,
                                            Py_ssize_t nargs) {
  (void)module;
  if (nargs != 2 || !dlb__function_check(args[0])) {
    PyErr_SetString(PyExc_TypeError,
                    "_function_force_identity(fn, identity) takes a "
                    "dlbridge.Function and a str");
    return NULL;
  }
  if (dlb__function_force_identity(args[0], args[1]) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyMethodDef function_test_methods[] = {
    {"_function_force_identity",
     (PyCFunction)(void (*)(void))py_function_force_identity, METH_FASTCALL,
     "Private (tests): set a Function's identity before it is made."},
    {NULL, NULL, 0, NULL},
};

int dlb__testing_init(PyObject *module, dlb_module_state *st) {
  (void)st;
  /* The budget of a never-installed allocator: unlimited.  Harmless to
   * repeat when a second module instance is made. */
  if (atomic_load(&counters.attempts) == 0 && atomic_load(&counters.live) == 0)
    atomic_store(&counters.budget, -1);
  if (PyModule_AddFunctions(module, testing_methods) < 0) return -1;
  /* 1 in the build whose private CPython API is replaced by the public
   * fallbacks (pycompat.h; make test-pycompat checks it is that build). */
  if (PyModule_AddIntConstant(module, "_PYCOMPAT_PUBLIC_ONLY",
                              !DLB_PYCOMPAT_PRIVATE) < 0)
    return -1;
  if (PyModule_AddFunctions(module, function_test_methods) < 0) return -1;
  return PyModule_AddFunctions(module, private_methods);
}
