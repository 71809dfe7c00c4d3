// Loading the tools' kernels (the copy kernels and the diagnostic variants)
// where XLA may capture them: on every device of every communicator set, as
// the core does for the production kernels.
#ifndef LLAR_TOOLS_PRELOAD_H_
#define LLAR_TOOLS_PRELOAD_H_

namespace llar {

// Idempotent. The first call hands the tools' preload to the registry
// (AddPreload): it runs at once on the devices of the sets that exist and on
// those of every set created later. Without communicator sets it makes no
// CUDA call. Throws std::runtime_error when a load fails.
void EnsureToolKernelsPreloaded();

}  // namespace llar

#endif  // LLAR_TOOLS_PRELOAD_H_
