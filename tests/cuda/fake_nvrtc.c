/* fake_nvrtc.c -- a stand-in for libnvrtc, selected with
 * DLB_CUDA_NVRTC=<path>.  "Compiling" checks that the source defines the
 * strided-copy kernel and yields a marker image that fake_driver.c's
 * cuModuleLoadData accepts; fake_driver.c's cuLaunchKernel then runs the
 * kernel's semantics on the host.  DLB_FAKE_NVRTC_FAIL=1 (or
 * dlb_fake_nvrtc_set_fail(1)) makes compilation fail with a log. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static const char image[] = "DLB_FAKE_PTX dlb_strided_copy";
static const char failure_log[] = "fake_nvrtc: compilation refused";
static int compiles;
static int fail_flag = -1;

typedef struct program { bool ok; } program;

static bool failing(void) {
  if (fail_flag >= 0) return fail_flag != 0;
  const char *e = getenv("DLB_FAKE_NVRTC_FAIL");
  return e != NULL && e[0] == '1';
}

EXPORT void dlb_fake_nvrtc_set_fail(int fail) { fail_flag = fail; }
EXPORT int dlb_fake_nvrtc_compiles(void) { return compiles; }

EXPORT const char *nvrtcGetErrorString(int result) {
  return result == 0 ? "NVRTC_SUCCESS" : "NVRTC_ERROR_COMPILATION";
}

EXPORT int nvrtcCreateProgram(void **prog, const char *src, const char *name,
                              int nh, const char *const *h,
                              const char *const *names) {
  (void)name; (void)nh; (void)h; (void)names;
  program *p = malloc(sizeof *p);
  if (p == NULL) return 1;
  p->ok = strstr(src, "dlb_strided_copy") != NULL;
  *prog = p;
  return 0;
}

EXPORT int nvrtcCompileProgram(void *prog, int n, const char *const *opts) {
  (void)n; (void)opts;
  program *p = prog;
  compiles++;
  if (failing()) p->ok = false;
  return p->ok ? 0 : 6; /* NVRTC_ERROR_COMPILATION */
}

EXPORT int nvrtcGetPTXSize(void *prog, size_t *size) {
  (void)prog;
  *size = sizeof image;
  return 0;
}

EXPORT int nvrtcGetPTX(void *prog, char *out) {
  (void)prog;
  memcpy(out, image, sizeof image);
  return 0;
}

EXPORT int nvrtcGetProgramLogSize(void *prog, size_t *size) {
  *size = ((program *)prog)->ok ? 1 : sizeof failure_log;
  return 0;
}

EXPORT int nvrtcGetProgramLog(void *prog, char *out) {
  if (((program *)prog)->ok) out[0] = '\0';
  else memcpy(out, failure_log, sizeof failure_log);
  return 0;
}

EXPORT int nvrtcDestroyProgram(void **prog) {
  free(*prog);
  *prog = NULL;
  return 0;
}
