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

namespace llar {
namespace {

// What the hooks changed on one device of one set.
struct DeviceHooks {
  bool trace_on = false;
  bool drop = false;
  uint64_t* trace_buffer = nullptr;  // allocated at the first EnableCallTrace, kept
};

std::mutex g_mutex;  // guards g_hooks and serialises the hooks
std::map<std::pair<int64_t, int32_t>, DeviceHooks> g_hooks;

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
  if (h.drop) {
    launcher = &LaunchOneShotLLDropPeerWrites;
  } else if (h.trace_on) {
    launcher = &LaunchOneShotLLTraced;
  }
  // Both variants replace the one-shot algorithm only.
  SetLauncherOverride(comm_id, ordinal, static_cast<int64_t>(Algorithm::kOneShotLL), launcher);
}

void SetCallTrace(int64_t comm_id, bool on) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceGuard guard;
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
    const PeerTable* table = m.context->base.peers;
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
  uint64_t epoch = 0;
  CheckCuda(cudaMemcpy(&epoch, m.context->base.epochs, sizeof(epoch), cudaMemcpyDeviceToHost),
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

void SetEpochForTesting(int64_t comm_id, uint64_t epoch) {
  const std::vector<Member> members = AllMembers(comm_id);
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceGuard guard;
  for (const Member& m : members) {
    CheckCuda(cudaSetDevice(m.ordinal), "cudaSetDevice");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  const std::vector<uint64_t> epochs(kEpochCounters, epoch);
  for (const Member& m : members) {
    CheckCuda(cudaSetDevice(m.ordinal), "cudaSetDevice");
    // Both sets of counters: the one-shot's and the two-shot's (args.h).
    for (int set : {0, kTwoShotEpochs}) {
      CheckCuda(cudaMemcpy(m.context->base.epochs + set, epochs.data(),
                           sizeof(uint64_t) * kEpochCounters, cudaMemcpyHostToDevice),
                "cudaMemcpy(epochs)");
    }
    CheckCuda(cudaMemset(m.scratch, 0, m.scratch_bytes), "cudaMemset(scratch)");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
}

void SetDropPeerWritesForTesting(int64_t comm_id, int32_t ordinal, bool drop) {
  MemberOn(comm_id, ordinal);  // throws for an unknown set or device
  std::lock_guard<std::mutex> lock(g_mutex);
  if (drop) {
    DeviceGuard guard;
    LoadToolKernels(ordinal);  // the drop variant, before the override names it
  }
  DeviceHooks& h = g_hooks[{comm_id, ordinal}];
  h.drop = drop;
  ApplyOverride(comm_id, ordinal, h);
}

}  // namespace llar
