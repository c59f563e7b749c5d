/* gpu_check.cu -- the CUDA core on a real GPU (tests/cuda/gpu-check.sh
 * builds and runs it; never part of the CPU test suites).  The CUDA runtime
 * stands in for "another framework": it creates streams, captures graphs
 * and checks results; everything under test goes through dlbridge. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../c/check.h"

extern "C" void dlb__cuda_reset_for_tests(void); /* core, internal */

#define CUDA_OK(x)                                                         \
  do {                                                                     \
    cudaError_t e_ = (x);                                                  \
    if (e_ != cudaSuccess) {                                               \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,           \
              cudaGetErrorString(e_));                                     \
      check_failed_++;                                                     \
    }                                                                      \
  } while (0)

static const DLDataType F32 = {kDLFloat, 32, 1};

typedef struct side {
  int kind; /* 0 host, 1 device */
  int32_t ndim;
  int64_t shape[2];
  int64_t strides[2];
  uint64_t byte_offset;
  size_t bytes;
} side;

static DLTensor tensor_of(side *s, void *p) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.device.device_type = s->kind ? kDLCUDA : kDLCPU;
  t.device.device_id = 0;
  t.ndim = s->ndim;
  t.dtype = F32;
  t.shape = s->shape;
  t.strides = s->strides;
  t.byte_offset = s->byte_offset;
  return t;
}

/* dlb_cuda_copy vs dlb_copy on host buffers of the same layouts: whole
 * destination buffers compared, gaps included. */
static int copy_case(side dst, side src, cudaStream_t stream) {
  dlb_error err;
  unsigned char *hs = (unsigned char *)malloc(src.bytes);
  unsigned char *hd = (unsigned char *)malloc(dst.bytes);
  unsigned char *rd = (unsigned char *)malloc(dst.bytes);
  unsigned char *back = (unsigned char *)malloc(dst.bytes);
  for (size_t i = 0; i < src.bytes; i++) hs[i] = (unsigned char)(i * 7 + 3);
  memset(hd, 0x55, dst.bytes);
  memset(rd, 0x55, dst.bytes);
  void *ds = hs, *dd = hd;
  if (src.kind) {
    CUDA_OK(cudaMalloc(&ds, src.bytes));
    CUDA_OK(cudaMemcpy(ds, hs, src.bytes, cudaMemcpyHostToDevice));
  }
  if (dst.kind) {
    CUDA_OK(cudaMalloc(&dd, dst.bytes));
    CUDA_OK(cudaMemcpy(dd, hd, dst.bytes, cudaMemcpyHostToDevice));
  }
  DLTensor td = tensor_of(&dst, dd), ts = tensor_of(&src, ds);
  int rc = dlb_cuda_copy(&td, &ts, stream, &err);
  if (rc != DLB_OK) fprintf(stderr, "  copy: %s\n", err.message);
  CUDA_OK(cudaStreamSynchronize(stream));
  if (rc == DLB_OK) {
    side h1 = dst, h2 = src;
    h1.kind = h2.kind = 0;
    DLTensor r1 = tensor_of(&h1, rd), r2 = tensor_of(&h2, hs);
    CHECK_EQ(dlb_copy(&r1, &r2, &err), DLB_OK);
    if (dst.kind) CUDA_OK(cudaMemcpy(back, dd, dst.bytes, cudaMemcpyDeviceToHost));
    else memcpy(back, hd, dst.bytes);
    bool same = memcmp(back, rd, dst.bytes) == 0;
    CHECK(same);
    if (!same)
      fprintf(stderr, "  mismatch: dst kind %d strides %lld,%lld src kind %d strides %lld,%lld\n",
              dst.kind, (long long)dst.strides[0], (long long)dst.strides[1], src.kind,
              (long long)src.strides[0], (long long)src.strides[1]);
  }
  if (src.kind) CUDA_OK(cudaFree(ds));
  if (dst.kind) CUDA_OK(cudaFree(dd));
  free(hs); free(hd); free(rd); free(back);
  return rc;
}

static side dev(side s) { s.kind = 1; return s; }

__global__ void slow_write(float *p, float value, long long spin) {
  long long start = clock64();
  while (clock64() - start < spin) {
  }
  *p = value;
}

typedef int (*kernel_fn)(DLTensor *const *, int32_t, void *, dlb_error *);

int main(void) {
  dlb_error err;
  int count = 0;
  cudaStream_t s1, s2;
  CHECK_EQ(dlb_cuda_load(&err), DLB_OK);
  if (err.code != 0) fprintf(stderr, "load: %s\n", err.message);
  CHECK_EQ(dlb_cuda_device_count(&count, &err), DLB_OK);
  printf("devices: %d\n", count);
  CHECK(count >= 1);
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(0)); /* runtime context = primary context */
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

  /* Pointer classification. */
  {
    void *d = NULL, *pinned = NULL, *managed = NULL;
    float host[4];
    dlb_cuda_pointer_info info;
    CUDA_OK(cudaMalloc(&d, 256));
    CUDA_OK(cudaMallocHost(&pinned, 256));
    CUDA_OK(cudaMallocManaged(&managed, 256));
    CHECK_EQ(dlb_cuda_pointer_info_get(d, &info, &err), DLB_OK);
    CHECK_EQ(info.memory_type, DLB_CUDA_MEMORY_DEVICE);
    CHECK_EQ(info.device_ordinal, 0);
    CHECK_EQ(dlb_cuda_pointer_info_get(host, &info, &err), DLB_OK);
    CHECK_EQ(info.memory_type, DLB_CUDA_MEMORY_UNREGISTERED);
    CHECK_EQ(dlb_cuda_pointer_info_get(pinned, &info, &err), DLB_OK);
    CHECK_EQ(info.memory_type, DLB_CUDA_MEMORY_HOST);
    CHECK_EQ(dlb_cuda_pointer_info_get(managed, &info, &err), DLB_OK);
    CHECK_EQ(info.memory_type, DLB_CUDA_MEMORY_MANAGED);
    CHECK_EQ(dlb_cuda_check_pointer(DLDevice{kDLCUDA, 0}, host, &err), DLB_EINVAL);
    printf("host claimed as cuda: %s\n", err.message);
    CHECK_EQ(dlb_cuda_check_pointer(DLDevice{kDLCPU, 0}, d, &err), DLB_EINVAL);
    CHECK_EQ(dlb_cuda_check_pointer(DLDevice{kDLCUDA, 0}, d, &err), DLB_OK);
    CHECK_EQ(dlb_cuda_check_pointer(DLDevice{kDLCUDAHost, 0}, pinned, &err), DLB_OK);
    CHECK_EQ(dlb_cuda_check_pointer(DLDevice{kDLCUDAManaged, 0}, managed, &err), DLB_OK);
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaFreeHost(pinned));
    CUDA_OK(cudaFree(managed));
  }

  /* Managed tensors, stream-ordered; the caller's context unchanged. */
  {
    DLManagedTensorVersioned *m = NULL;
    int64_t shape[2] = {300, 500};
    CHECK_EQ(dlb_cuda_managed_zeros(2, shape, F32, DLDevice{kDLCUDA, 0}, false, s1, &m, &err),
             DLB_OK);
    float probe[3] = {1, 1, 1};
    CUDA_OK(cudaMemcpyAsync(probe, (float *)m->dl_tensor.data + 1000, sizeof probe,
                            cudaMemcpyDeviceToHost, s1));
    CUDA_OK(cudaStreamSynchronize(s1));
    CHECK(probe[0] == 0.0f && probe[2] == 0.0f);
    dlb_managed_delete(m);
    CHECK_EQ(dlb_cuda_managed_zeros(2, shape, F32, DLDevice{kDLCUDAHost, 0}, false, NULL, &m,
                                    &err),
             DLB_OK);
    dlb_managed_delete(m);
    CUDA_OK(cudaStreamSynchronize(s1));
    CUDA_OK(cudaGetLastError());
  }

  /* Copies between layouts, both directions and on the device. */
  {
    const side C34 = {0, 2, {3, 4}, {4, 1}, 0, 48};
    const side T34 = {0, 2, {3, 4}, {1, 3}, 0, 48};
    const side R34 = {0, 2, {3, 4}, {-4, 1}, 32, 48};
    const side B34 = {0, 2, {3, 4}, {-1, -3}, 44, 48};
    const side P34 = {0, 2, {3, 4}, {8, 1}, 0, 96};
    const side O34 = {0, 2, {3, 4}, {4, 1}, 8, 56};
    const side L[] = {C34, T34, R34, B34, P34, O34};
    int ok = 0, refused = 0;
    for (int i = 0; i < 6; i++)
      for (int j = 0; j < 6; j++) {
        ok += copy_case(dev(L[i]), L[j], s1) == DLB_OK;
        int rc = copy_case(L[i], dev(L[j]), s1);
        ok += rc == DLB_OK;
        refused += rc == DLB_EUNSUPPORTED;
        ok += copy_case(dev(L[i]), dev(L[j]), s1) == DLB_OK;
      }
    printf("layout pairs copied: %d, refused (host dst with gaps): %d\n", ok, refused);
    CHECK_EQ(ok + refused, 108);
    /* Large: transposed 1000x700 through the kernel, pitched through 2D. */
    const side BIG_C = {0, 2, {1000, 700}, {700, 1}, 0, 2800000};
    const side BIG_T = {0, 2, {1000, 700}, {1, 1000}, 0, 2800000};
    const side BIG_P = {0, 2, {1000, 700}, {1024, 1}, 0, 4096000};
    CHECK_EQ(copy_case(dev(BIG_C), dev(BIG_T), s1), DLB_OK);
    CHECK_EQ(copy_case(dev(BIG_C), BIG_T, s1), DLB_OK);
    CHECK_EQ(copy_case(BIG_T, dev(BIG_C), s1), DLB_OK);
    CHECK_EQ(copy_case(dev(BIG_P), BIG_C, s1), DLB_OK);
  }

  /* Stream ordering: a slow write on s1, ordered before a read on s2. */
  {
    float *p = NULL, got = 0;
    CUDA_OK(cudaMalloc(&p, sizeof(float)));
    CUDA_OK(cudaMemset(p, 0, sizeof(float)));
    CUDA_OK(cudaDeviceSynchronize());
    slow_write<<<1, 1, 0, s1>>>(p, 42.0f, 200000000LL); /* ~0.1 s */
    CHECK_EQ(dlb_cuda_stream_order(0, s1, s2, &err), DLB_OK);
    CUDA_OK(cudaMemcpyAsync(&got, p, sizeof got, cudaMemcpyDeviceToHost, s2));
    CUDA_OK(cudaStreamSynchronize(s2));
    printf("ordered read: %g (expect 42)\n", got);
    CHECK(got == 42.0f);
    CUDA_OK(cudaFree(p));
  }

  /* Graph capture: allocation, a strided kernel copy (first use of the
   * kernel on this device inside the capture would be the hard case, but
   * it was built above), ordering into the capturing stream from outside,
   * stream-ordered free. */
  {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    bool capturing = false;
    float host[12], out[12];
    for (int i = 0; i < 12; i++) host[i] = (float)i;
    float *src = NULL, *dst = NULL;
    CUDA_OK(cudaMalloc(&src, sizeof host));
    CUDA_OK(cudaMalloc(&dst, sizeof out));
    CUDA_OK(cudaMemcpy(src, host, sizeof host, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dst, 0, sizeof out));
    CUDA_OK(cudaDeviceSynchronize());
    /* Forget the compiled kernel: its first use comes inside the capture. */
    dlb__cuda_reset_for_tests();
    /* Work on s2 before the capture that the captured work must follow. */
    slow_write<<<1, 1, 0, s2>>>(src + 11, 11.0f, 100000000LL);
    CUDA_OK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK_EQ(dlb_cuda_stream_is_capturing(0, s1, &capturing, &err), DLB_OK);
    CHECK(capturing);
    int rc = dlb_cuda_stream_order(0, s2, s1, &err);
    printf("order(outside -> capturing): rc %d %s\n", rc, rc ? err.message : "");
    CHECK_EQ(rc, DLB_OK);
    rc = dlb_cuda_stream_order(0, s1, DLB_CUDA_STREAM_LEGACY, &err);
    CHECK_EQ(rc, DLB_EUNSUPPORTED);
    void *tmp = NULL;
    CHECK_EQ(dlb_cuda_alloc(0, sizeof host, s1, &tmp, &err), DLB_OK);
    int64_t shape[2] = {3, 4}, cs[2] = {4, 1}, ts[2] = {1, 3};
    DLTensor a = {src, {kDLCUDA, 0}, 2, F32, shape, cs, 0};
    DLTensor t = {tmp, {kDLCUDA, 0}, 2, F32, shape, ts, 0};
    DLTensor d = {dst, {kDLCUDA, 0}, 2, F32, shape, cs, 0};
    CHECK_EQ(dlb_cuda_copy(&t, &a, s1, &err), DLB_OK); /* kernel */
    CHECK_EQ(dlb_cuda_copy(&d, &t, s1, &err), DLB_OK); /* kernel back */
    CHECK_EQ(dlb_cuda_free(0, tmp, s1, &err), DLB_OK);
    if (err.code) printf("capture: %s\n", err.message);
    CUDA_OK(cudaStreamEndCapture(s1, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, s1));
    CUDA_OK(cudaGraphLaunch(exec, s1));
    CUDA_OK(cudaStreamSynchronize(s1));
    CUDA_OK(cudaMemcpy(out, dst, sizeof out, cudaMemcpyDeviceToHost));
    CHECK(memcmp(out, host, sizeof out) == 0);
    printf("graph replay round trip: %s\n", memcmp(out, host, sizeof out) == 0 ? "exact" : "WRONG");
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaFree(src));
    CUDA_OK(cudaFree(dst));
  }

  /* The example kernels. */
  const char *lib = getenv("DLB_EXAMPLE_CUDA_KERNELS");
  void *h = lib ? dlopen(lib, RTLD_NOW) : NULL;
  CHECK(h != NULL);
  if (h != NULL) {
    kernel_fn saxpy = (kernel_fn)dlsym(h, "dlb_kernel_cuda_saxpy");
    kernel_fn matmul = (kernel_fn)dlsym(h, "dlb_kernel_cuda_matmul");
    enum { N = 1000, M = 70, K = 50, P = 90 };
    float x[N], y[N], a = 2.5f;
    for (int i = 0; i < N; i++) { x[i] = (float)i; y[i] = 1.0f; }
    float *dx, *dy;
    CUDA_OK(cudaMalloc(&dx, sizeof x));
    CUDA_OK(cudaMalloc(&dy, sizeof y));
    CUDA_OK(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dy, y, sizeof y, cudaMemcpyHostToDevice));
    int64_t n = N, one = 1;
    DLTensor ta = {&a, {kDLCPU, 0}, 0, F32, NULL, NULL, 0};
    DLTensor tx = {dx, {kDLCUDA, 0}, 1, F32, &n, &one, 0};
    DLTensor ty = {dy, {kDLCUDA, 0}, 1, F32, &n, &one, 0};
    DLTensor *args[3] = {&ta, &tx, &ty};
    CHECK_EQ(saxpy(args, 3, s1, &err), DLB_OK);
    CUDA_OK(cudaStreamSynchronize(s1));
    CUDA_OK(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
    CHECK(y[10] == 26.0f && y[999] == 2.5f * 999 + 1);
    /* matmul with a transposed b. */
    static float A[M * K], B[P * K], C[M * P], R[M * P];
    for (int i = 0; i < M * K; i++) A[i] = (float)((i * 37) % 11) - 5;
    for (int i = 0; i < P * K; i++) B[i] = (float)((i * 53) % 13) - 6;
    for (int i = 0; i < M; i++)
      for (int j = 0; j < P; j++) {
        float acc = 0;
        for (int q = 0; q < K; q++) acc += A[i * K + q] * B[j * K + q];
        R[i * P + j] = acc;
      }
    float *dA, *dB, *dC;
    CUDA_OK(cudaMalloc(&dA, sizeof A));
    CUDA_OK(cudaMalloc(&dB, sizeof B));
    CUDA_OK(cudaMalloc(&dC, sizeof C));
    CUDA_OK(cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice));
    int64_t sa[2] = {M, K}, sas[2] = {K, 1}, sb[2] = {K, P}, sbs[2] = {1, K};
    int64_t sc[2] = {M, P}, scs[2] = {P, 1};
    DLTensor tA = {dA, {kDLCUDA, 0}, 2, F32, sa, sas, 0};
    DLTensor tB = {dB, {kDLCUDA, 0}, 2, F32, sb, sbs, 0};
    DLTensor tC = {dC, {kDLCUDA, 0}, 2, F32, sc, scs, 0};
    DLTensor *margs[3] = {&tA, &tB, &tC};
    CHECK_EQ(matmul(margs, 3, s1, &err), DLB_OK);
    CUDA_OK(cudaStreamSynchronize(s1));
    CUDA_OK(cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost));
    CHECK(memcmp(C, R, sizeof C) == 0); /* small integers: exact */
    printf("example kernels: saxpy y[10]=%g, matmul %s\n", y[10],
           memcmp(C, R, sizeof C) == 0 ? "exact" : "WRONG");
    /* Host tensor refused. */
    tx.device.device_type = kDLCPU;
    CHECK_EQ(saxpy(args, 3, s1, &err), DLB_EUNSUPPORTED);
    cudaFree(dx); cudaFree(dy); cudaFree(dA); cudaFree(dB); cudaFree(dC);
  }
  CUDA_OK(cudaStreamDestroy(s1));
  CUDA_OK(cudaStreamDestroy(s2));
  return check_summary("gpu_check");
}
