// Communicator sets: creation (whole groups and groups that span processes),
// destruction of an unused set, the lock-free lookups and the queries over
// sets. Regions are registry/regions.cc's.
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "kernels/kernels.h"
#include "registry.h"
#include "registry/collective_step.h"
#include "registry/internal.h"
#include "registry/nccl_settings.h"

namespace llar {
namespace registry {

std::mutex g_mutex;
std::vector<std::unique_ptr<CommSet>>& g_sets = *new std::vector<std::unique_ptr<CommSet>>(1);
std::vector<cudaError_t (*)()> g_preloads;
std::array<std::array<std::atomic<const DeviceContext*>, kMaxOrdinals>, kMaxCommSets> g_table{};
std::array<std::atomic<int64_t>, kMaxCommSets> g_keys{};
std::array<std::atomic<uint32_t>, kMaxCommSets> g_region_masks{};

CommSet& SetOf(int64_t comm_id) {
  if (comm_id <= 0 || comm_id >= static_cast<int64_t>(g_sets.size())) {
    Fail("jax_llar: no communicator set " + std::to_string(comm_id));
  }
  return *g_sets[comm_id];
}

namespace {

void ValidateGroups(const std::vector<GroupSpec>& groups, uint64_t setup_timeout_ms) {
  if (groups.empty()) Fail("jax_llar: no replica groups given");
  if (std::any_of(groups.begin(), groups.end(), Spans)) {
    if (setup_timeout_ms == 0) {
      Fail("jax_llar: a replica group that spans processes needs a set-up bound "
           "(setup_timeout_ms > 0)");
    }
    RefuseForcedBlocking();
  }
  const int n_dev = CudaDeviceCount();
  std::set<int> seen;
  for (const auto& g : groups) {
    if (g.world < 2 || g.world > kMaxRanks) {
      std::ostringstream m;
      m << "jax_llar: a replica group has " << g.world
        << " ranks; the fast path serves 2.." << kMaxRanks;
      Fail(m.str());
    }
    if (g.ranks.empty() || g.ranks.size() != g.ordinals.size()) {
      Fail("jax_llar: a replica group needs as many ranks as CUDA ordinals, at least one");
    }
    for (size_t i = 0; i < g.ranks.size(); ++i) {
      if (g.ranks[i] < 0 || g.ranks[i] >= g.world || (i > 0 && g.ranks[i] <= g.ranks[i - 1])) {
        Fail("jax_llar: a replica group's ranks must ascend within 0.." +
             std::to_string(g.world - 1));
      }
    }
    if (g.unique_id.empty() ? static_cast<int>(g.ranks.size()) != g.world
                            : g.unique_id.size() != sizeof(ncclUniqueId)) {
      Fail(g.unique_id.empty()
               ? "jax_llar: a replica group without an NCCL unique id must hold every rank"
               : "jax_llar: an NCCL unique id has " + std::to_string(sizeof(ncclUniqueId)) +
                     " bytes, not " + std::to_string(g.unique_id.size()));
    }
    for (int d : g.ordinals) {
      if (d < 0 || d >= n_dev || d >= kMaxOrdinals) {
        Fail("jax_llar: CUDA ordinal " + std::to_string(d) +
             " is not a visible device");
      }
      if (!seen.insert(d).second) {
        Fail("jax_llar: CUDA ordinal " + std::to_string(d) +
             " appears in two replica groups");
      }
    }
    // Peers in other processes are checked by NCCL (one LSA team, CreateGroup).
    for (int a : g.ordinals) {
      for (int b : g.ordinals) {
        if (a != b && !CanAccessPeer(a, b)) {
          Fail("jax_llar: devices " + std::to_string(a) + " and " +
               std::to_string(b) + " are not peer (load/store) accessible");
        }
      }
    }
  }
}

// Releases what CreateGroup made for devices that no program can have used
// (a creation that failed part-way, or DestroyCommSet): aborts each
// communicator (local: it frees NCCL's resources, device communicators
// included, without waiting for another process), then frees the state words
// and error records. Best effort: errors are ignored and cleared.
void ReleaseDevices(std::vector<std::unique_ptr<DeviceResources>>& devices) {
  for (auto& d : devices) {
    if (d->comm != nullptr) (void)ncclCommAbort(d->comm);
    d->comm = nullptr;
  }
  for (auto& d : devices) {
    if (d->state != nullptr && cudaSetDevice(d->context.ordinal) == cudaSuccess) {
      (void)cudaFree(d->state);
    }
    if (d->error != nullptr) (void)cudaFreeHost(d->error);
  }
  (void)cudaGetLastError();
  devices.clear();
}

// Builds one group's communicators, device communicators and state for this
// process's members, appended to `out` (rank order) before anything of them
// is created, so that on a failure the caller's ReleaseDevices reaches all
// that exists. A spanning group's collective steps are bounded by
// `setup_timeout_ms` each.
void CreateGroup(const GroupSpec& spec, uint64_t timeout_ns, uint64_t setup_timeout_ms,
                 std::vector<std::unique_ptr<DeviceResources>>& out) {
  const std::vector<int>& group = spec.ordinals;
  const int n = static_cast<int>(group.size());  // this process's members
  const int world = spec.world;
  const StepBound bound{Spans(spec), setup_timeout_ms, MembersText(spec.ranks, group, world)};
  const size_t first = out.size();
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<DeviceResources>());
    DeviceResources& d = *out.back();
    d.context.ordinal = group[i];
    d.context.rank = spec.ranks[i];
    d.context.world = world;
    for (int64_t a = 1; a < kAlgorithmCount; ++a) d.launchers[a] = kAlgorithms[a].launch;
  }

  if (!bound.nonblocking) {
    std::vector<ncclComm_t> comms(n);
    CheckNccl(ncclCommInitAll(comms.data(), n, group.data()), "ncclCommInitAll");
    for (int i = 0; i < n; ++i) out[first + i]->comm = comms[i];
  } else {
    ncclUniqueId id;
    std::memcpy(&id, spec.unique_id.data(), sizeof(id));
    // Collective over the group's processes, grouped for several local
    // ranks, non-blocking: NCCL returns each handle at once, so
    // ReleaseDevices can abort a creation still in progress.
    CollectiveStep(bound, out, first, n, "ncclCommInitRank", [&] {
      for (int i = 0; i < n; ++i) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        CheckCuda(cudaSetDevice(group[i]), "cudaSetDevice");
        CheckStep(bound,
                  ncclCommInitRankConfig(&out[first + i]->comm, world, id, spec.ranks[i],
                                         &config),
                  "ncclCommInitRank");
      }
    });
  }

  for (int i = 0; i < n; ++i) {
    DeviceResources& d = *out[first + i];
    CheckCuda(cudaSetDevice(group[i]), "cudaSetDevice");
    CheckCuda(cudaMalloc(&d.state, sizeof(uint64_t) * kStateWords), "cudaMalloc(epochs)");
    CheckCuda(cudaMemset(d.state, 0, sizeof(uint64_t) * kStateWords),
              "cudaMemset(epochs)");
    CheckCuda(cudaHostAlloc(reinterpret_cast<void**>(&d.error), sizeof(ErrorRecord),
                            cudaHostAllocMapped | cudaHostAllocPortable),
              "cudaHostAlloc(error record)");
    std::memset(d.error, 0, sizeof(ErrorRecord));
    d.timeout_ns = timeout_ns;
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  // Device communicators are collective over the group; one thread drives
  // every local rank, so the calls are grouped.
  ncclDevCommRequirements reqs;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
  reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  std::memset(&reqs, 0, sizeof(reqs));  // 2.28/2.29 have no initializer macro
#endif
  CollectiveStep(bound, out, first, n, "ncclDevCommCreate", [&] {
    for (int i = 0; i < n; ++i) {
      CheckStep(bound, ncclDevCommCreate(out[first + i]->comm, &reqs, &out[first + i]->dev_comm),
                "ncclDevCommCreate");
    }
  });

  for (int i = 0; i < n; ++i) {
    DeviceResources& d = *out[first + i];
    const int rank = spec.ranks[i];
    if (d.dev_comm.rank != rank || d.dev_comm.nRanks != world ||
        d.dev_comm.lsaSize != world || d.dev_comm.lsaRank != rank) {
      std::ostringstream m;
      m << "jax_llar: NCCL does not place all " << world
        << " ranks in one load/store-accessible (LSA) team (rank " << rank
        << ": lsaRank " << d.dev_comm.lsaRank << ", lsaSize "
        << d.dev_comm.lsaSize << ")";
      Fail(m.str());
    }
    // Every kernel now, while nothing of the set runs: a lazy module load
    // later could wait for running kernels that wait for their peers.
    CheckCuda(cudaSetDevice(group[i]), "cudaSetDevice");
    for (int64_t a = 1; a < kAlgorithmCount; ++a) {
      CheckCuda(kAlgorithms[a].preload(),
                (std::string("loading the ") + kAlgorithms[a].name + " kernels").c_str());
    }
    CheckCuda(PreloadOneShotLLAddRmsNorm(), "loading the fused add + RMSNorm kernels");
  }
}

// Runs `preloads` on every device of `set`, ignoring their results
// (AddPreload). The caller holds g_mutex and a DeviceGuard.
void RunPreloadsBestEffort(const CommSet& set, const std::vector<cudaError_t (*)()>& preloads) {
  for (const auto& d : set.devices) {
    if (cudaSetDevice(d->context.ordinal) != cudaSuccess) {
      (void)cudaGetLastError();  // leave no error behind for a later check
      continue;
    }
    for (auto preload : preloads) (void)preload();
  }
}

}  // namespace
}  // namespace registry

using namespace registry;  // the API below works on the registry's state

int CreateCommSet(const std::vector<std::vector<int>>& groups, uint64_t timeout_ns) {
  std::vector<GroupSpec> specs;
  for (const auto& g : groups) {
    GroupSpec spec;
    spec.world = static_cast<int>(g.size());
    spec.ordinals = g;
    for (int r = 0; r < spec.world; ++r) spec.ranks.push_back(r);
    specs.push_back(std::move(spec));
  }
  return CreateCommSetOfRanks(specs, timeout_ns, /*setup_timeout_ms=*/0);  // no spanning group
}

int CreateCommSetOfRanks(const std::vector<GroupSpec>& groups, uint64_t timeout_ns,
                         uint64_t setup_timeout_ms) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_sets.size() >= static_cast<size_t>(kMaxCommSets)) {
    Fail("jax_llar: too many communicator sets (" + std::to_string(kMaxCommSets) + ")");
  }
  ValidateGroups(groups, setup_timeout_ms);
  DeviceGuard guard;
  auto set = std::make_unique<CommSet>();
  set->groups = groups;
  set->setup_timeout_ms = setup_timeout_ms;
  try {
    for (const auto& g : groups) CreateGroup(g, timeout_ns, setup_timeout_ms, set->devices);
  } catch (const CollectiveStepFailed& e) {
    ReleaseDevices(set->devices);
    Fail(std::string(e.what()) + "; this process aborted its communicators of the set");
  } catch (...) {
    ReleaseDevices(set->devices);
    throw;
  }
  const int id = static_cast<int>(g_sets.size());
  for (const auto& d : set->devices) {
    g_table[id][d->context.ordinal].store(&d->context, std::memory_order_release);
  }
  g_keys[id].store(KeyOfGroups(groups), std::memory_order_release);
  g_sets.push_back(std::move(set));
  // The tools' kernels, only once the set is published: they never fail it.
  RunPreloadsBestEffort(*g_sets.back(), g_preloads);
  return id;
}

void DestroyCommSet(int64_t comm_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CommSet& set = SetOf(comm_id);
  if (set.destroyed) return;
  for (const auto& d : set.devices) {
    for (int64_t a = 1; a < kAlgorithmCount; ++a) {
      if (d->regions[a]) {
        Fail("jax_llar: communicator set " + std::to_string(comm_id) + " holds the " +
             kAlgorithms[a].name +
             " scratch region, so a program may have been compiled with it; it is kept "
             "for the life of the process (only a set without regions can be destroyed)");
      }
    }
  }
  // Withdrawn before anything is freed: instantiate (KeyOf) and execute
  // (Lookup) find no set, EnsureRegion throws `failed`.
  g_keys[comm_id].store(0, std::memory_order_release);
  g_region_masks[comm_id].store(0, std::memory_order_release);
  for (const auto& d : set.devices) {
    g_table[comm_id][d->context.ordinal].store(nullptr, std::memory_order_release);
  }
  set.failed = "jax_llar: communicator set " + std::to_string(comm_id) + " was destroyed";
  set.destroyed = true;
  DeviceGuard guard;
  ReleaseDevices(set.devices);
  set.groups.clear();
}

std::string NcclUniqueId() {
  ncclUniqueId id;
  CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

const DeviceContext* Lookup(int64_t comm_id, int32_t ordinal) {
  if (comm_id <= 0 || comm_id >= kMaxCommSets || ordinal < 0 || ordinal >= kMaxOrdinals) {
    return nullptr;
  }
  return g_table[comm_id][ordinal].load(std::memory_order_acquire);
}

// FNV-1a over each group's number of ranks and this process's ranks and
// ordinals, with a separator per group.
int64_t KeyOfGroups(const std::vector<GroupSpec>& groups) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  for (const auto& g : groups) {
    mix(0x10000ull + static_cast<uint64_t>(g.world));
    for (size_t i = 0; i < g.ordinals.size(); ++i) {
      mix(0x20000ull + static_cast<uint64_t>(g.ranks[i]));
      mix(static_cast<uint64_t>(g.ordinals[i]) + 1);
    }
    mix(0xffffull);  // group separator
  }
  return static_cast<int64_t>(h & 0x7fffffffffffffffull);
}

int64_t KeyOf(int64_t comm_id) {
  if (comm_id <= 0 || comm_id >= kMaxCommSets) return 0;
  return g_keys[comm_id].load(std::memory_order_acquire);
}

std::vector<ErrorReport> ErrorReports() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<ErrorReport> out;
  for (size_t id = 1; id < g_sets.size(); ++id) {
    for (const auto& d : g_sets[id]->devices) {
      ErrorRecord r;
      std::memcpy(&r, const_cast<const ErrorRecord*>(d->error), sizeof(r));
      if (r.code != 0) out.push_back({static_cast<int64_t>(id), d->context.ordinal, r});
    }
  }
  return out;
}

std::vector<std::vector<Member>> MembersOf(int64_t comm_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (comm_id <= 0 || comm_id >= static_cast<int64_t>(g_sets.size())) return {};
  const CommSet& set = *g_sets[comm_id];
  for (const auto& g : set.groups) {
    if (static_cast<int>(g.ordinals.size()) != g.world) {
      Fail("jax_llar: communicator set " + std::to_string(comm_id) +
           " spans processes; the tools (kernel bench, call trace, test hooks) serve only "
           "sets whose ranks are all in this process");
    }
  }
  std::vector<std::vector<Member>> out;
  size_t next = 0;  // set.devices holds the groups' devices in order
  for (const auto& g : set.groups) {
    std::vector<Member> members;
    for (size_t i = 0; i < g.ordinals.size(); ++i, ++next) {
      const DeviceResources& d = *set.devices[next];
      std::vector<MemberRegion> regions(kAlgorithmCount);
      for (int64_t a = 1; a < kAlgorithmCount; ++a) {
        if (d.regions[a]) regions[a] = {d.regions[a]->scratch, d.regions[a]->bytes};
      }
      members.push_back({d.context.ordinal, d.context.rank, d.context.world, d.comm, d.state,
                         std::move(regions), &d.context});
    }
    out.push_back(std::move(members));
  }
  return out;
}

void AddPreload(cudaError_t (*preload)()) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (std::find(g_preloads.begin(), g_preloads.end(), preload) != g_preloads.end()) return;
  g_preloads.push_back(preload);
  if (g_sets.size() <= 1) return;  // no set: no CUDA call (not even DeviceGuard's)
  DeviceGuard guard;
  for (size_t id = 1; id < g_sets.size(); ++id) RunPreloadsBestEffort(*g_sets[id], {preload});
}

int NcclRuntimeVersion() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return -1;
  return v;
}

int NcclCompiledVersion() { return NCCL_VERSION_CODE; }

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

bool CanAccessPeer(int a, int b) {
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess) return false;
  return can != 0;
}

}  // namespace llar
