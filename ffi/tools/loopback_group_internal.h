// The loopback groups' state, shared by loopback_group.cc (set-up) and
// loopback_group_handlers.cc (the FFI handlers). Not part of any Python API.
#ifndef LLAR_TOOLS_LOOPBACK_GROUP_INTERNAL_H_
#define LLAR_TOOLS_LOOPBACK_GROUP_INTERNAL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {

// One simulated rank: what CreateCommSet and EnsureRegion give a device.
struct LoopbackRank {
  uint64_t* state = nullptr;        // kStateWords: every set's epochs, the claim word
  ErrorRecord* record = nullptr;    // host-mapped
  cudaStream_t stream = nullptr;    // the rank's kernels run here
  cudaEvent_t done = nullptr;       // joins the rank's stream back to XLA's
  std::vector<char*> scratch;       // per algorithm id (kAlgorithmCount), null if absent
  std::vector<PeerTable*> tables;   // device copies, per algorithm id
};

struct LoopbackGroup {
  int64_t id = 0;
  int32_t ordinal = -1;
  int world = 0;
  uint64_t timeout_ns = 0;
  std::vector<int64_t> algorithms;  // regions held, ascending
  std::vector<LoopbackRank> ranks;
  // args[a][r]: rank r's argument block of algorithm a (epochs, peers, rank,
  // world), as a DeviceContext's AlgorithmCall holds it; empty fields where
  // the group holds no region of a.
  std::vector<AllReduceArgs> args[kAlgorithmCount];
  cudaEvent_t fork = nullptr;       // forks the rank streams from XLA's
  std::mutex mu;                    // one call's launches at a time

  bool Has(int64_t algorithm) const {
    return algorithm > 0 && algorithm < kAlgorithmCount && !ranks.empty() &&
           ranks[0].scratch[algorithm] != nullptr;
  }
};

// The group `id`, or nullptr (withdrawn or never made).
std::shared_ptr<LoopbackGroup> FindLoopbackGroup(int64_t id);

}  // namespace llar

#endif  // LLAR_TOOLS_LOOPBACK_GROUP_INTERNAL_H_
