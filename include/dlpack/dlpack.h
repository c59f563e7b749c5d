/*
 * dlpack.h -- the DLPack 1.3 ABI, transcribed for dlbridge.
 *
 * Every struct, enum value, flag and function-pointer type here is laid out
 * exactly as in upstream DLPack 1.3, so a tensor built against this header can
 * be handed to any other DLPack implementation and back.  tests/c/test_abi.c
 * checks each size and offset against the published values (LP64).
 * Four enum values from DLPack's main branch, newer than 1.3 and marked so
 * below, are here too (kDLTPU, kDLTPUHost, kDLAscend, kDLBcomplex): enum
 * additions change no layout.
 *
 * The prose is ours; it records the ownership, NULL and version rules a
 * correct producer or consumer has to follow, because those rules are where
 * implementations go wrong.
 */
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define DLPACK_EXTERN_C extern "C"
#else
#define DLPACK_EXTERN_C
#endif

/* Version of the DLPack ABI this header describes.  A consumer compares a
 * tensor's version.major with DLPACK_MAJOR_VERSION before touching anything
 * past DLManagedTensorVersioned.flags. */
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 3

#ifdef _WIN32
#ifdef DLPACK_EXPORTS
#define DLPACK_DLL __declspec(dllexport)
#else
#define DLPACK_DLL __declspec(dllimport)
#endif
#else
#define DLPACK_DLL
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A DLPack version.  major changes when the layout of
 * DLManagedTensorVersioned changes (an ABI break); minor when values are added
 * that old consumers may not understand (new device types, dtype codes).
 * A consumer that meets a major other than its own must call the deleter and
 * read nothing else.  On a newer minor it may go on if it understands every
 * value it actually meets. */
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

/* Where the memory lives.  5 and 6 are unassigned. */
#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
  kDLCPU = 1,         /* plain host memory */
  kDLCUDA = 2,        /* CUDA device memory (cudaMalloc) */
  kDLCUDAHost = 3,    /* pinned host memory (cudaMallocHost) */
  kDLOpenCL = 4,      /* OpenCL; data may be a cl_mem handle */
  kDLVulkan = 7,      /* Vulkan buffer */
  kDLMetal = 8,       /* Apple Metal */
  kDLVPI = 9,         /* Verilog simulator buffer */
  kDLROCM = 10,       /* AMD ROCm device memory */
  kDLROCMHost = 11,   /* pinned host memory (hipMallocHost) */
  kDLExtDev = 12,     /* reserved for extension / testing devices */
  kDLCUDAManaged = 13,/* CUDA managed (unified) memory */
  kDLOneAPI = 14,     /* oneAPI unified shared memory */
  kDLWebGPU = 15,     /* WebGPU */
  kDLHexagon = 16,    /* Qualcomm Hexagon DSP */
  kDLMAIA = 17,       /* Microsoft MAIA (since 1.0) */
  kDLTrn = 18,        /* AWS Trainium (since 1.2) */
  /* Post-1.3: on DLPack's main branch, not in a release yet (the version
   * macros stay 1.3).  Producers already send them (JAX exports TPU host
   * arrays as kDLTPUHost), so a consumer meets them in 1.3 tensors. */
  kDLTPU = 19,        /* Google TPU device memory */
  kDLTPUHost = 20,    /* host memory of a TPU runtime (not known to be
                       * readable by the consumer's CPU) */
  kDLAscend = 21,     /* Huawei Ascend NPU */
} DLDeviceType;

/* A device: its type and the producer's index for it.  device_id is 0 for
 * plain CPU, pinned and managed memory.  Numbering is the producer's own; for
 * CUDA a consumer can recover the real device from the pointer. */
typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

/* Type codes stored in DLDataType.code (a uint8_t). */
typedef enum {
  kDLInt = 0U,           /* signed integer */
  kDLUInt = 1U,          /* unsigned integer */
  kDLFloat = 2U,         /* IEEE 754 binary float */
  kDLOpaqueHandle = 3U,  /* opaque handle; meaning agreed by both sides */
  kDLBfloat = 4U,        /* bfloat16 */
  kDLComplex = 5U,       /* complex; bits counts both parts (complex64 = 64) */
  kDLBool = 6U,          /* boolean stored in 8 bits */
  /* Since 1.1: the fp8 codes carry bits == 8. */
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
  kDLFloat8_e8m0fnu = 14U,
  /* Since 1.1: fp6 carries bits == 6 and fp4 bits == 4.  A consumer that sees
   * any other bits for these codes must refuse the tensor.  Sub-byte elements
   * are packed, element i at bits [i*bits, (i+1)*bits) little bit-endian,
   * unless DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED says otherwise. */
  kDLFloat6_e2m3fn = 15U,
  kDLFloat6_e3m2fn = 16U,
  kDLFloat4_e2m1fn = 17U,
  /* Post-1.3 (DLPack's main branch, not released): a complex number whose
   * real and imaginary parts are each a bfloat16, real first; bits counts
   * both parts, so bcomplex32 is {18, 32, 1}. */
  kDLBcomplex = 18U,
} DLDataTypeCode;

/* An element type: code, bits per lane, and lanes (> 1 for vector types).
 * Values are in the machine's native byte order.  float32 is {2, 32, 1};
 * complex64 is {5, 64, 1}, never {2, 32, 2}; bool is {6, 8, 1}. */
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

/* A strided view of memory.  Nothing in it is owned: the enclosing managed
 * tensor (or the caller of a borrowing API) keeps data, shape and strides
 * alive.
 *
 *  data        start of the allocation; element 0 lives at
 *              (char *)data + byte_offset.  The header once promised 256-byte
 *              alignment; no major framework honours that, so never rely on
 *              it.  May be NULL when the tensor has no elements.  On some
 *              devices (OpenCL) it is an opaque handle, not an address.
 *  ndim        number of dimensions, 0 for a scalar.
 *  shape       ndim extents; may be NULL when ndim == 0.
 *  strides     ndim steps in ELEMENTS, not bytes; may be negative or zero.
 *              Up to 1.1 NULL meant compact row-major; from 1.2 a producer
 *              must fill it when ndim != 0 (a consumer should still accept
 *              NULL from older producers).  A stride on a dimension of extent
 *              1 carries no meaning and may hold any value.
 *  byte_offset bytes from data to element 0. */
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;

/* The pre-1.0 owning wrapper, carried in a PyCapsule named "dltensor".
 * Deprecated since 0.8 but still all that JAX and TensorFlow produce.
 *  manager_ctx  the producer's context; opaque to the consumer.
 *  deleter      frees everything including this struct; may be NULL when the
 *               producer has nothing to release.  Called exactly once, by
 *               whoever owns the tensor last.
 * It cannot express read-only data, which is why producers refuse to export
 * read-only memory this way. */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* Bits of DLManagedTensorVersioned.flags. */
/* The consumer must not write through this tensor (since 1.0). */
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
/* The producer made a copy for this export; the consumer is its only owner
 * (since 1.0). */
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
/* Sub-byte elements each take whole bytes instead of being packed (1.1). */
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

/* The 1.x owning wrapper, carried in a PyCapsule named "dltensor_versioned".
 * Every field up to and including flags keeps its offset in all future
 * majors, so a consumer can always read version and call deleter.
 *  version      the DLPack version the producer followed.
 *  manager_ctx  the producer's context.
 *  deleter      frees everything including this struct; may be NULL.
 *  flags        DLPACK_FLAG_BITMASK_* bits.
 *  dl_tensor    the view (last here, unlike DLManagedTensor). */
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* ---- The C exchange API (1.2, renamed in 1.3) ----------------------------
 *
 * A framework publishes one process-lifetime DLPackExchangeAPI table as a
 * class attribute of its tensor type: __dlpack_c_exchange_api__, a PyCapsule
 * named "dlpack_exchange_api" (1.2 used an int named
 * __c_dlpack_exchange_api__).  Every function returns 0 on success and -1 on
 * failure, is called with the GIL held, and lets no C++ exception escape.
 * py_object arguments are PyObject * passed as void *. */

/* Allocate a new tensor in the producer's framework shaped like prototype
 * (only dtype, ndim, shape and device are read).  On success store an owning
 * tensor in *out.  On failure return -1 after calling
 * SetError(error_ctx, kind, message) exactly once, kind naming an exception
 * type such as "MemoryError"; errors go through the callback, not the Python
 * error indicator. */
typedef int (*DLPackManagedTensorAllocator)(
    DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
    void (*SetError)(void *error_ctx, const char *kind, const char *message));

/* Export py_object (an instance of the table's type) as an owning tensor in
 * *out, with no stream synchronisation.  -1 with a Python exception on
 * failure (BufferError when the data cannot be described). */
typedef int (*DLPackManagedTensorFromPyObjectNoSync)(
    void *py_object, DLManagedTensorVersioned **out);

/* Fill a caller-owned DLTensor describing py_object without allocating.
 * data, shape and strides stay owned by the object and are valid only while
 * the caller holds it and runs no Python code.  Optional: the table entry may
 * be NULL. */
typedef int (*DLPackDLTensorFromPyObjectNoSync)(void *py_object,
                                                DLTensor *out);

/* Store the producer's current work stream for the device (a cudaStream_t or
 * hipStream_t as void *).  NULL on CUDA means the legacy default stream;
 * stream-less devices store NULL. */
typedef int (*DLPackCurrentWorkStream)(DLDeviceType device_type,
                                       int32_t device_id,
                                       void **out_current_stream);

/* Import an owning tensor as a new reference to the producer's tensor type.
 * Ownership of tensor is stolen. */
typedef int (*DLPackManagedTensorToPyObjectNoSync)(
    DLManagedTensorVersioned *tensor, void **out_py_object);

/* Every table starts with this header.  version is the DLPack version the
 * table implements; a consumer checks version.major and, when it is newer
 * than it understands, walks prev_api to an older table (NULL: none). */
typedef struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  struct DLPackExchangeAPIHeader *prev_api;
} DLPackExchangeAPIHeader;

/* The major-1 table.  All entries but dltensor_from_py_object_no_sync are
 * required.  The table must live as long as the process. */
typedef struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  DLPackManagedTensorAllocator managed_tensor_allocator;
  DLPackManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync;
  DLPackManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync;
  DLPackDLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync;
  DLPackCurrentWorkStream current_work_stream;
} DLPackExchangeAPI;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DLPACK_DLPACK_H_ */
