/* test_cuda.c -- the CUDA layer against the recording fake driver
 * (tests/cuda/fake_driver.c) and fake NVRTC: load errors, contexts,
 * memory, streams and copies, asserted through the exact driver calls
 * logged.  meson passes the fakes' paths in DLB_CUDA_DRIVER_FAKE and
 * DLB_CUDA_NVRTC_FAKE; this program links them too, so the dlopen'd copy
 * and the hooks below are one and the same library. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include "check.h"

/* internal hooks of the core */
void dlb__cuda_reset_for_tests(void);
void dlb__cuda_pool_reset_for_tests(void);

/* the fake driver's hooks */
const char *dlb_fake_cuda_log_text(void);
void dlb_fake_cuda_log_clear(void);
void dlb_fake_cuda_set_fail(const char *name, int code);
void dlb_fake_cuda_hide(const char *name);
void dlb_fake_cuda_set_device_count(int n);
void dlb_fake_cuda_reset(void);
int dlb_fake_cuda_violations(void);
int dlb_fake_cuda_live_allocations(void);
void *dlb_fake_cuda_stream_new(int device);
void dlb_fake_cuda_stream_free(void *stream);
void dlb_fake_cuda_begin_capture(void *stream);
void dlb_fake_cuda_end_capture(void *stream);
void dlb_fake_cuda_set_foreign_context(int foreign);
const char *dlb_fake_cuda_current_context(void);
void *dlb_fake_cuda_managed_alloc(int device, size_t bytes);
void dlb_fake_cuda_managed_free(void *p);
void dlb_fake_nvrtc_set_fail(int fail);
int dlb_fake_nvrtc_compiles(void);

static const DLDataType F32 = {kDLFloat, 32, 1};
static const DLDataType F64 = {kDLFloat, 64, 1};

static const char *log_text(void) { return dlb_fake_cuda_log_text(); }
static bool logged(const char *needle) { return strstr(log_text(), needle) != NULL; }

static int count_lines(const char *needle) {
  int n = 0;
  for (const char *p = log_text(); (p = strstr(p, needle)) != NULL; p++) n++;
  return n;
}

/* The log lines other than the cuCtx calls, joined by ';'
 * and cut at " -> " (results) to compare call sequences exactly. */
static void calls(char *out, size_t len, const char *skip_prefix) {
  const char *p = log_text();
  out[0] = '\0';
  while (*p) {
    const char *end = strchr(p, '\n');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    const char *arrow = strstr(p, " -> ");
    size_t keep = arrow != NULL && arrow < p + n ? (size_t)(arrow - p) : n;
    if (strncmp(p, "cuCtx", 5) != 0 &&
        (skip_prefix == NULL || strncmp(p, skip_prefix, strlen(skip_prefix)) != 0)) {
      size_t used = strlen(out);
      if (used + keep + 2 < len) {
        memcpy(out + used, p, keep);
        out[used + keep] = ';';
        out[used + keep + 1] = '\0';
      }
    }
    p += n + (end ? 1 : 0);
  }
}

/* Fresh loader and fake, with the real fake paths. */
static void fresh(void) {
  setenv("DLB_CUDA_DRIVER", getenv("DLB_CUDA_DRIVER_FAKE"), 1);
  setenv("DLB_CUDA_NVRTC", getenv("DLB_CUDA_NVRTC_FAKE"), 1);
  dlb__cuda_reset_for_tests();
  dlb_fake_cuda_reset();
  dlb_fake_nvrtc_set_fail(0);
}

/* ---- loading ---------------------------------------------------------------- */

static void test_driver_missing(void) {
  dlb_error err;
  fresh();
  setenv("DLB_CUDA_DRIVER", "/nonexistent/libcuda-fake.so", 1);
  dlb__cuda_reset_for_tests();
  CHECK_EQ(dlb_cuda_load(&err), DLB_EDEVICE);
  CHECK_MSG(err, "CUDA driver not found");
  CHECK_MSG(err, "/nonexistent/libcuda-fake.so");
  CHECK_MSG(err, "DLB_CUDA_DRIVER");
  CHECK(!dlb_cuda_available());
  void *p = NULL;
  /* Every later call reports the same load error. */
  CHECK_EQ(dlb_cuda_alloc(0, 16, NULL, &p, &err), DLB_EDEVICE);
  CHECK_MSG(err, "/nonexistent/libcuda-fake.so");
  int count = 7;
  CHECK_EQ(dlb_cuda_device_count(&count, &err), DLB_EDEVICE);
  CHECK_EQ(count, 7);
}

/* Device memory comes from the default pool, told once per device to keep
 * freed memory; an allocation out of memory trims the pool and tries once
 * more; a driver without the pool entries still allocates. */
static void test_memory_pool(void) {
  dlb_error err;
  void *p = NULL, *q = NULL;
  fresh();
  dlb__cuda_pool_reset_for_tests();
  CHECK_EQ(dlb_cuda_alloc(1, 64, NULL, &p, &err), DLB_OK);
  CHECK(logged("cuDeviceGetDefaultMemPool device=1 -> 0"));
  CHECK(logged("cuMemPoolSetAttribute pool=p1 attr=4 value=18446744073709551615 -> 0"));
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_alloc(1, 64, NULL, &q, &err), DLB_OK);
  CHECK(!logged("cuMemPoolSetAttribute"));
  CHECK_EQ(dlb_cuda_free(1, q, NULL, &err), DLB_OK);
  dlb_fake_cuda_set_fail("cuMemAllocAsync", 2);
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_alloc(1, 64, NULL, &q, &err), DLB_ENOMEM);
  CHECK_EQ(count_lines("cuMemAllocAsync bytes=64"), 2);
  CHECK(logged("cuMemPoolTrimTo pool=p1 keep=0 -> 0"));
  /* the retry comes after the trim */
  CHECK(strstr(strstr(log_text(), "cuMemPoolTrimTo"), "cuMemAllocAsync bytes=64") != NULL);
  dlb_fake_cuda_set_fail("cuMemAllocAsync", 0);
  CHECK_EQ(dlb_cuda_free(1, p, NULL, &err), DLB_OK);
  /* optional entries missing: allocation works, nothing tuned */
  fresh();
  dlb__cuda_pool_reset_for_tests();
  dlb_fake_cuda_hide("cuMemPoolSetAttribute");
  CHECK_EQ(dlb_cuda_alloc(0, 64, NULL, &p, &err), DLB_OK);
  CHECK(!logged("cuMemPoolSetAttribute pool"));
  CHECK_EQ(dlb_cuda_free(0, p, NULL, &err), DLB_OK);
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);
}

static void test_driver_too_old(void) {
  dlb_error err;
  fresh();
  dlb_fake_cuda_hide("cuMemAllocAsync");
  CHECK_EQ(dlb_cuda_load(&err), DLB_EDEVICE);
  CHECK_MSG(err, "has no cuMemAllocAsync");
  CHECK_MSG(err, "11.2");
  /* Every entry is asked for at a pinned version, never 0 / newest. */
  fresh();
  CHECK_EQ(dlb_cuda_load(&err), DLB_OK);
  CHECK(logged("cuGetProcAddress cuMemAllocAsync version=11020 flags=1"));
  CHECK(logged("cuGetProcAddress cuEventDestroy version=4000"));
  CHECK(logged("cuGetProcAddress cuMemcpy2DAsync version=3020"));
}

static void test_cuinit_fails(void) {
  dlb_error err;
  fresh();
  dlb_fake_cuda_set_fail("cuInit", 999);
  CHECK_EQ(dlb_cuda_load(&err), DLB_EDEVICE);
  CHECK_MSG(err, "cuInit failed: CUDA_ERROR_UNKNOWN (999)");
  CHECK(!dlb_cuda_available());
}

static void test_no_device(void) {
  dlb_error err;
  int count = -1;
  void *p = NULL;
  /* A driver without a GPU: cuInit says NO_DEVICE. */
  fresh();
  dlb_fake_cuda_set_fail("cuInit", 100);
  CHECK_EQ(dlb_cuda_load(&err), DLB_OK);
  CHECK_EQ(dlb_cuda_device_count(&count, &err), DLB_OK);
  CHECK_EQ(count, 0);
  CHECK(!dlb_cuda_available());
  CHECK_EQ(dlb_cuda_alloc(0, 16, NULL, &p, &err), DLB_EINVAL);
  CHECK_MSG(err, "CUDA device 0 does not exist (0 CUDA devices found)");
  /* Or zero devices counted. */
  fresh();
  dlb_fake_cuda_set_device_count(0);
  CHECK_EQ(dlb_cuda_device_count(&count, &err), DLB_OK);
  CHECK_EQ(count, 0);
  fresh();
  CHECK(dlb_cuda_available());
  CHECK_EQ(dlb_cuda_device_count(&count, &err), DLB_OK);
  CHECK_EQ(count, 2);
  CHECK_EQ(dlb_cuda_alloc(2, 16, NULL, &p, &err), DLB_EINVAL);
  CHECK_MSG(err, "CUDA device 2 does not exist (2 CUDA devices found)");
}

/* The fake's own environment configuration. */
static void test_fake_env(void) {
  dlb_error err;
  int count = 0;
  fresh();
  setenv("DLB_FAKE_CUDA_FAIL", "cuDeviceGetCount:3,cuInit:999", 1);
  dlb_fake_cuda_reset();
  CHECK_EQ(dlb_cuda_load(&err), DLB_EDEVICE);
  CHECK_MSG(err, "cuInit failed: CUDA_ERROR_UNKNOWN");
  unsetenv("DLB_FAKE_CUDA_FAIL");
  setenv("DLB_FAKE_CUDA_DEVICES", "3", 1);
  fresh();
  CHECK_EQ(dlb_cuda_device_count(&count, &err), DLB_OK);
  CHECK_EQ(count, 3);
  unsetenv("DLB_FAKE_CUDA_DEVICES");
  fresh();
}

/* Several threads loading and using the driver at once: one load, one
 * primary-context retain, every thread's own context restored. */
enum { THREADS = 4, ROUNDS = 50 };
static int worker(void *arg) {
  void *s = arg;
  int bad = 0;
  dlb_fake_cuda_set_foreign_context(1); /* per thread, as in CUDA */
  for (int i = 0; i < ROUNDS; i++) {
    void *p = NULL;
    bad += dlb_cuda_alloc(0, 16, s, &p, NULL) != DLB_OK;
    bad += dlb_cuda_stream_order(0, s, DLB_CUDA_STREAM_LEGACY, NULL) != DLB_OK;
    bad += dlb_cuda_free(0, p, s, NULL) != DLB_OK;
  }
  bad += strcmp(dlb_fake_cuda_current_context(), "foreign") != 0;
  return bad;
}

static void test_threads(void) {
  thrd_t t[THREADS];
  void *streams[THREADS];
  fresh();
  for (int i = 0; i < THREADS; i++) {
    streams[i] = dlb_fake_cuda_stream_new(0);
    CHECK_EQ(thrd_create(&t[i], worker, streams[i]), thrd_success);
  }
  for (int i = 0; i < THREADS; i++) {
    int bad = -1;
    CHECK_EQ(thrd_join(t[i], &bad), thrd_success);
    CHECK_EQ(bad, 0);
    dlb_fake_cuda_stream_free(streams[i]);
  }
  CHECK_EQ(count_lines("cuInit flags"), 1);
  CHECK_EQ(count_lines("cuDevicePrimaryCtxRetain device"), 1);
  CHECK_EQ(count_lines("cuEventRecord event"), THREADS * ROUNDS);
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);
  CHECK_EQ(dlb_fake_cuda_violations(), 0);
}

/* ---- contexts and memory ------------------------------------------------------ */

static void test_context_restored(void) {
  dlb_error err;
  void *p = NULL;
  fresh();
  void *s = dlb_fake_cuda_stream_new(0);
  /* Another library's context is current: switched and put back. */
  CHECK_EQ(dlb_cuda_load(&err), DLB_OK);
  dlb_fake_cuda_set_foreign_context(1);
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_alloc(0, 64, s, &p, &err), DLB_OK);
  CHECK_STREQ(dlb_fake_cuda_current_context(), "foreign");
  char seq[2048];
  calls(seq, sizeof seq, NULL);
  CHECK_STREQ(seq,
              "cuDeviceGet ordinal=0;cuDevicePrimaryCtxRetain device=0;"
              "cuMemAllocAsync bytes=64 stream=s1 ctx=primary0;");
  CHECK(logged("cuCtxSetCurrent ctx=primary0"));
  CHECK(logged("cuCtxSetCurrent ctx=foreign"));
  /* No context current: left with none. */
  dlb_fake_cuda_set_foreign_context(0);
  CHECK_EQ(dlb_cuda_free(0, p, s, &err), DLB_OK);
  CHECK_STREQ(dlb_fake_cuda_current_context(), "none");
  /* Failure paths restore too. */
  dlb_fake_cuda_set_foreign_context(1);
  dlb_fake_cuda_set_fail("cuMemAllocAsync", 2);
  CHECK_EQ(dlb_cuda_alloc(0, 1 << 20, s, &p, &err), DLB_ENOMEM);
  CHECK_MSG(err, "cuMemAllocAsync failed: CUDA_ERROR_OUT_OF_MEMORY (2)");
  CHECK_MSG(err, "1048576 bytes on cuda:0");
  CHECK_STREQ(dlb_fake_cuda_current_context(), "foreign");
  dlb_fake_cuda_set_fail("cuMemAllocAsync", 0);
  /* The primary context is retained once per device, however often used. */
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_alloc(1, 8, NULL, &p, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_free(1, p, NULL, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_alloc(1, 8, NULL, &p, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_free(1, p, NULL, &err), DLB_OK);
  CHECK_EQ(count_lines("cuDevicePrimaryCtxRetain device"), 1);
  CHECK_STREQ(dlb_fake_cuda_current_context(), "foreign");
  /* A caller already in the primary context sees no switch at all. */
  dlb_fake_cuda_set_foreign_context(0);
  CHECK_EQ(dlb_cuda_alloc(0, 8, NULL, &p, &err), DLB_OK); /* leaves none */
  CHECK_EQ(dlb_cuda_free(0, p, NULL, &err), DLB_OK);
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);
  CHECK_EQ(dlb_fake_cuda_violations(), 0);
  dlb_fake_cuda_stream_free(s);
}

static void test_pointer_info(void) {
  dlb_error err;
  dlb_cuda_pointer_info info;
  DLDevice dev;
  float host[4];
  void *d1 = NULL, *pinned = NULL;
  fresh();
  CHECK_EQ(dlb_cuda_alloc(1, 64, NULL, &d1, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_host_alloc(32, &pinned, &err), DLB_OK);
  void *managed = dlb_fake_cuda_managed_alloc(0, 32);

  CHECK_EQ(dlb_cuda_pointer_info_get(host, &info, &err), DLB_OK);
  CHECK_EQ(info.memory_type, DLB_CUDA_MEMORY_UNREGISTERED);
  CHECK_EQ(info.device_ordinal, -1);
  CHECK_EQ(dlb_cuda_pointer_info_get((char *)d1 + 8, &info, &err), DLB_OK);
  CHECK_EQ(info.memory_type, DLB_CUDA_MEMORY_DEVICE);
  CHECK_EQ(info.device_ordinal, 1);
  CHECK(!info.is_managed);
  CHECK_EQ(dlb_cuda_pointer_info_get(pinned, &info, &err), DLB_OK);
  CHECK_EQ(info.memory_type, DLB_CUDA_MEMORY_HOST);
  CHECK_EQ(dlb_cuda_pointer_info_get(managed, &info, &err), DLB_OK);
  CHECK_EQ(info.memory_type, DLB_CUDA_MEMORY_MANAGED);
  CHECK(info.is_managed);

  /* Claims checked against the pointer. */
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLCUDA, 1}, d1, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLCUDA, 0}, d1, &err), DLB_EINVAL);
  CHECK_MSG(err, "claimed to be cuda:0 but is CUDA device memory of CUDA device 1");
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLCUDA, 0}, host, &err), DLB_EINVAL);
  CHECK_MSG(err, "claimed to be cuda:0 but is host memory unknown to CUDA");
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLCPU, 0}, d1, &err), DLB_EINVAL);
  CHECK_MSG(err, "claimed to be cpu but is CUDA device memory");
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLCPU, 0}, host, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLCPU, 0}, pinned, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLCUDAHost, 0}, pinned, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLCUDAHost, 0}, host, &err), DLB_EINVAL);
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLCUDAManaged, 0}, managed, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLCUDAManaged, 0}, d1, &err), DLB_EINVAL);
  CHECK_EQ(dlb_cuda_check_pointer((DLDevice){kDLROCM, 0}, d1, &err), DLB_EUNSUPPORTED);

  CHECK_EQ(dlb_cuda_device_of_pointer(d1, &dev, &err), DLB_OK);
  CHECK_EQ(dev.device_type, kDLCUDA);
  CHECK_EQ(dev.device_id, 1);
  CHECK_EQ(dlb_cuda_device_of_pointer(managed, &dev, &err), DLB_OK);
  CHECK_EQ(dev.device_type, kDLCUDAManaged);
  CHECK_EQ(dlb_cuda_device_of_pointer(host, &dev, &err), DLB_EINVAL);
  CHECK_MSG(err, "not a CUDA pointer");

  dlb_fake_cuda_set_fail("cuPointerGetAttributes", 1);
  CHECK_EQ(dlb_cuda_pointer_info_get(d1, &info, &err), DLB_EDEVICE);
  CHECK_MSG(err, "cuPointerGetAttributes failed: CUDA_ERROR_INVALID_VALUE (1)");
  dlb_fake_cuda_set_fail("cuPointerGetAttributes", 0);

  CHECK_EQ(dlb_cuda_free(1, d1, NULL, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_host_free(pinned, &err), DLB_OK);
  dlb_fake_cuda_managed_free(managed);
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);
}

static void test_managed_tensors(void) {
  dlb_error err;
  DLManagedTensorVersioned *m = NULL;
  int64_t shape[2] = {3, 4};
  fresh();
  void *s = dlb_fake_cuda_stream_new(1);
  dlb_fake_cuda_set_foreign_context(1);
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_managed_zeros(2, shape, F32, (DLDevice){kDLCUDA, 1}, false,
                                  s, &m, &err),
           DLB_OK);
  CHECK(logged("cuMemAllocAsync bytes=48 stream=s1 ctx=primary1"));
  CHECK(logged("cuMemsetD8Async bytes=48 value=0 stream=s1"));
  CHECK_EQ(m->dl_tensor.device.device_type, kDLCUDA);
  CHECK_EQ(m->dl_tensor.device.device_id, 1);
  CHECK_EQ(m->dl_tensor.strides[0], 4);
  CHECK_EQ(m->version.major, 1);
  CHECK_EQ((uintptr_t)m->dl_tensor.data % DLB_DATA_ALIGNMENT, 0);
  const float *data = m->dl_tensor.data; /* fake device memory is host memory */
  CHECK(data[0] == 0.0f && data[11] == 0.0f);
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 1);
  dlb_fake_cuda_log_clear();
  /* The allocation stream may be gone before the tensor: the free goes on
   * the legacy stream, which outlives every other. */
  dlb_fake_cuda_stream_free(s);
  dlb_managed_delete(m);
  CHECK_EQ(count_lines("cuMemFreeAsync"), 1);
  CHECK(logged("cuMemFreeAsync ptr=a1 stream=legacy ctx=primary1 -> 0"));
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);
  CHECK_STREQ(dlb_fake_cuda_current_context(), "foreign");
  CHECK_EQ(dlb_fake_cuda_violations(), 0); /* no double free */

  /* Pinned host tensors. */
  CHECK_EQ(dlb_cuda_managed_zeros(2, shape, F32, (DLDevice){kDLCUDAHost, 0},
                                  false, NULL, &m, &err),
           DLB_OK);
  CHECK(logged("cuMemHostAlloc bytes=48"));
  dlb_managed_delete(m);
  CHECK_EQ(count_lines("cuMemFreeHost"), 1);
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);

  /* Zero elements: no device allocation, nothing to free. */
  int64_t empty_shape[2] = {3, 0};
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_managed_zeros(2, empty_shape, F32, (DLDevice){kDLCUDA, 0},
                                  false, s, &m, &err),
           DLB_OK);
  CHECK(m->dl_tensor.data == NULL);
  dlb_managed_delete(m);
  CHECK(!logged("cuMemAllocAsync"));
  CHECK(!logged("cuMemFreeAsync"));

  /* Bad requests. */
  CHECK_EQ(dlb_cuda_managed_empty(2, shape, F32, (DLDevice){kDLCPU, 0}, false,
                                  NULL, &m, &err),
           DLB_EUNSUPPORTED);
  CHECK_EQ(dlb_cuda_managed_empty(2, shape, F32, (DLDevice){kDLCUDA, 5}, false,
                                  NULL, &m, &err),
           DLB_EINVAL);
  CHECK_MSG(err, "CUDA device 5 does not exist");

  /* Out of device memory: clean error, nothing left. */
  dlb_fake_cuda_set_fail("cuMemAllocAsync", 2);
  CHECK_EQ(dlb_cuda_managed_empty(2, shape, F32, (DLDevice){kDLCUDA, 0}, false,
                                  s, &m, &err),
           DLB_ENOMEM);
  CHECK_MSG(err, "CUDA_ERROR_OUT_OF_MEMORY");
  dlb_fake_cuda_set_fail("cuMemAllocAsync", 0);
  /* memset failing frees the device memory it got. */
  dlb_fake_cuda_set_fail("cuMemsetD8Async", 1);
  CHECK_EQ(dlb_cuda_managed_zeros(2, shape, F32, (DLDevice){kDLCUDA, 0}, false,
                                  s, &m, &err),
           DLB_EDEVICE);
  CHECK_MSG(err, "cuMemsetD8Async failed");
  dlb_fake_cuda_set_fail("cuMemsetD8Async", 0);
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);

  /* Every host allocation failing in turn: nothing leaks on either side. */
  for (long k = 0; k < 8; k++) {
    m = NULL;
    failing_allocator_install(k);
    int rc = dlb_cuda_managed_empty(2, shape, F32, (DLDevice){kDLCUDA, 0},
                                    false, s, &m, &err);
    long total = failing_allocator_total();
    if (rc == DLB_OK) {
      dlb_managed_delete(m);
    } else {
      CHECK_EQ(rc, DLB_ENOMEM);
      CHECK_MSG(err, "out of memory");
    }
    failing_allocator_remove();
    CHECK_EQ(failing_allocator_live(), 0);
    CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);
    if (rc == DLB_OK) {
      CHECK(k >= total); /* only stops once every allocation was tried */
      break;
    }
  }
  dlb_fake_cuda_stream_free(s);
}

/* ---- streams ------------------------------------------------------------------ */

static void test_stream_values(void) {
  dlb_error err;
  void *s = (void *)(uintptr_t)99;
  bool order = false;
  int64_t v;
  CHECK_EQ(dlb_cuda_stream_from_dlpack(NULL, &s, &order, &err), DLB_OK);
  CHECK(s == DLB_CUDA_STREAM_LEGACY && order);
  v = -1;
  CHECK_EQ(dlb_cuda_stream_from_dlpack(&v, &s, &order, &err), DLB_OK);
  CHECK(s == NULL && !order);
  v = 0;
  CHECK_EQ(dlb_cuda_stream_from_dlpack(&v, &s, &order, &err), DLB_EINVAL);
  CHECK_MSG(err, "stream 0 is not allowed for CUDA");
  v = 1;
  CHECK_EQ(dlb_cuda_stream_from_dlpack(&v, &s, &order, &err), DLB_OK);
  CHECK(s == DLB_CUDA_STREAM_LEGACY && order);
  v = 2;
  CHECK_EQ(dlb_cuda_stream_from_dlpack(&v, &s, &order, &err), DLB_OK);
  CHECK(s == DLB_CUDA_STREAM_PER_THREAD && order);
  v = 0x7f0012345600;
  CHECK_EQ(dlb_cuda_stream_from_dlpack(&v, &s, &order, &err), DLB_OK);
  CHECK((uintptr_t)s == 0x7f0012345600u && order);
  v = -7;
  CHECK_EQ(dlb_cuda_stream_from_dlpack(&v, &s, &order, &err), DLB_EINVAL);
  CHECK_MSG(err, "stream -7 is not a valid stream value");
  /* CAI: None means no synchronisation required; -1 is not a CAI value. */
  CHECK_EQ(dlb_cuda_stream_from_cai(NULL, &s, &order, &err), DLB_OK);
  CHECK(s == NULL && !order);
  v = -1;
  CHECK_EQ(dlb_cuda_stream_from_cai(&v, &s, &order, &err), DLB_EINVAL);
  v = 0;
  CHECK_EQ(dlb_cuda_stream_from_cai(&v, &s, &order, &err), DLB_EINVAL);
  v = 2;
  CHECK_EQ(dlb_cuda_stream_from_cai(&v, &s, &order, &err), DLB_OK);
  CHECK(s == DLB_CUDA_STREAM_PER_THREAD && order);
}

static void test_stream_order(void) {
  dlb_error err;
  char seq[4096];
  bool capturing = true;
  fresh();
  void *s1 = dlb_fake_cuda_stream_new(0), *s2 = dlb_fake_cuda_stream_new(0);
  CHECK_EQ(dlb_cuda_load(&err), DLB_OK);
  dlb_fake_cuda_set_foreign_context(1);

  /* Different streams: record on the producer, wait on the consumer. */
  CHECK_EQ(dlb_cuda_stream_order(0, s1, s2, &err), DLB_OK); /* retains ctx */
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_stream_order(0, s1, s2, &err), DLB_OK);
  calls(seq, sizeof seq, NULL);
  CHECK_STREQ(seq,
              "cuStreamIsCapturing stream=s1;cuStreamIsCapturing stream=s2;"
              "cuEventCreate flags=2;cuEventRecord event=e2 stream=s1;"
              "cuStreamWaitEvent stream=s2 event=e2 flags=0;"
              "cuEventDestroy event=e2;");
  CHECK(!logged("Synchronize"));
  CHECK_STREQ(dlb_fake_cuda_current_context(), "foreign");

  /* Same stream (and NULL vs 1, both legacy): no driver call at all. */
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_stream_order(0, s1, s1, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_stream_order(0, NULL, DLB_CUDA_STREAM_LEGACY, &err), DLB_OK);
  CHECK_STREQ(log_text(), "");

  /* Legacy producer, no capture: the legacy stream is never queried. */
  CHECK_EQ(dlb_cuda_stream_order(0, DLB_CUDA_STREAM_LEGACY, s2, &err), DLB_OK);
  calls(seq, sizeof seq, NULL);
  CHECK_STREQ(seq,
              "cuStreamIsCapturing stream=s2;cuEventCreate flags=2;"
              "cuEventRecord event=e3 stream=legacy;"
              "cuStreamWaitEvent stream=s2 event=e3 flags=0;"
              "cuEventDestroy event=e3;");

  /* Under capture: between non-legacy streams the record + wait is made;
   * anything needing the legacy stream is refused without touching it. */
  dlb_fake_cuda_begin_capture(s1);
  CHECK_EQ(dlb_cuda_stream_is_capturing(0, s1, &capturing, &err), DLB_OK);
  CHECK(capturing);
  CHECK_EQ(dlb_cuda_stream_is_capturing(0, s2, &capturing, &err), DLB_OK);
  CHECK(!capturing);
  capturing = true;
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_stream_is_capturing(0, DLB_CUDA_STREAM_LEGACY, &capturing, &err), DLB_OK);
  CHECK(!capturing);
  CHECK(!logged("cuStreamIsCapturing"));
  /* A capturing consumer waits on an outside event as an external wait
   * (a plain wait is CUDA_ERROR_STREAM_CAPTURE_ISOLATION), and the event
   * is kept for the graph. */
  CHECK_EQ(dlb_cuda_stream_order(0, s2, s1, &err), DLB_OK);
  CHECK(logged("cuEventRecord event=e4 stream=s2"));
  CHECK(logged("cuStreamWaitEvent stream=s1 event=e4 flags=1 -> 0"));
  CHECK(!logged("cuEventDestroy event=e4"));
  /* Both capturing (producer joined in): a plain wait, event destroyed. */
  dlb_fake_cuda_log_clear();
  dlb_fake_cuda_begin_capture(s2);
  CHECK_EQ(dlb_cuda_stream_order(0, s2, s1, &err), DLB_OK);
  CHECK(logged("cuStreamWaitEvent stream=s1 event=e5 flags=0 -> 0"));
  CHECK(logged("cuEventDestroy event=e5"));
  /* And the other way, both capturing. */
  CHECK_EQ(dlb_cuda_stream_order(0, s1, s2, &err), DLB_OK);
  dlb_fake_cuda_end_capture(s2);
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_stream_order(0, s1, DLB_CUDA_STREAM_LEGACY, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "producer stream is being captured");
  CHECK_EQ(dlb_cuda_stream_order(0, NULL, s1, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "consumer stream is being captured");
  CHECK(!logged("legacy"));
  CHECK(!logged("null"));
  CHECK(!logged("cuEvent"));
  /* Stream-ordered allocation on the capturing stream is fine. */
  void *p = NULL;
  CHECK_EQ(dlb_cuda_alloc(0, 32, s1, &p, &err), DLB_OK);
  CHECK_EQ(dlb_cuda_free(0, p, s1, &err), DLB_OK);
  CHECK(!logged("Synchronize"));
  CHECK_EQ(dlb_fake_cuda_violations(), 0);
  dlb_fake_cuda_end_capture(s1);

  /* Driver errors: named, event destroyed, context restored. */
  dlb_fake_cuda_set_fail("cuEventRecord", 400);
  dlb_fake_cuda_log_clear();
  CHECK_EQ(dlb_cuda_stream_order(0, s1, s2, &err), DLB_EDEVICE);
  CHECK_MSG(err, "cuEventRecord failed: CUDA_ERROR_INVALID_HANDLE (400)");
  CHECK_EQ(count_lines("cuEventDestroy"), 1);
  CHECK(!logged("cuStreamWaitEvent"));
  CHECK_STREQ(dlb_fake_cuda_current_context(), "foreign");
  dlb_fake_cuda_set_fail("cuEventRecord", 0);
  dlb_fake_cuda_set_fail("cuStreamIsCapturing", 999);
  CHECK_EQ(dlb_cuda_stream_order(0, s1, s2, &err), DLB_EDEVICE);
  CHECK_MSG(err, "cuStreamIsCapturing failed");
  dlb_fake_cuda_set_fail("cuStreamIsCapturing", 0);
  dlb_fake_cuda_set_fail("cuEventCreate", 2);
  CHECK_EQ(dlb_cuda_stream_order(0, s1, s2, &err), DLB_ENOMEM);
  dlb_fake_cuda_set_fail("cuEventCreate", 0);
  CHECK_STREQ(dlb_fake_cuda_current_context(), "foreign");
  dlb_fake_cuda_stream_free(s1);
  dlb_fake_cuda_stream_free(s2);
}

/* ---- copies ------------------------------------------------------------------- */

/* One side of a copy: where, layout, and a buffer big enough for it. */
typedef struct side {
  int kind; /* 0 host, 1 device (cuda:0) */
  int32_t ndim;
  int64_t shape[3];
  int64_t strides[3];
  uint64_t byte_offset;
  size_t buffer_bytes;
} side;

/* Device buffers are allocated on the copy's stream: under capture the
 * legacy stream is off limits to the test too. */
static void *side_buffer(const side *s, void *stream) {
  void *p = NULL;
  if (s->kind == 1) {
    dlb_error err;
    if (dlb_cuda_alloc(0, s->buffer_bytes, stream, &p, &err) != DLB_OK) abort();
  } else {
    p = malloc(s->buffer_bytes);
  }
  return p;
}

static void side_free(const side *s, void *p, void *stream) {
  if (s->kind == 1) (void)dlb_cuda_free(0, p, stream, NULL);
  else free(p);
}

static DLTensor side_tensor(side *s, void *buffer, DLDataType dtype) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = buffer;
  t.device = s->kind == 1 ? (DLDevice){kDLCUDA, 0} : (DLDevice){kDLCPU, 0};
  t.ndim = s->ndim;
  t.dtype = dtype;
  t.shape = s->shape;
  t.strides = s->strides;
  t.byte_offset = s->byte_offset;
  return t;
}

/* Copy with dlb_cuda_copy and with dlb_copy on plain host buffers of the
 * same layouts; the whole destination buffers (gaps included) must match
 * bit for bit.  Returns the rc of dlb_cuda_copy. */
static int copy_case(side dst, side src, DLDataType dtype, void *stream,
                     const char *expect_call) {
  dlb_error err;
  void *d = side_buffer(&dst, stream), *s = side_buffer(&src, stream);
  unsigned char *ref_d = malloc(dst.buffer_bytes), *ref_s = malloc(src.buffer_bytes);
  for (size_t i = 0; i < src.buffer_bytes; i++)
    ((unsigned char *)s)[i] = ref_s[i] = (unsigned char)(i * 7 + 3);
  memset(d, 0x55, dst.buffer_bytes);
  memset(ref_d, 0x55, dst.buffer_bytes);
  DLTensor td = side_tensor(&dst, d, dtype), ts = side_tensor(&src, s, dtype);
  dlb_fake_cuda_log_clear();
  int rc = dlb_cuda_copy(&td, &ts, stream, &err);
  if (rc == DLB_OK) {
    side hd = dst, hs = src;
    hd.kind = hs.kind = 0;
    DLTensor rd = side_tensor(&hd, ref_d, dtype), rs = side_tensor(&hs, ref_s, dtype);
    CHECK_EQ(dlb_copy(&rd, &rs, &err), DLB_OK);
    bool same = memcmp(d, ref_d, dst.buffer_bytes) == 0;
    CHECK(same);
    if (!same) fprintf(stderr, "  layouts dst %d/%lld,%lld src %d/%lld,%lld\n%s",
                       dst.kind, (long long)dst.strides[0], (long long)dst.strides[1],
                       src.kind, (long long)src.strides[0], (long long)src.strides[1],
                       log_text());
    if (expect_call != NULL) CHECK(logged(expect_call));
    CHECK(!logged("Synchronize"));
  }
  side_free(&dst, d, stream);
  side_free(&src, s, stream);
  free(ref_d);
  free(ref_s);
  return rc;
}

static const side C34 = {0, 2, {3, 4}, {4, 1}, 0, 48};          /* contiguous */
static const side T34 = {0, 2, {3, 4}, {1, 3}, 0, 48};          /* transposed */
static const side R34 = {0, 2, {3, 4}, {-4, 1}, 32, 48};        /* rows reversed */
static const side B34 = {0, 2, {3, 4}, {-1, -3}, 44, 48};       /* both reversed */
static const side P34 = {0, 2, {3, 4}, {8, 1}, 0, 96};          /* pitched rows */
static const side O34 = {0, 2, {3, 4}, {4, 1}, 8, 56};          /* byte_offset */
static const side G34 = {0, 2, {3, 4}, {1, 6}, 4, 96};          /* column-major gaps */
static const side COL = {0, 1, {5}, {3}, 0, 60};                /* strided vector */
static const side VEC = {0, 1, {5}, {1}, 0, 20};

static side dev(side s) { s.kind = 1; return s; }

static void test_copies(void) {
  fresh();
  void *s = dlb_fake_cuda_stream_new(0);
  dlb_fake_cuda_set_foreign_context(1);
  const side layouts[] = {C34, T34, R34, B34, P34, O34};
  /* Every pair of layouts, H2D, D2H and D2D, bit-exact. */
  for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
    for (size_t j = 0; j < sizeof layouts / sizeof layouts[0]; j++) {
      CHECK_EQ(copy_case(dev(layouts[i]), layouts[j], F32, s, NULL), DLB_OK);
      /* A host destination with gaps (P34) takes only what the 2D copy
       * expresses. */
      int want = layouts[i].strides[0] == 8 && layouts[j].strides[1] != 1
                     ? DLB_EUNSUPPORTED : DLB_OK;
      if (layouts[i].strides[0] == 8 && layouts[j].strides[0] < 0) want = DLB_EUNSUPPORTED;
      CHECK_EQ(copy_case(layouts[i], dev(layouts[j]), F32, s, NULL), want);
      CHECK_EQ(copy_case(dev(layouts[i]), dev(layouts[j]), F32, s, NULL), DLB_OK);
    }
  }
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);
  CHECK_STREQ(dlb_fake_cuda_current_context(), "foreign");

  /* The cheapest driver call is chosen. */
  CHECK_EQ(copy_case(dev(C34), C34, F32, s,
                     "cuMemcpyAsync dst=device src=host bytes=48 stream=s1 ctx=primary0"),
           DLB_OK);
  CHECK(!logged("cuLaunchKernel"));
  CHECK_EQ(copy_case(O34, dev(C34), F32, s,
                     "cuMemcpyAsync dst=host src=device bytes=48 stream=s1"),
           DLB_OK);
  CHECK_EQ(copy_case(dev(C34), P34, F32, s,
                     "cuMemcpy2DAsync dst=device(2) src=host(1) width=16 height=3 "
                     "dpitch=16 spitch=32 stream=s1"),
           DLB_OK);
  CHECK_EQ(copy_case(dev(VEC), dev(COL), F32, s,
                     "cuMemcpy2DAsync dst=device(2) src=device(2) width=4 height=5 "
                     "dpitch=4 spitch=12"),
           DLB_OK);
  CHECK(!logged("cuLaunchKernel"));
  /* D2D transposed: the kernel, straight on the stream. */
  CHECK_EQ(copy_case(dev(C34), dev(T34), F32, s,
                     "cuLaunchKernel fn=dlb_strided_copy grid=1,1,1 block=256,1,1 "
                     "shared=0 numel=12 ndim=2 stream=s1 ctx=primary0"),
           DLB_OK);
  CHECK(!logged("cuMemAllocAsync"));
  /* H2D transposed: src span staged, kernel scatters, staging freed on s. */
  CHECK_EQ(copy_case(dev(C34), T34, F32, s, NULL), DLB_OK);
  {
    char seq[4096];
    calls(seq, sizeof seq, "cuPointer");
    CHECK(strstr(seq, "cuMemAllocAsync bytes=48 stream=s1 ctx=primary0 ;"
                      "cuMemcpyAsync dst=device src=host bytes=48 stream=s1 ctx=primary0;"
                      "cuLaunchKernel") != NULL ||
          strstr(seq, "cuMemAllocAsync bytes=48 stream=s1 ctx=primary0;"
                      "cuMemcpyAsync dst=device src=host bytes=48 stream=s1 ctx=primary0;"
                      "cuLaunchKernel") != NULL);
    CHECK(logged("cuMemFreeAsync ptr="));
    CHECK(strstr(log_text(), "cuMemFreeAsync") > strstr(log_text(), "cuLaunchKernel"));
  }
  /* D2H into a reversed host layout: gathered on the device, one span copy. */
  CHECK_EQ(copy_case(B34, dev(C34), F32, s, "cuMemcpyAsync dst=host src=device bytes=48"),
           DLB_OK);
  CHECK(logged("cuLaunchKernel"));
  /* D2H into a host layout with gaps: refused, nothing written, no leak. */
  CHECK_EQ(copy_case(G34, dev(T34), F32, s, NULL), DLB_EUNSUPPORTED);
  /* H2D from one with gaps is fine (the span is staged as is). */
  CHECK_EQ(copy_case(dev(C34), G34, F32, s, NULL), DLB_OK);
  /* Other element sizes. */
  {
    const side t64 = {1, 2, {3, 4}, {1, 3}, 0, 96};
    const side r64 = {1, 2, {3, 4}, {-4, 1}, 64, 96};
    CHECK_EQ(copy_case(t64, r64, F64, s, "cuLaunchKernel"), DLB_OK);
    CHECK_EQ(copy_case(t64, C34, (DLDataType){kDLUInt, 16, 2}, s, "cuLaunchKernel"), DLB_OK);
  }
  /* The kernel was compiled and loaded once for the device. */
  CHECK_EQ(dlb_fake_nvrtc_compiles(), 1);
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);
  CHECK_EQ(dlb_fake_cuda_violations(), 0);
  CHECK_STREQ(dlb_fake_cuda_current_context(), "foreign");

  /* Under capture on s: kernel and staging stay on s, nothing illegal. */
  dlb_fake_cuda_begin_capture(s);
  CHECK_EQ(copy_case(dev(C34), T34, F32, s, "cuLaunchKernel"), DLB_OK);
  CHECK_EQ(copy_case(B34, dev(T34), F32, s, "cuLaunchKernel"), DLB_OK);
  CHECK_EQ(dlb_fake_cuda_violations(), 0);
  dlb_fake_cuda_end_capture(s);
  dlb_fake_cuda_stream_free(s);
}

static void test_copy_errors(void) {
  dlb_error err;
  fresh();
  void *s = dlb_fake_cuda_stream_new(0);
  float host[12];
  DLTensor a = {host, {kDLCPU, 0}, 2, F32, (int64_t[]){3, 4}, NULL, 0};
  DLTensor b = {host, {kDLCPU, 0}, 2, F64, (int64_t[]){3, 4}, NULL, 0};
  CHECK_EQ(dlb_cuda_copy(&a, &b, s, &err), DLB_EINVAL);
  CHECK_MSG(err, "dtypes differ");
  DLTensor c = {host, {kDLCPU, 0}, 2, F32, (int64_t[]){4, 3}, NULL, 0};
  CHECK_EQ(dlb_cuda_copy(&a, &c, s, &err), DLB_EINVAL);
  CHECK_MSG(err, "shapes differ");
  DLTensor r = {host, {kDLROCM, 0}, 2, F32, (int64_t[]){3, 4}, NULL, 0};
  CHECK_EQ(dlb_cuda_copy(&r, &a, s, &err), DLB_EUNSUPPORTED);
  CHECK_MSG(err, "dst is on rocm");
  /* Host to host needs no driver and no stream. */
  setenv("DLB_CUDA_DRIVER", "/nonexistent/libcuda.so", 1);
  dlb__cuda_reset_for_tests();
  float other[12] = {1, 2, 3};
  DLTensor o = {other, {kDLCPU, 0}, 2, F32, (int64_t[]){3, 4}, NULL, 0};
  CHECK_EQ(dlb_cuda_copy(&a, &o, NULL, &err), DLB_OK);
  CHECK(host[2] == 3.0f);
  /* Device copy without a driver: the load error. */
  o.device = (DLDevice){kDLCUDA, 0};
  CHECK_EQ(dlb_cuda_copy(&a, &o, NULL, &err), DLB_EDEVICE);
  CHECK_MSG(err, "CUDA driver not found");

  /* NVRTC missing: only the kernel path fails, naming what was tried. */
  fresh();
  setenv("DLB_CUDA_NVRTC", "/nonexistent/libnvrtc.so", 1);
  CHECK_EQ(copy_case(dev(C34), dev(T34), F32, s, NULL), DLB_EUNSUPPORTED);
  CHECK(logged("cuMemAllocAsync") || !logged("cuLaunchKernel"));
  {
    void *d = NULL, *x = NULL;
    CHECK_EQ(dlb_cuda_alloc(0, 48, s, &d, &err), DLB_OK);
    CHECK_EQ(dlb_cuda_alloc(0, 48, s, &x, &err), DLB_OK);
    side dc = dev(C34), dt = dev(T34);
    DLTensor td = side_tensor(&dc, d, F32), ts = side_tensor(&dt, x, F32);
    CHECK_EQ(dlb_cuda_copy(&td, &ts, s, &err), DLB_EUNSUPPORTED);
    CHECK_MSG(err, "/nonexistent/libnvrtc.so");
    CHECK_MSG(err, "DLB_CUDA_NVRTC");
    /* Compilation failing: its log in the message. */
    setenv("DLB_CUDA_NVRTC", getenv("DLB_CUDA_NVRTC_FAKE"), 1);
    dlb_fake_nvrtc_set_fail(1);
    CHECK_EQ(dlb_cuda_copy(&td, &ts, s, &err), DLB_EDEVICE);
    CHECK_MSG(err, "NVRTC could not compile");
    CHECK_MSG(err, "compilation refused");
    dlb_fake_nvrtc_set_fail(0);
    /* Module load, then launch failing. */
    dlb_fake_cuda_set_fail("cuModuleLoadData", 200);
    CHECK_EQ(dlb_cuda_copy(&td, &ts, s, &err), DLB_EDEVICE);
    CHECK_MSG(err, "cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE (200)");
    dlb_fake_cuda_set_fail("cuModuleLoadData", 0);
    dlb_fake_cuda_set_fail("cuLaunchKernel", 999);
    CHECK_EQ(dlb_cuda_copy(&td, &ts, s, &err), DLB_EDEVICE);
    CHECK_MSG(err, "cuLaunchKernel failed");
    dlb_fake_cuda_set_fail("cuLaunchKernel", 0);
    /* Our own allocation (the PTX buffer) failing in turn. */
    dlb__cuda_reset_for_tests();
    for (long k = 0; k < 4; k++) {
      failing_allocator_install(k);
      int rc = dlb_cuda_copy(&td, &ts, s, &err);
      long total = failing_allocator_total();
      failing_allocator_remove();
      CHECK_EQ(failing_allocator_live(), 0);
      if (rc == DLB_OK) {
        CHECK(k >= total);
        break;
      }
      CHECK_EQ(rc, DLB_ENOMEM);
      CHECK_MSG(err, "out of memory");
    }
    /* Staging allocation failing: clean error, nothing left over. */
    side hc = C34;
    DLTensor th;
    float hostbuf[12];
    th = side_tensor(&hc, hostbuf, F32);
    DLTensor tt = side_tensor(&dt, x, F32);
    dlb_fake_cuda_set_fail("cuMemAllocAsync", 2);
    CHECK_EQ(dlb_cuda_copy(&th, &tt, s, &err), DLB_ENOMEM);
    CHECK_MSG(err, "CUDA_ERROR_OUT_OF_MEMORY");
    dlb_fake_cuda_set_fail("cuMemAllocAsync", 0);
    /* Copy failing after staging: staging still freed. */
    dlb_fake_cuda_set_fail("cuMemcpyAsync", 1);
    int live = dlb_fake_cuda_live_allocations();
    CHECK_EQ(dlb_cuda_copy(&th, &tt, s, &err), DLB_EDEVICE);
    CHECK_MSG(err, "cuMemcpyAsync failed");
    CHECK_EQ(dlb_fake_cuda_live_allocations(), live);
    dlb_fake_cuda_set_fail("cuMemcpyAsync", 0);
    CHECK_EQ(dlb_cuda_free(0, d, s, &err), DLB_OK);
    CHECK_EQ(dlb_cuda_free(0, x, s, &err), DLB_OK);
  }
  CHECK_EQ(dlb_fake_cuda_live_allocations(), 0);
  CHECK_EQ(dlb_fake_cuda_violations(), 0);

  /* The kernel's first use inside a graph capture: the module is built
   * with this thread's capture mode relaxed, and the mode put back. */
  fresh();
  dlb_fake_cuda_begin_capture(s);
  CHECK_EQ(copy_case(dev(C34), dev(T34), F32, s, "cuLaunchKernel"), DLB_OK);
  CHECK(logged("cuThreadExchangeStreamCaptureMode mode=2"));
  CHECK(logged("cuThreadExchangeStreamCaptureMode mode=0"));
  CHECK(strstr(log_text(), "cuModuleLoadData") >
        strstr(log_text(), "cuThreadExchangeStreamCaptureMode mode=2"));
  CHECK_EQ(dlb_fake_cuda_violations(), 0);
  dlb_fake_cuda_end_capture(s);
  dlb_fake_cuda_stream_free(s);
}

int main(void) {
  if (getenv("DLB_CUDA_DRIVER_FAKE") == NULL || getenv("DLB_CUDA_NVRTC_FAKE") == NULL) {
    fprintf(stderr, "test_cuda: run through meson (DLB_CUDA_DRIVER_FAKE unset)\n");
    return 77;
  }
  test_driver_missing();
  test_driver_too_old();
  test_cuinit_fails();
  test_no_device();
  test_fake_env();
  test_threads();
  test_context_restored();
  test_pointer_info();
  test_managed_tensors();
  test_stream_values();
  test_stream_order();
  test_copies();
  test_copy_errors();
  test_memory_pool();
  dlb__cuda_reset_for_tests();
  return check_summary("test_cuda");
}
