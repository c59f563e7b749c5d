/*
 * dlbridge.h -- the dlbridge core library: what every DLPack producer and
 * consumer needs, in plain C11 with no Python.
 *
 * Conventions, everywhere in this header:
 *  - Functions that can fail return int: DLB_OK (0) or a negative dlb_status.
 *    Results come back through out-parameters, which are written only on
 *    success.
 *  - The last parameter is a caller-supplied dlb_error *, which may be NULL.
 *    On failure it receives the same code and a message a user can act on.
 *  - Ownership: a function that takes ownership of a managed tensor says so.
 *    Unless a function says it "steals", a failed call leaves everything it
 *    was given owned by the caller, untouched.
 *  - Memory comes from the allocator installed with dlb_set_allocator
 *    (malloc/free by default).  Each managed tensor remembers the allocator
 *    that made it, so swapping allocators never frees through the wrong one.
 */
#ifndef DLBRIDGE_DLBRIDGE_H_
#define DLBRIDGE_DLBRIDGE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dlpack/dlpack.h"

#ifdef __cplusplus
extern "C" {
#endif

/* DLB_API marks the library's public functions.  libdlbridge is compiled
 * with -fvisibility=hidden, so these are the only symbols its shared
 * library exports: the dlb__* helpers its source files share stay inside
 * it (tests/c/check_symbols.py checks the export list). */
#ifndef DLB_API
#if defined(__GNUC__) || defined(__clang__)
#define DLB_API __attribute__((visibility("default")))
#else
#define DLB_API
#endif
#endif

#define DLB_VERSION_MAJOR 0
#define DLB_VERSION_MINOR 1
#define DLB_VERSION_PATCH 0
#define DLB_VERSION_STRING "0.1.0"

/* Most dimensions a tensor may have.  Matches NumPy's NPY_MAXDIMS, so a
 * stack array of DLB_MAX_NDIM int64_t holds any shape or strides we accept. */
#define DLB_MAX_NDIM 64

/* Alignment of the data of every tensor dlbridge allocates.  DLPack's header
 * asks for 256 bytes (CUDA's own guarantee); we give it, even though we never
 * demand it of others. */
#define DLB_DATA_ALIGNMENT 256

/* Longest error message kept, terminator included. */
#define DLB_ERROR_MESSAGE_SIZE 256

typedef enum {
  DLB_OK = 0,
  DLB_EINVAL = -1,      /* an argument is malformed (NULL, out of range) */
  DLB_ENOMEM = -2,      /* an allocation failed */
  DLB_EOVERFLOW = -3,   /* a size or offset does not fit in 64 bits */
  DLB_EUNSUPPORTED = -4,/* well-formed, but not something we can handle:
                           dtype, device, layout */
  DLB_EVERSION = -5,    /* a DLPack major version we do not speak */
  DLB_EDEVICE = -6,     /* a device runtime call failed or is missing */
  DLB_EREADONLY = -7,   /* a write was asked of read-only memory */
  DLB_ESYSTEM = -8      /* an operating-system call failed: the message
                           names it, and errno is left set to its reason */
} dlb_status;

typedef struct dlb_error {
  int code;                                /* the dlb_status returned */
  char message[DLB_ERROR_MESSAGE_SIZE];    /* NUL-terminated */
} dlb_error;

/* A short constant name for a status code ("DLB_ENOMEM"); never NULL. */
DLB_API const char *dlb_status_name(int code);

/* Record code and a printf-style message in err (if non-NULL) and return
 * code, so error paths read `return dlb_error_set(err, DLB_EINVAL, ...)`.
 * Kernels called through dlbridge.Function report failures with it. */
DLB_API int dlb_error_set(dlb_error *err, int code, const char *fmt, ...);

/* Reset err to DLB_OK with an empty message.  NULL is fine. */
DLB_API void dlb_error_clear(dlb_error *err);

/* ---- Allocation --------------------------------------------------------- */

/* Where dlbridge gets host memory.  alloc returns memory aligned for any
 * scalar type (malloc's guarantee) or NULL; release(NULL) must be a no-op.
 * ctx is passed back to both. */
typedef struct dlb_allocator {
  void *(*alloc)(size_t size, void *ctx);
  void (*release)(void *ptr, void *ctx);
  void *ctx;
} dlb_allocator;

/* Install allocator for all later allocations (NULL restores malloc/free).
 * Not thread-safe: call it before other threads use dlbridge.  Tests use it
 * to make every allocation fail in turn. */
DLB_API void dlb_set_allocator(const dlb_allocator *allocator);

/* The allocator in force now (never NULL). */
DLB_API const dlb_allocator *dlb_get_allocator(void);

/* Whether the allocator in force is dlbridge's own (dlb_set_allocator never
 * called, or called with NULL).  A caller that keeps small bookkeeping of
 * its own may then take it from a faster allocator of its own; with an
 * installed allocator everything should come from that one. */
DLB_API bool dlb_allocator_is_default(void);

/* ---- Data types ---------------------------------------------------------- */

/* The dtype named name: NumPy's names for the common types ("bool", "int8"
 * ... "uint64", "float16", "float32", "float64", "complex64", "complex128"),
 * "bfloat16", "complex32", "bcomplex32" (two bfloat16, the post-1.3
 * kDLBcomplex), integers of any width dlb_dtype_check allows
 * named by their bits ("int2", "uint4", "int24"), and DLPack's enum names in
 * lower case for the rest ("float8_e4m3fn", "float6_e2m3fn", "float4_e2m1fn",
 * ...).  A vector type is written "float32x4".  Unknown names fail with
 * DLB_EINVAL and a message naming the string. */
DLB_API int dlb_dtype_from_name(const char *name, DLDataType *out,
                                dlb_error *err);

/* Write dtype's canonical name (the one dlb_dtype_from_name reads back) into
 * buf.  DLB_EUNSUPPORTED when dtype is not one we know; DLB_EINVAL when
 * buflen is too small (32 bytes always suffice). */
DLB_API int dlb_dtype_name(DLDataType dtype, char *buf, size_t buflen,
                           dlb_error *err);

/* The one spelling of a dtype in dlbridge's messages: its canonical name
 * ("float32", "float32x4") when it has one, else its raw fields as
 * "(code 2, bits 7, lanes 1)".  Same buffer rules and result as
 * dlb_device_describe (DLB_DESCRIBE_MAX bytes always suffice). */
DLB_API const char *dlb_dtype_describe(DLDataType dtype, char *buf,
                                       size_t buflen);

/* The dtype of an __array_interface__ / __cuda_array_interface__ typestr
 * ("<f4", "|b1", "=i8"): byte order '<', '>', '|' or '=', a kind of b, i,
 * u, f or c, and a size of 1 to 32 bytes in plain decimal digits.  A
 * malformed typestr (a sign, spaces, a missing size) is DLB_EINVAL; a kind
 * DLPack has no code for, or multi-byte data not in this machine's byte
 * order, DLB_EUNSUPPORTED. */
DLB_API int dlb_dtype_from_typestr(const char *typestr, DLDataType *out,
                                   dlb_error *err);

/* The dtype of a buffer-protocol (struct module) format of one element:
 * an optional byte-order prefix ('@', '=', '<', '>', '!'), an optional 'Z'
 * (complex), one code of ? b B h H i I l L q Q n N c e f d; itemsize, the
 * exporter's, gives the width.  NULL fmt is "B" (PEP 3118).  Anything else,
 * or a foreign byte order, is DLB_EUNSUPPORTED. */
DLB_API int dlb_dtype_from_buffer_format(const char *fmt, int64_t itemsize,
                                         DLDataType *out, dlb_error *err);

/* DLB_OK when dtype is a combination dlbridge understands, lanes >= 1 and:
 *   - kDLInt / kDLUInt of 1, 2 or 4 bits (sub-byte, packed unless the
 *     managed tensor says IS_SUBBYTE_TYPE_PADDED), or of any bits when
 *     bits * lanes is a multiple of 8 (int8 ... int64, int24, int12x2);
 *   - every other code at its defined widths only (float 16/32/64,
 *     bfloat 16, complex 32/64/128, bcomplex 32, bool 8, the float8
 *     codes 8, fp6 6, fp4 4); kDLOpaqueHandle never; a code above 18 (none
 *     is defined) never: its size is not known.
 * Otherwise DLB_EUNSUPPORTED with a message naming code, bits and lanes and
 * saying which part is wrong. */
DLB_API int dlb_dtype_check(DLDataType dtype, dlb_error *err);

/* True when bits * lanes is not a whole number of bytes (int1, int2, int4,
 * fp6, fp4). */
DLB_API bool dlb_dtype_is_subbyte(DLDataType dtype);

/* Bytes one element takes when each element is rounded up to whole bytes:
 * (bits * lanes + 7) / 8.  This is the padded size of a sub-byte type. */
DLB_API int64_t dlb_dtype_itemsize(DLDataType dtype);

/* Bytes needed to store count elements contiguously.  Packed (padded ==
 * false): ceil(count * bits * lanes / 8), DLPack's default for sub-byte
 * types.  Padded: count * itemsize.  The two agree for whole-byte types. */
DLB_API int dlb_dtype_storage_bytes(DLDataType dtype, int64_t count,
                                    bool padded,
                                    int64_t *out, dlb_error *err);

/* ---- Layout -------------------------------------------------------------- */

/* Product of ndim extents in *out.  DLB_EINVAL for a negative extent or a
 * NULL shape with ndim > 0; DLB_EOVERFLOW when the product exceeds INT64_MAX
 * (checked without dividing, so a zero extent anywhere is fine). */
DLB_API int dlb_shape_numel(int32_t ndim, const int64_t *shape, int64_t *out,
                            dlb_error *err);

/* Compact row-major strides (in elements) for shape, written to strides.
 * Extents of 0 and 1 do not stop the running product from being exact:
 * the result is what NumPy and PyTorch produce. */
DLB_API int dlb_strides_row_major(int32_t ndim, const int64_t *shape,
                                  int64_t *strides,
                                  dlb_error *err);

/* The strides of t: t->strides, or, when that is NULL (legacy and pre-1.2
 * producers), compact row-major strides written into scratch, which must
 * hold DLB_MAX_NDIM values.  Returns NULL only for ndim == 0 or a tensor
 * dlb_tensor_validate would reject. */
DLB_API const int64_t *dlb_tensor_strides(const DLTensor *t, int64_t *scratch);

/* Element count of t (1 for ndim == 0). */
DLB_API int dlb_tensor_numel(const DLTensor *t, int64_t *out, dlb_error *err);

/* Bytes the elements of t would take stored compactly (packed for sub-byte
 * types unless padded). */
DLB_API int dlb_tensor_nbytes(const DLTensor *t, bool padded, int64_t *out,
                              dlb_error *err);

/* Address of element 0: (char *)t->data + t->byte_offset. */
DLB_API void *dlb_tensor_data(const DLTensor *t);

/* True when t is compact row-major (C order).  Strides of extent-1 dims are
 * ignored, a tensor with no elements is always contiguous, NULL strides mean
 * contiguous. */
DLB_API bool dlb_tensor_is_contiguous(const DLTensor *t);

/* The same for column-major (Fortran order). */
DLB_API bool dlb_tensor_is_contiguous_f(const DLTensor *t);

/* True when t is compact in some dimension order: a transposition of a
 * compact row-major tensor, its elements filling one block with no gaps,
 * overlaps or negative strides (C and Fortran order are two such orders).
 * Extent-1 dims, empty tensors and NULL strides as dlb_tensor_is_contiguous. */
DLB_API bool dlb_tensor_is_dense(const DLTensor *t);

/* The byte range [*lo, *hi) that t's elements touch, relative to element 0
 * (so *lo <= 0 < *hi for a non-empty tensor; negative strides make *lo
 * negative).  A tensor with no elements gives [0, 0).  DLB_EOVERFLOW when the
 * range does not fit in int64_t.  Sub-byte types are DLB_EUNSUPPORTED unless
 * t is contiguous, since elements smaller than a byte have no byte
 * address; their span is the packed size (a DLTensor cannot say it is
 * padded: callers holding a padded tensor use dlb_tensor_nbytes). */
DLB_API int dlb_tensor_byte_span(const DLTensor *t, int64_t *lo, int64_t *hi,
                                 dlb_error *err);

/* How two tensors' memory relates (dlb_tensor_overlap). */
enum {
  DLB_OVERLAP_NONE = 0,    /* no byte in common: disjoint byte ranges, a
                              tensor with no elements, or two devices */
  DLB_OVERLAP_SAME = 1,    /* the same view: one device, one address of
                              element 0, one dtype, shape and strides (a
                              stride of an extent-1 dim not compared) */
  DLB_OVERLAP_PARTIAL = 2  /* anything else whose byte ranges intersect */
};

/* Whether a and b share memory, into *out (DLB_OVERLAP_*).  The rule is
 * the byte ranges' (dlb_tensor_byte_span from each address of element 0,
 * data + byte_offset): views that interleave without sharing a byte
 * (x[0::2] and x[1::2]) intersect and are PARTIAL -- deciding exactly
 * which elements two strided views share is a search this function does
 * not make.  A function of the descriptions only: no memory is read, and
 * data may be NULL (addresses are data + byte_offset as integers).
 * dlb_tensor_byte_span's errors for either tensor. */
DLB_API int dlb_tensor_overlap(const DLTensor *a, const DLTensor *b, int *out,
                               dlb_error *err);

/* ---- Validation ------------------------------------------------------------ */

/* Options for dlb_tensor_validate. */
enum {
  /* Reject NULL strides when ndim > 0 (the DLPack >= 1.2 rule).  Off by
   * default: legacy and older producers send NULL for compact tensors. */
  DLB_VALIDATE_STRIDES_REQUIRED = 1u << 0,
  /* Accept any device type, 0 and negative ones too.  Without it every
   * type >= 1 is accepted (one dlbridge has no name for is a foreign
   * device, see dlb_device_type_valid) and the others are refused. */
  DLB_VALIDATE_ANY_DEVICE = 1u << 1,
  /* Accept dtypes dlbridge does not recognise (code, bits, lanes). */
  DLB_VALIDATE_ANY_DTYPE = 1u << 2
};

/* Check a DLTensor that came from a producer we do not trust, before reading
 * any of it: ndim in [0, DLB_MAX_NDIM]; shape non-NULL when ndim > 0; every
 * extent >= 0; element count, byte size and strided byte span within
 * int64_t; a known dtype and a device type >= 1 (unless options say
 * otherwise);
 * device_id >= 0; data non-NULL unless the tensor has no elements; byte_offset
 * <= INT64_MAX; sub-byte dtypes only in contiguous layouts.  The first
 * failure is returned with a message naming the field and value. */
DLB_API int dlb_tensor_validate(const DLTensor *t, unsigned options,
                                dlb_error *err);

/* Check the header of a versioned managed tensor: DLB_EVERSION when
 * version.major is not DLPACK_MAJOR_VERSION (the caller must then call the
 * deleter and read nothing else), DLB_EINVAL for NULL.  It does not look at
 * dl_tensor; follow with dlb_tensor_validate. */
DLB_API int dlb_managed_check_version(const DLManagedTensorVersioned *m,
                                      dlb_error *err);

/* True when dlbridge knows the device type: it has a name (the types of
 * DLPack 1.3 and the post-1.3 kDLTPU, kDLTPUHost, kDLAscend). */
DLB_API bool dlb_device_type_known(int32_t device_type);

/* True when device_type can be a device at all: >= 1.  A valid type that
 * is not known is a foreign device (a type newer than this header): a
 * tensor on it can be held and passed on, its memory never read by the
 * host; it is named "device<N>". */
DLB_API bool dlb_device_type_valid(int32_t device_type);

/* Lower-case name of a device type ("cpu", "cuda", "cuda_host", "rocm",
 * "tpu_host", ...), or NULL when unknown. */
DLB_API const char *dlb_device_type_name(int32_t device_type);

/* Parse "cpu", "cuda", "cuda:1", "rocm:0", "tpu_host:0", ... into *out;
 * "device<N>[:<id>]" names DLPack device type N (any N >= 1, canonical
 * decimal), so every device's text below parses back. */
DLB_API int dlb_device_from_name(const char *name, DLDevice *out,
                                 dlb_error *err);

/* A buffer of DLB_DESCRIBE_MAX bytes always holds the whole text of
 * dlb_device_describe and dlb_dtype_describe. */
#define DLB_DESCRIBE_MAX 48

/* The one spelling of a device in dlbridge's messages, and what
 * str(dlbridge.Device) gives: "cpu" for CPU 0, "<type>:<id>" for any other
 * ("cuda:1", "cpu:1"), "device<n>:<id>" for a type dlbridge has no name
 * for ("device99:0").  Writes into buf (truncated to buflen - 1 characters, always
 * NUL-terminated when buflen > 0) and returns buf, so it can be used
 * directly as a "%s" argument. */
DLB_API const char *dlb_device_describe(DLDevice device, char *buf,
                                        size_t buflen);

/* True when the CPU can read and write the memory directly (kDLCPU,
 * kDLCUDAHost, kDLROCMHost, kDLCUDAManaged). */
DLB_API bool dlb_device_is_host_accessible(DLDevice device);

/* ---- Managed tensors --------------------------------------------------------- */

/* Run m's deleter if it has one.  NULL is fine. */
DLB_API void dlb_managed_delete(DLManagedTensorVersioned *m);
DLB_API void dlb_managed_delete_legacy(DLManagedTensor *m);

/* A new owning tensor on the CPU: one allocation holds the managed struct,
 * shape, strides and the data, aligned to DLB_DATA_ALIGNMENT.  Strides are
 * compact row-major and always filled.  version is {1, 3}; flags are 0 except
 * IS_SUBBYTE_TYPE_PADDED when padded is true.  empty leaves the data
 * uninitialised, zeros clears it.  device must be host memory: kDLCPU
 * (kDLCUDAHost and friends need a device runtime, see the device API). */
DLB_API int dlb_managed_empty(int32_t ndim, const int64_t *shape,
                              DLDataType dtype,
                              DLDevice device, bool padded,
                              DLManagedTensorVersioned **out, dlb_error *err);
DLB_API int dlb_managed_zeros(int32_t ndim, const int64_t *shape,
                              DLDataType dtype,
                              DLDevice device, bool padded,
                              DLManagedTensorVersioned **out, dlb_error *err);

/* Called once when a wrapped tensor is deleted, with the ctx given to
 * dlb_managed_wrap. */
typedef void (*dlb_release_fn)(void *ctx);

/* A managed tensor describing memory someone else owns.  view is copied:
 * shape and strides go into the same allocation as the struct (strides are
 * synthesised when view->strides is NULL), data and byte_offset are kept as
 * given, nothing is validated beyond what copying needs (validate first if
 * view is untrusted).  When the result is deleted, release(ctx) runs exactly
 * once (release may be NULL).  On failure release is not called: the caller
 * still owns whatever ctx stands for. */
DLB_API int dlb_managed_wrap(const DLTensor *view, uint64_t flags,
                             dlb_release_fn release, void *ctx,
                             DLManagedTensorVersioned **out, dlb_error *err);

/* The release function and context a tensor made by dlb_managed_wrap will
 * call: true with *release and *ctx set when m was made by dlb_managed_wrap
 * (or dlb_managed_from_legacy) in this library, false otherwise (any other
 * tensor, NULL).  For owners that must look inside what they hold, such as
 * a garbage collector visiting the objects a wrapped tensor keeps alive;
 * the tensor still runs release itself when deleted. */
bool dlb_managed_wrap_context(const DLManagedTensorVersioned *m,
                              dlb_release_fn *release, void **ctx);

/* Versioned view of a legacy tensor, without copying data.  On success the
 * result owns legacy: deleting it runs legacy's deleter exactly once.  The
 * result is writable (flags 0): the legacy format cannot say read-only.  On
 * failure legacy is untouched and still the caller's. */
DLB_API int dlb_managed_from_legacy(DLManagedTensor *legacy,
                                    DLManagedTensorVersioned **out,
                                    dlb_error *err);

/* Legacy view of a versioned tensor, for consumers that only speak the old
 * format.  On success the result owns m.  Fails with DLB_EREADONLY when m is
 * READ_ONLY (the legacy format would silently make it writable), with
 * DLB_EVERSION for a major we do not speak, and with DLB_EUNSUPPORTED for
 * sub-byte data with IS_SUBBYTE_TYPE_PADDED set (the legacy format has no
 * flags, so a consumer would read it as packed).  On failure m is still the
 * caller's. */
DLB_API int dlb_managed_to_legacy(DLManagedTensorVersioned *m,
                                  DLManagedTensor **out,
                                  dlb_error *err);

/* ---- Kernels (dlbridge.Function) -------------------------------------------- */

/* A kernel callable from every framework through dlbridge.Function.
 *  args    inputs then outputs, in signature order; 0-d parameters (Python
 *          numbers included) arrive as 0-d tensors.  The views are valid for
 *          the length of the call only.
 *  stream  the caller's current stream for the arguments' device (a
 *          cudaStream_t as void *), NULL on the CPU.
 * Return 0, or fill err (dlb_error_set) and return a negative dlb_status; the
 * caller raises it as a Python exception. */
typedef int (*dlb_kernel)(DLTensor *const *args, int32_t nargs, void *stream,
                          dlb_error *err);

/* ---- Copy ------------------------------------------------------------------ */

/* Copy the elements of src into dst, element by element in logical order:
 * same dtype and shape, any strides on either side (negative, zero on src,
 * byte_offset).  Both must be host-accessible.  memcpy when both are
 * contiguous; otherwise loops over dimensions merged and ordered for dst's
 * memory order.  dst must not have zero (broadcast) strides over more than
 * one element, and must not be READ_ONLY memory (the caller knows; this
 * function cannot).  When the byte spans of dst and src overlap, the copy
 * goes through a temporary buffer so the result is as if src were read
 * first. */
DLB_API int dlb_copy(const DLTensor *dst, const DLTensor *src, dlb_error *err);

/* ---- CUDA (driver loaded at run time) ---------------------------------------
 *
 * Nothing CUDA is needed to build or link dlbridge.  On first use the driver
 * is opened with dlopen: the file named by the environment variable
 * DLB_CUDA_DRIVER when set (tests point it at a recording fake), otherwise
 * "libcuda.so.1".  Only cuGetProcAddress_v2 (or cuGetProcAddress on drivers
 * older than 12.0) is taken with dlsym; every other entry point is requested
 * through it at a pinned ABI version, so a newer driver can never hand out a
 * different signature.  The load runs once per process (thread-safe); its
 * outcome, success or the error, is kept and reported to every later call.
 *
 * Contexts: dlbridge works in each device's PRIMARY context (the one the CUDA
 * runtime, PyTorch and CuPy use), retained on first use and kept.  Every call
 * below that takes a device makes that context current and puts the caller's
 * current context back before returning, on every path.
 *
 * Streams are passed as void * (a CUstream).  NULL and DLB_CUDA_STREAM_LEGACY
 * (1) mean the legacy default stream, DLB_CUDA_STREAM_PER_THREAD (2) the
 * per-thread default stream; anything else is a stream handle.  A stream must
 * belong to the device (context) the call names.
 *
 * Graph capture: nothing here synchronises with the host, and nothing
 * touches the legacy stream while a stream involved in the call is capturing.
 * Allocation is stream-ordered (cuMemAllocAsync), so it is legal inside a
 * capture.  All calls are safe from several threads. */

#define DLB_CUDA_STREAM_LEGACY ((void *)(uintptr_t)1)
#define DLB_CUDA_STREAM_PER_THREAD ((void *)(uintptr_t)2)

/* Load the driver now (or get the outcome of the one earlier attempt).
 * DLB_EDEVICE with a message naming the library tried and dlerror(), the
 * missing entry point, or the failing call and its CUDA error name.  A driver
 * that loads but finds no GPU (cuInit: CUDA_ERROR_NO_DEVICE) loads fine and
 * reports 0 devices. */
DLB_API int dlb_cuda_load(dlb_error *err);

/* True when the driver loads and at least one device is present.  Never
 * fails; loads the driver if that was not tried yet. */
DLB_API bool dlb_cuda_available(void);

/* Number of CUDA devices (0 when the driver reports none). */
DLB_API int dlb_cuda_device_count(int *count, dlb_error *err);

/* What a pointer is, as cuPointerGetAttributes sees it. */
typedef enum {
  DLB_CUDA_MEMORY_UNREGISTERED = 0, /* host memory CUDA does not know */
  DLB_CUDA_MEMORY_HOST = 1,         /* pinned / registered host memory */
  DLB_CUDA_MEMORY_DEVICE = 2,       /* device memory */
  DLB_CUDA_MEMORY_MANAGED = 3       /* managed (unified) memory */
} dlb_cuda_memory_type;

typedef struct dlb_cuda_pointer_info {
  dlb_cuda_memory_type memory_type;
  int device_ordinal; /* -1 for unregistered memory */
  bool is_managed;
} dlb_cuda_pointer_info;

/* Classify ptr.  Unregistered host memory is not an error. */
DLB_API int dlb_cuda_pointer_info_get(const void *ptr,
                                      dlb_cuda_pointer_info *info,
                                      dlb_error *err);

/* Check that ptr really is memory of the claimed device, before anyone reads
 * it: kDLCUDA needs device (or managed) memory of that ordinal, kDLCUDAHost
 * pinned host memory, kDLCUDAManaged managed memory, kDLCPU anything the CPU
 * may read (unregistered, pinned or managed, never plain device memory).
 * DLB_EINVAL with a message naming the claim and what the pointer is;
 * other device types are DLB_EUNSUPPORTED.  NULL ptr passes (empty
 * tensors). */
DLB_API int dlb_cuda_check_pointer(DLDevice claimed, const void *ptr,
                                   dlb_error *err);

/* The device a CUDA pointer lives on, as a DLDevice: kDLCUDA with the
 * pointer's own ordinal, kDLCUDAManaged, or kDLCUDAHost.  For importers that
 * are given only an address (__cuda_array_interface__).  Unregistered host
 * memory is DLB_EINVAL. */
DLB_API int dlb_cuda_device_of_pointer(const void *ptr, DLDevice *out,
                                       dlb_error *err);

/* Stream-ordered device memory: cuMemAllocAsync on stream, in device_id's
 * primary context, from the device's default memory pool; 256-byte aligned.
 * Legal inside graph capture (the graph then owns the allocation).  nbytes
 * == 0 gives *out == NULL.  DLB_ENOMEM when the device is out of memory. */
DLB_API int dlb_cuda_alloc(int device_id, size_t nbytes, void *stream,
                           void **out,
                           dlb_error *err);

/* Free memory from dlb_cuda_alloc with cuMemFreeAsync on stream (NULL ptr is
 * a no-op).  The memory may be reused by work ordered after stream's pending
 * work, so pass the stream the memory was last used on. */
DLB_API int dlb_cuda_free(int device_id, void *ptr, void *stream,
                          dlb_error *err);

/* Pinned (page-locked) host memory for kDLCUDAHost: cuMemHostAlloc with
 * CU_MEMHOSTALLOC_PORTABLE (usable from every context).  Freeing it
 * (cuMemFreeHost) is synchronous: not for use during graph capture. */
DLB_API int dlb_cuda_host_alloc(size_t nbytes, void **out, dlb_error *err);
DLB_API int dlb_cuda_host_free(void *ptr, dlb_error *err);

/* A new owning tensor in CUDA memory, like dlb_managed_empty/zeros: compact
 * row-major strides, version {1, 3}, flags 0 (IS_SUBBYTE_TYPE_PADDED when
 * padded).  device.device_type:
 *   kDLCUDA      data from dlb_cuda_alloc on stream; zeros clears it with
 *                cuMemsetD8Async on the same stream.  The deleter frees it
 *                exactly once with cuMemFreeAsync on the LEGACY stream (which
 *                outlives every other stream; `stream` may be destroyed
 *                before the tensor), in the device's primary context,
 *                restoring the caller's context.  Work on a non-blocking
 *                stream still using the memory when the tensor is deleted
 *                must be ordered by the caller (as with PyTorch's caching
 *                allocator).
 *   kDLCUDAHost  data from dlb_cuda_host_alloc (stream unused; zeros clears
 *                it on the host); the deleter calls cuMemFreeHost.
 * On failure nothing is left allocated. */
DLB_API int dlb_cuda_managed_empty(int32_t ndim, const int64_t *shape,
                                   DLDataType dtype, DLDevice device,
                                   bool padded,
                                   void *stream, DLManagedTensorVersioned **out,
                                   dlb_error *err);
DLB_API int dlb_cuda_managed_zeros(int32_t ndim, const int64_t *shape,
                                   DLDataType dtype, DLDevice device,
                                   bool padded,
                                   void *stream, DLManagedTensorVersioned **out,
                                   dlb_error *err);

/* Decode a DLPack __dlpack__(stream=...) value for a CUDA producer, in one
 * place so no caller re-implements the table.  value NULL stands for Python's
 * None.
 *   None -> the legacy stream (1), *order = true
 *   -1   -> *stream = NULL, *order = false (the consumer asked for no sync)
 *   0    -> DLB_EINVAL (disallowed on CUDA by the array API)
 *   1, 2 -> the legacy / per-thread default stream, *order = true
 *   > 2  -> that stream handle, *order = true
 *   < -1 -> DLB_EINVAL */
DLB_API int dlb_cuda_stream_from_dlpack(const int64_t *value, void **stream,
                                        bool *order, dlb_error *err);

/* The same for the "stream" field of __cuda_array_interface__ v3: missing or
 * None (value NULL) means no synchronisation is required (*order = false);
 * 0 is disallowed; 1, 2 and handles as above.  -1 is not a CAI value and is
 * DLB_EINVAL. */
DLB_API int dlb_cuda_stream_from_cai(const int64_t *value, void **stream,
                                     bool *order,
                                     dlb_error *err);

/* Whether stream is being captured into a graph (cuStreamIsCapturing).  The
 * legacy stream cannot itself be captured, and querying it while another
 * stream captures is an error, so NULL and 1 answer false without asking
 * the driver.  An invalidated capture counts as capturing. */
DLB_API int dlb_cuda_stream_is_capturing(int device_id, void *stream, bool *out,
                                         dlb_error *err);

/* Order everything already queued on producer before anything later queued
 * on consumer, without blocking the host: when the two streams differ, an
 * event (created with CU_EVENT_DISABLE_TIMING, recorded on producer) is
 * waited on by consumer (cuStreamWaitEvent) and destroyed (the driver keeps
 * it alive until the wait is resolved).  Equal streams: nothing happens, no
 * driver call.  Graph capture: the non-legacy streams are asked whether they
 * capture; if one does and the other is the legacy stream, the ordering
 * cannot be expressed without touching the legacy stream inside a capture,
 * so this fails with DLB_EUNSUPPORTED (pass the capturing stream, or -1, as
 * the consumer stream).  Between two non-legacy streams the record + wait
 * is done.  A capturing consumer waits on a producer outside the capture
 * with CU_EVENT_WAIT_EXTERNAL (a plain wait is
 * CUDA_ERROR_STREAM_CAPTURE_ISOLATION): the graph then holds an event-wait
 * node, so that event is kept alive (never destroyed).  A non-capturing
 * consumer waiting on a capturing producer joins the capture and must be
 * joined back before the capture ends (CUDA's rule). */
DLB_API int dlb_cuda_stream_order(int device_id, void *producer, void *consumer,
                                  dlb_error *err);

/* Block the calling thread until everything queued on stream (of device_id)
 * has run: cuStreamSynchronize.  The one host wait dlbridge makes, for a
 * copy into host memory that the host reads next (Tensor.copy(device="cpu"),
 * tolist); never for ordering between streams.  A stream being captured
 * into a graph cannot be waited for: DLB_EUNSUPPORTED, without asking the
 * driver to (which would invalidate the capture). */
DLB_API int dlb_cuda_stream_synchronize(int device_id, void *stream,
                                        dlb_error *err);

/* Copy src's elements into dst, asynchronously on stream: same dtype and
 * shape, any layouts (strides, negative strides, byte_offset), either side
 * kDLCPU/kDLCUDAHost (host) or kDLCUDA/kDLCUDAManaged (device).  Nothing
 * passes through host code:
 *   - both contiguous: one cuMemcpyAsync;
 *   - layouts that are rows of contiguous bytes with one pitch on each side:
 *     one cuMemcpy2DAsync;
 *   - device <-> device otherwise: a strided-copy kernel compiled once per
 *     device with NVRTC (libnvrtc loaded with dlopen: DLB_CUDA_NVRTC, else
 *     libnvrtc.so.13, .12, .11.2, libnvrtc.so) and launched on stream;
 *   - host -> device otherwise: the bytes src's elements span are copied to
 *     a stream-ordered device buffer, then the kernel scatters them;
 *   - device -> host otherwise: the kernel gathers into a device buffer laid
 *     out like dst, whose span is then copied to dst.  This needs dst's
 *     elements to fill their byte span (transposed, reversed and offset
 *     layouts do); a host layout with gaps is DLB_EUNSUPPORTED (copy to a
 *     contiguous host tensor, then dlb_copy).
 * Both host: dlb_copy (synchronous, stream unused).  Device to device across
 * two GPUs: contiguous only.  dst and src must not overlap.  The work runs in
 * the device's primary context; the staging buffers are freed on stream
 * (stream-ordered), so this is legal inside graph capture as long as
 * stream is not the legacy stream; the kernel's one-time build runs with
 * the thread's capture mode relaxed, so it may come inside a capture. */
DLB_API int dlb_cuda_copy(const DLTensor *dst, const DLTensor *src,
                          void *stream,
                          dlb_error *err);

/* ---- Kernel signatures (signature.c) -----------------------------------------
 *
 * The signature language of dlb_kernel functions, as dlbridge.Function
 * takes it: "saxpy(a: float32, x: float32[n], y: mut float32[n]) ->
 * float32[n]", with `nodiff` parameters and named results for the
 * derivatives: "f(x: float32[n], idx: nodiff int64[k]) -> (y: float32[k],
 * lse: nodiff float32)" (grammar in src/core/signature.c and
 * docs/function.md).
 * Parsed into flat records: a parameter is a dtype, a rank and the index
 * of its first dimension record; a dimension is a literal extent, the
 * first appearance of a name (binds it), or a later one (must equal the
 * extent at (from_param, from_axis) that bound it).  Inputs come first,
 * then results.
 *
 * Batch dimensions: dims beginning with `...` ("bscale(a: float64[...],
 * x: float64[..., n]) -> (y: float64[..., n])") take any number of
 * leading axes before their ndim core ones (the `batch` flag).  A dim
 * record's (from_param, from_axis) counts core axes: the extent it names
 * is axis (t->ndim - params[from_param].ndim + from_axis) of that
 * parameter's tensor.  dlb_signature_batch_shape broadcasts the batch
 * parts. */

#define DLB_SIGNATURE_MAX_PARAMS 64

enum {
  DLB_SIGNATURE_DIM_LITERAL = 0, /* extent must equal value */
  DLB_SIGNATURE_DIM_BIND,        /* first use of a name: anything goes */
  DLB_SIGNATURE_DIM_CHECK        /* must equal the extent that bound it */
};

typedef struct dlb_signature_dim {
  int64_t value;      /* DLB_SIGNATURE_DIM_LITERAL: the extent */
  int16_t kind;
  int16_t from_param; /* BIND / CHECK: the (parameter, axis) that bound it */
  int16_t from_axis;
  int16_t sym;        /* index into sym[], -1 for literals */
} dlb_signature_dim;

typedef struct dlb_signature_param {
  DLDataType dtype;
  int32_t ndim;
  int32_t dim0; /* first of ndim records in dims[] */
  uint8_t mut;  /* inputs only: written by the kernel */
  uint8_t nodiff; /* declared `nodiff`: no cotangent/tangent (inputs and
                     results) */
  uint8_t batch;  /* dims begin with `...`: any leading batch dims, then
                     the ndim core dims (dim0.. describe the core only) */
} dlb_signature_param;

/* The parse, in one (large: ~130 KB, allocate it) struct.  Names point
 * into the text parsed, which must outlive their use. */
typedef struct dlb_signature {
  const char *text;
  size_t length, pos;
  const char *message; /* the first error, or NULL */
  size_t error_pos;    /* byte offset of the error in text */
  char message_buf[160];
  const char *name;    /* the function name */
  size_t name_len;
  int nparams, nin;    /* parameters and results; inputs among them */
  dlb_signature_param params[DLB_SIGNATURE_MAX_PARAMS];
  /* a parameter's name; a result's name, or NULL / 0 when it has none
   * (dlb_signature_param_label gives every result a label) */
  const char *param_name[DLB_SIGNATURE_MAX_PARAMS];
  size_t param_name_len[DLB_SIGNATURE_MAX_PARAMS];
  int ndims;
  dlb_signature_dim dims[DLB_SIGNATURE_MAX_PARAMS * DLB_MAX_NDIM];
  int nsyms;
  const char *sym[DLB_SIGNATURE_MAX_PARAMS * DLB_MAX_NDIM];
  size_t sym_len[DLB_SIGNATURE_MAX_PARAMS * DLB_MAX_NDIM];
} dlb_signature;

/* Parse length bytes of text (no NUL needed) into *out.  DLB_EINVAL with a
 * message and its byte offset (also in out->message / out->error_pos) for
 * text that is not a signature. */
DLB_API int dlb_signature_parse(const char *text, size_t length,
                                dlb_signature *out, dlb_error *err);

/* ---- Batch dimensions (signature_batch.c) ------------------------------------
 *
 * NumPy's broadcast of the batch parts of a call's `...` tensors: the
 * batch part of tensor i (parameter params[i], p->batch set) is its
 * leading t->ndim - p->ndim axes; the parts are right-aligned, and at each
 * axis every extent is the broadcast one or 1.  An extent < 0 is unknown
 * (a compiler's dynamic dimension): it matches anything, and the
 * broadcast extent is unknown (-1) only when no tensor knows it (a known
 * one other than 1 wins).  Parameters without `...` are not looked at. */

enum {
  DLB_BATCH_OK = 0,
  DLB_BATCH_RANK,      /* refused has fewer dims than its core rank */
  DLB_BATCH_TOO_MANY,  /* refused has more than DLB_MAX_NDIM batch dims */
  DLB_BATCH_BROADCAST, /* refused and other do not broadcast */
  DLB_BATCH_NOT_FULL   /* refused (a `mut` input or a result) is not the
                          whole broadcast shape, which other gave at
                          that axis */
};

typedef struct dlb_signature_batch {
  int32_t ndim;                /* R = len(B) */
  int64_t shape[DLB_MAX_NDIM]; /* B; -1 where unknown */
  int32_t reason;              /* DLB_BATCH_*: why it failed */
  int32_t refused, other;      /* the parameters (indices into params), -1
                                  when none */
  int32_t axis;                /* the batch axis, counted from the right
                                  (0: the last batch axis), or -1 */
} dlb_signature_batch;

/* The broadcast batch shape of tensors[0..nparams) (NULL entries, e.g.
 * results not allocated yet, are skipped) into *out.  Inputs
 * [0, nin) broadcast into B; a `mut` input and a result [nin, nparams)
 * must already have B's extent at every axis (both left-padded with 1s:
 * the kernel writes all of it); a `mut` input broadcasts into B too, a
 * result does not.  DLB_EINVAL with out->reason, refused,
 * other and axis saying who (and a message by parameter index: a caller
 * with names writes its own).  On success reason is DLB_BATCH_OK and
 * refused / other / axis are -1. */
DLB_API int dlb_signature_batch_shape(const dlb_signature_param *params,
                                      int nin, int nparams,
                                      DLTensor *const *tensors,
                                      dlb_signature_batch *out,
                                      dlb_error *err);

/* The header a kernel gets for tensor t of `...` parameter p in a call of
 * batch shape b (from dlb_signature_batch_shape): t's dims left-padded to
 * b->ndim batch dims with extent 1 and stride 0, strides always written
 * (compact row-major when t->strides is NULL), data / device / dtype /
 * byte_offset as t's.  No copy, no allocation: shape and strides (at
 * least b->ndim + p->ndim entries each) are the caller's and must outlive
 * *out.  DLB_EINVAL when t's batch part is longer than b or the result
 * would pass DLB_MAX_NDIM. */
DLB_API int dlb_signature_batch_pad(const dlb_signature_param *p,
                                    const DLTensor *t,
                                    const dlb_signature_batch *b,
                                    int64_t *shape, int64_t *strides,
                                    DLTensor *out, dlb_error *err);

/* ---- Derivatives of a signature (signature_grad.c) ---------------------------
 *
 * A Function's vjp and jvp kernels are Functions of their own, bound to the
 * primal by name (docs/function.md, "Gradients"):
 *   vjp: <name>_vjp(<every input>, d<r> per differentiable result r)
 *            -> (d<p>: per differentiable input p)
 *   jvp: <name>_jvp(<every input>, t<p> per differentiable input p)
 *            -> (t<r>: per differentiable result r)
 * A spelled derivative signature may take any subset of the primal's
 * inputs and results (a vjp's are saved from the forward; a jvp runs after
 * the forward, softmax's reads its result), must take
 * the cotangent (tangent) of every differentiable result (input), and must
 * return exactly one cotangent (tangent) per differentiable input
 * (result).  A derivative parameter or result has the dtype, rank and
 * dimension spelling of its primal, `...` included; none is `mut`.
 *
 * A parameter or result is differentiable when its dtype is floating or
 * complex (float*, bfloat16, complex*) and it is neither `mut` nor
 * `nodiff`.  A result's label is its name, or "out" for the only result,
 * "out<k>" for the k-th of several unnamed ones. */

enum { DLB_DERIVATIVE_VJP = 0, DLB_DERIVATIVE_JVP = 1 };

/* What a derivative kernel's parameter receives. */
enum {
  DLB_BIND_INPUT = 0,    /* the primal's input `index` */
  DLB_BIND_RESULT = 1,   /* the primal's result `index` (0-based among the
                            results), as the forward computed it */
  DLB_BIND_DERIVATIVE = 2 /* vjp: the cotangent of result `index`;
                             jvp: the tangent of input `index` */
};

typedef struct dlb_signature_binding {
  int nargs;    /* the derivative's inputs */
  int nresults; /* the derivative's results */
  struct {
    int16_t kind;  /* DLB_BIND_* */
    int16_t index;
  } arg[DLB_SIGNATURE_MAX_PARAMS];
  /* vjp: the primal input each result is the cotangent of; jvp: the
   * primal result (0-based among results) each result is the tangent of */
  int16_t result[DLB_SIGNATURE_MAX_PARAMS];
} dlb_signature_binding;

/* Whether parameter or result i of s (0 <= i < s->nparams) is
 * differentiable (1) or not (0). */
DLB_API int dlb_signature_differentiable(const dlb_signature *s, int i);

/* The label of parameter or result i: its name, or out / out<k> for an
 * unnamed result.  Writes at most cap bytes with a NUL (truncating);
 * returns the label's length. */
DLB_API size_t dlb_signature_param_label(const dlb_signature *s, int i,
                                         char *buf, size_t cap);

/* The derived signature of kind (DLB_DERIVATIVE_*) of primal, as text in
 * buf (cap bytes, NUL-terminated; *len its length).  DLB_EINVAL with a
 * message naming the reason: a `mut` parameter, nothing differentiable
 * among the inputs or the results, a derived name (d<r>, t<p>, ...) that
 * is also another name's (both meanings named); DLB_EOVERFLOW when cap is
 * too small, *len then the length it needs (without the NUL), as
 * snprintf.  The text always parses and binds back to primal (every input
 * is kept, so every dimension name is bound). */
DLB_API int dlb_signature_derive(const dlb_signature *primal, int kind,
                                 char *buf, size_t cap, size_t *len,
                                 dlb_error *err);

/* Bind the derivative signature deriv (derived or spelled) of kind to
 * primal by name into *out.  DLB_EINVAL with a message naming the
 * parameter for: a name that is neither an input, a result (vjp), nor the
 * derivative of one; the derivative of something not differentiable; a
 * type (dtype, rank, `...` or dims) other than its primal's; a `mut` parameter;
 * a missing cotangent/tangent parameter or result; a result that is not
 * d<input> (t<result>) (an unnamed one included); a name with two
 * meanings; and what dlb_signature_derive refuses of the primal: `mut`
 * parameters, nothing differentiable.  (A name given twice cannot parse.)
 * *out is zeroed on failure. */
DLB_API int dlb_signature_bind(const dlb_signature *primal,
                               const dlb_signature *deriv, int kind,
                               dlb_signature_binding *out, dlb_error *err);

/* ---- CUDA IPC (cuda_ipc.c) ---------------------------------------------------
 *
 * Device memory another process maps with no copy, for dlbridge.share of
 * CUDA tensors.  CUDA's IPC handles work on memory from cuMemAlloc only
 * (not on the stream-ordered pool memory of dlb_cuda_alloc), so memory to
 * be shared is allocated for it.  A handle carries the allocation's
 * cuIpcMemHandle, an interprocess event recorded on the exporter's stream
 * when the handle was made (the importer's stream waits for it on the GPU),
 * the device's UUID (devices are matched by UUID: CUDA_VISIBLE_DEVICES may
 * order them differently in two processes), and the exporter's address and
 * process id.  Lifetime, CUDA's rule: the exporting process must keep the
 * allocation alive while any importer has it open.  The IPC entry points
 * are optional in the driver table: without them these calls fail with
 * DLB_EUNSUPPORTED and nothing else is affected. */

typedef struct dlb_cuda_ipc_handle {
  unsigned char memory[64]; /* CUipcMemHandle of the allocation */
  unsigned char event[64];  /* CUipcEventHandle of the exporter's event */
  unsigned char uuid[16];   /* CUuuid of the device */
  uint64_t base;            /* the allocation's address in the exporter */
  uint64_t size;            /* its size in bytes */
  int64_t pid;              /* the exporter's process id */
} dlb_cuda_ipc_handle;

/* Memory that can be exported (cuMemAlloc in device_id's primary context;
 * synchronous, so not during graph capture), and its free (cuMemFree). */
DLB_API int dlb_cuda_ipc_alloc(int device_id, size_t nbytes, void **out,
                               dlb_error *err);
DLB_API int dlb_cuda_ipc_free(int device_id, void *ptr, dlb_error *err);

/* An interprocess event (CU_EVENT_INTERPROCESS | DISABLE_TIMING) to export
 * with an allocation; it must live as long as handles made with it can be
 * opened. */
DLB_API int dlb_cuda_ipc_event_create(int device_id, void **event,
                                      dlb_error *err);
DLB_API int dlb_cuda_ipc_event_destroy(int device_id, void *event,
                                       dlb_error *err);

/* Fill h for the allocation base (size bytes, from dlb_cuda_ipc_alloc on
 * device_id), recording event on stream first: the importer will wait for
 * the work queued on stream so far. */
DLB_API int dlb_cuda_ipc_export(int device_id, void *base, size_t size,
                                void *event, void *stream,
                                dlb_cuda_ipc_handle *h, dlb_error *err);

/* The local ordinal of the device h's memory lives on (by UUID); DLB_EINVAL
 * when this process does not see it. */
DLB_API int dlb_cuda_ipc_find_device(const dlb_cuda_ipc_handle *h,
                                     int *device_id, dlb_error *err);

/* Map h's allocation here (cuIpcOpenMemHandle, peer access enabled lazily):
 * *device_id is its device, *base its address in this process; stream (of
 * that device) waits for the exporter's event.  A handle made by this very
 * process is DLB_EINVAL (CUDA cannot open those; the memory is at h->base
 * already), and so is one whose size is larger than the allocation it names
 * (the driver's cuMemGetAddressRange says; h may come from a hostile
 * pickle): h->size bytes from *base are mapped when this succeeds.  Close
 * with dlb_cuda_ipc_close. */
DLB_API int dlb_cuda_ipc_open(const dlb_cuda_ipc_handle *h, void *stream,
                              int *device_id, void **base, dlb_error *err);
DLB_API int dlb_cuda_ipc_close(int device_id, void *base, dlb_error *err);

/* ---- Shared memory (shm.c) -------------------------------------------------
 *
 * POSIX shared-memory segments several processes map, for dlbridge.share.
 * A segment is named "dlb-<creator pid>-<serial>-<salt>" (as listed in
 * /dev/shm) and holds DLB_SHM_HEADER_BYTES of header, then the data, aligned
 * to DLB_DATA_ALIGNMENT.  A cross-process count in the header tracks live
 * mappings and handles in flight (described to another process, not yet
 * opened there), and each mapping holds a shared flock, which its process
 * drops however it ends; the segment's name is unlinked once no process
 * maps it and no handle is in flight.
 * Lifetime rules and crash cleanup: docs/scale-out.md. */

#define DLB_SHM_HEADER_BYTES 256
/* Longest segment name, terminator included. */
#define DLB_SHM_NAME_MAX 64

typedef struct dlb_shm dlb_shm;  /* one mapping of a segment in this process */

/* A new segment with data_bytes of data (0 is fine), mapped read-write, the
 * caller's mapping counted.  Its pages are reserved now, so a full /dev/shm
 * fails here (DLB_ENOMEM) and never with a SIGBUS later.  The shm functions
 * report a failing system call (out of file descriptors: each open dlb_shm
 * keeps one; /dev/shm not writable) as DLB_ESYSTEM, errno left set. */
DLB_API int dlb_shm_create(size_t data_bytes, dlb_shm **out, dlb_error *err);

/* Map the segment named name (as dlb_shm_name gives it), adopting one
 * handle in flight if there is one.  DLB_EINVAL for a name that is not of
 * dlbridge's form, a segment that is gone or already released, or one whose
 * header or size is wrong (a segment shrunk since it was made is refused
 * before anything is mapped).  A failed open changes no count. */
DLB_API int dlb_shm_open(const char *name, dlb_shm **out, dlb_error *err);

/* Count one handle in flight: the segment outlives every mapping until
 * someone opens it (or dlb_shm_cleanup finds its creator dead and it
 * unmapped). */
DLB_API int dlb_shm_hand_out(dlb_shm *shm, dlb_error *err);

/* Unmap; unlink the name when no process maps the segment any more and no
 * handle is in flight -- counted mappings of processes that ended without
 * closing (_exit, a crash) do not keep it.  NULL is fine.  A handle still
 * open when the process exits normally gives its segment back then (the
 * pages stay mapped until dlb_shm_close). */
DLB_API void dlb_shm_close(dlb_shm *shm);

/* Close a handle dlb_shm_open just made, unused (the load it served
 * failed): the handle in flight the open adopted is in flight again, so it
 * can still be loaded; otherwise as dlb_shm_close.  NULL is fine. */
DLB_API void dlb_shm_close_unused(dlb_shm *shm);

/* DLB_DATA_ALIGNMENT-aligned */
DLB_API void *dlb_shm_data(const dlb_shm *shm);
DLB_API size_t dlb_shm_size(const dlb_shm *shm);       /* data bytes */
DLB_API const char *dlb_shm_name(const dlb_shm *shm);  /* "dlb-..." */
/* The counts in the header now (racy by nature: for tests and diagnostics). */
DLB_API void dlb_shm_counts(const dlb_shm *shm, uint32_t *mappings,
                            uint32_t *in_flight);

/* Unlink leftovers: segments no process maps whose creator no longer runs
 * (their handles in flight are given up), and segments this process made
 * that no process maps and no handle in flight holds.  Runs at a normal
 * exit too.  *removed (may be NULL) gets how many. */
DLB_API int dlb_shm_cleanup(int *removed, dlb_error *err);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DLBRIDGE_DLBRIDGE_H_ */
