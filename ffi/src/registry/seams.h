// The registry's test and diagnostic seams, for the tools module
// (jax_llar.tools._llar_tools: the call trace, the fault modes, the
// registration test hook). jax_llar._llar binds none of them.
//
// What production pays: nothing on the execute path. The launcher seam
// replaces the device's published AlgorithmCall, which the execute handler
// reads anyway; the registration seam is one check on the set-up path
// (registry/internal.h: RegistrationSeam).
#ifndef LLAR_REGISTRY_SEAMS_H_
#define LLAR_REGISTRY_SEAMS_H_

#include <cstdint>

#include "api.h"
#include "kernels/kernels.h"

namespace llar {

// Device `ordinal` of `comm_id` launches `algorithm` (an id of kAlgorithms)
// through `launcher`, or with nullptr through kAlgorithms' own again; calls
// of other algorithms are unaffected. Applies to calls launched afterwards
// (a CUDA graph keeps the launcher it captured), and to a region created
// later. Throws std::runtime_error when the set has no such device or the
// algorithm is unknown.
LLAR_API void SetLauncherOverride(int64_t comm_id, int32_t ordinal, int64_t algorithm,
                                  Launcher launcher);

// The next region EnsureRegion creates for `comm_id` fails in this process
// once its registration and peer tables are complete (as when the set-up
// bound passes just as NCCL completes the step); the set is then given up as
// after a failed registration (registry.h: EnsureRegion), whichever kind of
// group it holds. Throws std::runtime_error for an unknown set.
LLAR_API void FailNextRegistrationForTesting(int64_t comm_id);

}  // namespace llar

#endif  // LLAR_REGISTRY_SEAMS_H_
