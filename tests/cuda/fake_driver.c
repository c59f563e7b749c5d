/* fake_driver.c -- a recording stand-in for libcuda.so.1, for tests on
 * machines without a GPU.  Select it with DLB_CUDA_DRIVER=<path of this
 * library>.  It exports cuGetProcAddress(_v2) and the driver entries
 * dlbridge resolves; "device memory" is host memory kept in a table (so
 * cuPointerGetAttributes can classify it), streams, events and contexts are
 * small objects, copies and the strided-copy kernel really move the bytes.
 *
 * Every call is appended to a log, one line each ("name key=value ... ->
 * result"), read with dlb_fake_cuda_log_text().  Things CUDA forbids during
 * graph capture -- a synchronising call, or any use of the legacy stream
 * (NULL or 1) while a stream captures -- fail as the driver would and are
 * logged as "VIOLATION ..." lines and counted.
 *
 * Configuration: functions below (from C, or Python ctypes), or the
 * environment, read at the first cuGetProcAddress and on reset:
 *   DLB_FAKE_CUDA_DEVICES=n        number of devices (default 2)
 *   DLB_FAKE_CUDA_FAIL=name:code,...  make those entries return code
 */
/* shm_open, ftruncate, mmap: POSIX, not plain C11 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h" /* dlb__cuda_copy_params, the kernel's arguments */

#define EXPORT __attribute__((visibility("default")))

enum {
  OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3,
  INVALID_IMAGE = 200, INVALID_CONTEXT = 201, INVALID_DEVICE = 101,
  INVALID_HANDLE = 400, NOT_FOUND = 500, CAPTURE_UNSUPPORTED = 900,
  CAPTURE_IMPLICIT = 906
};

#define MAX_FAILS 16
#define MAX_ALLOCS 4096
#define MAX_STREAMS 64

typedef struct fake_ctx { int device; const char *name; } fake_ctx;
typedef struct fake_stream { int id; int device; bool capturing; bool live; } fake_stream;
typedef struct fake_event { int id; bool captured; struct fake_event *next; } fake_event;
/* ipc: 0 plain host memory; 1 a POSIX shm mapping this process created
 * (cuMemAlloc: exportable); 2 a mapping of another's (cuIpcOpenMemHandle). */
typedef struct alloc_rec {
  char *base; size_t size; int device; int kind; int id;
  int ipc; size_t mapped; char shm[48];
} alloc_rec;
enum { KIND_DEVICE = 2, KIND_HOST = 1, KIND_MANAGED = 4 };

static struct {
  bool configured, initialised;
  int devices;
  struct { char name[64]; int code; } fails[MAX_FAILS];
  int nfails;
  char hidden[64];
  char *log;
  size_t log_len, log_cap;
  int violations;
  alloc_rec allocs[MAX_ALLOCS];
  int nallocs, alloc_ids;
  fake_stream streams[MAX_STREAMS];
  int capturing;
  int event_ids;
  fake_event *events; /* live ones: an event never destroyed stays reachable */
  fake_ctx primary[8];
  int retains;
} st;

static fake_ctx foreign_ctx = {-1, "foreign"};
static _Thread_local fake_ctx *current;
static once_flag lock_once = ONCE_FLAG_INIT;
static mtx_t lock;
static void lock_create(void) { (void)mtx_init(&lock, mtx_recursive); }
#define LOCK() (call_once(&lock_once, lock_create), mtx_lock(&lock))
#define UNLOCK() mtx_unlock(&lock)

static void logf_(const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof line) n = (int)sizeof line - 1;
  if (st.log_len + (size_t)n + 2 > st.log_cap) {
    size_t cap = st.log_cap ? st.log_cap * 2 : 4096;
    while (cap < st.log_len + (size_t)n + 2) cap *= 2;
    char *p = realloc(st.log, cap);
    if (p == NULL) return;
    st.log = p;
    st.log_cap = cap;
  }
  memcpy(st.log + st.log_len, line, (size_t)n);
  st.log_len += (size_t)n;
  st.log[st.log_len++] = '\n';
  st.log[st.log_len] = '\0';
}

static void configure_from_env(void) {
  st.devices = 2;
  st.nfails = 0;
  const char *d = getenv("DLB_FAKE_CUDA_DEVICES");
  if (d != NULL && *d) st.devices = atoi(d);
  if (st.devices > 8) st.devices = 8;
  const char *f = getenv("DLB_FAKE_CUDA_FAIL");
  while (f != NULL && *f && st.nfails < MAX_FAILS) {
    const char *colon = strchr(f, ':');
    if (colon == NULL || colon - f >= 63) break;
    memcpy(st.fails[st.nfails].name, f, (size_t)(colon - f));
    st.fails[st.nfails].name[colon - f] = '\0';
    st.fails[st.nfails].code = atoi(colon + 1);
    st.nfails++;
    f = strchr(colon, ',');
    if (f != NULL) f++;
  }
  for (int i = 0; i < 8; i++) {
    st.primary[i].device = i;
    st.primary[i].name = NULL;
  }
  st.configured = true;
}

static int injected(const char *name) {
  for (int i = 0; i < st.nfails; i++)
    if (strcmp(st.fails[i].name, name) == 0) return st.fails[i].code;
  return OK;
}

static const char *stream_name(const void *s, char *buf) {
  uintptr_t v = (uintptr_t)s;
  if (v == 0) return "null";
  if (v == 1) return "legacy";
  if (v == 2) return "per_thread";
  snprintf(buf, 24, "s%d", ((const fake_stream *)s)->id);
  return buf;
}

static const char *ctx_name(const fake_ctx *c, char *buf) {
  if (c == NULL) return "none";
  if (c == &foreign_ctx) return "foreign";
  snprintf(buf, 24, "primary%d", c->device);
  return buf;
}

/* The legacy stream while anything captures: the driver's
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT. */
static bool legacy_violation(const char *call, const void *stream) {
  if (((uintptr_t)stream == 0 || (uintptr_t)stream == 1) && st.capturing > 0) {
    st.violations++;
    logf_("VIOLATION %s used the legacy stream during capture", call);
    return true;
  }
  return false;
}

static bool sync_violation(const char *call) {
  if (st.capturing > 0) {
    st.violations++;
    logf_("VIOLATION %s synchronises during capture", call);
    return true;
  }
  return false;
}

static alloc_rec *find_alloc(const void *p, bool exact) {
  for (int i = 0; i < st.nallocs; i++) {
    alloc_rec *a = &st.allocs[i];
    if (exact ? a->base == p
              : ((const char *)p >= a->base && (const char *)p < a->base + (a->size ? a->size : 1)))
      return a;
  }
  return NULL;
}

static int add_alloc(size_t size, int device, int kind, void **out) {
  if (st.nallocs == MAX_ALLOCS) return OUT_OF_MEMORY;
  size_t rounded = (size + 255) / 256 * 256;
  char *p = aligned_alloc(256, rounded ? rounded : 256);
  if (p == NULL) return OUT_OF_MEMORY;
  /* Fresh "device memory" is garbage, as on a GPU. */
  memset(p, 0xAB, rounded ? rounded : 256);
  st.allocs[st.nallocs++] = (alloc_rec){p, size, device, kind, ++st.alloc_ids,
                                        0, 0, ""};
  *out = p;
  return OK;
}

static void remove_alloc(alloc_rec *a) {
  if (a->ipc != 0)
    munmap(a->base, a->mapped);
  else
    free(a->base);
  if (a->ipc == 1) shm_unlink(a->shm);
  *a = st.allocs[--st.nallocs];
}

/* IPC memory lives in a POSIX shared-memory segment, so a second process
 * (a test's child) can open its handle and see the same bytes. */
static int add_shm_alloc(const char *name, size_t size, int device, bool create,
                         void **out) {
  if (st.nallocs == MAX_ALLOCS) return OUT_OF_MEMORY;
  size_t mapped = (size + 255) / 256 * 256;
  if (mapped == 0) mapped = 256;
  int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return create ? OUT_OF_MEMORY : INVALID_HANDLE;
  if (create && ftruncate(fd, (off_t)mapped) != 0) {
    close(fd);
    shm_unlink(name);
    return OUT_OF_MEMORY;
  }
  /* An opened handle names its allocation's size, which a real driver
   * checks against the allocation; the fake checks it against the file
   * (mapping past its end would SIGBUS the test, not report). */
  struct stat fst;
  if (!create && (fstat(fd, &fst) != 0 || (size_t)fst.st_size < mapped)) {
    close(fd);
    return INVALID_HANDLE;
  }
  void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    if (create) shm_unlink(name);
    return create ? OUT_OF_MEMORY : INVALID_HANDLE;
  }
  if (create) memset(p, 0xAB, mapped);
  alloc_rec r = {p, size, device, KIND_DEVICE, ++st.alloc_ids, create ? 1 : 2,
                 mapped, ""};
  snprintf(r.shm, sizeof r.shm, "%s", name);
  st.allocs[st.nallocs++] = r;
  *out = p;
  return OK;
}

/* ---- entries ------------------------------------------------------------ */

static const char *const error_names[][2] = {
    {"0", "CUDA_SUCCESS"}, {"1", "CUDA_ERROR_INVALID_VALUE"},
    {"2", "CUDA_ERROR_OUT_OF_MEMORY"}, {"3", "CUDA_ERROR_NOT_INITIALIZED"},
    {"34", "CUDA_ERROR_STUB_LIBRARY"}, {"100", "CUDA_ERROR_NO_DEVICE"},
    {"101", "CUDA_ERROR_INVALID_DEVICE"}, {"200", "CUDA_ERROR_INVALID_IMAGE"},
    {"201", "CUDA_ERROR_INVALID_CONTEXT"}, {"400", "CUDA_ERROR_INVALID_HANDLE"},
    {"500", "CUDA_ERROR_NOT_FOUND"}, {"900", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
    {"905", "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"},
    {"906", "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"}, {"999", "CUDA_ERROR_UNKNOWN"},
};

static int f_cuGetErrorName(int error, const char **name) {
  char code[16];
  snprintf(code, sizeof code, "%d", error);
  for (size_t i = 0; i < sizeof error_names / sizeof error_names[0]; i++) {
    if (strcmp(error_names[i][0], code) == 0) {
      *name = error_names[i][1];
      return OK;
    }
  }
  *name = NULL;
  return INVALID_VALUE;
}

#define ENTER(name)        \
  LOCK();                  \
  int rc_ = injected(name)
#define RETURN(rc)         \
  do {                     \
    int r_ = (rc);         \
    UNLOCK();              \
    return r_;             \
  } while (0)

static int f_cuInit(unsigned flags) {
  ENTER("cuInit");
  logf_("cuInit flags=%u -> %d", flags, rc_);
  if (rc_ == OK) st.initialised = true;
  RETURN(rc_);
}

static int f_cuDriverGetVersion(int *v) {
  ENTER("cuDriverGetVersion");
  *v = 13000;
  RETURN(rc_);
}

static int f_cuDeviceGetCount(int *count) {
  ENTER("cuDeviceGetCount");
  if (rc_ == OK && !st.initialised) rc_ = NOT_INITIALIZED;
  if (rc_ == OK) *count = st.devices;
  logf_("cuDeviceGetCount -> %d (count=%d)", rc_, rc_ == OK ? *count : -1);
  RETURN(rc_);
}

static int f_cuDeviceGet(int *device, int ordinal) {
  ENTER("cuDeviceGet");
  if (rc_ == OK && (ordinal < 0 || ordinal >= st.devices)) rc_ = INVALID_DEVICE;
  if (rc_ == OK) *device = ordinal;
  logf_("cuDeviceGet ordinal=%d -> %d", ordinal, rc_);
  RETURN(rc_);
}

static int f_cuDeviceGetAttribute(int *value, int attribute, int device) {
  ENTER("cuDeviceGetAttribute");
  *value = attribute == 75 ? 9 : 0;
  logf_("cuDeviceGetAttribute attr=%d device=%d -> %d", attribute, device, rc_);
  RETURN(rc_);
}

static int f_cuDevicePrimaryCtxRetain(void **ctx, int device) {
  ENTER("cuDevicePrimaryCtxRetain");
  if (rc_ == OK && (device < 0 || device >= st.devices)) rc_ = INVALID_DEVICE;
  if (rc_ == OK) {
    *ctx = &st.primary[device];
    st.retains++;
  }
  logf_("cuDevicePrimaryCtxRetain device=%d -> %d", device, rc_);
  RETURN(rc_);
}

static int f_cuCtxGetCurrent(void **ctx) {
  ENTER("cuCtxGetCurrent");
  char b[24];
  if (rc_ == OK) *ctx = current;
  logf_("cuCtxGetCurrent -> %d (%s)", rc_, ctx_name(current, b));
  RETURN(rc_);
}

static int f_cuCtxSetCurrent(void *ctx) {
  ENTER("cuCtxSetCurrent");
  char b[24];
  if (rc_ == OK) current = ctx;
  logf_("cuCtxSetCurrent ctx=%s -> %d", ctx_name(ctx, b), rc_);
  RETURN(rc_);
}

static int f_cuPointerGetAttributes(unsigned n, int *attrs, void **data,
                                    uint64_t ptr) {
  ENTER("cuPointerGetAttributes");
  alloc_rec *a = find_alloc((const void *)(uintptr_t)ptr, false);
  for (unsigned i = 0; rc_ == OK && i < n; i++) {
    switch (attrs[i]) {
      case 2: *(unsigned *)data[i] = a == NULL ? 0u : a->kind == KIND_MANAGED ? 2u : (unsigned)a->kind; break;
      case 8: *(unsigned *)data[i] = a != NULL && a->kind == KIND_MANAGED; break;
      case 9: *(int *)data[i] = a == NULL ? -2 : a->device; break;
      default: rc_ = INVALID_VALUE;
    }
  }
  logf_("cuPointerGetAttributes n=%u ptr=%s%d -> %d", n, a ? "a" : "host",
        a ? a->id : 0, rc_);
  RETURN(rc_);
}

static int f_cuMemAllocAsync(uint64_t *ptr, size_t bytes, void *stream) {
  ENTER("cuMemAllocAsync");
  char b[24], c[24];
  void *p = NULL;
  if (rc_ == OK && current == NULL) rc_ = INVALID_CONTEXT;
  if (rc_ == OK && legacy_violation("cuMemAllocAsync", stream)) rc_ = CAPTURE_IMPLICIT;
  if (rc_ == OK && bytes == 0) rc_ = INVALID_VALUE;
  if (rc_ == OK) rc_ = add_alloc(bytes, current->device, KIND_DEVICE, &p);
  if (rc_ == OK) *ptr = (uint64_t)(uintptr_t)p;
  logf_("cuMemAllocAsync bytes=%zu stream=%s ctx=%s -> %d (a%d)", bytes,
        stream_name(stream, b), ctx_name(current, c), rc_,
        rc_ == OK ? st.alloc_ids : 0);
  RETURN(rc_);
}

/* One default memory pool object per device; its attributes are only
 * logged. */
static int fake_pools[8];

static int f_cuDeviceGetDefaultMemPool(void **pool, int device) {
  ENTER("cuDeviceGetDefaultMemPool");
  if (rc_ == OK && (device < 0 || device >= st.devices)) rc_ = INVALID_DEVICE;
  if (rc_ == OK) *pool = &fake_pools[device];
  logf_("cuDeviceGetDefaultMemPool device=%d -> %d", device, rc_);
  RETURN(rc_);
}

static int f_cuMemPoolSetAttribute(void *pool, int attr, void *value) {
  ENTER("cuMemPoolSetAttribute");
  logf_("cuMemPoolSetAttribute pool=p%d attr=%d value=%llu -> %d",
        (int)((int *)pool - fake_pools), attr,
        (unsigned long long)*(uint64_t *)value, rc_);
  RETURN(rc_);
}

static int f_cuMemPoolTrimTo(void *pool, size_t keep) {
  ENTER("cuMemPoolTrimTo");
  logf_("cuMemPoolTrimTo pool=p%d keep=%zu -> %d",
        (int)((int *)pool - fake_pools), keep, rc_);
  RETURN(rc_);
}

static int f_cuMemFreeAsync(uint64_t ptr, void *stream) {
  ENTER("cuMemFreeAsync");
  char b[24], c[24];
  alloc_rec *a = find_alloc((void *)(uintptr_t)ptr, true);
  int id = a ? a->id : 0;
  if (rc_ == OK && (a == NULL || a->kind != KIND_DEVICE)) {
    st.violations++;
    logf_("VIOLATION cuMemFreeAsync of memory not from cuMemAllocAsync (double free?)");
    rc_ = INVALID_VALUE;
  }
  if (rc_ == OK && current == NULL) rc_ = INVALID_CONTEXT;
  if (rc_ == OK && legacy_violation("cuMemFreeAsync", stream)) rc_ = CAPTURE_IMPLICIT;
  if (rc_ == OK) remove_alloc(a);
  logf_("cuMemFreeAsync ptr=a%d stream=%s ctx=%s -> %d", id,
        stream_name(stream, b), ctx_name(current, c), rc_);
  RETURN(rc_);
}

static int f_cuMemHostAlloc(void **ptr, size_t bytes, unsigned flags) {
  ENTER("cuMemHostAlloc");
  if (rc_ == OK) rc_ = add_alloc(bytes, 0, KIND_HOST, ptr);
  logf_("cuMemHostAlloc bytes=%zu flags=%u -> %d (a%d)", bytes, flags, rc_,
        rc_ == OK ? st.alloc_ids : 0);
  RETURN(rc_);
}

static int f_cuMemFreeHost(void *ptr) {
  ENTER("cuMemFreeHost");
  alloc_rec *a = find_alloc(ptr, true);
  int id = a ? a->id : 0;
  if (rc_ == OK && sync_violation("cuMemFreeHost")) rc_ = CAPTURE_UNSUPPORTED;
  if (rc_ == OK && (a == NULL || a->kind != KIND_HOST)) rc_ = INVALID_VALUE;
  if (rc_ == OK) remove_alloc(a);
  logf_("cuMemFreeHost ptr=a%d -> %d", id, rc_);
  RETURN(rc_);
}

static int f_cuMemsetD8Async(uint64_t ptr, unsigned char value, size_t n,
                             void *stream) {
  ENTER("cuMemsetD8Async");
  char b[24];
  if (rc_ == OK && legacy_violation("cuMemsetD8Async", stream)) rc_ = CAPTURE_IMPLICIT;
  if (rc_ == OK) memset((void *)(uintptr_t)ptr, value, n);
  logf_("cuMemsetD8Async bytes=%zu value=%u stream=%s -> %d", n, value,
        stream_name(stream, b), rc_);
  RETURN(rc_);
}

static const char *where(const void *p) {
  alloc_rec *a = find_alloc(p, false);
  if (a == NULL) return "host";
  return a->kind == KIND_HOST ? "pinned" : "device";
}

static int f_cuMemcpyAsync(uint64_t dst, uint64_t src, size_t n, void *stream) {
  ENTER("cuMemcpyAsync");
  char b[24], c[24];
  void *d = (void *)(uintptr_t)dst;
  const void *s = (const void *)(uintptr_t)src;
  if (rc_ == OK && legacy_violation("cuMemcpyAsync", stream)) rc_ = CAPTURE_IMPLICIT;
  if (rc_ == OK) memmove(d, s, n);
  logf_("cuMemcpyAsync dst=%s src=%s bytes=%zu stream=%s ctx=%s -> %d", where(d),
        where(s), n, stream_name(stream, b), ctx_name(current, c), rc_);
  RETURN(rc_);
}

static int f_cuMemcpy2DAsync(const dlb__CUDA_MEMCPY2D *c, void *stream) {
  ENTER("cuMemcpy2DAsync");
  char b[24];
  char *d = c->dstMemoryType == 1 ? (char *)c->dstHost : (char *)(uintptr_t)c->dstDevice;
  const char *s = c->srcMemoryType == 1 ? (const char *)c->srcHost
                                        : (const char *)(uintptr_t)c->srcDevice;
  if (rc_ == OK && legacy_violation("cuMemcpy2DAsync", stream)) rc_ = CAPTURE_IMPLICIT;
  if (rc_ == OK && (c->dstPitch < c->WidthInBytes || c->srcPitch < c->WidthInBytes))
    rc_ = INVALID_VALUE;
  for (size_t y = 0; rc_ == OK && y < c->Height; y++)
    memcpy(d + y * c->dstPitch, s + y * c->srcPitch, c->WidthInBytes);
  logf_("cuMemcpy2DAsync dst=%s(%u) src=%s(%u) width=%zu height=%zu dpitch=%zu "
        "spitch=%zu stream=%s -> %d",
        where(d), c->dstMemoryType, where(s), c->srcMemoryType, c->WidthInBytes,
        c->Height, c->dstPitch, c->srcPitch, stream_name(stream, b), rc_);
  RETURN(rc_);
}

static int f_cuStreamIsCapturing(void *stream, int *status) {
  ENTER("cuStreamIsCapturing");
  char b[24];
  if (rc_ == OK && legacy_violation("cuStreamIsCapturing", stream)) rc_ = CAPTURE_IMPLICIT;
  if (rc_ == OK)
    *status = (uintptr_t)stream > 2 && ((fake_stream *)stream)->capturing ? 1 : 0;
  logf_("cuStreamIsCapturing stream=%s -> %d (%d)", stream_name(stream, b), rc_,
        rc_ == OK ? *status : -1);
  RETURN(rc_);
}

static _Thread_local int capture_mode;

static int f_cuThreadExchangeStreamCaptureMode(int *mode) {
  ENTER("cuThreadExchangeStreamCaptureMode");
  if (rc_ == OK) {
    int old = capture_mode;
    capture_mode = *mode;
    *mode = old;
  }
  logf_("cuThreadExchangeStreamCaptureMode mode=%d -> %d", capture_mode, rc_);
  RETURN(rc_);
}

/* A new live event (kept reachable until destroyed); the lock is held. */
static int new_event(fake_event **out) {
  fake_event *e = malloc(sizeof *e);
  if (e == NULL) return OUT_OF_MEMORY;
  e->id = ++st.event_ids;
  e->captured = false;
  e->next = st.events;
  st.events = e;
  *out = e;
  return OK;
}

static int f_cuEventCreate(void **event, unsigned flags) {
  ENTER("cuEventCreate");
  fake_event *e = NULL;
  if (rc_ == OK && current == NULL) rc_ = INVALID_CONTEXT;
  if (rc_ == OK) rc_ = new_event(&e);
  if (rc_ == OK) *event = e;
  logf_("cuEventCreate flags=%u -> %d (e%d)", flags, rc_, e ? e->id : 0);
  RETURN(rc_);
}

static int f_cuEventRecord(void *event, void *stream) {
  ENTER("cuEventRecord");
  char b[24];
  if (rc_ == OK && legacy_violation("cuEventRecord", stream)) rc_ = CAPTURE_IMPLICIT;
  if (rc_ == OK)
    ((fake_event *)event)->captured =
        (uintptr_t)stream > 2 && ((fake_stream *)stream)->capturing;
  logf_("cuEventRecord event=e%d stream=%s -> %d", ((fake_event *)event)->id,
        stream_name(stream, b), rc_);
  RETURN(rc_);
}

static int f_cuStreamWaitEvent(void *stream, void *event, unsigned flags) {
  ENTER("cuStreamWaitEvent");
  char b[24];
  if (rc_ == OK && legacy_violation("cuStreamWaitEvent", stream)) rc_ = CAPTURE_IMPLICIT;
  fake_event *e = event;
  if (rc_ == OK && (uintptr_t)stream > 2 && ((fake_stream *)stream)->capturing &&
      !e->captured && (flags & 1u) == 0) {
    st.violations++;
    logf_("VIOLATION cuStreamWaitEvent of a capturing stream on an event recorded outside it");
    rc_ = 905; /* CUDA_ERROR_STREAM_CAPTURE_ISOLATION */
  }
  logf_("cuStreamWaitEvent stream=%s event=e%d flags=%u -> %d",
        stream_name(stream, b), ((fake_event *)event)->id, flags, rc_);
  RETURN(rc_);
}

static int f_cuEventDestroy(void *event) {
  ENTER("cuEventDestroy");
  int id = ((fake_event *)event)->id;
  for (fake_event **link = &st.events; *link != NULL; link = &(*link)->next) {
    if (*link == event) {
      *link = ((fake_event *)event)->next;
      break;
    }
  }
  free(event);
  logf_("cuEventDestroy event=e%d -> %d", id, rc_);
  RETURN(rc_);
}

static const char fake_ptx_magic[] = "DLB_FAKE_PTX";
static int fake_module, fake_function;

static int f_cuModuleLoadData(void **module, const void *image) {
  ENTER("cuModuleLoadData");
  if (rc_ == OK && st.capturing > 0 && capture_mode != 2) {
    st.violations++;
    logf_("VIOLATION cuModuleLoadData during a global-mode capture");
    rc_ = CAPTURE_UNSUPPORTED;
  }
  if (rc_ == OK && strncmp(image, fake_ptx_magic, sizeof fake_ptx_magic - 1) != 0)
    rc_ = INVALID_IMAGE;
  if (rc_ == OK) *module = &fake_module;
  logf_("cuModuleLoadData -> %d", rc_);
  RETURN(rc_);
}

static int f_cuModuleGetFunction(void **fn, void *module, const char *name) {
  ENTER("cuModuleGetFunction");
  if (rc_ == OK && (module != &fake_module || strcmp(name, DLB__CUDA_COPY_KERNEL) != 0))
    rc_ = NOT_FOUND;
  if (rc_ == OK) *fn = &fake_function;
  logf_("cuModuleGetFunction name=%s -> %d", name, rc_);
  RETURN(rc_);
}

/* The strided-copy kernel's semantics, on the host. */
static void run_copy_kernel(const dlb__cuda_copy_params *p) {
  for (int64_t i = 0; i < p->numel; i++) {
    int64_t rest = i, d = 0, s = 0;
    for (int k = p->ndim - 1; k >= 0; k--) {
      int64_t q = rest / p->shape[k], c = rest - q * p->shape[k];
      rest = q;
      d += c * p->dst_stride[k];
      s += c * p->src_stride[k];
    }
    memcpy((char *)(uintptr_t)(p->dst + (uint64_t)d),
           (const char *)(uintptr_t)(p->src + (uint64_t)s), (size_t)p->itemsize);
  }
}

static int f_cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz,
                            unsigned bx, unsigned by, unsigned bz,
                            unsigned shared, void *stream, void **params,
                            void **extra) {
  ENTER("cuLaunchKernel");
  char b[24], c[24];
  (void)extra;
  if (rc_ == OK && fn != &fake_function) rc_ = INVALID_HANDLE;
  if (rc_ == OK && legacy_violation("cuLaunchKernel", stream)) rc_ = CAPTURE_IMPLICIT;
  const dlb__cuda_copy_params *p = params[0];
  if (rc_ == OK) run_copy_kernel(p);
  logf_("cuLaunchKernel fn=%s grid=%u,%u,%u block=%u,%u,%u shared=%u "
        "numel=%lld ndim=%d stream=%s ctx=%s -> %d",
        DLB__CUDA_COPY_KERNEL, gx, gy, gz, bx, by, bz, shared,
        (long long)p->numel, p->ndim, stream_name(stream, b),
        ctx_name(current, c), rc_);
  RETURN(rc_);
}

/* ---- IPC ----------------------------------------------------------------- */

typedef struct { char reserved[64]; } fake_ipc_handle;
typedef struct { char bytes[16]; } fake_uuid;
static const char ipc_mem_magic[] = "DLBFAKEIPCMEM";
static const char ipc_event_magic[] = "DLBFAKEIPCEV";
static int ipc_serial;

static int f_cuMemAlloc(uint64_t *ptr, size_t bytes) {
  ENTER("cuMemAlloc");
  char c[24], name[48];
  void *p = NULL;
  if (rc_ == OK && current == NULL) rc_ = INVALID_CONTEXT;
  if (rc_ == OK && sync_violation("cuMemAlloc")) rc_ = CAPTURE_UNSUPPORTED;
  if (rc_ == OK && bytes == 0) rc_ = INVALID_VALUE;
  if (rc_ == OK) {
    snprintf(name, sizeof name, "/dlbfake-%ld-%d", (long)getpid(), ++ipc_serial);
    rc_ = add_shm_alloc(name, bytes, current->device, true, &p);
  }
  if (rc_ == OK) *ptr = (uint64_t)(uintptr_t)p;
  logf_("cuMemAlloc bytes=%zu ctx=%s -> %d (a%d)", bytes, ctx_name(current, c),
        rc_, rc_ == OK ? st.alloc_ids : 0);
  RETURN(rc_);
}

static int f_cuMemFree(uint64_t ptr) {
  ENTER("cuMemFree");
  alloc_rec *a = find_alloc((void *)(uintptr_t)ptr, true);
  int id = a ? a->id : 0;
  if (rc_ == OK && (a == NULL || a->ipc != 1)) {
    st.violations++;
    logf_("VIOLATION cuMemFree of memory not from cuMemAlloc (double free?)");
    rc_ = INVALID_VALUE;
  }
  if (rc_ == OK && sync_violation("cuMemFree")) rc_ = CAPTURE_UNSUPPORTED;
  if (rc_ == OK) remove_alloc(a);
  logf_("cuMemFree ptr=a%d -> %d", id, rc_);
  RETURN(rc_);
}

static int f_cuIpcGetMemHandle(fake_ipc_handle *h, uint64_t ptr) {
  ENTER("cuIpcGetMemHandle");
  alloc_rec *a = find_alloc((void *)(uintptr_t)ptr, true);
  if (rc_ == OK && (a == NULL || a->ipc != 1)) rc_ = INVALID_VALUE;
  if (rc_ == OK) {
    memset(h, 0, sizeof *h);
    snprintf(h->reserved, sizeof h->reserved, "%s %zu %s", ipc_mem_magic,
             a->size, a->shm);
  }
  logf_("cuIpcGetMemHandle ptr=a%d -> %d", a ? a->id : 0, rc_);
  RETURN(rc_);
}

static int f_cuIpcOpenMemHandle(uint64_t *ptr, fake_ipc_handle h,
                                unsigned flags) {
  ENTER("cuIpcOpenMemHandle");
  char name[48] = "", magic[16] = "";
  size_t size = 0;
  void *p = NULL;
  h.reserved[63] = '\0';
  if (rc_ == OK && current == NULL) rc_ = INVALID_CONTEXT;
  if (rc_ == OK && (sscanf(h.reserved, "%15s %zu %47s", magic, &size, name) != 3 ||
                    strcmp(magic, ipc_mem_magic) != 0))
    rc_ = INVALID_HANDLE;
  if (rc_ == OK) {
    /* CUDA refuses a process's own handles; so does the fake. */
    for (int i = 0; i < st.nallocs; i++)
      if (st.allocs[i].ipc == 1 && strcmp(st.allocs[i].shm, name) == 0)
        rc_ = INVALID_CONTEXT;
  }
  if (rc_ == OK) rc_ = add_shm_alloc(name, size, current->device, false, &p);
  if (rc_ == OK) *ptr = (uint64_t)(uintptr_t)p;
  logf_("cuIpcOpenMemHandle size=%zu flags=%u ctx=%s -> %d (a%d)", size, flags,
        ctx_name(current, (char[24]){0}), rc_, rc_ == OK ? st.alloc_ids : 0);
  RETURN(rc_);
}

/* The allocation (device, host, IPC or opened) holding ptr: where it
 * starts and its size in bytes, as cuMemAlloc was asked for it. */
static int f_cuMemGetAddressRange(uint64_t *base, size_t *size, uint64_t ptr) {
  ENTER("cuMemGetAddressRange");
  alloc_rec *a = find_alloc((const void *)(uintptr_t)ptr, false);
  if (rc_ == OK && a == NULL) rc_ = NOT_FOUND;
  if (rc_ == OK) {
    if (base != NULL) *base = (uint64_t)(uintptr_t)a->base;
    if (size != NULL) *size = a->size;
  }
  logf_("cuMemGetAddressRange ptr=%s%d -> %d (size=%zu)", a ? "a" : "host",
        a ? a->id : 0, rc_, rc_ == OK ? a->size : (size_t)0);
  RETURN(rc_);
}

static int f_cuIpcCloseMemHandle(uint64_t ptr) {
  ENTER("cuIpcCloseMemHandle");
  alloc_rec *a = find_alloc((void *)(uintptr_t)ptr, true);
  int id = a ? a->id : 0;
  if (rc_ == OK && (a == NULL || a->ipc != 2)) {
    st.violations++;
    logf_("VIOLATION cuIpcCloseMemHandle of memory not opened by cuIpcOpenMemHandle");
    rc_ = INVALID_VALUE;
  }
  if (rc_ == OK) remove_alloc(a);
  logf_("cuIpcCloseMemHandle ptr=a%d -> %d", id, rc_);
  RETURN(rc_);
}

static int f_cuIpcGetEventHandle(fake_ipc_handle *h, void *event) {
  ENTER("cuIpcGetEventHandle");
  if (rc_ == OK) {
    memset(h, 0, sizeof *h);
    snprintf(h->reserved, sizeof h->reserved, "%s %d", ipc_event_magic,
             ((fake_event *)event)->id);
  }
  logf_("cuIpcGetEventHandle event=e%d -> %d", ((fake_event *)event)->id, rc_);
  RETURN(rc_);
}

static int f_cuIpcOpenEventHandle(void **event, fake_ipc_handle h) {
  ENTER("cuIpcOpenEventHandle");
  char magic[16] = "";
  int remote = 0;
  fake_event *e = NULL;
  h.reserved[63] = '\0';
  if (rc_ == OK && (sscanf(h.reserved, "%15s %d", magic, &remote) != 2 ||
                    strcmp(magic, ipc_event_magic) != 0))
    rc_ = INVALID_HANDLE;
  if (rc_ == OK) rc_ = new_event(&e);
  if (rc_ == OK) *event = e;
  logf_("cuIpcOpenEventHandle remote=e%d -> %d (e%d)", remote, rc_, e ? e->id : 0);
  RETURN(rc_);
}

static int f_cuDeviceGetUuid(fake_uuid *uuid, int device) {
  ENTER("cuDeviceGetUuid");
  if (rc_ == OK && (device < 0 || device >= st.devices)) rc_ = INVALID_DEVICE;
  if (rc_ == OK) {
    char text[32];
    memset(text, 0, sizeof text);
    snprintf(text, sizeof text, "fake-gpu-uuid-%02d", device & 0x3f);
    memcpy(uuid->bytes, text, 16);
  }
  logf_("cuDeviceGetUuid device=%d -> %d", device, rc_);
  RETURN(rc_);
}

/* Synchronising calls: never made by dlbridge; present so that a test
 * proves it. */
static int sync_call(const char *name) {
  ENTER(name);
  if (rc_ == OK && sync_violation(name)) rc_ = CAPTURE_UNSUPPORTED;
  logf_("%s -> %d", name, rc_);
  RETURN(rc_);
}
static int f_cuCtxSynchronize(void) { return sync_call("cuCtxSynchronize"); }
static int f_cuStreamSynchronize(void *s) { (void)s; return sync_call("cuStreamSynchronize"); }
static int f_cuEventSynchronize(void *e) { (void)e; return sync_call("cuEventSynchronize"); }

/* ---- cuGetProcAddress ---------------------------------------------------- */

typedef struct proc { const char *name; void (*fn)(void); } proc;
#define P(name) {#name, (void (*)(void))(uintptr_t)f_##name}
static const proc procs[] = {
    P(cuGetErrorName), P(cuInit), P(cuDriverGetVersion), P(cuDeviceGetCount),
    P(cuDeviceGet), P(cuDeviceGetAttribute), P(cuDevicePrimaryCtxRetain),
    P(cuCtxGetCurrent), P(cuCtxSetCurrent), P(cuPointerGetAttributes),
    P(cuMemAllocAsync), P(cuMemFreeAsync), P(cuMemHostAlloc), P(cuMemFreeHost),
    P(cuMemsetD8Async), P(cuMemcpyAsync), P(cuMemcpy2DAsync),
    P(cuStreamIsCapturing), P(cuThreadExchangeStreamCaptureMode),
    P(cuEventCreate), P(cuEventRecord),
    P(cuEventDestroy), P(cuStreamWaitEvent), P(cuModuleLoadData),
    P(cuModuleGetFunction), P(cuLaunchKernel), P(cuCtxSynchronize),
    P(cuStreamSynchronize), P(cuEventSynchronize),
    P(cuDeviceGetDefaultMemPool), P(cuMemPoolSetAttribute), P(cuMemPoolTrimTo),
    P(cuMemAlloc), P(cuMemFree), P(cuIpcGetMemHandle), P(cuIpcOpenMemHandle),
    P(cuIpcCloseMemHandle), P(cuIpcGetEventHandle), P(cuIpcOpenEventHandle),
    P(cuDeviceGetUuid), P(cuMemGetAddressRange),
};
#undef P

static int get_proc(const char *symbol, void **pfn, int version, uint64_t flags,
                    int *status) {
  LOCK();
  if (!st.configured) configure_from_env();
  int rc = NOT_FOUND;
  *pfn = NULL;
  if (strcmp(symbol, st.hidden) != 0) {
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
      if (strcmp(procs[i].name, symbol) == 0) {
        memcpy(pfn, &procs[i].fn, sizeof *pfn);
        rc = OK;
      }
    }
  }
  if (status != NULL) *status = rc == OK ? 0 : 1;
  logf_("cuGetProcAddress %s version=%d flags=%llu -> %d", symbol, version,
        (unsigned long long)flags, rc);
  UNLOCK();
  return rc;
}

EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                               uint64_t flags, int *status) {
  return get_proc(symbol, pfn, version, flags, status);
}

EXPORT int cuGetProcAddress(const char *symbol, void **pfn, int version,
                            uint64_t flags) {
  return get_proc(symbol, pfn, version, flags, NULL);
}

/* ---- test hooks ---------------------------------------------------------- */

/* The log so far (valid until the next call into the fake). */
EXPORT const char *dlb_fake_cuda_log_text(void) {
  return st.log != NULL ? st.log : "";
}

EXPORT void dlb_fake_cuda_log_clear(void) {
  LOCK();
  st.log_len = 0;
  if (st.log != NULL) st.log[0] = '\0';
  UNLOCK();
}

/* Make entry `name` return `code` from now on (code 0 removes it). */
EXPORT void dlb_fake_cuda_set_fail(const char *name, int code) {
  LOCK();
  if (!st.configured) configure_from_env();
  for (int i = 0; i < st.nfails; i++) {
    if (strcmp(st.fails[i].name, name) == 0) {
      st.fails[i] = st.fails[--st.nfails];
      break;
    }
  }
  if (code != 0 && st.nfails < MAX_FAILS && strlen(name) < 64) {
    strcpy(st.fails[st.nfails].name, name);
    st.fails[st.nfails++].code = code;
  }
  UNLOCK();
}

/* cuGetProcAddress answers NOT_FOUND for name (a driver too old). */
EXPORT void dlb_fake_cuda_hide(const char *name) {
  LOCK();
  snprintf(st.hidden, sizeof st.hidden, "%s", name != NULL ? name : "");
  UNLOCK();
}

EXPORT void dlb_fake_cuda_set_device_count(int n) {
  LOCK();
  if (!st.configured) configure_from_env();
  st.devices = n < 0 ? 0 : n > 8 ? 8 : n;
  UNLOCK();
}

/* Back to the environment's configuration: no failures, log cleared, not
 * initialised, no current context.  Allocations are kept (see
 * dlb_fake_cuda_live_allocations) so leaks stay visible. */
EXPORT void dlb_fake_cuda_reset(void) {
  LOCK();
  configure_from_env();
  st.hidden[0] = '\0';
  st.initialised = false;
  st.violations = 0;
  if (st.nallocs == 0) st.alloc_ids = 0;
  st.event_ids = 0;
  st.log_len = 0;
  if (st.log != NULL) st.log[0] = '\0';
  current = NULL;
  UNLOCK();
}

EXPORT int dlb_fake_cuda_violations(void) { return st.violations; }
EXPORT int dlb_fake_cuda_live_allocations(void) { return st.nallocs; }

/* A stream handle on device (as cuStreamCreate would give), or NULL. */
EXPORT void *dlb_fake_cuda_stream_new(int device) {
  LOCK();
  fake_stream *s = NULL;
  for (int i = 0; i < MAX_STREAMS && s == NULL; i++) {
    if (!st.streams[i].live) {
      s = &st.streams[i];
      *s = (fake_stream){i + 1, device, false, true};
    }
  }
  UNLOCK();
  return s;
}

EXPORT void dlb_fake_cuda_stream_free(void *stream) {
  LOCK();
  fake_stream *s = stream;
  if (s->capturing) st.capturing--;
  s->live = false;
  s->capturing = false;
  UNLOCK();
}

/* Pretend stream is being captured into a graph (until end_capture). */
EXPORT void dlb_fake_cuda_begin_capture(void *stream) {
  LOCK();
  fake_stream *s = stream;
  if (!s->capturing) st.capturing++;
  s->capturing = true;
  logf_("BEGIN_CAPTURE s%d", s->id);
  UNLOCK();
}

EXPORT void dlb_fake_cuda_end_capture(void *stream) {
  LOCK();
  fake_stream *s = stream;
  if (s->capturing) st.capturing--;
  s->capturing = false;
  logf_("END_CAPTURE s%d", s->id);
  UNLOCK();
}

/* Make a context that is not a primary one current (as another library
 * might), or none; and name the current context ("none", "foreign",
 * "primary<N>"). */
EXPORT void dlb_fake_cuda_set_foreign_context(int foreign) {
  current = foreign ? &foreign_ctx : NULL;
}

EXPORT const char *dlb_fake_cuda_current_context(void) {
  static _Thread_local char b[24];
  return ctx_name(current, b);
}

/* Managed memory on device (cuMemAllocManaged is not in dlbridge's set). */
EXPORT void *dlb_fake_cuda_managed_alloc(int device, size_t bytes) {
  LOCK();
  void *p = NULL;
  if (add_alloc(bytes, device, KIND_MANAGED, &p) != OK) p = NULL;
  UNLOCK();
  return p;
}

EXPORT void dlb_fake_cuda_managed_free(void *p) {
  LOCK();
  alloc_rec *a = find_alloc(p, true);
  if (a != NULL) remove_alloc(a);
  UNLOCK();
}
