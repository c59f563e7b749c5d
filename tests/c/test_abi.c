/* test_abi.c -- include/dlpack/dlpack.h against the published DLPack 1.3
 * ABI (LP64).  Each fact is checked twice: _Static_assert stops a broken
 * header from compiling at all, and the runtime CHECK_EQ makes the count of
 * checked facts visible in the test report. */
#include <stddef.h>

#include "check.h"

#if UINTPTR_MAX == UINT64_MAX
#define LP64_ONLY(x) x
#else
#define LP64_ONLY(x)
#endif

/* Pointer-sized facts are asserted at compile time only on 64-bit targets,
 * where the published values apply; elsewhere the runtime checks still run
 * and report the difference. */
#define ABI_STATIC(expr, value) \
  _Static_assert((expr) == (value), #expr " == " #value)

/* ---- compile time --------------------------------------------------------- */

ABI_STATIC(sizeof(DLPackVersion), 8);
ABI_STATIC(offsetof(DLPackVersion, major), 0);
ABI_STATIC(offsetof(DLPackVersion, minor), 4);

ABI_STATIC(sizeof(DLDeviceType), 4);
ABI_STATIC(sizeof(DLDevice), 8);
ABI_STATIC(offsetof(DLDevice, device_type), 0);
ABI_STATIC(offsetof(DLDevice, device_id), 4);

ABI_STATIC(sizeof(DLDataType), 4);
ABI_STATIC(offsetof(DLDataType, code), 0);
ABI_STATIC(offsetof(DLDataType, bits), 1);
ABI_STATIC(offsetof(DLDataType, lanes), 2);

LP64_ONLY(ABI_STATIC(sizeof(DLTensor), 48);)
LP64_ONLY(ABI_STATIC(_Alignof(DLTensor), 8);)
ABI_STATIC(offsetof(DLTensor, data), 0);
LP64_ONLY(ABI_STATIC(offsetof(DLTensor, device), 8);)
LP64_ONLY(ABI_STATIC(offsetof(DLTensor, ndim), 16);)
LP64_ONLY(ABI_STATIC(offsetof(DLTensor, dtype), 20);)
LP64_ONLY(ABI_STATIC(offsetof(DLTensor, shape), 24);)
LP64_ONLY(ABI_STATIC(offsetof(DLTensor, strides), 32);)
LP64_ONLY(ABI_STATIC(offsetof(DLTensor, byte_offset), 40);)

LP64_ONLY(ABI_STATIC(sizeof(DLManagedTensor), 64);)
ABI_STATIC(offsetof(DLManagedTensor, dl_tensor), 0);
LP64_ONLY(ABI_STATIC(offsetof(DLManagedTensor, manager_ctx), 48);)
LP64_ONLY(ABI_STATIC(offsetof(DLManagedTensor, deleter), 56);)

LP64_ONLY(ABI_STATIC(sizeof(DLManagedTensorVersioned), 80);)
ABI_STATIC(offsetof(DLManagedTensorVersioned, version), 0);
LP64_ONLY(ABI_STATIC(offsetof(DLManagedTensorVersioned, manager_ctx), 8);)
LP64_ONLY(ABI_STATIC(offsetof(DLManagedTensorVersioned, deleter), 16);)
LP64_ONLY(ABI_STATIC(offsetof(DLManagedTensorVersioned, flags), 24);)
LP64_ONLY(ABI_STATIC(offsetof(DLManagedTensorVersioned, dl_tensor), 32);)

LP64_ONLY(ABI_STATIC(sizeof(DLPackExchangeAPIHeader), 16);)
ABI_STATIC(offsetof(DLPackExchangeAPIHeader, version), 0);
ABI_STATIC(offsetof(DLPackExchangeAPIHeader, prev_api), 8);

LP64_ONLY(ABI_STATIC(sizeof(DLPackExchangeAPI), 56);)
ABI_STATIC(offsetof(DLPackExchangeAPI, header), 0);
LP64_ONLY(ABI_STATIC(offsetof(DLPackExchangeAPI, managed_tensor_allocator), 16);)
LP64_ONLY(ABI_STATIC(
    offsetof(DLPackExchangeAPI, managed_tensor_from_py_object_no_sync), 24);)
LP64_ONLY(ABI_STATIC(
    offsetof(DLPackExchangeAPI, managed_tensor_to_py_object_no_sync), 32);)
LP64_ONLY(ABI_STATIC(
    offsetof(DLPackExchangeAPI, dltensor_from_py_object_no_sync), 40);)
LP64_ONLY(ABI_STATIC(offsetof(DLPackExchangeAPI, current_work_stream), 48);)

ABI_STATIC(DLPACK_MAJOR_VERSION, 1);
ABI_STATIC(DLPACK_MINOR_VERSION, 3);

ABI_STATIC(kDLCPU, 1);
ABI_STATIC(kDLCUDA, 2);
ABI_STATIC(kDLCUDAHost, 3);
ABI_STATIC(kDLOpenCL, 4);
ABI_STATIC(kDLVulkan, 7);
ABI_STATIC(kDLMetal, 8);
ABI_STATIC(kDLVPI, 9);
ABI_STATIC(kDLROCM, 10);
ABI_STATIC(kDLROCMHost, 11);
ABI_STATIC(kDLExtDev, 12);
ABI_STATIC(kDLCUDAManaged, 13);
ABI_STATIC(kDLOneAPI, 14);
ABI_STATIC(kDLWebGPU, 15);
ABI_STATIC(kDLHexagon, 16);
ABI_STATIC(kDLMAIA, 17);
ABI_STATIC(kDLTrn, 18);
/* Post-1.3 values of DLPack's main branch. */
ABI_STATIC(kDLTPU, 19);
ABI_STATIC(kDLTPUHost, 20);
ABI_STATIC(kDLAscend, 21);

ABI_STATIC(kDLInt, 0);
ABI_STATIC(kDLUInt, 1);
ABI_STATIC(kDLFloat, 2);
ABI_STATIC(kDLOpaqueHandle, 3);
ABI_STATIC(kDLBfloat, 4);
ABI_STATIC(kDLComplex, 5);
ABI_STATIC(kDLBool, 6);
ABI_STATIC(kDLFloat8_e3m4, 7);
ABI_STATIC(kDLFloat8_e4m3, 8);
ABI_STATIC(kDLFloat8_e4m3b11fnuz, 9);
ABI_STATIC(kDLFloat8_e4m3fn, 10);
ABI_STATIC(kDLFloat8_e4m3fnuz, 11);
ABI_STATIC(kDLFloat8_e5m2, 12);
ABI_STATIC(kDLFloat8_e5m2fnuz, 13);
ABI_STATIC(kDLFloat8_e8m0fnu, 14);
ABI_STATIC(kDLFloat6_e2m3fn, 15);
ABI_STATIC(kDLFloat6_e3m2fn, 16);
ABI_STATIC(kDLFloat4_e2m1fn, 17);
ABI_STATIC(kDLBcomplex, 18);

ABI_STATIC(DLPACK_FLAG_BITMASK_READ_ONLY, 1);
ABI_STATIC(DLPACK_FLAG_BITMASK_IS_COPIED, 2);
ABI_STATIC(DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, 4);

/* ---- run time ------------------------------------------------------------- */

static void test_sizes_and_offsets(void) {
  CHECK_EQ(sizeof(DLPackVersion), 8);
  CHECK_EQ(_Alignof(DLPackVersion), 4);
  CHECK_EQ(offsetof(DLPackVersion, major), 0);
  CHECK_EQ(offsetof(DLPackVersion, minor), 4);

  CHECK_EQ(sizeof(DLDeviceType), 4);
  CHECK_EQ(sizeof(DLDevice), 8);
  CHECK_EQ(offsetof(DLDevice, device_type), 0);
  CHECK_EQ(offsetof(DLDevice, device_id), 4);

  CHECK_EQ(sizeof(DLDataType), 4);
  CHECK_EQ(offsetof(DLDataType, code), 0);
  CHECK_EQ(offsetof(DLDataType, bits), 1);
  CHECK_EQ(offsetof(DLDataType, lanes), 2);
  CHECK_EQ(sizeof(((DLDataType *)0)->code), 1);
  CHECK_EQ(sizeof(((DLDataType *)0)->bits), 1);
  CHECK_EQ(sizeof(((DLDataType *)0)->lanes), 2);

  CHECK_EQ(sizeof(DLTensor), 48);
  CHECK_EQ(_Alignof(DLTensor), 8);
  CHECK_EQ(offsetof(DLTensor, data), 0);
  CHECK_EQ(offsetof(DLTensor, device), 8);
  CHECK_EQ(offsetof(DLTensor, ndim), 16);
  CHECK_EQ(offsetof(DLTensor, dtype), 20);
  CHECK_EQ(offsetof(DLTensor, shape), 24);
  CHECK_EQ(offsetof(DLTensor, strides), 32);
  CHECK_EQ(offsetof(DLTensor, byte_offset), 40);
  CHECK_EQ(sizeof(((DLTensor *)0)->byte_offset), 8);

  CHECK_EQ(sizeof(DLManagedTensor), 64);
  CHECK_EQ(offsetof(DLManagedTensor, dl_tensor), 0);
  CHECK_EQ(offsetof(DLManagedTensor, manager_ctx), 48);
  CHECK_EQ(offsetof(DLManagedTensor, deleter), 56);

  CHECK_EQ(sizeof(DLManagedTensorVersioned), 80);
  CHECK_EQ(offsetof(DLManagedTensorVersioned, version), 0);
  CHECK_EQ(offsetof(DLManagedTensorVersioned, manager_ctx), 8);
  CHECK_EQ(offsetof(DLManagedTensorVersioned, deleter), 16);
  CHECK_EQ(offsetof(DLManagedTensorVersioned, flags), 24);
  CHECK_EQ(offsetof(DLManagedTensorVersioned, dl_tensor), 32);
  CHECK_EQ(sizeof(((DLManagedTensorVersioned *)0)->flags), 8);

  CHECK_EQ(sizeof(DLPackExchangeAPIHeader), 16);
  CHECK_EQ(offsetof(DLPackExchangeAPIHeader, version), 0);
  CHECK_EQ(offsetof(DLPackExchangeAPIHeader, prev_api), 8);

  CHECK_EQ(sizeof(DLPackExchangeAPI), 56);
  CHECK_EQ(offsetof(DLPackExchangeAPI, header), 0);
  CHECK_EQ(offsetof(DLPackExchangeAPI, managed_tensor_allocator), 16);
  CHECK_EQ(offsetof(DLPackExchangeAPI, managed_tensor_from_py_object_no_sync),
           24);
  CHECK_EQ(offsetof(DLPackExchangeAPI, managed_tensor_to_py_object_no_sync),
           32);
  CHECK_EQ(offsetof(DLPackExchangeAPI, dltensor_from_py_object_no_sync), 40);
  CHECK_EQ(offsetof(DLPackExchangeAPI, current_work_stream), 48);
}

static void test_device_types(void) {
  CHECK_EQ(kDLCPU, 1);
  CHECK_EQ(kDLCUDA, 2);
  CHECK_EQ(kDLCUDAHost, 3);
  CHECK_EQ(kDLOpenCL, 4);
  CHECK_EQ(kDLVulkan, 7);
  CHECK_EQ(kDLMetal, 8);
  CHECK_EQ(kDLVPI, 9);
  CHECK_EQ(kDLROCM, 10);
  CHECK_EQ(kDLROCMHost, 11);
  CHECK_EQ(kDLExtDev, 12);
  CHECK_EQ(kDLCUDAManaged, 13);
  CHECK_EQ(kDLOneAPI, 14);
  CHECK_EQ(kDLWebGPU, 15);
  CHECK_EQ(kDLHexagon, 16);
  CHECK_EQ(kDLMAIA, 17);
  CHECK_EQ(kDLTrn, 18);
  CHECK_EQ(kDLTPU, 19);
  CHECK_EQ(kDLTPUHost, 20);
  CHECK_EQ(kDLAscend, 21);
}

static void test_dtype_codes(void) {
  CHECK_EQ(kDLInt, 0);
  CHECK_EQ(kDLUInt, 1);
  CHECK_EQ(kDLFloat, 2);
  CHECK_EQ(kDLOpaqueHandle, 3);
  CHECK_EQ(kDLBfloat, 4);
  CHECK_EQ(kDLComplex, 5);
  CHECK_EQ(kDLBool, 6);
  CHECK_EQ(kDLFloat8_e3m4, 7);
  CHECK_EQ(kDLFloat8_e4m3, 8);
  CHECK_EQ(kDLFloat8_e4m3b11fnuz, 9);
  CHECK_EQ(kDLFloat8_e4m3fn, 10);
  CHECK_EQ(kDLFloat8_e4m3fnuz, 11);
  CHECK_EQ(kDLFloat8_e5m2, 12);
  CHECK_EQ(kDLFloat8_e5m2fnuz, 13);
  CHECK_EQ(kDLFloat8_e8m0fnu, 14);
  CHECK_EQ(kDLFloat6_e2m3fn, 15);
  CHECK_EQ(kDLFloat6_e3m2fn, 16);
  CHECK_EQ(kDLFloat4_e2m1fn, 17);
  CHECK_EQ(kDLBcomplex, 18);
}

static void test_flags_and_version(void) {
  CHECK_EQ(DLPACK_FLAG_BITMASK_READ_ONLY, 1);
  CHECK_EQ(DLPACK_FLAG_BITMASK_IS_COPIED, 2);
  CHECK_EQ(DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, 4);
  /* The three bits are distinct, so one can be set without another. */
  CHECK_EQ(DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_COPIED |
               DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED,
           7);
  CHECK_EQ(DLPACK_MAJOR_VERSION, 1);
  CHECK_EQ(DLPACK_MINOR_VERSION, 3);
}

/* Byte-level check of the layout: a DLTensor written through the struct
 * must land where another implementation would read it. */
static void test_field_bytes(void) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.ndim = 0x01020304;
  t.dtype.code = 0xAB;
  t.dtype.bits = 0xCD;
  t.dtype.lanes = 0x1234;
  t.byte_offset = UINT64_C(0x1122334455667788);
  const unsigned char *p = (const unsigned char *)&t;
  int32_t ndim;
  memcpy(&ndim, p + 16, sizeof ndim);
  CHECK_EQ(ndim, 0x01020304);
  CHECK_EQ(p[20], 0xAB);
  CHECK_EQ(p[21], 0xCD);
  uint16_t lanes;
  memcpy(&lanes, p + 22, sizeof lanes);
  CHECK_EQ(lanes, 0x1234);
  uint64_t off;
  memcpy(&off, p + 40, sizeof off);
  CHECK(off == UINT64_C(0x1122334455667788));
}

int main(void) {
  test_sizes_and_offsets();
  test_device_types();
  test_dtype_codes();
  test_flags_and_version();
  test_field_bytes();
  return check_summary("test_abi");
}
