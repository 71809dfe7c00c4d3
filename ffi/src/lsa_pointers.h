// The peer addresses of a symmetric window (the core's reader; the tools
// module reads its diagnostic window's with it too).
#ifndef LLAR_LSA_POINTERS_H_
#define LLAR_LSA_POINTERS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "api.h"

namespace llar {

// Fills host_out[0..n) with ncclGetLsaPointer(window, 0, peer) for every LSA
// peer, as mapped on the current device. Runs on `stream` (0: the legacy
// default stream) and synchronises that stream only, so it never waits for
// kernels on other non-blocking streams (XLA's): call at set-up only.
LLAR_API cudaError_t ReadLsaPointers(ncclWindow_t window, int n, void** host_out,
                                     cudaStream_t stream = nullptr);

}  // namespace llar

#endif  // LLAR_LSA_POINTERS_H_
