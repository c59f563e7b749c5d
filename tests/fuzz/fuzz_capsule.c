/*
 * fuzz_capsule.c -- libFuzzer target for what a consumer does with a
 * managed tensor it was handed (the core half of importing a capsule):
 * check the version, validate the tensor, wrap a legacy tensor as a
 * versioned one, then release it.  Whatever the input, the producer's
 * deleter must run exactly once, on the acceptance path and on every
 * refusal alike.
 */
#include <stdlib.h>

#include "dlbridge/dlbridge.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int deleter_calls;

static void versioned_deleter(DLManagedTensorVersioned *self) {
  (void)self;
  deleter_calls++;
}

static void legacy_deleter(DLManagedTensor *self) {
  (void)self;
  deleter_calls++;
}

static void fill(fuzz_input *in, DLTensor *t, int64_t *shape,
                 int64_t *strides) {
  static uint8_t backing[64];
  memset(t, 0, sizeof *t);
  t->ndim = (int8_t)fuzz_u8(in) % (DLB_MAX_NDIM + 3);
  int32_t stored = t->ndim > 0 ? t->ndim : 0;
  for (int32_t i = 0; i < stored; i++) {
    shape[i] = fuzz_dim(in);
    strides[i] = fuzz_dim(in);
  }
  t->shape = stored > 0 ? shape : NULL;
  t->strides = (fuzz_u8(in) & 1) ? strides : NULL;
  t->dtype.code = fuzz_u8(in);
  t->dtype.bits = fuzz_u8(in);
  t->dtype.lanes = fuzz_u8(in);
  t->device.device_type = (DLDeviceType)(int8_t)fuzz_u8(in);
  t->device.device_id = (int32_t)(int8_t)fuzz_u8(in);
  t->byte_offset = (uint64_t)fuzz_dim(in);
  t->data = (fuzz_u8(in) & 1) ? backing : NULL;
}

/* The consumer's side for a versioned tensor: 0 when it was kept. */
static void consume_versioned(DLManagedTensorVersioned *m) {
  dlb_error err;
  if (dlb_managed_check_version(m, &err) != DLB_OK ||
      dlb_tensor_validate(&m->dl_tensor, 0, &err) != DLB_OK) {
    dlb_managed_delete(m);
    return;
  }
  /* Accepted: a consumer would now hold it, then let it go once. */
  dlb_managed_delete(m);
}

static void consume_legacy(DLManagedTensor *legacy) {
  dlb_error err;
  if (dlb_tensor_validate(&legacy->dl_tensor, 0, &err) != DLB_OK) {
    dlb_managed_delete_legacy(legacy);
    return;
  }
  DLManagedTensorVersioned *m = NULL;
  if (dlb_managed_from_legacy(legacy, &m, &err) != DLB_OK) {
    dlb_managed_delete_legacy(legacy); /* still ours on failure */
    return;
  }
  dlb_managed_delete(m); /* runs legacy's deleter */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_input in = {data, size};
  int64_t shape[DLB_MAX_NDIM + 2], strides[DLB_MAX_NDIM + 2];
  deleter_calls = 0;
  if (fuzz_u8(&in) & 1) {
    DLManagedTensorVersioned m;
    memset(&m, 0, sizeof m);
    m.version.major = fuzz_u8(&in) % 3;
    m.version.minor = fuzz_u8(&in);
    m.flags = (uint64_t)fuzz_u8(&in);
    m.deleter = versioned_deleter;
    fill(&in, &m.dl_tensor, shape, strides);
    consume_versioned(&m);
  } else {
    DLManagedTensor m;
    memset(&m, 0, sizeof m);
    m.deleter = legacy_deleter;
    fill(&in, &m.dl_tensor, shape, strides);
    consume_legacy(&m);
  }
  if (deleter_calls != 1) abort();
  return 0;
}
