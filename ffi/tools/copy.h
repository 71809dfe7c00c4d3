// The trivial custom call (impl name `ffi.copy` in the benchmarks): copies its
// operand to its result. It is registered exactly like the all-reduce, so a
// chain of it measures what XLA charges per custom call step before any
// communication (benchmarks/METHOD.md, JAX level). Its wide twin
// (`diag.ffi_copy_wide`) is the same copy with a 208-byte parameter block, the
// size of the one-shot kernel's parameters before they moved into the
// device-memory PeerTable: the difference between the two at the JAX level is
// what parameter bytes cost XLA's graph.
#ifndef LLAR_TOOLS_COPY_H_
#define LLAR_TOOLS_COPY_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace llar {

// copy.cu. Launchers only compute the grid and launch (safe in stream capture).
cudaError_t LaunchCopy(const void* in, void* out, uint64_t n_bytes, cudaStream_t stream);
cudaError_t LaunchWideCopy(const void* in, void* out, uint64_t n_bytes,
                           cudaStream_t stream);
// Loads both copy kernels on the current device.
cudaError_t PreloadCopy();

// copy_handlers.cc: the execute-only FFI handlers (kCmdBufferCompatible) of
// the targets jax_llar_copy and jax_llar_copy_wide.
struct CopyHandlers {
  void* copy;
  void* wide_copy;
};
CopyHandlers GetCopyHandlers();

}  // namespace llar

#endif  // LLAR_TOOLS_COPY_H_
