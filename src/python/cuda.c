/*
 * cuda.c -- the extension's CUDA rules, each in one place:
 *   - dlbridge's current stream, per thread (what `with dlb.stream(s):`
 *     sets; the legacy default stream otherwise): the stream dlbridge's
 *     own work runs on and the stream it names to producers and consumers;
 *   - ordering a producer's stream before it (GPU-side, never a host wait);
 *   - copying a tensor into new memory on any host or CUDA device, on that
 *     stream, with the one host wait a host read needs.
 * Everything CUDA goes through the core (src/core/cuda_*.c), which loads the
 * driver on first use: a CPU-only program never reaches the driver, and a
 * machine without one gets an error naming what was looked for.
 *
 * Decisions (docs/gpu.md, "Python"):
 *  - The current stream is a C thread-local, not a contextvars.ContextVar:
 *    CUDA's own notion of "current" (context, capture mode) is per thread,
 *    and a thread-local read costs nothing on the paths that ask for it on
 *    every call (__dlpack__, the exchange table's current_work_stream).
 *    dlb.stream restores the previous value on exit, exceptions included.
 *  - One stream for every device: a handle belongs to one device, so code
 *    that works on two GPUs switches dlb.stream as it switches devices (as
 *    with CuPy's and torch's stream context managers).  The special values
 *    1 (legacy) and 2 (per-thread) are valid on every device.
 *  - A copy whose result is host memory the caller reads next waits for the
 *    stream on the host (dlb_cuda_stream_synchronize), after the copy; so
 *    does a copy from pinned host memory, which the driver reads
 *    asynchronously and whose owner may be freed as soon as we return.
 *    Pageable host sources need no wait: the driver has staged them before
 *    cuMemcpyAsync returns.  Nothing else in dlbridge waits on the host.
 */
#include "dlbridge_py.h"

#include <string.h>

/* ---- the current stream --------------------------------------------------------- */

/* This thread's stream as dlb.stream set it: 0 (not set) for the legacy
 * default stream, value 1, else the handle (2 is the per-thread default
 * stream); unordered for -1, "no ordering" (current_stream is 0 then:
 * dlbridge's own work still has to run somewhere, on the legacy stream). */
static _Thread_local uintptr_t current_stream;
static _Thread_local int current_unordered;

void *dlb__stream_current(void) {
  return current_stream != 0 ? (void *)current_stream : DLB_CUDA_STREAM_LEGACY;
}

void *dlb__stream_swap(void *stream) {
  void *prev = dlb__stream_current();
  current_stream = dlb__cuda_stream_value(stream) == 1
                       ? 0
                       : (uintptr_t)stream;
  current_unordered = 0;
  return prev;
}

int64_t dlb__cuda_stream_value(void *stream) {
  uintptr_t v = (uintptr_t)stream;
  return v == 0 ? 1 : (int64_t)v;
}

PyObject *dlb__stream_current_object(void) {
  if (current_unordered) return PyLong_FromLong(-1);
  if (current_stream == 0) return PyLong_FromLong(1);
  return PyLong_FromUnsignedLongLong((unsigned long long)current_stream);
}

/* _swap_stream(value) -> previous value: the int a producer would be given
 * for the stream (1 legacy, 2 per-thread, -1 no ordering, else a handle:
 * a pointer, so up to 2**64 - 1).  dlb.stream
 * (python/dlbridge/_streams.py) turns stream objects into such ints and
 * checks the range first; this is the same rule for direct callers. */
static PyObject *py_swap_stream(PyObject *module, PyObject *arg) {
  (void)module;
  uintptr_t next = 0;
  int unordered = 0;
  if (!PyLong_Check(arg)) {
    PyErr_Format(PyExc_TypeError,
                 "_swap_stream() takes an int stream value, not %.200s",
                 Py_TYPE(arg)->tp_name);
    return NULL;
  }
  int overflow = 0;
  long long small = PyLong_AsLongLongAndOverflow(arg, &overflow);
  if (small == -1 && PyErr_Occurred()) return NULL;
  if (overflow < 0 || (overflow == 0 && small < -1)) {
    PyErr_Format(PyExc_OverflowError,
                 "dlbridge.stream: %R is outside -1 .. 2**64 - 1 (a CUDA "
                 "stream handle is a pointer; -1 asks for no ordering)",
                 arg);
    return NULL;
  }
  if (overflow == 0 && small == 0) {
    PyErr_SetString(PyExc_ValueError,
                    "dlbridge.stream: 0 is not a CUDA stream (1 is the "
                    "legacy default stream, 2 the per-thread default stream, "
                    "-1 no ordering, anything larger a stream handle; 0 is "
                    "ambiguous on CUDA)");
    return NULL;
  }
  if (overflow == 0 && small == -1) {
    unordered = 1;
  } else {
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
      PyErr_Clear();
      PyErr_Format(PyExc_OverflowError,
                   "dlbridge.stream: %R is outside -1 .. 2**64 - 1 (a CUDA "
                   "stream handle is a pointer; -1 asks for no ordering)",
                   arg);
      return NULL;
    }
    if (sizeof(uintptr_t) < sizeof v && v > (unsigned long long)UINTPTR_MAX) {
      PyErr_Format(PyExc_OverflowError,
                   "dlbridge.stream: %R does not fit in a pointer here", arg);
      return NULL;
    }
    next = v == 1 ? 0 : (uintptr_t)v;
  }
  PyObject *prev = dlb__stream_current_object();
  if (prev == NULL) return NULL;
  current_stream = next;
  current_unordered = unordered;
  return prev;
}

static PyObject *py_current_stream(PyObject *module, PyObject *unused) {
  (void)module;
  (void)unused;
  return dlb__stream_current_object();
}

/* ---- ordering ---------------------------------------------------------------------- */

int dlb__is_cuda_device(DLDevice device) {
  return device.device_type == kDLCUDA ||
         device.device_type == kDLCUDAManaged;
}

int dlb__stream_order_before_current(DLDevice device, void *producer) {
  if (current_unordered) return 0;
  return dlb__stream_order(device, producer, dlb__stream_current());
}

int dlb__stream_order(DLDevice device, void *producer, void *consumer) {
  dlb_error err;
  if (!dlb__is_cuda_device(device)) return 0;
  if (dlb_cuda_stream_order(device.device_id, producer, consumer, &err) !=
      DLB_OK) {
    dlb__raise(&err);
    return -1;
  }
  return 0;
}

/* ---- copies ------------------------------------------------------------------------- */

/* dtype used to copy src's elements: padded sub-byte elements are whole
 * bytes each, which the copy routines handle only when told they are
 * bytes. */
static DLDataType copy_dtype(DLDataType dt, uint64_t flags) {
  if ((flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) &&
      dlb_dtype_is_subbyte(dt)) {
    DLDataType u = {kDLUInt, 8, (uint16_t)dlb_dtype_itemsize(dt)};
    return u;
  }
  return dt;
}

/* Where a copy can be made: host memory the CPU allocates, and CUDA device
 * or pinned memory. */
static int copy_target_ok(DLDevice d) {
  return d.device_type == kDLCPU || d.device_type == kDLCUDA ||
         d.device_type == kDLCUDAHost;
}

static int copy_source_ok(DLDevice d) {
  return dlb_device_is_host_accessible(d) || d.device_type == kDLCUDA;
}

int dlb__copy_managed(const DLTensor *src, uint64_t flags, DLDevice target,
                      const char *what, DLManagedTensorVersioned **out) {
  DLManagedTensorVersioned *m = NULL;
  dlb_error err;
  char a[64], b[64];
  int rc;
  bool padded = (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0;
  int device_side = dlb__is_cuda_device(src->device) ||
                    target.device_type == kDLCUDA;
  void *stream = dlb__stream_current();

  if (!copy_source_ok(src->device) || !copy_target_ok(target)) {
    PyErr_Format(PyExc_BufferError,
                 "%s: cannot copy from %s to %s: dlbridge copies between host "
                 "memory and CUDA devices only",
                 what, dlb__device_str(src->device, a, sizeof a),
                 dlb__device_str(target, b, sizeof b));
    return -1;
  }
  if (target.device_type == kDLCPU)
    rc = dlb_managed_empty(src->ndim, src->shape, src->dtype, target, padded,
                           &m, &err);
  else
    rc = dlb_cuda_managed_empty(src->ndim, src->shape, src->dtype, target,
                                padded, stream, &m, &err);
  if (rc != DLB_OK) goto fail;
  DLTensor s = *src, d = m->dl_tensor;
  s.dtype = copy_dtype(src->dtype, flags);
  d.dtype = copy_dtype(d.dtype, flags);
  if (!device_side) {
    rc = dlb_copy(&d, &s, &err);
    if (rc != DLB_OK) goto fail;
  } else {
    rc = dlb_cuda_copy(&d, &s, stream, &err);
    if (rc != DLB_OK) goto fail;
    /* The host may read a host result, or free a pinned source, as soon as
     * we return (see the header comment). */
    int host_result = target.device_type != kDLCUDA;
    int pinned_source = src->device.device_type == kDLCUDAHost;
    if (host_result || pinned_source) {
      int dev = target.device_type == kDLCUDA ? target.device_id
                                              : src->device.device_id;
      rc = dlb_cuda_stream_synchronize(dev, stream, &err);
      if (rc != DLB_OK) goto fail;
    }
  }
  *out = m;
  return 0;

fail:
  if (m != NULL) dlb_managed_delete(m); /* ours: touches no Python */
  /* a driver failure: this copy cannot be made */
  dlb__raise_status(what, &err, PyExc_BufferError);
  return -1;
}

int dlb__empty_managed(int32_t ndim, const int64_t *shape, DLDataType dtype,
                       DLDevice device, bool zero, const char *what,
                       DLManagedTensorVersioned **out) {
  dlb_error err;
  int rc;
  if (device.device_type == kDLCPU)
    rc = zero ? dlb_managed_zeros(ndim, shape, dtype, device, false, out, &err)
              : dlb_managed_empty(ndim, shape, dtype, device, false, out, &err);
  else if (device.device_type == kDLCUDA || device.device_type == kDLCUDAHost)
    rc = zero ? dlb_cuda_managed_zeros(ndim, shape, dtype, device, false,
                                       dlb__stream_current(), out, &err)
              : dlb_cuda_managed_empty(ndim, shape, dtype, device, false,
                                       dlb__stream_current(), out, &err);
  else {
    char a[64];
    PyErr_Format(PyExc_BufferError,
                 "%s(): cannot allocate on %s: dlbridge allocates CPU memory, "
                 "CUDA device memory ('cuda:N') and pinned host memory "
                 "('cuda_host')",
                 what, dlb__device_str(device, a, sizeof a));
    return -1;
  }
  if (rc != DLB_OK) {
    dlb__raise_status(what, &err, PyExc_RuntimeError);
    return -1;
  }
  return 0;
}

/* ---- module functions ------------------------------------------------------------- */

/* _cuda_device_count() -> int: CUDA devices the driver reports, 0 when
 * there is no driver (no exception): for tools deciding whether to probe
 * CUDA at all (dlbridge doctor) without importing a framework. */
static PyObject *py_cuda_device_count(PyObject *module, PyObject *unused) {
  (void)module;
  (void)unused;
  int count = 0;
  dlb_error err;
  if (dlb_cuda_device_count(&count, &err) != DLB_OK) count = 0;
  return PyLong_FromLong(count);
}

static PyMethodDef cuda_methods[] = {
    {"_cuda_device_count", py_cuda_device_count, METH_NOARGS,
     "_cuda_device_count() -> int\n\nCUDA devices the driver reports (0 "
     "without a driver)."},
    {"_swap_stream", py_swap_stream, METH_O,
     "_swap_stream(value) -> int\n\nMake value (1 legacy, 2 per-thread, or a "
     "CUDA stream handle) this thread's current stream; returns the previous "
     "one.  Used by dlbridge.stream."},
    {"_current_stream", py_current_stream, METH_NOARGS,
     "_current_stream() -> int\n\nThis thread's current CUDA stream value (1 "
     "when dlbridge.stream was not used)."},
    {NULL, NULL, 0, NULL},
};

int dlb__cuda_init(PyObject *module) {
  return PyModule_AddFunctions(module, cuda_methods);
}
