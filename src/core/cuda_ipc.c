/* cuda_ipc.c -- CUDA IPC: device memory another process maps with no copy.
 *
 * CUDA's legacy IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle) works on
 * memory from cuMemAlloc only -- stream-ordered pool memory is not
 * exportable that way -- so memory meant to be shared is allocated for it
 * (dlb_cuda_ipc_alloc).  The handle also carries an interprocess event,
 * recorded on the exporter's stream when the handle is made, which the
 * importer's stream waits for on the GPU: the importer sees everything the
 * exporter queued before exporting, with no host wait on either side.
 *
 * Devices are matched by UUID, not ordinal: CUDA_VISIBLE_DEVICES may order
 * them differently in the two processes.
 *
 * Lifetime (CUDA's rule, written down in docs/scale-out.md): the exporting
 * process keeps the allocation alive while any importer has it open;
 * freeing it earlier leaves the importer's mapping undefined.
 */
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* The IPC entries are optional in the driver table: a driver without them
 * still serves everything else (the load decided which, once). */
static int require_ipc(const dlb__cuda_api *api, const char *what,
                       dlb_error *err) {
  if (!api->ipc)
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "%s: this CUDA driver has no IPC entry points "
                         "(cuIpcGetMemHandle and friends)",
                         what);
  return DLB_OK;
}

/* Enter device_id's primary context and check the IPC entries. */
static int enter_ipc(const char *what, int device_id, dlb__cuda_scope *scope,
                     dlb_error *err) {
  int rc = dlb__cuda_enter(what, device_id, scope, err);
  if (rc == DLB_OK) rc = require_ipc(scope->api, what, err);
  return rc;
}

int dlb_cuda_ipc_alloc(int device_id, size_t nbytes, void **out,
                       dlb_error *err) {
  static const char what[] = "dlb_cuda_ipc_alloc";
  dlb__cuda_scope scope;
  dlb__CUdeviceptr ptr = 0;
  if (out == NULL) return dlb_error_set(err, DLB_EINVAL, "%s: out is NULL", what);
  int rc = enter_ipc(what, device_id, &scope, err);
  if (rc != DLB_OK) goto cleanup;
  /* IPC handles name an allocation: never a zero-byte one. */
  dlb__CUresult cu = scope.api->cuMemAlloc(&ptr, nbytes == 0 ? 1 : nbytes);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuMemAlloc", cu);
    goto cleanup;
  }
  *out = (void *)(uintptr_t)ptr;

cleanup:
  dlb__cuda_leave(&scope);
  return rc;
}

int dlb_cuda_ipc_free(int device_id, void *ptr, dlb_error *err) {
  static const char what[] = "dlb_cuda_ipc_free";
  dlb__cuda_scope scope;
  if (ptr == NULL) return DLB_OK;
  int rc = enter_ipc(what, device_id, &scope, err);
  if (rc == DLB_OK) {
    dlb__CUresult cu = scope.api->cuMemFree((dlb__CUdeviceptr)(uintptr_t)ptr);
    if (cu != DLB__CUDA_SUCCESS) rc = dlb__cuda_fail(err, what, "cuMemFree", cu);
  }
  dlb__cuda_leave(&scope);
  return rc;
}

int dlb_cuda_ipc_event_create(int device_id, void **event, dlb_error *err) {
  static const char what[] = "dlb_cuda_ipc_event_create";
  dlb__cuda_scope scope;
  if (event == NULL) return dlb_error_set(err, DLB_EINVAL, "%s: event is NULL", what);
  int rc = enter_ipc(what, device_id, &scope, err);
  if (rc == DLB_OK) {
    dlb__CUevent ev = NULL;
    dlb__CUresult cu = scope.api->cuEventCreate(
        &ev, DLB__CU_EVENT_INTERPROCESS | DLB__CU_EVENT_DISABLE_TIMING);
    if (cu != DLB__CUDA_SUCCESS)
      rc = dlb__cuda_fail(err, what, "cuEventCreate", cu);
    else
      *event = ev;
  }
  dlb__cuda_leave(&scope);
  return rc;
}

int dlb_cuda_ipc_event_destroy(int device_id, void *event, dlb_error *err) {
  static const char what[] = "dlb_cuda_ipc_event_destroy";
  dlb__cuda_scope scope;
  if (event == NULL) return DLB_OK;
  int rc = dlb__cuda_enter(what, device_id, &scope, err);
  if (rc == DLB_OK) {
    dlb__CUresult cu = scope.api->cuEventDestroy(event);
    if (cu != DLB__CUDA_SUCCESS)
      rc = dlb__cuda_fail(err, what, "cuEventDestroy", cu);
  }
  dlb__cuda_leave(&scope);
  return rc;
}

static int device_uuid(const dlb__cuda_api *api, int ordinal, dlb__CUuuid *out,
                       const char *what, dlb_error *err) {
  dlb__CUdevice device = 0;
  dlb__CUresult cu = api->cuDeviceGet(&device, ordinal);
  if (cu == DLB__CUDA_SUCCESS) cu = api->cuDeviceGetUuid(out, device);
  if (cu != DLB__CUDA_SUCCESS) return dlb__cuda_fail(err, what, "cuDeviceGetUuid", cu);
  return DLB_OK;
}

int dlb_cuda_ipc_export(int device_id, void *base, size_t size, void *event,
                        void *stream, dlb_cuda_ipc_handle *h, dlb_error *err) {
  static const char what[] = "dlb_cuda_ipc_export";
  dlb__cuda_scope scope;
  dlb__CUipcMemHandle mem;
  dlb__CUipcEventHandle ev;
  dlb__CUuuid uuid;
  if (base == NULL || event == NULL || h == NULL)
    return dlb_error_set(err, DLB_EINVAL, "%s: base, event and h must not be NULL",
                         what);
  int rc = enter_ipc(what, device_id, &scope, err);
  if (rc != DLB_OK) goto cleanup;
  rc = device_uuid(scope.api, device_id, &uuid, what, err);
  if (rc != DLB_OK) goto cleanup;
  dlb__CUresult cu =
      scope.api->cuIpcGetMemHandle(&mem, (dlb__CUdeviceptr)(uintptr_t)base);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuIpcGetMemHandle", cu);
    goto cleanup;
  }
  /* Recorded now: the importer waits for what was queued up to here. */
  cu = scope.api->cuEventRecord(event, stream);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuEventRecord", cu);
    goto cleanup;
  }
  cu = scope.api->cuIpcGetEventHandle(&ev, event);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuIpcGetEventHandle", cu);
    goto cleanup;
  }
  memset(h, 0, sizeof *h);
  memcpy(h->memory, mem.reserved, sizeof h->memory);
  memcpy(h->event, ev.reserved, sizeof h->event);
  memcpy(h->uuid, uuid.bytes, sizeof h->uuid);
  h->base = (uint64_t)(uintptr_t)base;
  h->size = (uint64_t)size;
  h->pid = (int64_t)getpid();

cleanup:
  dlb__cuda_leave(&scope);
  return rc;
}

int dlb_cuda_ipc_find_device(const dlb_cuda_ipc_handle *h, int *device_id,
                             dlb_error *err) {
  static const char what[] = "dlb_cuda_ipc_find_device";
  const dlb__cuda_api *api;
  int count = 0;
  if (h == NULL || device_id == NULL)
    return dlb_error_set(err, DLB_EINVAL, "%s: h and device_id must not be NULL",
                         what);
  int rc = dlb__cuda_api_get(&api, err);
  if (rc == DLB_OK) rc = require_ipc(api, what, err);
  if (rc == DLB_OK) rc = dlb_cuda_device_count(&count, err);
  if (rc != DLB_OK) return rc;
  for (int i = 0; i < count; i++) {
    dlb__CUuuid uuid;
    rc = device_uuid(api, i, &uuid, what, err);
    if (rc != DLB_OK) return rc;
    if (memcmp(uuid.bytes, h->uuid, sizeof h->uuid) == 0) {
      *device_id = i;
      return DLB_OK;
    }
  }
  return dlb_error_set(err, DLB_EINVAL,
                       "%s: the exporting process's GPU is not visible to "
                       "this process (no device with its UUID among %d; check "
                       "CUDA_VISIBLE_DEVICES)",
                       what, count);
}

int dlb_cuda_ipc_open(const dlb_cuda_ipc_handle *h, void *stream,
                      int *device_id, void **base, dlb_error *err) {
  static const char what[] = "dlb_cuda_ipc_open";
  dlb__cuda_scope scope;
  dlb__CUipcMemHandle mem;
  dlb__CUipcEventHandle evh;
  dlb__CUevent ev = NULL;
  dlb__CUdeviceptr ptr = 0;
  int dev = -1;
  if (h == NULL || device_id == NULL || base == NULL)
    return dlb_error_set(err, DLB_EINVAL,
                         "%s: h, device_id and base must not be NULL", what);
  if (h->pid == (int64_t)getpid())
    return dlb_error_set(err, DLB_EINVAL,
                         "%s: the handle was made by this process, which "
                         "cannot open its own IPC handles (use the exporter's "
                         "address)",
                         what);
  int rc = dlb_cuda_ipc_find_device(h, &dev, err);
  if (rc != DLB_OK) return rc;
  rc = enter_ipc(what, dev, &scope, err);
  if (rc != DLB_OK) goto cleanup;
  memcpy(mem.reserved, h->memory, sizeof mem.reserved);
  memcpy(evh.reserved, h->event, sizeof evh.reserved);
  dlb__CUresult cu = scope.api->cuIpcOpenMemHandle(
      &ptr, mem, DLB__CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuIpcOpenMemHandle", cu);
    goto cleanup;
  }
  /* The exporter's work before the export, ordered before ours on the GPU.
   * The opened event is ours to destroy; the driver keeps it until the
   * wait resolves. */
  /* The handle's size comes from a pickle: the driver knows the real one.
   * A handle claiming more than its allocation would let the importer's
   * tensor reach past the mapping. */
  dlb__CUdeviceptr range_base = 0;
  size_t range_size = 0;
  cu = scope.api->cuMemGetAddressRange(&range_base, &range_size, ptr);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuMemGetAddressRange", cu);
    (void)scope.api->cuIpcCloseMemHandle(ptr);
    goto cleanup;
  }
  if (range_base != ptr || h->size > (uint64_t)range_size) {
    rc = dlb_error_set(err, DLB_EINVAL,
                       "%s: the handle claims %llu bytes, but the allocation "
                       "it names has %zu",
                       what, (unsigned long long)h->size, range_size);
    (void)scope.api->cuIpcCloseMemHandle(ptr);
    goto cleanup;
  }
  cu = scope.api->cuIpcOpenEventHandle(&ev, evh);
  if (cu == DLB__CUDA_SUCCESS) cu = scope.api->cuStreamWaitEvent(stream, ev, 0);
  if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb__cuda_fail(err, what, "cuIpcOpenEventHandle/cuStreamWaitEvent", cu);
    (void)scope.api->cuIpcCloseMemHandle(ptr);
    goto cleanup;
  }
  *device_id = dev;
  *base = (void *)(uintptr_t)ptr;

cleanup:
  if (ev != NULL) (void)scope.api->cuEventDestroy(ev);
  dlb__cuda_leave(&scope);
  return rc;
}

int dlb_cuda_ipc_close(int device_id, void *base, dlb_error *err) {
  static const char what[] = "dlb_cuda_ipc_close";
  dlb__cuda_scope scope;
  if (base == NULL) return DLB_OK;
  int rc = enter_ipc(what, device_id, &scope, err);
  if (rc == DLB_OK) {
    dlb__CUresult cu =
        scope.api->cuIpcCloseMemHandle((dlb__CUdeviceptr)(uintptr_t)base);
    if (cu != DLB__CUDA_SUCCESS)
      rc = dlb__cuda_fail(err, what, "cuIpcCloseMemHandle", cu);
  }
  dlb__cuda_leave(&scope);
  return rc;
}
