// _tvm_peer.cc -- the tvm-ffi peer: a compiled C++ function taking three
// tensors through tvm-ffi's typed-function machinery.  TensorView is the
// borrowed form (DLTensor underneath), the cheapest signature tvm-ffi offers;
// the Python side still converts torch tensors through the exchange table's
// owning entry (managed_tensor_from_py_object_no_sync) per argument.
#include <tvm/ffi/function.h>
#include <tvm/ffi/container/tensor.h>

namespace {
void noop3(tvm::ffi::TensorView a, tvm::ffi::TensorView b,
           tvm::ffi::TensorView c) {
  (void)a.data_ptr();
  (void)b.data_ptr();
  (void)c.data_ptr();
}
}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(noop3, noop3);
