// XLA FFI handlers of the copy targets (copy.h): execute only, captured into
// XLA's CUDA graph like the all-reduce.
#include <cuda_runtime_api.h>

#include <string>

#include "copy.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llar {
namespace {

template <cudaError_t (*Launch)(const void*, void*, uint64_t, cudaStream_t)>
ffi::Error CopyExecute(cudaStream_t stream, ffi::AnyBuffer x,
                       ffi::Result<ffi::AnyBuffer> y) {
  if (y->size_bytes() != x.size_bytes()) {
    return ffi::Error::InvalidArgument("jax_llar: copy needs equal sizes");
  }
  const cudaError_t e = Launch(x.untyped_data(), y->untyped_data(), x.size_bytes(), stream);
  if (e != cudaSuccess) {
    return ffi::Error::Internal(std::string("jax_llar: copy launch failed: ") +
                                cudaGetErrorString(e));
  }
  return ffi::Error::Success();
}

// The two copy calls share one signature.
auto CopyBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Arg<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kCopyExecute, CopyExecute<LaunchCopy>, CopyBinding(),
                       {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kWideCopyExecute, CopyExecute<LaunchWideCopy>, CopyBinding(),
                       {ffi::Traits::kCmdBufferCompatible});

CopyHandlers GetCopyHandlers() {
  return {reinterpret_cast<void*>(kCopyExecute), reinterpret_cast<void*>(kWideCopyExecute)};
}

}  // namespace llar
