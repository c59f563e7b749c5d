// _jax_tvm_peer.cc -- the jax-tvm-ffi peer of bench/bench_compiled.py: the
// kernel the dlbridge Function of the JAX benchmark runs (dlb_kernel_noop in
// build/libdlb_example_kernels.so, the dlb_kernel ABI of dlbridge.h) as a
// tvm-ffi function of XLA's operand and result, which jax_tvm_ffi registers
// as an XLA FFI target.  Each TensorView becomes the DLTensor the kernel
// takes; the stream is NULL, as on the host.  Built by bench/build_peers.sh.
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
extern "C" int dlb_kernel_noop(DLTensor *const *args, int32_t nargs,
                               void *stream, peer_dlb_error *err);

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

void step(tvm::ffi::TensorView x, tvm::ffi::TensorView out) {
  DLTensor tx = as_dltensor(x), tout = as_dltensor(out);
  DLTensor *argv[2] = {&tx, &tout};
  peer_dlb_error err{0, {0}};
  if (dlb_kernel_noop(argv, 2, nullptr, &err) != 0)
    TVM_FFI_THROW(RuntimeError) << err.message;
}
}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(step, step);
