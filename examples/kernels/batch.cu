/*
 * batch.cu -- batch.c's bscale and vscale on the GPU (issue 25 item 6; built
 * by meson into libdlb_example_cuda_kernels.so with the other CUDA examples):
 *   dlb_kernel_cuda_bscale  bscale(a: T[...], x: T[..., n]) -> (y: T[..., n])
 *   dlb_kernel_cuda_vscale  vscale(a: T, x: T[n]) -> (y: T[n])   (no `...`)
 * T = float32 or float64 (all three alike); y = a x.
 *
 * The contract dlbridge keeps for a `...` kernel (docs/function.md, "Batch
 * dimensions"), which bscale checks and relies on: every `...` tensor has the
 * same batch rank R; at each batch axis an extent is the broadcast shape B's
 * or 1 (a 1 is broadcast here, by a zero stride); any element strides; the
 * result has the full B.  ONE launch covers the whole batch: a thread per
 * element of B + [n], which finds its batch index by division.  Under
 * jax.vmap or torch.vmap that is one launch per vmapped call, not one per
 * item; vscale, declared without `...`, is the per-item kernel dlbridge
 * loops over instead.
 *
 * The launch goes on the stream dlbridge passes (the framework's), nothing
 * synchronises.  `a` may be in host memory when it is one element (a Python
 * number, or a 0-d host tensor): it is then passed by value.
 *
 * Counters, host-side (read with ctypes; tests/gpu/test_gpu_batch.py):
 * dlb_example_cuda_batch_calls counts launches of either kernel,
 * dlb_example_cuda_batch_last holds the last one's [R, B0, ..., B(R-1)]
 * and dlb_example_cuda_batch_stream the stream it went on.
 */
#include "cuda_common.cuh"

#define BATCH_MAX 16

/* Definitions with C names (EXPORT's one-line extern "C" would make them
 * declarations). */
extern "C" {
__attribute__((visibility("default"))) int64_t dlb_example_cuda_batch_calls;
__attribute__((visibility("default"))) int64_t
    dlb_example_cuda_batch_last[1 + BATCH_MAX];
__attribute__((visibility("default"))) uintptr_t dlb_example_cuda_batch_stream;
}

/* What the kernel needs, by value: the batch shape, each tensor's batch
 * strides (0 where its extent is 1) and core strides, in elements. */
struct batch_plan {
  int32_t rank;
  int64_t n, total;
  int64_t shape[BATCH_MAX];
  int64_t sa[BATCH_MAX], sx[BATCH_MAX], sy[BATCH_MAX];
  int64_t cx, cy;
};

template <typename T>
__global__ void bscale_kernel(batch_plan p, T a_value, const T *a,
                              const T *x, T *y) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
       i < p.total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t item = i / p.n, j = i % p.n;
    int64_t oa = 0, ox = j * p.cx, oy = j * p.cy;
    for (int32_t k = p.rank - 1; k >= 0; k--) {
      const int64_t at = item % p.shape[k];
      item /= p.shape[k];
      oa += at * p.sa[k];
      ox += at * p.sx[k];
      oy += at * p.sy[k];
    }
    y[oy] = (a != NULL ? a[oa] : a_value) * x[ox];
  }
}

/* The element count of t. */
static int64_t elements(const DLTensor *t) {
  int64_t c = 1;
  for (int32_t k = 0; k < t->ndim; k++) c *= t->shape[k];
  return c;
}

/* Checks (a, x, y) against bscale's contract (batched: whether the three
 * carry `...`; without, a is 0-d and x, y 1-d) and fills the plan. */
static int plan_of(DLTensor *const *args, int32_t nargs, bool batched,
                   const char *who, batch_plan *p, dlb_error *err) {
  if (nargs != 3)
    return dlb_error_set(err, DLB_EINVAL, "%s takes 3 arguments (a, x, y), got %d",
                         who, (int)nargs);
  for (int32_t i = 0; i < 3; i++)
    if (args[i] == NULL)
      return dlb_error_set(err, DLB_EINVAL, "%s: argument %d is NULL", who, (int)i);
  const DLTensor *A = args[0], *X = args[1], *Y = args[2];
  for (int32_t i = 0; i < 3; i++) {
    const DLDataType d = args[i]->dtype;
    if (d.code != kDLFloat || d.lanes != 1 || (d.bits != 32 && d.bits != 64) ||
        d.bits != A->dtype.bits)
      return dlb_error_set(err, DLB_EINVAL,
                           "%s: argument %d must be float32 or float64 like a "
                           "(dtype code %d, %d bits)",
                           who, (int)i, (int)d.code, (int)d.bits);
  }
  if (X->ndim < 1 || Y->ndim != X->ndim || A->ndim != X->ndim - 1)
    return dlb_error_set(err, DLB_EINVAL,
                         "%s: batch ranks differ (a %d-d, x %d-d, y %d-d; a "
                         "has one dimension fewer, dlbridge pads every `...` "
                         "tensor to one rank)",
                         who, (int)A->ndim, (int)X->ndim, (int)Y->ndim);
  p->rank = X->ndim - 1;
  if (!batched && p->rank != 0)
    return dlb_error_set(err, DLB_EINVAL,
                         "%s has no batch dimensions: a 0-d, x and y 1-d "
                         "(got x %d-d)", who, (int)X->ndim);
  if (p->rank > BATCH_MAX)
    return dlb_error_set(err, DLB_EINVAL, "%s: batch rank %d is over %d", who,
                         (int)p->rank, BATCH_MAX);
  p->n = X->shape[p->rank];
  if (Y->shape[p->rank] != p->n)
    return dlb_error_set(err, DLB_EINVAL, "%s: core dimension n: x has %lld, y has %lld",
                         who, (long long)p->n, (long long)Y->shape[p->rank]);
  p->total = p->n;
  for (int32_t k = 0; k < p->rank; k++) {
    const int64_t b = Y->shape[k], ea = A->shape[k], ex = X->shape[k];
    if ((ea != b && ea != 1) || (ex != b && ex != 1))
      return dlb_error_set(err, DLB_EINVAL,
                           "%s: batch axis %d: y has %lld, a %lld, x %lld (each "
                           "must be y's, the broadcast extent, or 1)",
                           who, (int)k, (long long)b, (long long)ea, (long long)ex);
    p->shape[k] = b;
    p->sa[k] = ea == 1 ? 0 : stride_of(A, k);
    p->sx[k] = ex == 1 ? 0 : stride_of(X, k);
    p->sy[k] = stride_of(Y, k);
    p->total *= b;
  }
  p->cx = stride_of(X, p->rank);
  p->cy = stride_of(Y, p->rank);
  return DLB_OK;
}

template <typename T>
static void launch(const batch_plan &p, DLTensor *const *args, cudaStream_t s,
                   bool a_on_host) {
  const T *a = a_on_host ? NULL : (const T *)dlb_tensor_data(args[0]);
  const T a_value = a_on_host ? *(const T *)dlb_tensor_data(args[0]) : T(0);
  int64_t blocks = (p.total + 255) / 256;
  if (blocks > 65535) blocks = 65535;
  bscale_kernel<T><<<(unsigned)blocks, 256, 0, s>>>(
      p, a_value, a, (const T *)dlb_tensor_data(args[1]),
      (T *)dlb_tensor_data(args[2]));
}

static int run(DLTensor *const *args, int32_t nargs, void *stream,
               bool batched, const char *who, dlb_error *err) {
  batch_plan p;
  int rc = plan_of(args, nargs, batched, who, &p, err);
  if (rc != DLB_OK) return rc;
  // a may stay on the host only as one element, read here by value.
  const bool a_on_host = !on_gpu(args[0]) && elements(args[0]) == 1;
  int device;
  rc = check_devices(args, nargs, a_on_host ? 1u : 0u, who, &device, err);
  if (rc != DLB_OK) return rc;
  dlb_example_cuda_batch_calls++;
  dlb_example_cuda_batch_last[0] = p.rank;
  for (int32_t k = 0; k < p.rank; k++) dlb_example_cuda_batch_last[1 + k] = p.shape[k];
  dlb_example_cuda_batch_stream = (uintptr_t)stream;
  if (p.total == 0) return DLB_OK;
  device_guard guard;
  rc = device_enter(&guard, device, who, err);
  if (rc != DLB_OK) return rc;
  if (args[0]->dtype.bits == 32)
    launch<float>(p, args, (cudaStream_t)stream, a_on_host);
  else
    launch<double>(p, args, (cudaStream_t)stream, a_on_host);
  rc = launch_status(who, err);
  device_leave(&guard);
  return rc;
}

EXPORT int dlb_kernel_cuda_bscale(DLTensor *const *args, int32_t nargs,
                                  void *stream, dlb_error *err) {
  return run(args, nargs, stream, true, "cuda_bscale", err);
}

EXPORT int dlb_kernel_cuda_vscale(DLTensor *const *args, int32_t nargs,
                                  void *stream, dlb_error *err) {
  return run(args, nargs, stream, false, "cuda_vscale", err);
}
