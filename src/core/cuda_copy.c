/* cuda_copy.c -- dlb_cuda_copy: asynchronous copies between host and device
 * and between any two layouts, on a caller's stream.
 *
 * Plan: describe both tensors as one list of (extent, dst byte stride, src
 * byte stride) dims in logical order, drop extent-1 dims and merge
 * neighbours contiguous in both.  Then, cheapest first:
 *   - one run of bytes on both sides: cuMemcpyAsync;
 *   - rows of contiguous bytes with one pitch per side: cuMemcpy2DAsync;
 *   - otherwise the strided-copy kernel below, compiled once per device with
 *     NVRTC (loaded with dlopen) and launched on the stream, with a
 *     stream-ordered staging buffer when one side is host memory (see
 *     dlbridge.h for the exact rules).
 * The whole operation runs in the device's primary context; the caller's
 * context is restored.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include "internal.h"

/* ---- the kernel ------------------------------------------------------------
 * One thread per element (grid-stride), logical index decomposed row-major
 * over the merged dims.  The parameter block mirrors dlb__cuda_copy_params
 * field by field (same types, same natural alignment).  Elements are moved
 * with one load/store when their addresses allow, byte by byte otherwise
 * (byte_offset may misalign them). */
_Static_assert(DLB_MAX_NDIM == 64,
               "kernel_source spells dlb__cuda_copy_params' arrays as [64]");
static const char kernel_source[] =
    "struct dlb_copy_params {\n"
    "  unsigned long long dst, src;\n"
    "  long long numel;\n"
    "  int ndim, itemsize;\n"
    "  long long shape[64], dst_stride[64], src_stride[64];\n"
    "};\n"
    "template <typename T> __device__ void move(char *d, const char *s) {\n"
    "  *(T *)d = *(const T *)s;\n"
    "}\n"
    "extern \"C\" __global__ void " DLB__CUDA_COPY_KERNEL
    "(const dlb_copy_params p) {\n"
    "  long long step = (long long)gridDim.x * blockDim.x;\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "       i < p.numel; i += step) {\n"
    "    long long rest = i, d = 0, s = 0;\n"
    "    for (int k = p.ndim - 1; k >= 0; --k) {\n"
    "      long long q = rest / p.shape[k], c = rest - q * p.shape[k];\n"
    "      rest = q; d += c * p.dst_stride[k]; s += c * p.src_stride[k];\n"
    "    }\n"
    "    char *dp = (char *)p.dst + d;\n"
    "    const char *sp = (const char *)p.src + s;\n"
    "    unsigned long long mis = ((unsigned long long)dp |\n"
    "                              (unsigned long long)sp) % p.itemsize;\n"
    "    if (mis == 0 && p.itemsize == 1) move<unsigned char>(dp, sp);\n"
    "    else if (mis == 0 && p.itemsize == 2) move<unsigned short>(dp, sp);\n"
    "    else if (mis == 0 && p.itemsize == 4) move<unsigned int>(dp, sp);\n"
    "    else if (mis == 0 && p.itemsize == 8)\n"
    "      move<unsigned long long>(dp, sp);\n"
    "    else for (int b = 0; b < p.itemsize; ++b) dp[b] = sp[b];\n"
    "  }\n"
    "}\n";

#define THREADS_PER_BLOCK 256u
#define MAX_BLOCKS 65535u

/* ---- NVRTC, loaded at run time ------------------------------------------ */

typedef int (*nvrtc_create_fn)(void **prog, const char *src, const char *name,
                               int nheaders, const char *const *headers,
                               const char *const *names);
typedef int (*nvrtc_compile_fn)(void *prog, int nopts,
                                const char *const *opts);
typedef int (*nvrtc_size_fn)(void *prog, size_t *size);
typedef int (*nvrtc_get_fn)(void *prog, char *out);
typedef int (*nvrtc_destroy_fn)(void **prog);
typedef const char *(*nvrtc_error_fn)(int result);

static struct {
  void *library;
  nvrtc_create_fn create;
  nvrtc_compile_fn compile;
  nvrtc_size_fn ptx_size;
  nvrtc_get_fn ptx;
  nvrtc_size_fn log_size;
  nvrtc_get_fn log;
  nvrtc_destroy_fn destroy;
  nvrtc_error_fn error_string;
  dlb__CUfunction kernel[DLB__CUDA_MAX_DEVICES];
} copier;

static once_flag copier_once = ONCE_FLAG_INIT;
static mtx_t copier_mutex;

static void copier_mutex_create(void) {
  (void)mtx_init(&copier_mutex, mtx_plain);
}

static void *nvrtc_symbol(void *library, const char *name, bool *missing) {
  void *p = dlsym(library, name);
  if (p == NULL) *missing = true;
  return p;
}

/* Open NVRTC; runs under copier_mutex.  Success is kept; a failure is
 * reported and tried again next time. */
static int nvrtc_load(dlb_error *err) {
  static const char *const candidates[] = {
      "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"};
  void *library = NULL;
  const char *env = getenv("DLB_CUDA_NVRTC");
  const char *why = NULL;
  bool missing = false;
  if (copier.library != NULL) return DLB_OK;
  if (env != NULL && env[0] != '\0') {
    library = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
      why = dlerror();
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "dlb_cuda_copy: this layout needs the strided-copy "
                           "kernel, but NVRTC could not be loaded: "
                           "dlopen(\"%s\") (from DLB_CUDA_NVRTC) failed: %s",
                           env, why != NULL ? why : "(no reason given)");
    }
  } else {
    for (size_t i = 0; library == NULL && i < sizeof candidates / sizeof candidates[0]; i++) {
      library = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
      if (library == NULL) why = dlerror();
    }
    if (library == NULL) {
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "dlb_cuda_copy: this layout needs the strided-copy "
                           "kernel, but NVRTC was not found (tried "
                           "libnvrtc.so.13, .12, .11.2 and libnvrtc.so; last "
                           "error: %s); set DLB_CUDA_NVRTC or copy through a "
                           "contiguous tensor",
                           why != NULL ? why : "(no reason given)");
    }
  }
  copier.create = (nvrtc_create_fn)(uintptr_t)nvrtc_symbol(library, "nvrtcCreateProgram", &missing);
  copier.compile = (nvrtc_compile_fn)(uintptr_t)nvrtc_symbol(library, "nvrtcCompileProgram", &missing);
  copier.ptx_size = (nvrtc_size_fn)(uintptr_t)nvrtc_symbol(library, "nvrtcGetPTXSize", &missing);
  copier.ptx = (nvrtc_get_fn)(uintptr_t)nvrtc_symbol(library, "nvrtcGetPTX", &missing);
  copier.log_size = (nvrtc_size_fn)(uintptr_t)nvrtc_symbol(library, "nvrtcGetProgramLogSize", &missing);
  copier.log = (nvrtc_get_fn)(uintptr_t)nvrtc_symbol(library, "nvrtcGetProgramLog", &missing);
  copier.destroy = (nvrtc_destroy_fn)(uintptr_t)nvrtc_symbol(library, "nvrtcDestroyProgram", &missing);
  copier.error_string = (nvrtc_error_fn)(uintptr_t)nvrtc_symbol(library, "nvrtcGetErrorString", &missing);
  if (missing) {
    dlclose(library);
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dlb_cuda_copy: the NVRTC library loaded lacks the "
                         "nvrtc* entry points dlbridge needs");
  }
  copier.library = library;
  return DLB_OK;
}

static const char *nvrtc_text(int result) {
  const char *s = copier.error_string(result);
  return s != NULL ? s : "(unknown)";
}

/* Compile the kernel for the current context's device and load it; runs
 * under copier_mutex, in device_id's primary context. */
static int build_kernel(const dlb__cuda_api *api, int device_id,
                        dlb__CUfunction *out, dlb_error *err) {
  static const char what[] = "dlb_cuda_copy";
  int rc = DLB_OK;
  void *prog = NULL;
  char *ptx = NULL, *log = NULL;
  int major = 0, minor = 0;
  dlb__CUdevice device = 0;
  dlb__CUmodule module = NULL;
  char arch[48];

  rc = nvrtc_load(err);
  if (rc != DLB_OK) goto cleanup;
  dlb__CUresult cu = api->cuDeviceGet(&device, device_id);
  if (cu == DLB__CUDA_SUCCESS)
    cu = api->cuDeviceGetAttribute(&major, DLB__CU_DEVICE_ATTRIBUTE_CC_MAJOR, device);
  if (cu == DLB__CUDA_SUCCESS)
    cu = api->cuDeviceGetAttribute(&minor, DLB__CU_DEVICE_ATTRIBUTE_CC_MINOR, device);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuDeviceGetAttribute", cu);
    goto cleanup;
  }
  /* PTX for the device's own virtual architecture: the driver JIT-compiles
   * it, so one NVRTC serves every GPU it knows. */
  snprintf(arch, sizeof arch, "--gpu-architecture=compute_%d%d", major, minor);
  const char *options[] = {arch, "-default-device"};
  int nv = copier.create(&prog, kernel_source, "dlb_strided_copy.cu", 0, NULL, NULL);
  if (nv != 0) {
    prog = NULL;
    rc = dlb_error_set(err, DLB_EDEVICE, "%s: nvrtcCreateProgram failed: %s",
                       what, nvrtc_text(nv));
    goto cleanup;
  }
  nv = copier.compile(prog, 2, options);
  if (nv != 0) {
    size_t log_bytes = 0;
    if (copier.log_size(prog, &log_bytes) == 0 && log_bytes > 0)
      log = dlb__alloc(log_bytes);
    if (log != NULL && copier.log(prog, log) != 0) log[0] = '\0';
    rc = dlb_error_set(err, DLB_EDEVICE,
                       "%s: NVRTC could not compile the strided-copy kernel "
                       "for %s: %s; log: %.120s",
                       what, arch + 21, nvrtc_text(nv),
                       log != NULL ? log : "(unavailable)");
    goto cleanup;
  }
  size_t ptx_bytes = 0;
  nv = copier.ptx_size(prog, &ptx_bytes);
  if (nv != 0) {
    rc = dlb_error_set(err, DLB_EDEVICE, "%s: nvrtcGetPTXSize failed: %s",
                       what, nvrtc_text(nv));
    goto cleanup;
  }
  ptx = dlb__alloc(ptx_bytes);
  if (ptx == NULL) {
    rc = dlb_error_set(err, DLB_ENOMEM,
                       "%s: out of memory allocating %zu bytes of PTX", what,
                       ptx_bytes);
    goto cleanup;
  }
  nv = copier.ptx(prog, ptx);
  if (nv != 0) {
    rc = dlb_error_set(err, DLB_EDEVICE, "%s: nvrtcGetPTX failed: %s", what,
                       nvrtc_text(nv));
    goto cleanup;
  }
  cu = api->cuModuleLoadData(&module, ptx);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuModuleLoadData", cu);
    goto cleanup;
  }
  /* The module stays loaded for the life of the process, like the primary
   * context it lives in. */
  cu = api->cuModuleGetFunction(out, module, DLB__CUDA_COPY_KERNEL);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuModuleGetFunction", cu);
    goto cleanup;
  }

cleanup:
  if (prog != NULL) (void)copier.destroy(&prog);
  dlb__free(ptx);
  dlb__free(log);
  return rc;
}

static int copy_kernel(const dlb__cuda_api *api, int device_id,
                       dlb__CUfunction *out, dlb_error *err) {
  int rc = DLB_OK;
  call_once(&copier_once, copier_mutex_create);
  mtx_lock(&copier_mutex);
  if (copier.kernel[device_id] == NULL) {
    /* The first strided copy may come inside a graph capture (a Function
     * call under torch.cuda.graph).  Loading a module is not a stream
     * operation, but in the default "global" capture mode CUDA refuses
     * such potentially synchronising calls from any thread while a capture
     * runs; this thread's mode is relaxed for the build and put back. */
    int mode = DLB__CU_STREAM_CAPTURE_MODE_RELAXED;
    dlb__CUresult cu = api->cuThreadExchangeStreamCaptureMode(&mode);
    if (cu != DLB__CUDA_SUCCESS) {
      rc = dlb__cuda_fail(err, "dlb_cuda_copy",
                          "cuThreadExchangeStreamCaptureMode", cu);
    } else {
      rc = build_kernel(api, device_id, &copier.kernel[device_id], err);
      (void)api->cuThreadExchangeStreamCaptureMode(&mode);
    }
  }
  if (rc == DLB_OK) *out = copier.kernel[device_id];
  mtx_unlock(&copier_mutex);
  return rc;
}

void dlb__cuda_reset_for_tests(void) {
  call_once(&copier_once, copier_mutex_create);
  mtx_lock(&copier_mutex);
  if (copier.library != NULL) dlclose(copier.library);
  memset(&copier, 0, sizeof copier);
  mtx_unlock(&copier_mutex);
  dlb__cuda_driver_reset();
}

/* ---- planning ---------------------------------------------------------------- */

typedef enum { SIDE_HOST, SIDE_DEVICE } side_kind;

static int side_of(const char *name, const DLTensor *t, side_kind *out,
                   dlb_error *err) {
  switch ((int)t->device.device_type) {
    case kDLCPU: case kDLCUDAHost: *out = SIDE_HOST; return DLB_OK;
    case kDLCUDA: case kDLCUDAManaged: *out = SIDE_DEVICE; return DLB_OK;
    default: {
      char dev[DLB_DESCRIBE_MAX];
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "dlb_cuda_copy: %s is on %s; CUDA copies take "
                           "cpu, cuda, cuda_host and cuda_managed",
                           name, dlb_device_describe(t->device, dev, sizeof dev));
    }
  }
}

/* The merged dims of a copy, strides in bytes, logical order. */
typedef struct copy_plan {
  int nd;
  int64_t numel;
  int64_t itemsize;
  int64_t n[DLB_MAX_NDIM];
  int64_t ds[DLB_MAX_NDIM];
  int64_t ss[DLB_MAX_NDIM];
} copy_plan;

static int check_pair(const DLTensor *dst, const DLTensor *src,
                      dlb_error *err) {
  if (dst == NULL || src == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dlb_cuda_copy: %s is NULL",
                         dst == NULL ? "dst" : "src");
  int rc = dlb_tensor_validate(dst, 0, err);
  if (rc == DLB_OK) rc = dlb_tensor_validate(src, 0, err);
  if (rc != DLB_OK) return rc;
  if (dst->dtype.code != src->dtype.code || dst->dtype.bits != src->dtype.bits ||
      dst->dtype.lanes != src->dtype.lanes) {
    char a[DLB_DESCRIBE_MAX], b[DLB_DESCRIBE_MAX];
    return dlb_error_set(err, DLB_EINVAL,
                         "dlb_cuda_copy: dtypes differ (dst %s, src %s); "
                         "copies do not convert",
                         dlb_dtype_describe(dst->dtype, a, sizeof a),
                         dlb_dtype_describe(src->dtype, b, sizeof b));
  }
  if (dst->ndim != src->ndim)
    return dlb_error_set(err, DLB_EINVAL,
                         "dlb_cuda_copy: dst has %d dims, src %d", (int)dst->ndim,
                         (int)src->ndim);
  for (int32_t i = 0; i < dst->ndim; i++)
    if (dst->shape[i] != src->shape[i])
      return dlb_error_set(err, DLB_EINVAL,
                           "dlb_cuda_copy: shapes differ at dim %d (%lld vs "
                           "%lld)",
                           (int)i, (long long)dst->shape[i],
                           (long long)src->shape[i]);
  return DLB_OK;
}

/* Build the merged plan.  Sub-byte types are only copied contiguously, as
 * packed bytes: the plan is then one run of that many bytes. */
static int make_plan(const DLTensor *dst, const DLTensor *src, copy_plan *p,
                     dlb_error *err) {
  int64_t dscratch[DLB_MAX_NDIM], sscratch[DLB_MAX_NDIM];
  int rc = dlb_tensor_numel(dst, &p->numel, err);
  if (rc != DLB_OK) return rc;
  p->nd = 0;
  if (dlb_dtype_is_subbyte(dst->dtype)) {
    if (!dlb_tensor_is_contiguous(dst) || !dlb_tensor_is_contiguous(src))
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "dlb_cuda_copy: sub-byte elements have no byte "
                           "address, so they are copied only between "
                           "contiguous tensors");
    int64_t bytes = 0;
    rc = dlb_tensor_nbytes(dst, false, &bytes, err);
    if (rc != DLB_OK) return rc;
    p->itemsize = 1;
    p->numel = bytes;
    if (bytes > 0) {
      p->nd = 1;
      p->n[0] = bytes;
      p->ds[0] = p->ss[0] = 1;
    }
    return DLB_OK;
  }
  p->itemsize = dlb_dtype_itemsize(dst->dtype);
  if (p->numel == 0) return DLB_OK;
  const int64_t *dst_strides = dlb_tensor_strides(dst, dscratch);
  const int64_t *src_strides = dlb_tensor_strides(src, sscratch);
  for (int32_t i = 0; i < dst->ndim; i++) {
    int64_t n = dst->shape[i];
    if (n == 1) continue;
    /* validate bounded the spans, so these products fit. */
    int64_t ds = dst_strides[i] * p->itemsize, ss = src_strides[i] * p->itemsize;
    if (p->nd > 0) {
      int k = p->nd - 1;
      if (p->ds[k] == ds * n && p->ss[k] == ss * n) {
        p->n[k] *= n;
        p->ds[k] = ds;
        p->ss[k] = ss;
        continue;
      }
    }
    p->n[p->nd] = n;
    p->ds[p->nd] = ds;
    p->ss[p->nd] = ss;
    p->nd++;
  }
  for (int k = 0; k < p->nd; k++) {
    if (p->ds[k] == 0)
      return dlb_error_set(err, DLB_EINVAL,
                           "dlb_cuda_copy: dst has a zero stride over %lld "
                           "elements; every element would be written to the "
                           "same place",
                           (long long)p->n[k]);
  }
  return DLB_OK;
}

static bool plan_is_run(const copy_plan *p) {
  return p->nd == 0 ||
         (p->nd == 1 && p->ds[0] == p->itemsize && p->ss[0] == p->itemsize);
}

/* Rows of contiguous bytes, one positive pitch per side. */
static bool plan_as_2d(const copy_plan *p, size_t *width, size_t *height,
                       size_t *dpitch, size_t *spitch) {
  if (p->nd == 1 && p->ds[0] >= p->itemsize && p->ss[0] >= p->itemsize) {
    *width = (size_t)p->itemsize;
    *height = (size_t)p->n[0];
    *dpitch = (size_t)p->ds[0];
    *spitch = (size_t)p->ss[0];
    return true;
  }
  if (p->nd == 2 && p->ds[1] == p->itemsize && p->ss[1] == p->itemsize) {
    int64_t row = p->n[1] * p->itemsize;
    if (p->ds[0] >= row && p->ss[0] >= row) {
      *width = (size_t)row;
      *height = (size_t)p->n[0];
      *dpitch = (size_t)p->ds[0];
      *spitch = (size_t)p->ss[0];
      return true;
    }
  }
  return false;
}

/* [lo, hi) bytes one side's elements touch, relative to element 0. */
static void plan_span(const copy_plan *p, bool dst_side, int64_t *lo,
                      int64_t *hi) {
  *lo = 0;
  *hi = p->itemsize;
  for (int k = 0; k < p->nd; k++) {
    int64_t reach = (p->n[k] - 1) * (dst_side ? p->ds[k] : p->ss[k]);
    if (reach < 0) *lo += reach; else *hi += reach;
  }
}

static dlb__CUdeviceptr addr(const void *p) {
  return (dlb__CUdeviceptr)(uintptr_t)p;
}

static int launch(const dlb__cuda_api *api, int device_id, const copy_plan *p,
                  uint64_t dst, uint64_t src, void *stream, dlb_error *err) {
  dlb__CUfunction fn = NULL;
  int rc = copy_kernel(api, device_id, &fn, err);
  if (rc != DLB_OK) return rc;
  dlb__cuda_copy_params params;
  memset(&params, 0, sizeof params);
  params.dst = dst;
  params.src = src;
  params.numel = p->numel;
  params.ndim = p->nd;
  params.itemsize = (int32_t)p->itemsize;
  for (int k = 0; k < p->nd; k++) {
    params.shape[k] = p->n[k];
    params.dst_stride[k] = p->ds[k];
    params.src_stride[k] = p->ss[k];
  }
  uint64_t blocks = ((uint64_t)p->numel + THREADS_PER_BLOCK - 1) / THREADS_PER_BLOCK;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  void *args[1] = {&params};
  dlb__CUresult cu = api->cuLaunchKernel(fn, (unsigned)blocks, 1, 1,
                                         THREADS_PER_BLOCK, 1, 1, 0, stream,
                                         args, NULL);
  if (cu != DLB__CUDA_SUCCESS)
    return dlb__cuda_fail(err, "dlb_cuda_copy", "cuLaunchKernel", cu);
  return DLB_OK;
}

static int copy_2d(const dlb__cuda_api *api, void *d, side_kind dk,
                   const void *s, side_kind sk, size_t width, size_t height,
                   size_t dpitch, size_t spitch, void *stream,
                   dlb_error *err) {
  dlb__CUDA_MEMCPY2D c;
  memset(&c, 0, sizeof c);
  if (sk == SIDE_HOST) {
    c.srcMemoryType = DLB__CU_MEMORYTYPE_HOST;
    c.srcHost = s;
  } else {
    c.srcMemoryType = DLB__CU_MEMORYTYPE_DEVICE;
    c.srcDevice = addr(s);
  }
  if (dk == SIDE_HOST) {
    c.dstMemoryType = DLB__CU_MEMORYTYPE_HOST;
    c.dstHost = d;
  } else {
    c.dstMemoryType = DLB__CU_MEMORYTYPE_DEVICE;
    c.dstDevice = addr(d);
  }
  c.srcPitch = spitch;
  c.dstPitch = dpitch;
  c.WidthInBytes = width;
  c.Height = height;
  dlb__CUresult cu = api->cuMemcpy2DAsync(&c, stream);
  if (cu != DLB__CUDA_SUCCESS)
    return dlb__cuda_fail(err, "dlb_cuda_copy", "cuMemcpy2DAsync", cu);
  return DLB_OK;
}

/* Kernel copy with one host side, through a stream-ordered device buffer. */
static int copy_staged(const dlb__cuda_api *api, int device_id,
                       const copy_plan *p, char *d, side_kind dk,
                       const char *s, void *stream, dlb_error *err) {
  int64_t lo, hi;
  void *staging = NULL;
  int rc;
  plan_span(p, dk == SIDE_HOST, &lo, &hi);
  if (dk == SIDE_HOST && hi - lo != p->numel * p->itemsize) {
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "dlb_cuda_copy: the host destination's layout "
                         "leaves gaps between its elements, which a copy "
                         "from the device cannot write without the host; "
                         "copy into a contiguous host tensor and then use "
                         "dlb_copy");
  }
  rc = dlb_cuda_alloc(device_id, (size_t)(hi - lo), stream, &staging, err);
  if (rc != DLB_OK) goto cleanup;
  /* Offsets are applied in integer arithmetic: the staged element 0 sits
   * -lo bytes into the buffer, wherever the host side's element 0 is. */
  uint64_t base = (uint64_t)(uintptr_t)staging - (uint64_t)lo;
  dlb__CUresult cu;
  if (dk == SIDE_DEVICE) {
    /* host -> device: bring src's span over as is, then scatter. */
    cu = api->cuMemcpyAsync(addr(staging), addr(s + lo), (size_t)(hi - lo), stream);
    if (cu != DLB__CUDA_SUCCESS) {
      rc = dlb__cuda_fail(err, "dlb_cuda_copy", "cuMemcpyAsync", cu);
      goto cleanup;
    }
    rc = launch(api, device_id, p, (uint64_t)(uintptr_t)d, base, stream, err);
  } else {
    /* device -> host: gather laid out like dst, then one span copy. */
    rc = launch(api, device_id, p, base, (uint64_t)(uintptr_t)s, stream, err);
    if (rc != DLB_OK) goto cleanup;
    cu = api->cuMemcpyAsync(addr(d + lo), addr(staging), (size_t)(hi - lo), stream);
    if (cu != DLB__CUDA_SUCCESS)
      rc = dlb__cuda_fail(err, "dlb_cuda_copy", "cuMemcpyAsync", cu);
  }

cleanup:
  if (staging != NULL) {
    /* Stream-ordered: freed after the work above, never on the host's
     * clock.  A failure here cannot undo the copy; report the first error. */
    dlb_error ignored;
    if (dlb_cuda_free(device_id, staging, stream, rc == DLB_OK ? err : &ignored) !=
            DLB_OK &&
        rc == DLB_OK)
      rc = err != NULL ? err->code : DLB_EDEVICE;
  }
  return rc;
}

int dlb_cuda_copy(const DLTensor *dst, const DLTensor *src, void *stream,
                  dlb_error *err) {
  static const char what[] = "dlb_cuda_copy";
  copy_plan plan;
  /* Set by side_of; initialised because -O3 cannot see that through its
   * error returns (-Wmaybe-uninitialized in release builds). */
  side_kind dk = SIDE_HOST, sk = SIDE_HOST;
  dlb__cuda_scope scope = {NULL, NULL, false};
  size_t width, height, dpitch, spitch;

  int rc = check_pair(dst, src, err);
  if (rc != DLB_OK) return rc;
  rc = side_of("dst", dst, &dk, err);
  if (rc == DLB_OK) rc = side_of("src", src, &sk, err);
  if (rc != DLB_OK) return rc;
  if (dk == SIDE_HOST && sk == SIDE_HOST) return dlb_copy(dst, src, err);
  rc = make_plan(dst, src, &plan, err);
  if (rc != DLB_OK || plan.numel == 0) return rc;
  int device_id = dk == SIDE_DEVICE ? dst->device.device_id : src->device.device_id;
  bool cross = dk == SIDE_DEVICE && sk == SIDE_DEVICE &&
               dst->device.device_id != src->device.device_id;
  char *d = dlb_tensor_data(dst);
  const char *s = dlb_tensor_data(src);

  rc = dlb__cuda_enter(what, device_id, &scope, err);
  if (rc != DLB_OK) goto cleanup;
  if (plan_is_run(&plan)) {
    dlb__CUresult cu = scope.api->cuMemcpyAsync(
        addr(d), addr(s), (size_t)(plan.numel * plan.itemsize), stream);
    if (cu != DLB__CUDA_SUCCESS)
      rc = dlb__cuda_fail(err, what, "cuMemcpyAsync", cu);
  } else if (cross) {
    rc = dlb_error_set(err, DLB_EUNSUPPORTED,
                       "%s: a strided copy between cuda:%d and cuda:%d is not "
                       "supported; copy contiguously across devices",
                       what, (int)src->device.device_id,
                       (int)dst->device.device_id);
  } else if (plan_as_2d(&plan, &width, &height, &dpitch, &spitch)) {
    rc = copy_2d(scope.api, d, dk, s, sk, width, height, dpitch, spitch,
                 stream, err);
  } else if (dk == SIDE_DEVICE && sk == SIDE_DEVICE) {
    rc = launch(scope.api, device_id, &plan, (uint64_t)(uintptr_t)d,
                (uint64_t)(uintptr_t)s, stream, err);
  } else {
    rc = copy_staged(scope.api, device_id, &plan, d, dk, s, stream, err);
  }

cleanup:
  dlb__cuda_leave(&scope);
  return rc;
}
