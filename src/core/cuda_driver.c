/* cuda_driver.c -- the CUDA driver, opened at run time: the one load, the
 * entry table, error text, device count and primary contexts.
 *
 * Load: dlopen(DLB_CUDA_DRIVER or "libcuda.so.1"), dlsym of
 * cuGetProcAddress_v2 only (cuGetProcAddress, the 4-argument form, on
 * drivers older than 12.0), then every entry point of internal.h's
 * DLB__CUDA_ENTRIES through it, at the CUDA version whose signature that
 * list transcribes; whether all the IPC entries are there is decided then,
 * once (dlb__cuda_api.ipc).  The outcome (table or error) is decided once,
 * under a mutex, and published with an atomic flag so the common path is
 * one acquire load.
 *
 * Threads: C11 <threads.h> (glibc >= 2.28 has it, and -std=c11 builds with
 * it): call_once creates the mutex, the mutex serialises the load and the
 * lazy per-device primary-context retain.
 *
 * Primary contexts are retained once per device and never released: torch
 * and CuPy share them, and releasing at exit would race their own teardown.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include "internal.h"

/* cuGetProcAddress flag: the entry points of the legacy default stream
 * semantics (stream 2 still names the per-thread stream explicitly). */
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1u

typedef dlb__CUresult (*get_proc_v2_fn)(const char *symbol, void **pfn,
                                        int version, uint64_t flags,
                                        int *status);
typedef dlb__CUresult (*get_proc_v1_fn)(const char *symbol, void **pfn,
                                        int version, uint64_t flags);

/* What dlbridge does without an entry (internal.h, DLB__CUDA_ENTRIES). */
enum entry_kind { REQUIRED, OPTIONAL, IPC };

/* Entry name, ABI version pinned, offset of its slot in the table, kind:
 * generated from the one list in internal.h. */
typedef struct entry_spec {
  const char *name;
  int version;
  size_t offset;
  enum entry_kind kind;
} entry_spec;

#define ENTRY_SPEC(kind, name, version, params) \
  {#name, version, offsetof(dlb__cuda_api, name), kind},
static const entry_spec entries[] = {DLB__CUDA_ENTRIES(ENTRY_SPEC)};
#undef ENTRY_SPEC

/* The newest ABI version a required entry is pinned at: a driver older
 * than this is reported as too old rather than one entry at a time. */
static int newest_required_version(void) {
  int newest = 0;
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
    if (entries[i].kind == REQUIRED && entries[i].version > newest)
      newest = entries[i].version;
  return newest;
}

enum { LOAD_NOT_TRIED = 0, LOAD_OK = 1, LOAD_FAILED = 2 };

static struct {
  _Atomic int state;
  void *library;
  dlb__cuda_api api;
  dlb_error error;     /* the load's failure, replayed to every caller */
  int device_count;
  dlb__CUcontext primary[DLB__CUDA_MAX_DEVICES];
} driver;

static once_flag mutex_once = ONCE_FLAG_INIT;
static mtx_t mutex;

static void mutex_create(void) { (void)mtx_init(&mutex, mtx_plain); }

static const char *error_name(const dlb__cuda_api *api, dlb__CUresult rc) {
  const char *name = NULL;
  if (api->cuGetErrorName == NULL ||
      api->cuGetErrorName(rc, &name) != DLB__CUDA_SUCCESS || name == NULL)
    return "CUDA_ERROR_(unknown)";
  return name;
}

int dlb__cuda_fail(dlb_error *err, const char *what, const char *call,
                   dlb__CUresult rc) {
  /* Called only after a successful load, so the table is there. */
  const char *name = error_name(&driver.api, rc);
  return dlb_error_set(err,
                       rc == DLB__CUDA_ERROR_OUT_OF_MEMORY ? DLB_ENOMEM
                                                           : DLB_EDEVICE,
                       "%s: %s failed: %s (%d)", what, call, name, (int)rc);
}

/* Resolve every entry; the first one missing is the error. */
static int resolve_entries(void *library, const char *path, dlb_error *err) {
  get_proc_v2_fn get_v2 =
      (get_proc_v2_fn)(uintptr_t)dlsym(library, "cuGetProcAddress_v2");
  get_proc_v1_fn get_v1 = NULL;
  if (get_v2 == NULL) {
    get_v1 = (get_proc_v1_fn)(uintptr_t)dlsym(library, "cuGetProcAddress");
    if (get_v1 == NULL) {
      return dlb_error_set(err, DLB_EDEVICE,
                           "CUDA driver %s has neither cuGetProcAddress_v2 "
                           "nor cuGetProcAddress (driver older than CUDA "
                           "11.3?)",
                           path);
    }
  }
  driver.api.ipc = true;
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
    void *fn = NULL;
    int status = 0;
    dlb__CUresult rc =
        get_v2 != NULL
            ? get_v2(entries[i].name, &fn, entries[i].version,
                     CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status)
            : get_v1(entries[i].name, &fn, entries[i].version,
                     CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    if (rc != DLB__CUDA_SUCCESS || fn == NULL) {
      fn = NULL;
      if (entries[i].kind == IPC) driver.api.ipc = false;
      if (entries[i].kind == REQUIRED) {
        int newest = newest_required_version();
        return dlb_error_set(err, DLB_EDEVICE,
                             "CUDA driver %s has no %s (ABI of CUDA %d.%d; "
                             "cuGetProcAddress returned %d): the driver is "
                             "too old for dlbridge, which needs CUDA >= %d.%d",
                             path, entries[i].name, entries[i].version / 1000,
                             entries[i].version % 1000 / 10, (int)rc,
                             newest / 1000, newest % 1000 / 10);
      }
    }
    /* The slots are all function pointers; storing through the matching
     * type keeps the conversion defined. */
    memcpy((char *)&driver.api + entries[i].offset, &fn, sizeof fn);
  }
  return DLB_OK;
}

/* The one load attempt; runs under the mutex. */
static int load_locked(dlb_error *err) {
  int rc;
  const char *env = getenv("DLB_CUDA_DRIVER");
  const char *path = env != NULL && env[0] != '\0' ? env : "libcuda.so.1";
  void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    const char *why = dlerror();
    rc = dlb_error_set(err, DLB_EDEVICE,
                       "CUDA driver not found: dlopen(\"%s\")%s failed: %s",
                       path,
                       env != NULL && env[0] != '\0'
                           ? " (from DLB_CUDA_DRIVER)"
                           : "",
                       why != NULL ? why : "(no reason given)");
    goto cleanup;
  }
  rc = resolve_entries(library, path, err);
  if (rc != DLB_OK) goto cleanup;

  dlb__CUresult cu = driver.api.cuInit(0);
  if (cu == DLB__CUDA_ERROR_NO_DEVICE) {
    driver.device_count = 0; /* a driver without a GPU: loads, 0 devices */
  } else if (cu != DLB__CUDA_SUCCESS) {
    rc = dlb_error_set(err, DLB_EDEVICE,
                       "CUDA driver %s: cuInit failed: %s (%d)", path,
                       error_name(&driver.api, cu), (int)cu);
    goto cleanup;
  } else {
    int count = 0;
    cu = driver.api.cuDeviceGetCount(&count);
    if (cu != DLB__CUDA_SUCCESS) {
      rc = dlb_error_set(err, DLB_EDEVICE,
                         "CUDA driver %s: cuDeviceGetCount failed: %s (%d)",
                         path, error_name(&driver.api, cu), (int)cu);
      goto cleanup;
    }
    driver.device_count = count;
  }
  driver.library = library;
  library = NULL;
  rc = DLB_OK;

cleanup:
  if (library != NULL) {
    memset(&driver.api, 0, sizeof driver.api);
    dlclose(library);
  }
  return rc;
}

int dlb__cuda_api_get(const dlb__cuda_api **api, dlb_error *err) {
  int state = atomic_load_explicit(&driver.state, memory_order_acquire);
  if (state == LOAD_NOT_TRIED) {
    call_once(&mutex_once, mutex_create);
    mtx_lock(&mutex);
    state = atomic_load_explicit(&driver.state, memory_order_relaxed);
    if (state == LOAD_NOT_TRIED) {
      dlb_error_clear(&driver.error);
      state = load_locked(&driver.error) == DLB_OK ? LOAD_OK : LOAD_FAILED;
      atomic_store_explicit(&driver.state, state, memory_order_release);
    }
    mtx_unlock(&mutex);
  }
  if (state != LOAD_OK) {
    if (err != NULL) *err = driver.error;
    return driver.error.code;
  }
  *api = &driver.api;
  return DLB_OK;
}

int dlb_cuda_load(dlb_error *err) {
  const dlb__cuda_api *api;
  return dlb__cuda_api_get(&api, err);
}

int dlb_cuda_device_count(int *count, dlb_error *err) {
  const dlb__cuda_api *api;
  if (count == NULL)
    return dlb_error_set(err, DLB_EINVAL, "dlb_cuda_device_count: count is NULL");
  int rc = dlb__cuda_api_get(&api, err);
  if (rc != DLB_OK) return rc;
  *count = driver.device_count;
  return DLB_OK;
}

bool dlb_cuda_available(void) {
  int count = 0;
  return dlb_cuda_device_count(&count, NULL) == DLB_OK && count > 0;
}

/* device_id's primary context, retained on first use. */
static int primary_context(const char *what, int device_id,
                           dlb__CUcontext *out, dlb_error *err) {
  int rc = DLB_OK;
  if (device_id < 0 || device_id >= driver.device_count) {
    return dlb_error_set(err, DLB_EINVAL,
                         "%s: CUDA device %d does not exist (%d CUDA "
                         "device%s found)",
                         what, device_id, driver.device_count,
                         driver.device_count == 1 ? "" : "s");
  }
  if (device_id >= DLB__CUDA_MAX_DEVICES) {
    return dlb_error_set(err, DLB_EUNSUPPORTED,
                         "%s: CUDA device %d: dlbridge handles devices 0 to "
                         "%d",
                         what, device_id, DLB__CUDA_MAX_DEVICES - 1);
  }
  mtx_lock(&mutex);
  if (driver.primary[device_id] == NULL) {
    dlb__CUdevice device = 0;
    dlb__CUcontext ctx = NULL;
    dlb__CUresult cu = driver.api.cuDeviceGet(&device, device_id);
    if (cu != DLB__CUDA_SUCCESS) {
      rc = dlb__cuda_fail(err, what, "cuDeviceGet", cu);
      goto cleanup;
    }
    cu = driver.api.cuDevicePrimaryCtxRetain(&ctx, device);
    if (cu != DLB__CUDA_SUCCESS) {
      rc = dlb__cuda_fail(err, what, "cuDevicePrimaryCtxRetain", cu);
      goto cleanup;
    }
    driver.primary[device_id] = ctx;
  }
  *out = driver.primary[device_id];

cleanup:
  mtx_unlock(&mutex);
  return rc;
}

int dlb__cuda_enter(const char *what, int device_id, dlb__cuda_scope *scope,
                    dlb_error *err) {
  dlb__CUcontext ctx = NULL;
  scope->api = NULL;
  scope->previous = NULL;
  scope->switched = false;
  int rc = dlb__cuda_api_get(&scope->api, err);
  if (rc != DLB_OK) return rc;
  rc = primary_context(what, device_id, &ctx, err);
  if (rc != DLB_OK) return rc;
  dlb__CUresult cu = scope->api->cuCtxGetCurrent(&scope->previous);
  if (cu != DLB__CUDA_SUCCESS) return dlb__cuda_fail(err, what, "cuCtxGetCurrent", cu);
  if (scope->previous != ctx) {
    cu = scope->api->cuCtxSetCurrent(ctx);
    if (cu != DLB__CUDA_SUCCESS)
      return dlb__cuda_fail(err, what, "cuCtxSetCurrent", cu);
    scope->switched = true;
  }
  return DLB_OK;
}

void dlb__cuda_leave(dlb__cuda_scope *scope) {
  /* Putting back a context that was current a moment ago cannot fail in a
   * way we could act on; the caller's own error (if any) matters more. */
  if (scope->switched) (void)scope->api->cuCtxSetCurrent(scope->previous);
  scope->switched = false;
}

void dlb__cuda_driver_reset(void) {
  call_once(&mutex_once, mutex_create);
  mtx_lock(&mutex);
  if (driver.library != NULL) dlclose(driver.library);
  driver.library = NULL;
  memset(&driver.api, 0, sizeof driver.api);
  memset(driver.primary, 0, sizeof driver.primary);
  driver.device_count = 0;
  dlb_error_clear(&driver.error);
  atomic_store_explicit(&driver.state, LOAD_NOT_TRIED, memory_order_release);
  mtx_unlock(&mutex);
}
