#include "hooks.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "kernels/kernels.h"
#include "llar/args.h"
#include "one_shot_ll_diag.h"
#include "preload.h"
#include "registry.h"
#include "registry/seams.h"

namespace llar {
namespace {

// What the hooks changed on one device of one set.
struct DeviceHooks {
  bool trace_on = false;
  Fault fault = Fault::kNone;
  uint64_t* trace_buffer = nullptr;  // allocated at the first EnableCallTrace, kept
};

std::mutex g_mutex;  // guards g_hooks and serialises the hooks
std::map<std::pair<int64_t, int32_t>, DeviceHooks> g_hooks;

constexpr int64_t kOneShot = static_cast<int64_t>(Algorithm::kOneShotLL);

// The one-shot's argument block of a member (its region exists: the hooks
// ensure it first, as a lowering would).
const AllReduceArgs& OneShotArgs(const Member& m) {
  const AllReduceArgs* a = ArgsOf(m.context, kOneShot);
  if (a == nullptr) Fail("jax_llar: the one-shot region is missing on CUDA device " +
                         std::to_string(m.ordinal));
  return *a;
}

std::vector<Member> AllMembers(int64_t comm_id) {
  std::vector<Member> all;
  for (const auto& group : MembersOf(comm_id)) all.insert(all.end(), group.begin(), group.end());
  if (all.empty()) Fail("jax_llar: unknown communicator set " + std::to_string(comm_id));
  return all;
}

Member MemberOn(int64_t comm_id, int32_t ordinal) {
  for (const Member& m : AllMembers(comm_id)) {
    if (m.ordinal == ordinal) return m;
  }
  Fail("jax_llar: communicator set " + std::to_string(comm_id) +
       " has no member on CUDA device " + std::to_string(ordinal));
}

// The launcher a device's programs should capture, given its hooks.
void ApplyOverride(int64_t comm_id, int32_t ordinal, const DeviceHooks& h) {
  Launcher launcher = nullptr;
  switch (h.fault) {
    case Fault::kDropPeerWrites:
      launcher = &LaunchOneShotLLDropPeerWrites;
      break;
    case Fault::kCorruptFlag:
      launcher = &LaunchOneShotLLCorruptFlag;
      break;
    case Fault::kDelayRank:
      launcher = &LaunchOneShotLLDelayRank;
      break;
    case Fault::kNone:
      if (h.trace_on) launcher = &LaunchOneShotLLTraced;
      break;
  }
  // Every variant replaces the one-shot algorithm only.
  SetLauncherOverride(comm_id, ordinal, static_cast<int64_t>(Algorithm::kOneShotLL), launcher);
}

void SetCallTrace(int64_t comm_id, bool on) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceGuard guard;
  AllMembers(comm_id);  // throws for an unknown set
  EnsureRegion(comm_id, kOneShot);  // the trace pointer lives in its peer table
  const std::vector<Member> members = AllMembers(comm_id);
  // The traced variant is loaded on every device before any override
  // changes (disabling only returns to launchers loaded before).
  if (on) {
    for (const Member& m : members) LoadToolKernels(m.ordinal);
  }
  for (const Member& m : members) {
    DeviceHooks& h = g_hooks[{comm_id, m.ordinal}];
    CheckCuda(cudaSetDevice(m.ordinal), "cudaSetDevice");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const size_t bytes = sizeof(uint64_t) * 2 * kTraceSlots;
    if (on && h.trace_buffer == nullptr) {
      CheckCuda(cudaMalloc(&h.trace_buffer, bytes), "cudaMalloc(trace)");
    }
    if (on) CheckCuda(cudaMemset(h.trace_buffer, 0, bytes), "cudaMemset(trace)");
    uint64_t* ptr = on ? h.trace_buffer : nullptr;
    const PeerTable* table = OneShotArgs(m).peers;
    CheckCuda(cudaMemcpy(reinterpret_cast<char*>(const_cast<PeerTable*>(table)) +
                             offsetof(PeerTable, trace),
                         &ptr, sizeof(ptr), cudaMemcpyHostToDevice),
              "cudaMemcpy(trace pointer)");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    h.trace_on = on;
    ApplyOverride(comm_id, m.ordinal, h);
  }
}

}  // namespace

void EnableCallTrace(int64_t comm_id) { SetCallTrace(comm_id, true); }
void DisableCallTrace(int64_t comm_id) { SetCallTrace(comm_id, false); }

std::pair<uint64_t, std::vector<uint64_t>> ReadCallTrace(int64_t comm_id,
                                                         int32_t ordinal) {
  const Member m = MemberOn(comm_id, ordinal);
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceGuard guard;
  CheckCuda(cudaSetDevice(ordinal), "cudaSetDevice");
  CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // The one-shot's first counter (0 before its region exists: no call ran).
  uint64_t epoch = 0;
  CheckCuda(cudaMemcpy(&epoch, m.state + EpochSetOffset(Algorithm::kOneShotLL), sizeof(epoch),
                       cudaMemcpyDeviceToHost),
            "cudaMemcpy(epoch)");
  std::vector<uint64_t> words;
  const auto it = g_hooks.find({comm_id, ordinal});
  if (it != g_hooks.end() && it->second.trace_buffer != nullptr) {
    words.resize(2 * kTraceSlots);
    CheckCuda(cudaMemcpy(words.data(), it->second.trace_buffer,
                         sizeof(uint64_t) * words.size(), cudaMemcpyDeviceToHost),
              "cudaMemcpy(trace)");
  }
  return {epoch, std::move(words)};
}

void SetEpochForTesting(int64_t comm_id, uint64_t epoch, int32_t ordinal) {
  const std::vector<Member> members =
      ordinal < 0 ? AllMembers(comm_id) : std::vector<Member>{MemberOn(comm_id, ordinal)};
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceGuard guard;
  for (const Member& m : members) {
    CheckCuda(cudaSetDevice(m.ordinal), "cudaSetDevice");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  const std::vector<uint64_t> epochs(kEpochCounters, epoch);
  for (const Member& m : members) {
    CheckCuda(cudaSetDevice(m.ordinal), "cudaSetDevice");
    // Every algorithm's counters, and every region back to its idle fill.
    for (int a = 1; a < kMaxAlgorithms; ++a) {
      CheckCuda(cudaMemcpy(m.state + EpochSetOffset(static_cast<Algorithm>(a)), epochs.data(),
                           sizeof(uint64_t) * kEpochCounters, cudaMemcpyHostToDevice),
                "cudaMemcpy(epochs)");
    }
    for (int64_t a = 1; a < kAlgorithmCount; ++a) {
      if (m.regions[a].scratch == nullptr) continue;
      CheckCuda(cudaMemset(m.regions[a].scratch, kAlgorithms[a].fill, m.regions[a].bytes),
                "cudaMemset(scratch)");
    }
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
}

void SetFaultForTesting(int64_t comm_id, int32_t ordinal, Fault fault) {
  MemberOn(comm_id, ordinal);  // throws for an unknown set or device
  std::lock_guard<std::mutex> lock(g_mutex);
  if (fault != Fault::kNone) {
    DeviceGuard guard;
    LoadToolKernels(ordinal);  // the fault's variant, before the override names it
  }
  DeviceHooks& h = g_hooks[{comm_id, ordinal}];
  h.fault = fault;
  ApplyOverride(comm_id, ordinal, h);
}

}  // namespace llar
