// Collective set-up steps of a group (communicator creation, device
// communicators, window registration), bounded for groups that span
// processes. Shared by registry/comm_set.cc and registry/regions.cc.
#ifndef LLAR_REGISTRY_COLLECTIVE_STEP_H_
#define LLAR_REGISTRY_COLLECTIVE_STEP_H_

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "errors.h"
#include "registry.h"
#include "registry/internal.h"

namespace llar {
namespace registry {

// True when the group's other ranks are in other processes (it has an NCCL
// unique id): its communicators are non-blocking and every collective step
// of its set-up is bounded.
inline bool Spans(const GroupSpec& g) { return !g.unique_id.empty(); }

// This process's members of a group, for messages: "rank 0 of 2 (CUDA device
// 0)", "ranks 0, 1 of 4 (CUDA devices 2, 3)".
std::string MembersText(const std::vector<int>& ranks, const std::vector<int>& ordinals,
                        int world);

// How a group's collective steps end: for a spanning group (`nonblocking`)
// each waits at most `timeout_ms` for NCCL's thread (AwaitComms); for a group
// held whole by this process the calls themselves finish the step.
struct StepBound {
  bool nonblocking = false;
  uint64_t timeout_ms = 0;
  std::string who;  // MembersText of this process's members
};

// A collective step of a spanning group failed (an error, or the bound
// passed): NCCL's thread may still be inside the step, writing its outputs,
// until ncclCommAbort stops it.
class CollectiveStepFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Waits until NCCL's thread has finished the pending work of every
// communicator of `comms` (non-blocking, after a call that answered
// ncclInProgress), polling ncclCommGetAsyncError with growing pauses.
// Throws std::runtime_error, naming `step` and `who`, when one reports an
// error or `timeout_ms` passes first; a communicator that answered
// ncclSuccess is no longer used by NCCL's thread, the others may be.
void AwaitComms(const std::vector<ncclComm_t>& comms, uint64_t timeout_ms, const char* step,
                const std::string& who);

// The communicators of devices all[first .. first + n).
std::vector<ncclComm_t> CommsOf(const std::vector<std::unique_ptr<DeviceResources>>& all,
                                size_t first, int n);

// One collective step of a group (devices all[first .. first + n)): `calls`
// (one NCCL call per member, each checked with CheckStep) grouped, then, for
// a spanning group, the bounded wait (AwaitComms). For a spanning group every
// failure is a CollectiveStepFailed, whose handler must abort the group's
// communicators before it frees anything the step uses. Nothing the calls
// write may be read before it returns.
template <typename F>
void CollectiveStep(const StepBound& bound,
                    const std::vector<std::unique_ptr<DeviceResources>>& all, size_t first,
                    int n, const char* step, F&& calls) {
  try {
    GroupedCalls(step, calls, bound.nonblocking);
    if (bound.nonblocking) AwaitComms(CommsOf(all, first, n), bound.timeout_ms, step, bound.who);
  } catch (const std::exception& e) {
    if (!bound.nonblocking) throw;
    throw CollectiveStepFailed(e.what());
  }
}

// Checks one call of a CollectiveStep: ncclInProgress is the normal answer
// of a non-blocking communicator.
inline void CheckStep(const StepBound& bound, ncclResult_t r, const char* what) {
  if (bound.nonblocking) {
    CheckNcclStarted(r, what);
  } else {
    CheckNccl(r, what);
  }
}

}  // namespace registry
}  // namespace llar

#endif  // LLAR_REGISTRY_COLLECTIVE_STEP_H_
