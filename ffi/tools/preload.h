// Loading the tools' kernels (the copy kernels and the diagnostic variants)
// where XLA or the kernel bench may capture them, so that no lazy module load
// happens inside a captured CUDA graph.
#ifndef LLAR_TOOLS_PRELOAD_H_
#define LLAR_TOOLS_PRELOAD_H_

#include <cstdint>

namespace llar {

// Idempotent; never throws. The first call hands the tools' preload to the
// registry (AddPreload), which runs it best-effort on the devices of the
// sets that exist and on those of every set created later, after the set is
// published: a failure there is ignored and never affects the set. Without
// communicator sets it makes no CUDA call.
void EnsureToolKernelsPreloaded();

// Checked, on demand: makes `ordinal` the current device, synchronises it
// (no kernel of it runs while the module loads) and loads the tools' kernels
// there. Call it before setting a launcher override or capturing a tools'
// kernel on that device, under a DeviceGuard. Throws std::runtime_error when
// a load fails.
void LoadToolKernels(int32_t ordinal);

}  // namespace llar

#endif  // LLAR_TOOLS_PRELOAD_H_
