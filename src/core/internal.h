/*
 * internal.h -- helpers shared by the core's source files; not installed.
 */
#ifndef DLB_CORE_INTERNAL_H_
#define DLB_CORE_INTERNAL_H_

#include "dlbridge/dlbridge.h"

/* Allocate through the installed allocator.  Callers that hand memory to a
 * deleter which may run after the allocator changed must keep a copy of the
 * allocator (see managed.c) instead of calling dlb__free later. */
void *dlb__alloc(size_t size);
void dlb__free(void *ptr);

/* ---- hot-path helpers shared by layout.c, validate.c and dtype.c ----------
 * The fast paths below only ever answer "this input is certainly fine"; any
 * doubt sends the caller to its original, message-producing slow path, so
 * error codes and messages cannot drift between the two. */

/* The fast paths hand anything doubtful to a fallback that builds the
 * error message.  Inlined, that fallback bloats the hot function (measured:
 * dlb_tensor_validate 6 ns -> 9 ns per tensor), and standard C cannot say
 * "never inline".  A call through a volatile function pointer can: the
 * compiler must load the pointer at each call, so it cannot see the callee.
 * The load costs nothing on the fast path, which never makes the call. */
#define DLB__OUT_OF_LINE(ret, name, params) \
  static ret (*const volatile name##_out_of_line) params = name

/* Checked arithmetic: the core's one convention.  Every product or sum of
 * untrusted extents, strides, offsets and sizes goes through these (no
 * ad-hoc "a > INT64_MAX - b" at the call sites).  Like the compilers'
 * __builtin_*_overflow, each returns true on overflow (the rare case, so
 * callers may OR the flags together and branch once) and false with the
 * exact result in *out otherwise.  *out holds 0 on overflow, so a loop may
 * keep going and look at the flag later.  Any signs.  Plain C: measured
 * against the builtins, the fast paths run no slower, because they only
 * reach these helpers in the rare "careful" tier. */
static inline bool dlb__mul_overflow(int64_t a, int64_t b, int64_t *out) {
  uint64_t ua = a < 0 ? 0u - (uint64_t)a : (uint64_t)a;
  uint64_t ub = b < 0 ? 0u - (uint64_t)b : (uint64_t)b;
  *out = 0;
  if (ub != 0 && ua > UINT64_MAX / ub) return true;
  uint64_t mag = ua * ub;
  if ((a < 0) != (b < 0) && mag != 0) {
    if (mag > (uint64_t)INT64_MAX + 1u) return true;
    *out = mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)(mag - 1u) - 1;
  } else {
    if (mag > (uint64_t)INT64_MAX) return true;
    *out = (int64_t)mag;
  }
  return false;
}

static inline bool dlb__add_overflow(int64_t a, int64_t b, int64_t *out) {
  *out = 0;
  if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b))
    return true;
  *out = a + b;
  return false;
}

static inline bool dlb__sub_overflow(int64_t a, int64_t b, int64_t *out) {
  *out = 0;
  if ((b < 0 && a > INT64_MAX + b) || (b > 0 && a < INT64_MIN + b))
    return true;
  *out = a - b;
  return false;
}

/* bytes + extra as a size_t (an allocation size): true when bytes is
 * negative or the sum does not fit in size_t. */
static inline bool dlb__size_overflow(int64_t bytes, size_t extra,
                                      size_t *out) {
  *out = 0;
  if (bytes < 0 || (uint64_t)bytes > SIZE_MAX - extra) return true;
  *out = (size_t)bytes + extra;
  return false;
}

/* The dtype rule, as one lookup: whether DLDataType d is one dlbridge
 * accepts.  Bit b of row `code` is set when that code allows b bits at any
 * lanes:
 *   - kDLInt / kDLUInt: 1, 2 and 4 (packed sub-byte integers, any lanes)
 *     and every multiple of 8; other bits only when bits * lanes is a
 *     multiple of 8 (int12x2), which the last line of dlb__dtype_ok checks;
 *   - every other code: its defined widths only (fp6 is 6 bits, bool 8).
 * Code 3 (kDLOpaqueHandle) allows nothing.  dtype.c's tables stay the
 * authority for names and messages: dlb_dtype_check's slow path consults
 * them, and tests/c/test_dtype.c and test_validate.c compare the two over
 * every (code, bits) pair. */
#define DLB__BITW(n, w) \
  ((n) != 0 && (n) / 64 == (w) ? (uint64_t)1 << ((n) % 64) : (uint64_t)0)
#define DLB__ALLOW(a, b, c, d, e)                                         \
  {DLB__BITW(a, 0) | DLB__BITW(b, 0) | DLB__BITW(c, 0) | DLB__BITW(d, 0) | \
       DLB__BITW(e, 0),                                                   \
   DLB__BITW(a, 1) | DLB__BITW(b, 1) | DLB__BITW(c, 1) | DLB__BITW(d, 1) | \
       DLB__BITW(e, 1),                                                   \
   DLB__BITW(a, 2) | DLB__BITW(b, 2) | DLB__BITW(c, 2) | DLB__BITW(d, 2) | \
       DLB__BITW(e, 2),                                                   \
   DLB__BITW(a, 3) | DLB__BITW(b, 3) | DLB__BITW(c, 3) | DLB__BITW(d, 3) | \
       DLB__BITW(e, 3)}
/* Every multiple of 8 from 8 to 248, plus 1, 2 and 4: the integer rows. */
#define DLB__BYTES_WORD UINT64_C(0x0101010101010101)
#define DLB__INT_BITS                                                  \
  {(DLB__BYTES_WORD & ~(uint64_t)1) | DLB__BITW(1, 0) | DLB__BITW(2, 0) | \
       DLB__BITW(4, 0),                                                \
   DLB__BYTES_WORD, DLB__BYTES_WORD, DLB__BYTES_WORD}
#define DLB__DTYPE_CODES 19

static inline bool dlb__dtype_ok(DLDataType d) {
  static const uint64_t allowed[DLB__DTYPE_CODES][4] = {
      DLB__INT_BITS,                  /* kDLInt */
      DLB__INT_BITS,                  /* kDLUInt */
      DLB__ALLOW(16, 32, 64, 0, 0),   /* kDLFloat */
      DLB__ALLOW(0, 0, 0, 0, 0),      /* kDLOpaqueHandle */
      DLB__ALLOW(16, 0, 0, 0, 0),     /* kDLBfloat */
      DLB__ALLOW(32, 64, 128, 0, 0),  /* kDLComplex */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLBool */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e3m4 */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e4m3 */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e4m3b11fnuz */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e4m3fn */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e4m3fnuz */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e5m2 */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e5m2fnuz */
      DLB__ALLOW(8, 0, 0, 0, 0),      /* kDLFloat8_e8m0fnu */
      DLB__ALLOW(6, 0, 0, 0, 0),      /* kDLFloat6_e2m3fn */
      DLB__ALLOW(6, 0, 0, 0, 0),      /* kDLFloat6_e3m2fn */
      DLB__ALLOW(4, 0, 0, 0, 0),      /* kDLFloat4_e2m1fn */
      DLB__ALLOW(32, 0, 0, 0, 0),     /* kDLBcomplex (post-1.3) */
  };
  unsigned code = d.code, bits = d.bits;
  if (d.lanes == 0 || code >= DLB__DTYPE_CODES) return false;
  /* bits is a uint8_t field, so bits / 64 < 4. */
  if (((allowed[code][bits / 64] >> (bits % 64)) & 1u) != 0) return true;
  return code <= kDLUInt && bits != 0 && (bits * d.lanes) % 8u == 0;
}

/* One pass over the dims of a tensor whose ndim is in [0, DLB_MAX_NDIM] and
 * whose shape is non-NULL when ndim > 0: its element count and the lowest
 * and highest element offsets it reaches (strides NULL meaning row-major).
 * True only when every extent is >= 0 and everything the layout functions
 * would compute fits in int64: the count, for a non-empty tensor the span
 * (each (extent - 1) * stride and the running sums, in the order
 * dlb_tensor_byte_span adds them), and for NULL strides the row-major
 * strides a consumer would synthesise (checked even when empty).  False
 * means "take the slow path", never "invalid" by itself.  *lo_e and *hi_e
 * are 0 for an empty tensor.
 *
 * dlb__geometry_checked (layout.c) does this with every step checked.
 * dlb__geometry is a cheaper pass, exact whenever extents and strides are
 * small (nearly always), that calls nothing, so callers keep everything in
 * registers; it answers false when the values are too large for it, when
 * an extent is 0 while the product overflows, and for an empty tensor with
 * NULL strides: callers then try dlb__geometry_checked. */
bool dlb__geometry_checked(int32_t ndim, const int64_t *shape,
                           const int64_t *strides, int64_t *numel,
                           int64_t *lo_e, int64_t *hi_e);

/* With 0 <= extent < 2^29 and -2^28 <= stride < 2^28, every
 * (extent - 1) * stride is below 2^57 in magnitude, so no sum of at most
 * DLB_MAX_NDIM (2^6) of them can leave int64: the span needs no checks. */
#define DLB__SMALL_EXTENT ((uint64_t)1 << 29)
#define DLB__SMALL_STRIDE ((uint64_t)1 << 28)

static inline bool dlb__geometry(int32_t ndim, const int64_t *shape,
                                 const int64_t *strides, int64_t *numel,
                                 int64_t *lo_e, int64_t *hi_e) {
  /* The element count is kept exact without dividing: every extent here is
   * below 2^29 (or the pass gives up), so a running product below 2^34
   * cannot overflow when multiplied; one at or past 2^34 is flagged and
   * the careful pass, which checks every step, takes over. */
  const uint64_t count_limit = (uint64_t)1 << 34;
  uint64_t n = 1;
  bool ovf = false;
  if (strides != NULL) {
    /* Unsigned arithmetic: wraps instead of overflowing while the bounds
     * are unknown, and is exact once they hold. */
    uint64_t big = 0, lo = 0, hi = 0;
    for (int32_t i = 0; i < ndim; i++) {
      uint64_t e = (uint64_t)shape[i], s = (uint64_t)strides[i];
      big |= e | (s + DLB__SMALL_STRIDE);
      ovf |= n >= count_limit;
      n *= e;
      uint64_t reach = (e - 1u) * s;
      uint64_t neg = 0u - (reach >> 63); /* all ones when reach < 0 */
      lo += reach & neg;
      hi += reach & ~neg;
    }
    /* A zero extent with an overflowing product needs the careful pass,
     * as do large values. */
    if (big >= DLB__SMALL_EXTENT || ovf) return false;
    if (n == 0) {
      *numel = *lo_e = *hi_e = 0;
      return true;
    }
    *numel = (int64_t)n;
    /* lo is a two's complement value in (-2^63, 0]: negate its magnitude
     * rather than convert an out-of-range unsigned. */
    *lo_e = lo == 0 ? 0 : -(int64_t)(0u - lo);
    *hi_e = (int64_t)hi;
    return true;
  }
  uint64_t big = 0;
  for (int32_t i = 0; i < ndim; i++) {
    uint64_t e = (uint64_t)shape[i];
    big |= e; /* a negative extent sets the top bit */
    ovf |= n >= count_limit;
    n *= e;
  }
  /* With every extent in [0, 2^29) and no flag, n is the exact count: it is
   * 0 exactly when some extent is, and then the row-major strides need a
   * look of their own. */
  if (big >= DLB__SMALL_EXTENT || ovf || n == 0) return false;
  /* Non-empty row-major: offsets 0 .. numel - 1, and every stride (a
   * suffix product of the extents) fits because numel does. */
  *numel = (int64_t)n;
  *lo_e = 0;
  *hi_e = (int64_t)n - 1;
  return true;
}


/* ---- CUDA driver, loaded at run time (cuda_driver.c) ----------------------
 * Our own transcription of the few driver types and constants we use, so
 * nothing CUDA is needed to build.  Every entry point is resolved through
 * cuGetProcAddress at the ABI version written next to it in cuda_driver.c;
 * the typedefs below are the signatures of exactly those versions. */
typedef int dlb__CUresult;
typedef int dlb__CUdevice;
typedef uint64_t dlb__CUdeviceptr;
typedef void *dlb__CUcontext;
typedef void *dlb__CUstream;
typedef void *dlb__CUevent;
typedef void *dlb__CUmodule;
typedef void *dlb__CUfunction;
typedef void *dlb__CUmemoryPool;
/* IPC handles and UUIDs: opaque bytes, passed BY VALUE to the open calls */
typedef struct { char reserved[64]; } dlb__CUipcMemHandle;
typedef struct { char reserved[64]; } dlb__CUipcEventHandle;
typedef struct { char bytes[16]; } dlb__CUuuid;

#define DLB__CUDA_SUCCESS 0
#define DLB__CUDA_ERROR_OUT_OF_MEMORY 2
#define DLB__CUDA_ERROR_NO_DEVICE 100
#define DLB__CU_STREAM_LEGACY ((dlb__CUstream)(uintptr_t)1)
#define DLB__CU_STREAM_PER_THREAD ((dlb__CUstream)(uintptr_t)2)
#define DLB__CU_EVENT_DISABLE_TIMING 0x2u
#define DLB__CU_EVENT_WAIT_EXTERNAL 0x1u
#define DLB__CU_EVENT_INTERPROCESS 0x4u
#define DLB__CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1u
#define DLB__CU_STREAM_CAPTURE_MODE_RELAXED 2
#define DLB__CU_MEMHOSTALLOC_PORTABLE 0x1u
/* CUmemorytype */
#define DLB__CU_MEMORYTYPE_HOST 1u
#define DLB__CU_MEMORYTYPE_DEVICE 2u
#define DLB__CU_MEMORYTYPE_UNIFIED 4u
/* CUpointer_attribute */
#define DLB__CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define DLB__CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define DLB__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
/* CUdevice_attribute */
#define DLB__CU_DEVICE_ATTRIBUTE_CC_MAJOR 75
#define DLB__CU_DEVICE_ATTRIBUTE_CC_MINOR 76
/* CUstreamCaptureStatus */
#define DLB__CU_STREAM_CAPTURE_STATUS_NONE 0
/* CUmemPool_attribute: bytes a pool keeps when it could release memory */
#define DLB__CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4

/* CUDA_MEMCPY2D (the _v2 layout, CUDA >= 3.2). */
typedef struct dlb__CUDA_MEMCPY2D {
  size_t srcXInBytes, srcY;
  unsigned srcMemoryType;
  const void *srcHost;
  dlb__CUdeviceptr srcDevice;
  void *srcArray;
  size_t srcPitch;
  size_t dstXInBytes, dstY;
  unsigned dstMemoryType;
  void *dstHost;
  dlb__CUdeviceptr dstDevice;
  void *dstArray;
  size_t dstPitch;
  size_t WidthInBytes;
  size_t Height;
} dlb__CUDA_MEMCPY2D;

/* Every driver entry point dlbridge resolves, one line each:
 * X(kind, name, version, parameters).  kind says what dlbridge does without
 * it: REQUIRED (the load fails, naming it), OPTIONAL (the slot stays NULL
 * and its caller does without: memory-pool tuning), IPC (CUDA IPC, which
 * only dlb.share of CUDA tensors needs: without any one of them the table
 * says ipc == false and the IPC calls fail with DLB_EUNSUPPORTED).  version
 * is the CUDA ABI version cuGetProcAddress is asked for, the one whose
 * signature the parameters transcribe; every entry returns CUresult.  The
 * table's members and cuda_driver.c's version table are generated from this
 * list, so a name, its version and its signature cannot drift apart. */
#define DLB__CUDA_ENTRIES(X)                                                  \
  /* the driver, devices, contexts */                                        \
  X(REQUIRED, cuInit, 2000, (unsigned flags))                                \
  X(REQUIRED, cuDriverGetVersion, 2020, (int *version))                      \
  X(REQUIRED, cuGetErrorName, 6000, (dlb__CUresult error, const char **name)) \
  X(REQUIRED, cuDeviceGetCount, 2000, (int *count))                          \
  X(REQUIRED, cuDeviceGet, 2000, (dlb__CUdevice *device, int ordinal))       \
  X(REQUIRED, cuDeviceGetAttribute, 2000,                                    \
    (int *value, int attribute, dlb__CUdevice device))                       \
  X(REQUIRED, cuDevicePrimaryCtxRetain, 7000,                                \
    (dlb__CUcontext *ctx, dlb__CUdevice device))                             \
  X(REQUIRED, cuCtxGetCurrent, 4000, (dlb__CUcontext *ctx))                  \
  X(REQUIRED, cuCtxSetCurrent, 4000, (dlb__CUcontext ctx))                   \
  X(REQUIRED, cuPointerGetAttributes, 7000,                                  \
    (unsigned count, int *attributes, void **data, dlb__CUdeviceptr ptr))    \
  /* memory (cuda_memory.c) */                                               \
  X(REQUIRED, cuMemAllocAsync, 11020,                                        \
    (dlb__CUdeviceptr *ptr, size_t bytes, dlb__CUstream stream))             \
  X(REQUIRED, cuMemFreeAsync, 11020,                                         \
    (dlb__CUdeviceptr ptr, dlb__CUstream stream))                            \
  X(REQUIRED, cuMemHostAlloc, 3020, (void **ptr, size_t bytes, unsigned flags)) \
  X(REQUIRED, cuMemFreeHost, 2000, (void *ptr))                              \
  X(REQUIRED, cuMemsetD8Async, 3020,                                         \
    (dlb__CUdeviceptr ptr, unsigned char value, size_t count,                \
     dlb__CUstream stream))                                                  \
  /* copies (cuda_copy.c), the strided-copy kernel among them */             \
  X(REQUIRED, cuMemcpyAsync, 4000,                                           \
    (dlb__CUdeviceptr dst, dlb__CUdeviceptr src, size_t bytes,               \
     dlb__CUstream stream))                                                  \
  X(REQUIRED, cuMemcpy2DAsync, 3020,                                         \
    (const dlb__CUDA_MEMCPY2D *copy, dlb__CUstream stream))                  \
  X(REQUIRED, cuModuleLoadData, 2000, (dlb__CUmodule *module, const void *image)) \
  X(REQUIRED, cuModuleGetFunction, 2000,                                     \
    (dlb__CUfunction *fn, dlb__CUmodule module, const char *name))           \
  X(REQUIRED, cuLaunchKernel, 4000,                                          \
    (dlb__CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, \
     unsigned by, unsigned bz, unsigned shared, dlb__CUstream stream,        \
     void **params, void **extra))                                           \
  /* streams, events, capture (cuda_stream.c) */                             \
  X(REQUIRED, cuStreamIsCapturing, 10000, (dlb__CUstream stream, int *status)) \
  X(REQUIRED, cuThreadExchangeStreamCaptureMode, 10010, (int *mode))         \
  X(REQUIRED, cuEventCreate, 2000, (dlb__CUevent *event, unsigned flags))    \
  X(REQUIRED, cuEventRecord, 2000, (dlb__CUevent event, dlb__CUstream stream)) \
  X(REQUIRED, cuEventDestroy, 4000, (dlb__CUevent event))                    \
  X(REQUIRED, cuStreamWaitEvent, 3020,                                       \
    (dlb__CUstream stream, dlb__CUevent event, unsigned flags))              \
  X(REQUIRED, cuStreamSynchronize, 2000, (dlb__CUstream stream))             \
  /* memory-pool tuning (cuda_memory.c): without it allocations work, only  \
   * slower (the pool then gives memory back at every sync) */              \
  X(OPTIONAL, cuDeviceGetDefaultMemPool, 11020,                              \
    (dlb__CUmemoryPool *pool, dlb__CUdevice device))                         \
  X(OPTIONAL, cuMemPoolSetAttribute, 11020,                                  \
    (dlb__CUmemoryPool pool, int attr, void *value))                         \
  X(OPTIONAL, cuMemPoolTrimTo, 11020, (dlb__CUmemoryPool pool, size_t keep)) \
  /* CUDA IPC (cuda_ipc.c) */                                                \
  X(IPC, cuMemAlloc, 3020, (dlb__CUdeviceptr *ptr, size_t bytes))            \
  X(IPC, cuMemFree, 3020, (dlb__CUdeviceptr ptr))                            \
  X(IPC, cuIpcGetMemHandle, 4010,                                            \
    (dlb__CUipcMemHandle *handle, dlb__CUdeviceptr ptr))                     \
  X(IPC, cuIpcOpenMemHandle, 11000,                                          \
    (dlb__CUdeviceptr *ptr, dlb__CUipcMemHandle handle, unsigned flags))     \
  X(IPC, cuIpcCloseMemHandle, 4010, (dlb__CUdeviceptr ptr))                  \
  X(IPC, cuIpcGetEventHandle, 4010,                                          \
    (dlb__CUipcEventHandle *handle, dlb__CUevent event))                     \
  X(IPC, cuIpcOpenEventHandle, 4010,                                         \
    (dlb__CUevent *event, dlb__CUipcEventHandle handle))                     \
  X(IPC, cuDeviceGetUuid, 9020, (dlb__CUuuid *uuid, dlb__CUdevice device)) \
  /* the real extent of an opened allocation: a handle's own size field     \
   * comes from a pickle, which may be hostile */                           \
  X(IPC, cuMemGetAddressRange, 3020,                                         \
    (dlb__CUdeviceptr *base, size_t *size, dlb__CUdeviceptr ptr))

/* The entry table: one member per DLB__CUDA_ENTRIES line, named after the
 * driver's base name; NULL for a missing OPTIONAL or IPC entry. */
typedef struct dlb__cuda_api {
#define DLB__CUDA_MEMBER(kind, name, version, params) dlb__CUresult(*name) params;
  DLB__CUDA_ENTRIES(DLB__CUDA_MEMBER)
#undef DLB__CUDA_MEMBER
  /* Every IPC entry was found: decided once, when the driver loads. */
  bool ipc;
} dlb__cuda_api;

/* Most devices dlbridge addresses (primary contexts and copy modules are
 * kept in fixed tables of this size). */
#define DLB__CUDA_MAX_DEVICES 64

/* The loaded table, loading it on first use (thread-safe).  On failure the
 * error recorded by the one load attempt is copied into err. */
int dlb__cuda_api_get(const dlb__cuda_api **api, dlb_error *err);

/* Fill err with "<what>: <call> failed: CUDA_ERROR_X (<code>)" and return
 * DLB_EDEVICE (DLB_ENOMEM for CUDA_ERROR_OUT_OF_MEMORY). */
int dlb__cuda_fail(dlb_error *err, const char *what, const char *call,
                   dlb__CUresult rc);

/* Make device's primary context current for the length of an operation.
 * enter retains the primary context the first time a device is used (and
 * keeps it), checks device_id against the device count, and switches only
 * when another context is current; leave puts the caller's back. */
typedef struct dlb__cuda_scope {
  const dlb__cuda_api *api;
  dlb__CUcontext previous;
  bool switched;
} dlb__cuda_scope;

int dlb__cuda_enter(const char *what, int device_id, dlb__cuda_scope *scope,
                    dlb_error *err);
void dlb__cuda_leave(dlb__cuda_scope *scope);

/* True for the streams that must never be touched while something may be
 * capturing: NULL and CU_STREAM_LEGACY. */
static inline bool dlb__cuda_stream_is_legacy(const void *stream) {
  return stream == NULL || stream == (const void *)DLB__CU_STREAM_LEGACY;
}

/* The argument block of the strided-copy kernel (cuda_copy.c compiles the
 * kernel at run time; tests/cuda/fake_driver.c runs the same loop on the
 * host).  Strides and offsets are in bytes; dims are logical row-major. */
typedef struct dlb__cuda_copy_params {
  uint64_t dst;      /* address of dst element 0 */
  uint64_t src;      /* address of src element 0 */
  int64_t numel;
  int32_t ndim;
  int32_t itemsize;
  int64_t shape[DLB_MAX_NDIM];
  int64_t dst_stride[DLB_MAX_NDIM];
  int64_t src_stride[DLB_MAX_NDIM];
} dlb__cuda_copy_params;

/* Name of the kernel inside the module. */
#define DLB__CUDA_COPY_KERNEL "dlb_strided_copy"

/* Test-only: forget the loaded driver, contexts and modules so the next call
 * loads again (tests change DLB_CUDA_DRIVER between scenarios).  Not
 * thread-safe; never called by the library. */
void dlb__cuda_reset_for_tests(void); /* cuda_copy.c: all of the below */
void dlb__cuda_driver_reset(void);    /* cuda_driver.c: table, contexts */
/* cuda_memory.c: forget which devices' pools were tuned (kept by the reset
 * above, so call sequences of other tests stay exact) */
void dlb__cuda_pool_reset_for_tests(void);

#endif /* DLB_CORE_INTERNAL_H_ */
