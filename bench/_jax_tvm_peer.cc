// _jax_tvm_peer.cc -- the jax-tvm-ffi peer of bench/bench_compiled.py: the
// kernel the dlbridge Function of the JAX benchmark runs (dlb_kernel_noop in
// build/libdlb_example_kernels.so, the dlb_kernel ABI of dlbridge.h) as a
// tvm-ffi function of XLA's operand and result, which jax_tvm_ffi registers
// as an XLA FFI target; and `mul` / `mul_vjp`, dlb_kernel_mul_f32 and its
// vjp kernel, the jax-tvm-ffi + jax.custom_vjp reference of the gradient
// rows (dlbridge/_bench_grad.py); and `bscale`, dlb_kernel_bscale of
// examples/kernels/batch.c (y = a x, a: float32[...], x: float32[..., n]),
// the jax-tvm-ffi + vmap_method="broadcast_all" reference of the batch row
// (dlbridge/_bench_batch.py).  Each TensorView becomes the DLTensor the
// kernel takes; the stream is NULL, as on the host.  Built by
// bench/build_peers.sh.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <cstdint>

// dlbridge.h's dlb_error and dlb_kernel (that header's DLPack and
// tvm-ffi's would clash in one translation unit).
struct peer_dlb_error {
  int code;
  char message[256];
};
typedef int peer_dlb_kernel(DLTensor *const *args, int32_t nargs,
                            void *stream, peer_dlb_error *err);
extern "C" peer_dlb_kernel dlb_kernel_noop, dlb_kernel_mul_f32,
    dlb_kernel_mul_f32_vjp, dlb_kernel_bscale;

namespace {
DLTensor as_dltensor(const tvm::ffi::TensorView &v) {
  DLTensor t;
  t.data = v.data_ptr();
  t.device = v.device();
  t.ndim = v.ndim();
  t.dtype = v.dtype();
  t.shape = const_cast<int64_t *>(v.shape().data());
  t.strides = const_cast<int64_t *>(v.strides().data());
  t.byte_offset = v.byte_offset();
  return t;
}

// Runs kernel on the views, in order; a failure is a tvm-ffi error.
template <int N>
void call(peer_dlb_kernel *kernel, const tvm::ffi::TensorView (&views)[N]) {
  DLTensor t[N];
  DLTensor *argv[N];
  for (int i = 0; i < N; i++) {
    t[i] = as_dltensor(views[i]);
    argv[i] = &t[i];
  }
  peer_dlb_error err{0, {0}};
  if (kernel(argv, N, nullptr, &err) != 0)
    TVM_FFI_THROW(RuntimeError) << err.message;
}

void step(tvm::ffi::TensorView x, tvm::ffi::TensorView out) {
  call<2>(dlb_kernel_noop, {x, out});
}

void mul(tvm::ffi::TensorView a, tvm::ffi::TensorView b,
         tvm::ffi::TensorView y) {
  call<3>(dlb_kernel_mul_f32, {a, b, y});
}

void mul_vjp(tvm::ffi::TensorView a, tvm::ffi::TensorView b,
             tvm::ffi::TensorView dy, tvm::ffi::TensorView da,
             tvm::ffi::TensorView db) {
  call<5>(dlb_kernel_mul_f32_vjp, {a, b, dy, da, db});
}

// Under vmap_method="broadcast_all" a, x and y all come with the batch
// axis in front, a and x broadcast to it: the kernel's batch contract.
void bscale(tvm::ffi::TensorView a, tvm::ffi::TensorView x,
            tvm::ffi::TensorView y) {
  call<3>(dlb_kernel_bscale, {a, x, y});
}
}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(step, step);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(mul, mul);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(mul_vjp, mul_vjp);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(bscale, bscale);
