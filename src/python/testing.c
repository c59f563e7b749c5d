/*
 * testing.c -- private hooks for dlbridge's own tests: allocation-failure
 * injection through the core allocator, and live-block counts.
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

int dlb__testing_init(PyObject *module, dlb_module_state *st) {
  (void)st;
  /* The budget of a never-installed allocator: unlimited.  Harmless to
   * repeat when a second module instance is made. */
  if (atomic_load(&counters.attempts) == 0 && atomic_load(&counters.live) == 0)
    atomic_store(&counters.budget, -1);
  return PyModule_AddFunctions(module, testing_methods);
}
