/* cuda_common.cuh -- shared by the example CUDA kernels: argument checks
 * and the device guard every dlb_kernel entry uses. */
#ifndef DLB_EXAMPLES_CUDA_COMMON_CUH_
#define DLB_EXAMPLES_CUDA_COMMON_CUH_

#include <cuda_runtime.h>

#include "dlbridge/dlbridge.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

/* Element stride of dim d (NULL strides mean compact row-major). */
static inline int64_t stride_of(const DLTensor *t, int d) {
  if (t->strides != NULL) return t->strides[d];
  int64_t s = 1;
  for (int i = t->ndim - 1; i > d; i--) s *= t->shape[i];
  return s;
}

static inline bool on_gpu(const DLTensor *t) {
  return t->device.device_type == kDLCUDA ||
         t->device.device_type == kDLCUDAManaged;
}

/* All tensor arguments on one CUDA device, except those in host_ok (a
 * bit mask of the 0-d scalars, which may also come from the host). */
static inline int check_devices(DLTensor *const *args, int32_t nargs,
                                unsigned host_ok, const char *who,
                                int *device, dlb_error *err) {
  *device = -1;
  for (int32_t i = 0; i < nargs; i++) {
    if (!on_gpu(args[i])) {
      if ((host_ok >> i) & 1u && dlb_device_is_host_accessible(args[i]->device))
        continue;
      return dlb_error_set(err, DLB_EUNSUPPORTED,
                           "%s runs on CUDA devices only (argument %d is not)",
                           who, (int)i);
    }
    if (*device >= 0 && args[i]->device.device_id != *device)
      return dlb_error_set(err, DLB_EINVAL,
                           "%s: arguments on cuda:%d and cuda:%d", who, *device,
                           (int)args[i]->device.device_id);
    *device = args[i]->device.device_id;
  }
  if (*device < 0)
    return dlb_error_set(err, DLB_EINVAL, "%s: no CUDA tensor given", who);
  return DLB_OK;
}

/* The runtime's current device, switched for the launch and put back, so
 * the caller's state is untouched. */
typedef struct device_guard {
  int previous;
  bool switched;
} device_guard;

static inline int device_enter(device_guard *g, int device, const char *who,
                               dlb_error *err) {
  g->switched = false;
  cudaError_t e = cudaGetDevice(&g->previous);
  if (e == cudaSuccess && g->previous != device) {
    e = cudaSetDevice(device);
    g->switched = e == cudaSuccess;
  }
  if (e != cudaSuccess)
    return dlb_error_set(err, DLB_EDEVICE, "%s: %s", who, cudaGetErrorString(e));
  return DLB_OK;
}

static inline void device_leave(device_guard *g) {
  if (g->switched) (void)cudaSetDevice(g->previous);
}

/* The launch's own error (bad configuration, no kernel image for this GPU),
 * without synchronising. */
static inline int launch_status(const char *who, dlb_error *err) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return dlb_error_set(err, DLB_EDEVICE, "%s: kernel launch failed: %s", who,
                         cudaGetErrorString(e));
  return DLB_OK;
}

#endif /* DLB_EXAMPLES_CUDA_COMMON_CUH_ */
