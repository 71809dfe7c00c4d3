#include "registry/collective_step.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "errors.h"

namespace llar {
namespace registry {
namespace {

// The longest bound AwaitComms applies, so that its deadline cannot overflow
// the clock.
inline constexpr uint64_t kMaxSetupTimeoutMs = 1'000'000'000;
// AwaitComms' pause between polls: the first, doubled after each poll up to
// the longest. Short enough that a step that completes is seen at once, long
// enough that the wait costs no CPU worth counting.
inline constexpr std::chrono::microseconds kFirstPollPause{100};
inline constexpr std::chrono::microseconds kLongestPollPause{10'000};

}  // namespace

std::string MembersText(const std::vector<int>& ranks, const std::vector<int>& ordinals,
                        int world) {
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
    return out;
  };
  const bool one = ranks.size() == 1;
  return std::string(one ? "rank " : "ranks ") + list(ranks) + " of " + std::to_string(world) +
         (one ? " (CUDA device " : " (CUDA devices ") + list(ordinals) + ")";
}

// The bindings release the GIL around the set-up calls, so the sleeps below
// hold nothing Python needs.
void AwaitComms(const std::vector<ncclComm_t>& comms, uint64_t timeout_ms, const char* step,
                const std::string& who) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(std::min(timeout_ms, kMaxSetupTimeoutMs));
  std::chrono::microseconds pause = kFirstPollPause;
  std::vector<bool> done(comms.size(), false);
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < comms.size(); ++i) {
      if (done[i]) continue;
      ncclResult_t state = ncclInProgress;
      CheckNccl(ncclCommGetAsyncError(comms[i], &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) {
        done[i] = true;
      } else if (state == ncclInProgress) {
        all = false;
      } else {
        Fail(std::string("jax_llar: ") + step + " failed for " + who + ": " +
             ncclGetErrorString(state) + " (" + ncclGetLastError(nullptr) + ")");
      }
    }
    if (all) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      Fail(std::string("jax_llar: ") + step + " did not complete within " +
           std::to_string(timeout_ms) + " ms for " + who +
           ": a process of the group may have died or not reached this step");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, kLongestPollPause);
  }
}

std::vector<ncclComm_t> CommsOf(const std::vector<std::unique_ptr<DeviceResources>>& all,
                                size_t first, int n) {
  std::vector<ncclComm_t> comms;
  for (int i = 0; i < n; ++i) comms.push_back(all[first + i]->comm);
  return comms;
}

}  // namespace registry
}  // namespace llar
