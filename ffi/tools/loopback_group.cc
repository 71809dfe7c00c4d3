// Loopback groups (loopback_group.h): set-up, lookup and teardown. The
// handlers are in loopback_group_handlers.cc.
#include "loopback_group.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "errors.h"
#include "kernels/kernels.h"
#include "llar/args.h"
#include "loopback.h"
#include "loopback_group_internal.h"

namespace llar {
namespace {

// The harness's bound on a kernel timeout (loopback.cc): ten minutes.
constexpr uint64_t kMaxTimeoutNs = 600'000'000'000ull;

[[noreturn]] void BadArgument(const std::string& what) {
  throw std::invalid_argument("jax_llar loopback group: " + what);
}

std::mutex& GroupsMutex() {
  static std::mutex mu;
  return mu;
}
std::map<int64_t, std::shared_ptr<LoopbackGroup>>& Groups() {
  static auto* groups = new std::map<int64_t, std::shared_ptr<LoopbackGroup>>();
  return *groups;
}
// Withdrawn groups: their memory stays for the life of the process, as the
// registry keeps a set's (registry.h).
std::vector<std::shared_ptr<LoopbackGroup>>& Retired() {
  static auto* retired = new std::vector<std::shared_ptr<LoopbackGroup>>();
  return *retired;
}
int64_t& LastId() {
  static int64_t id = 0;
  return id;
}

// Frees what `g` holds on its device (current device set by the caller);
// errors are ignored (after a trap the context is lost).
void FreeGroup(LoopbackGroup* g) {
  for (LoopbackRank& r : g->ranks) {
    if (r.stream != nullptr) (void)cudaStreamDestroy(r.stream);
    if (r.done != nullptr) (void)cudaEventDestroy(r.done);
    if (r.state != nullptr) (void)cudaFree(r.state);
    if (r.record != nullptr) (void)cudaFreeHost(r.record);
    for (char* s : r.scratch) {
      if (s != nullptr) (void)cudaFree(s);
    }
    for (PeerTable* t : r.tables) {
      if (t != nullptr) (void)cudaFree(t);
    }
  }
  if (g->fork != nullptr) (void)cudaEventDestroy(g->fork);
  (void)cudaGetLastError();
}

// The bounded wait for the group's rank streams (loopback.h).
cudaError_t WaitStreams(const LoopbackGroup& g, std::chrono::steady_clock::time_point deadline) {
  std::vector<cudaStream_t> streams;
  for (const LoopbackRank& r : g.ranks) streams.push_back(r.stream);
  return WaitForStreams(streams, deadline);
}

std::shared_ptr<LoopbackGroup> Find(int64_t id) {
  std::lock_guard<std::mutex> lock(GroupsMutex());
  auto it = Groups().find(id);
  if (it == Groups().end()) BadArgument("no loopback group " + std::to_string(id));
  return it->second;
}

}  // namespace

std::shared_ptr<LoopbackGroup> FindLoopbackGroup(int64_t id) {
  std::lock_guard<std::mutex> lock(GroupsMutex());
  auto it = Groups().find(id);
  return it == Groups().end() ? nullptr : it->second;
}

int64_t CreateLoopbackGroup(int32_t ordinal, int world, const std::vector<int64_t>& algorithms,
                            uint64_t timeout_ns) {
  if (world < 2 || world > kMaxRanks) {
    BadArgument("world must be 2-" + std::to_string(kMaxRanks) + ", not " +
                std::to_string(world));
  }
  if (timeout_ns == 0 || timeout_ns > kMaxTimeoutNs) {
    BadArgument("the timeout must be 1 ns - 600000 ms");
  }
  if (algorithms.empty()) BadArgument("name at least one algorithm");
  std::vector<int64_t> ids = algorithms;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int64_t a : ids) {
    const AlgorithmEntry* entry = FindAlgorithm(a);
    if (entry == nullptr) BadArgument("unknown algorithm id " + std::to_string(a));
    if (entry->lla2a_slots != nullptr) {
      BadArgument(std::string(entry->name) +
                  " runs on NCCL's LL all-to-all session, which needs a device communicator "
                  "over distinct GPUs; a loopback group makes no NCCL call");
    }
  }
  auto g = std::make_shared<LoopbackGroup>();
  g->ordinal = ordinal;
  g->world = world;
  g->timeout_ns = timeout_ns;
  g->algorithms = ids;
  g->ranks.resize(world);
  for (LoopbackRank& r : g->ranks) {
    r.scratch.assign(kAlgorithmCount, nullptr);
    r.tables.assign(kAlgorithmCount, nullptr);
  }
  for (auto& per_rank : g->args) per_rank.assign(world, AllReduceArgs{});

  DeviceGuard guard;
  CheckCuda(cudaSetDevice(ordinal), "cudaSetDevice");
  try {
    // As EnsureRegion: every kernel loaded before any runs (a lazy load can
    // wait for kernels that spin on their peers). The fused kernel runs on
    // the one-shot LL's region, so it is loaded with it.
    for (int64_t a : ids) {
      CheckCuda(kAlgorithms[a].preload(),
                (std::string("loading the ") + kAlgorithms[a].name + " kernels").c_str());
    }
    if (std::find(ids.begin(), ids.end(), static_cast<int64_t>(Algorithm::kOneShotLL)) !=
        ids.end()) {
      CheckCuda(PreloadOneShotLLAddRmsNorm(), "loading the fused kernels");
    }
    CheckCuda(cudaEventCreateWithFlags(&g->fork, cudaEventDisableTiming),
              "cudaEventCreate(fork)");
    const size_t state_bytes = sizeof(uint64_t) * kStateWords;
    for (LoopbackRank& r : g->ranks) {
      CheckCuda(cudaMalloc(&r.state, state_bytes), "cudaMalloc(state words)");
      CheckCuda(cudaMemset(r.state, 0, state_bytes), "cudaMemset(state words)");
      CheckCuda(cudaHostAlloc(reinterpret_cast<void**>(&r.record), sizeof(ErrorRecord),
                              cudaHostAllocMapped | cudaHostAllocPortable),
                "cudaHostAlloc(error record)");
      std::memset(r.record, 0, sizeof(ErrorRecord));
      CheckCuda(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking),
                "cudaStreamCreateWithFlags");
      CheckCuda(cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming),
                "cudaEventCreate(join)");
    }
    for (int64_t a : ids) {
      const size_t bytes = RegionBytes(static_cast<Algorithm>(a), world);
      for (LoopbackRank& r : g->ranks) {
        CheckCuda(cudaMalloc(&r.scratch[a], bytes), "cudaMalloc(region)");
        CheckCuda(cudaMemset(r.scratch[a], kAlgorithms[a].fill, bytes), "cudaMemset(region)");
        CheckCuda(cudaMalloc(&r.tables[a], sizeof(PeerTable)), "cudaMalloc(peer table)");
      }
      for (int rank = 0; rank < world; ++rank) {
        LoopbackRank& r = g->ranks[rank];
        PeerTable table{};
        for (int p = 0; p < world; ++p) table.scratch[p] = g->ranks[p].scratch[a];
        table.error_claim = reinterpret_cast<int32_t*>(r.state + kClaimWord);
        CheckCuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&table.error), r.record, 0),
                  "cudaHostGetDevicePointer");
        table.timeout_ns = timeout_ns;
        CheckCuda(cudaMemcpy(r.tables[a], &table, sizeof(table), cudaMemcpyHostToDevice),
                  "cudaMemcpy(peer table)");
        AllReduceArgs& args = g->args[a][rank];
        args.epochs = r.state + EpochSetOffset(static_cast<Algorithm>(a));
        args.peers = r.tables[a];
        args.rank = static_cast<uint8_t>(rank);
        args.world = static_cast<uint8_t>(world);
      }
    }
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after the set-up)");
  } catch (...) {
    FreeGroup(g.get());
    throw;
  }
  std::lock_guard<std::mutex> lock(GroupsMutex());
  g->id = ++LastId();
  Groups()[g->id] = g;
  return g->id;
}

void DestroyLoopbackGroup(int64_t id) {
  std::shared_ptr<LoopbackGroup> g;
  {
    std::lock_guard<std::mutex> lock(GroupsMutex());
    auto it = Groups().find(id);
    if (it == Groups().end()) BadArgument("no loopback group " + std::to_string(id));
    g = it->second;
    Groups().erase(it);  // withdrawn: the handlers find it no more
    // Kept: a command buffer captured earlier holds its addresses.
    Retired().push_back(g);
  }
  std::lock_guard<std::mutex> call_lock(g->mu);  // no call of it is being launched
  DeviceGuard guard;
  CheckCuda(cudaSetDevice(g->ordinal), "cudaSetDevice");
  const cudaError_t e = WaitStreams(
      *g, std::chrono::steady_clock::now() +
              std::chrono::nanoseconds(2 * g->timeout_ns + kHostMarginNs));
  if (e == cudaErrorNotReady) {
    throw std::runtime_error("jax_llar loopback group " + std::to_string(id) +
                             ": kernels still ran at the host deadline");
  }
  if (e != cudaSuccess) {
    throw std::runtime_error("jax_llar loopback group " + std::to_string(id) +
                             ": its streams failed: " + CudaErrorText(e));
  }
}

LoopbackGroupInfo LoopbackGroupInfoOf(int64_t id) {
  const std::shared_ptr<LoopbackGroup> g = Find(id);
  LoopbackGroupInfo info;
  info.ordinal = g->ordinal;
  info.world = g->world;
  info.algorithms = g->algorithms;
  info.timeout_ns = g->timeout_ns;
  return info;
}

std::vector<ErrorRecord> LoopbackGroupRecords(int64_t id) {
  const std::shared_ptr<LoopbackGroup> g = Find(id);
  std::vector<ErrorRecord> out(g->world);
  for (int r = 0; r < g->world; ++r) {
    std::memcpy(&out[r], const_cast<const ErrorRecord*>(g->ranks[r].record), sizeof(ErrorRecord));
  }
  return out;
}

std::vector<std::vector<uint64_t>> LoopbackGroupState(int64_t id) {
  const std::shared_ptr<LoopbackGroup> g = Find(id);
  std::lock_guard<std::mutex> call_lock(g->mu);
  DeviceGuard guard;
  CheckCuda(cudaSetDevice(g->ordinal), "cudaSetDevice");
  const cudaError_t e = WaitStreams(
      *g, std::chrono::steady_clock::now() +
              std::chrono::nanoseconds(2 * g->timeout_ns + kHostMarginNs));
  if (e == cudaErrorNotReady) {
    throw std::runtime_error("jax_llar loopback group: kernels still ran at the host deadline");
  }
  CheckCuda(e, "the rank streams");
  std::vector<std::vector<uint64_t>> out(g->world, std::vector<uint64_t>(kStateWords));
  for (int r = 0; r < g->world; ++r) {
    CheckCuda(cudaMemcpy(out[r].data(), g->ranks[r].state, sizeof(uint64_t) * kStateWords,
                         cudaMemcpyDeviceToHost),
              "cudaMemcpy(state words)");
  }
  return out;
}

}  // namespace llar
