/* cuda_memory.c -- CUDA memory: what a pointer is, stream-ordered device
 * allocation, pinned host allocation, and owning managed tensors on them.
 *
 * Managed tensors reuse dlb_managed_wrap (managed.c) for the struct, shape
 * and strides, with a release function that frees the CUDA memory.  The
 * release context is one small host block that remembers the allocator that
 * made it (the rule of managed.c: free through the allocator that
 * allocated, even after dlb_set_allocator changed).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

int dlb_cuda_pointer_info_get(const void *ptr, dlb_cuda_pointer_info *info,
                              dlb_error *err) {
  const dlb__cuda_api *api;
  if (info == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dlb_cuda_pointer_info_get: info is NULL");
  int rc = dlb__cuda_api_get(&api, err);
  if (rc != DLB_OK) return rc;
  unsigned memory_type = 0, is_managed = 0;
  int ordinal = -1;
  int attributes[3] = {DLB__CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                       DLB__CU_POINTER_ATTRIBUTE_IS_MANAGED,
                       DLB__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void *data[3] = {&memory_type, &is_managed, &ordinal};
  /* The plural form answers for unregistered host memory too (memory type
   * 0) instead of failing, and needs no current context. */
  dlb__CUresult cu = api->cuPointerGetAttributes(
      3, attributes, data, (dlb__CUdeviceptr)(uintptr_t)ptr);
  if (cu != DLB__CUDA_SUCCESS)
    return dlb__cuda_fail(err, "dlb_cuda_pointer_info_get",
                          "cuPointerGetAttributes", cu);
  dlb_cuda_pointer_info out = {DLB_CUDA_MEMORY_UNREGISTERED, -1, false};
  if (is_managed != 0) {
    out.memory_type = DLB_CUDA_MEMORY_MANAGED;
    out.is_managed = true;
    out.device_ordinal = ordinal;
  } else if (memory_type == DLB__CU_MEMORYTYPE_DEVICE) {
    out.memory_type = DLB_CUDA_MEMORY_DEVICE;
    out.device_ordinal = ordinal;
  } else if (memory_type == DLB__CU_MEMORYTYPE_HOST) {
    out.memory_type = DLB_CUDA_MEMORY_HOST;
    out.device_ordinal = ordinal;
  }
  *info = out;
  return DLB_OK;
}

static const char *memory_type_text(dlb_cuda_memory_type t) {
  switch (t) {
    case DLB_CUDA_MEMORY_HOST: return "pinned host memory";
    case DLB_CUDA_MEMORY_DEVICE: return "CUDA device memory";
    case DLB_CUDA_MEMORY_MANAGED: return "CUDA managed memory";
    default: return "host memory unknown to CUDA";
  }
}

int dlb_cuda_check_pointer(DLDevice claimed, const void *ptr, dlb_error *err) {
  dlb_cuda_pointer_info info;
  bool ok = false;
  char claim[DLB_DESCRIBE_MAX];
  dlb_device_describe(claimed, claim, sizeof claim);
  if (ptr == NULL) return DLB_OK;
  switch ((int)claimed.device_type) {
    case kDLCPU: case kDLCUDA: case kDLCUDAHost: case kDLCUDAManaged: break;
    default:
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "dlb_cuda_check_pointer: device %s is not one "
                           "CUDA can check",
                           claim);
  }
  int rc = dlb_cuda_pointer_info_get(ptr, &info, err);
  if (rc != DLB_OK) return rc;
  switch ((int)claimed.device_type) {
    case kDLCPU: ok = info.memory_type != DLB_CUDA_MEMORY_DEVICE; break;
    case kDLCUDA:
      ok = (info.memory_type == DLB_CUDA_MEMORY_DEVICE ||
            info.memory_type == DLB_CUDA_MEMORY_MANAGED) &&
           info.device_ordinal == claimed.device_id;
      break;
    case kDLCUDAHost: ok = info.memory_type == DLB_CUDA_MEMORY_HOST; break;
    default: ok = info.is_managed; break; /* kDLCUDAManaged */
  }
  if (ok) return DLB_OK;
  if (info.memory_type == DLB_CUDA_MEMORY_UNREGISTERED) {
    return dlb_error_set(err, DLB_EINVAL,
                         "pointer %p is claimed to be %s but is %s",
                         ptr, claim, memory_type_text(info.memory_type));
  }
  return dlb_error_set(err, DLB_EINVAL,
                       "pointer %p is claimed to be %s but is %s of CUDA "
                       "device %d",
                       ptr, claim, memory_type_text(info.memory_type),
                       info.device_ordinal);
}

int dlb_cuda_device_of_pointer(const void *ptr, DLDevice *out,
                               dlb_error *err) {
  dlb_cuda_pointer_info info;
  if (out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dlb_cuda_device_of_pointer: out is NULL");
  int rc = dlb_cuda_pointer_info_get(ptr, &info, err);
  if (rc != DLB_OK) return rc;
  switch (info.memory_type) {
    case DLB_CUDA_MEMORY_DEVICE:
      out->device_type = kDLCUDA;
      break;
    case DLB_CUDA_MEMORY_MANAGED:
      out->device_type = kDLCUDAManaged;
      break;
    case DLB_CUDA_MEMORY_HOST:
      out->device_type = kDLCUDAHost;
      break;
    default:
      return dlb_error_set(err, DLB_EINVAL,
                           "pointer %p is host memory unknown to CUDA, not a "
                           "CUDA pointer",
                           ptr);
  }
  out->device_id = info.device_ordinal < 0 ? 0 : info.device_ordinal;
  return DLB_OK;
}

/* Device memory comes from each device's default memory pool.  With its
 * default release threshold of 0 the pool hands freed memory back to the
 * OS at every synchronisation, so the next allocation maps fresh pages:
 * a 256 MiB copy measured 5x slower than PyTorch's (H100).  The threshold
 * is raised to "keep everything" once per device, as PyTorch's
 * cudaMallocAsync backend and CuPy's async pool do with the same pool; an
 * allocation that runs out of memory trims the pool and tries once more,
 * so memory kept for dlbridge never makes dlbridge itself fail.  Drivers
 * without the pool entries skip both. */
static _Atomic int pool_tuned[DLB__CUDA_MAX_DEVICES];

static dlb__CUmemoryPool default_pool(const dlb__cuda_api *api, int device_id) {
  dlb__CUdevice device = 0;
  dlb__CUmemoryPool pool = NULL;
  if (api->cuDeviceGetDefaultMemPool == NULL ||
      api->cuDeviceGet(&device, device_id) != DLB__CUDA_SUCCESS ||
      api->cuDeviceGetDefaultMemPool(&pool, device) != DLB__CUDA_SUCCESS)
    return NULL;
  return pool;
}

static void tune_pool(const dlb__cuda_api *api, int device_id) {
  if (pool_tuned[device_id] || api->cuMemPoolSetAttribute == NULL) return;
  /* Racing threads may both set it: the same value, harmless. */
  dlb__CUmemoryPool pool = default_pool(api, device_id);
  uint64_t keep_all = UINT64_MAX;
  if (pool != NULL)
    (void)api->cuMemPoolSetAttribute(
        pool, DLB__CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all);
  pool_tuned[device_id] = 1;
}

void dlb__cuda_pool_reset_for_tests(void) {
  for (int i = 0; i < DLB__CUDA_MAX_DEVICES; i++) pool_tuned[i] = 0;
}

int dlb_cuda_alloc(int device_id, size_t nbytes, void *stream, void **out,
                   dlb_error *err) {
  dlb__cuda_scope scope;
  dlb__CUdeviceptr ptr = 0;
  if (out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dlb_cuda_alloc: out is NULL");
  int rc = dlb__cuda_enter("dlb_cuda_alloc", device_id, &scope, err);
  if (rc != DLB_OK) goto cleanup;
  if (nbytes == 0) {
    *out = NULL;
    goto cleanup;
  }
  tune_pool(scope.api, device_id);
  dlb__CUresult cu = scope.api->cuMemAllocAsync(&ptr, nbytes, stream);
  if (cu == DLB__CUDA_ERROR_OUT_OF_MEMORY && scope.api->cuMemPoolTrimTo != NULL) {
    dlb__CUmemoryPool pool = default_pool(scope.api, device_id);
    if (pool != NULL &&
        scope.api->cuMemPoolTrimTo(pool, 0) == DLB__CUDA_SUCCESS)
      cu = scope.api->cuMemAllocAsync(&ptr, nbytes, stream);
  }
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, "dlb_cuda_alloc", "cuMemAllocAsync", cu);
    if (rc == DLB_ENOMEM && err != NULL) {
      size_t used = strlen(err->message);
      snprintf(err->message + used, sizeof err->message - used,
               " allocating %zu bytes on cuda:%d", nbytes, device_id);
    }
    goto cleanup;
  }
  *out = (void *)(uintptr_t)ptr;

cleanup:
  dlb__cuda_leave(&scope);
  return rc;
}

int dlb_cuda_free(int device_id, void *ptr, void *stream, dlb_error *err) {
  dlb__cuda_scope scope;
  if (ptr == NULL) return DLB_OK;
  int rc = dlb__cuda_enter("dlb_cuda_free", device_id, &scope, err);
  if (rc != DLB_OK) goto cleanup;
  dlb__CUresult cu =
      scope.api->cuMemFreeAsync((dlb__CUdeviceptr)(uintptr_t)ptr, stream);
  if (cu != DLB__CUDA_SUCCESS)
    rc = dlb__cuda_fail(err, "dlb_cuda_free", "cuMemFreeAsync", cu);

cleanup:
  dlb__cuda_leave(&scope);
  return rc;
}

int dlb_cuda_host_alloc(size_t nbytes, void **out, dlb_error *err) {
  const dlb__cuda_api *api;
  if (out == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dlb_cuda_host_alloc: out is NULL");
  int rc = dlb__cuda_api_get(&api, err);
  if (rc != DLB_OK) return rc;
  void *p = NULL;
  /* Pinned memory of 0 bytes: ask for 1 so the pointer is CUDA's. */
  dlb__CUresult cu = api->cuMemHostAlloc(&p, nbytes == 0 ? 1 : nbytes,
                                         DLB__CU_MEMHOSTALLOC_PORTABLE);
  if (cu != DLB__CUDA_SUCCESS)
    return dlb__cuda_fail(err, "dlb_cuda_host_alloc", "cuMemHostAlloc", cu);
  *out = p;
  return DLB_OK;
}

int dlb_cuda_host_free(void *ptr, dlb_error *err) {
  const dlb__cuda_api *api;
  if (ptr == NULL) return DLB_OK;
  int rc = dlb__cuda_api_get(&api, err);
  if (rc != DLB_OK) return rc;
  dlb__CUresult cu = api->cuMemFreeHost(ptr);
  if (cu != DLB__CUDA_SUCCESS)
    return dlb__cuda_fail(err, "dlb_cuda_host_free", "cuMemFreeHost", cu);
  return DLB_OK;
}

/* ---- managed tensors ------------------------------------------------------ */

/* What the release function needs to free the data once. */
typedef struct cuda_owner {
  dlb_allocator allocator; /* made this block */
  DLDevice device;
  void *data;
  void *stream;
} cuda_owner;

static void release_data(const cuda_owner *o) {
  /* A deleter cannot report failure; the memory is lost at worst. */
  if (o->device.device_type == kDLCUDAHost)
    (void)dlb_cuda_host_free(o->data, NULL);
  else
    (void)dlb_cuda_free(o->device.device_id, o->data, o->stream, NULL);
}

static void cuda_owner_release(void *ctx) {
  cuda_owner *o = ctx;
  cuda_owner copy = *o;
  copy.allocator.release(o, copy.allocator.ctx);
  release_data(&copy);
}

static int make_cuda_owned(const char *what, int32_t ndim,
                           const int64_t *shape, DLDataType dtype,
                           DLDevice device, bool padded, void *stream,
                           bool clear, DLManagedTensorVersioned **out,
                           dlb_error *err) {
  int rc;
  cuda_owner *owner = NULL;
  int64_t numel = 0, nbytes = 0;
  int64_t strides[DLB_MAX_NDIM];
  const dlb_allocator *allocator = dlb_get_allocator();

  if (out == NULL || (ndim > 0 && shape == NULL) || ndim < 0) {
    rc = dlb_error_set(err, DLB_EINVAL, "%s: %s", what,
                       out == NULL ? "out is NULL"
                                   : "ndim < 0, or shape is NULL with ndim > 0");
    goto cleanup;
  }
  if (ndim > DLB_MAX_NDIM) {
    rc = dlb_error_set(err, DLB_EUNSUPPORTED,
                       "%s: ndim is %d; dlbridge handles at most %d "
                       "dimensions (DLB_MAX_NDIM)",
                       what, (int)ndim, DLB_MAX_NDIM);
    goto cleanup;
  }
  if (device.device_type != kDLCUDA && device.device_type != kDLCUDAHost) {
    char d[DLB_DESCRIBE_MAX];
    rc = dlb_error_set(err, DLB_EUNSUPPORTED,
                       "%s: device %s is not cuda or cuda_host", what,
                       dlb_device_describe(device, d, sizeof d));
    goto cleanup;
  }
  rc = dlb_dtype_check(dtype, err);
  if (rc != DLB_OK) goto cleanup;
  rc = dlb_shape_numel(ndim, shape, &numel, err);
  if (rc != DLB_OK) goto cleanup;
  rc = dlb_dtype_storage_bytes(dtype, numel, padded, &nbytes, err);
  if (rc != DLB_OK) goto cleanup;
  if (ndim > 0) {
    rc = dlb_strides_row_major(ndim, shape, strides, err);
    if (rc != DLB_OK) goto cleanup;
  }

  owner = allocator->alloc(sizeof *owner, allocator->ctx);
  if (owner == NULL) {
    rc = dlb_error_set(err, DLB_ENOMEM, "%s: out of memory allocating %zu bytes",
                       what, sizeof *owner);
    goto cleanup;
  }
  owner->allocator = *allocator;
  owner->device = device;
  owner->data = NULL;
  /* Freed on the legacy stream, not on `stream`: a framework's stream
   * object may be destroyed before the tensor (a CuPy or torch stream
   * dropped while its results live on), and freeing on a destroyed stream
   * is undefined behaviour (it crashed, seen with CuPy 14 on an H100).
   * The legacy stream exists for the life of the context and orders
   * itself after every blocking stream; work on a non-blocking stream that
   * still uses the memory when the tensor is dropped is the caller's to
   * order, as with PyTorch's caching allocator. */
  owner->stream = DLB_CUDA_STREAM_LEGACY;
  if (device.device_type == kDLCUDAHost) {
    rc = dlb_cuda_host_alloc((size_t)nbytes, &owner->data, err);
    if (rc != DLB_OK) goto cleanup;
    if (clear) memset(owner->data, 0, (size_t)nbytes);
  } else {
    rc = dlb_cuda_alloc(device.device_id, (size_t)nbytes, stream, &owner->data,
                        err);
    if (rc != DLB_OK) goto cleanup;
    if (clear && nbytes > 0) {
      dlb__cuda_scope scope;
      rc = dlb__cuda_enter(what, device.device_id, &scope, err);
      if (rc == DLB_OK) {
        dlb__CUresult cu = scope.api->cuMemsetD8Async(
            (dlb__CUdeviceptr)(uintptr_t)owner->data, 0, (size_t)nbytes,
            stream);
        if (cu != DLB__CUDA_SUCCESS)
          rc = dlb__cuda_fail(err, what, "cuMemsetD8Async", cu);
      }
      dlb__cuda_leave(&scope);
      if (rc != DLB_OK) goto cleanup;
    }
  }

  DLTensor view;
  memset(&view, 0, sizeof view);
  view.data = owner->data;
  view.device = device;
  view.ndim = ndim;
  view.dtype = dtype;
  view.shape = ndim > 0 ? (int64_t *)(uintptr_t)shape : NULL;
  view.strides = ndim > 0 ? strides : NULL;
  rc = dlb_managed_wrap(&view,
                        padded ? DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED : 0,
                        cuda_owner_release, owner, out, err);
  if (rc != DLB_OK) goto cleanup;
  owner = NULL; /* the tensor's deleter owns it now */

cleanup:
  if (owner != NULL) {
    cuda_owner copy = *owner;
    copy.allocator.release(owner, copy.allocator.ctx);
    release_data(&copy);
  }
  return rc;
}

int dlb_cuda_managed_empty(int32_t ndim, const int64_t *shape,
                           DLDataType dtype, DLDevice device, bool padded,
                           void *stream, DLManagedTensorVersioned **out,
                           dlb_error *err) {
  return make_cuda_owned("dlb_cuda_managed_empty", ndim, shape, dtype, device,
                         padded, stream, false, out, err);
}

int dlb_cuda_managed_zeros(int32_t ndim, const int64_t *shape,
                           DLDataType dtype, DLDevice device, bool padded,
                           void *stream, DLManagedTensorVersioned **out,
                           dlb_error *err) {
  return make_cuda_owned("dlb_cuda_managed_zeros", ndim, shape, dtype, device,
                         padded, stream, true, out, err);
}
