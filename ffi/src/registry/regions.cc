// Symmetric scratch regions: EnsureRegion, its agreement across the
// processes of a spanning group, publication of the devices' calls, and
// giving up a set whose registration failed (registry.h: EnsureRegion).
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "kernels/kernels.h"
#include "llar/args.h"
#include "llar/nccl_lla2a.h"
#include "lsa_pointers.h"
#include "registry.h"
#include "registry/collective_step.h"
#include "registry/internal.h"

namespace llar {
namespace registry {

void Publish(DeviceResources& d, int64_t algorithm) {
  Region& r = *d.regions[algorithm];
  const Launcher launch = d.launchers[algorithm];
  const AlgorithmCall* call = nullptr;
  for (const auto& c : r.calls) {
    if (c->launch == launch) call = c.get();
  }
  if (call == nullptr) {
    auto made = std::make_unique<AlgorithmCall>();
    made->args = r.args;
    made->launch = launch;
    call = made.get();
    r.calls.push_back(std::move(made));
  }
  d.context.calls[algorithm].store(call, std::memory_order_release);
}

namespace {

using Devices = std::vector<std::unique_ptr<DeviceResources>>;
using Regions = std::vector<std::unique_ptr<Region>>;

// A non-blocking stream of the current device, destroyed with the object:
// set-up work that must not wait for (or be waited for by) XLA's streams.
struct SetupStream {
  cudaStream_t stream = nullptr;
  SetupStream() {
    CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
  }
  ~SetupStream() {
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }
  SetupStream(const SetupStream&) = delete;
  SetupStream& operator=(const SetupStream&) = delete;
};

// What every step below works on: one group's local devices all[first ..
// first + n) of `world` ranks, and the bound of its collective steps.
// Programs of the set may be running: every CUDA call is on a stream of its
// own (or synchronous only with the host), never a device-wide
// synchronisation, and the kernels were loaded when the set was created.
struct GroupDevices {
  Devices& all;
  size_t first;
  int n;
  int world;
  StepBound bound;
};

// The scratch part of an LL all-to-all algorithm's region
// (AlgorithmEntry::lla2a_slots): per rank a device communicator of its own
// whose only resource is the sessions' buffer,
// ncclLLA2ACreateRequirement(kMaxBlocks, slots), created in a collective
// step (NCCL fills the handle's buffer offset when it completes), and its
// NcclLLA2AComm copied to device memory.
void CreateLLA2AComms(const GroupDevices& g, int64_t algorithm, Regions& regions) {
  const AlgorithmEntry& entry = kAlgorithms[algorithm];
  const int slots = entry.lla2a_slots(g.world);
  const uint64_t bytes = RegionBytes(static_cast<Algorithm>(algorithm), g.world);
  std::vector<ncclDevResourceRequirements> buffers(g.n);
  std::vector<ncclDevCommRequirements> reqs(g.n);
  for (int i = 0; i < g.n; ++i) {
    CheckNccl(ncclLLA2ACreateRequirement(kMaxBlocks, slots, &regions[i]->lla2a.handle,
                                         &buffers[i]),
              "ncclLLA2ACreateRequirement");
    if (buffers[i].bufferSize != bytes) {
      Fail(std::string("jax_llar: NCCL's LL all-to-all buffer for ") + entry.name + " is " +
           std::to_string(buffers[i].bufferSize) + " bytes per rank, not the " +
           std::to_string(bytes) + " that args.h (NcclLLA2ABufferBytes) expects of NCCL " +
           std::to_string(NCCL_VERSION_CODE));
    }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
    reqs[i] = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
    std::memset(&reqs[i], 0, sizeof(reqs[i]));  // 2.28/2.29 have no initializer macro
#endif
    reqs[i].resourceRequirementsList = &buffers[i];
    reqs[i].lsaMultimem = false;  // never NVLink multicast
  }
  CollectiveStep(g.bound, g.all, g.first, g.n, "ncclDevCommCreate (LL all-to-all)", [&] {
    for (int i = 0; i < g.n; ++i) {
      CheckStep(g.bound,
                ncclDevCommCreate(g.all[g.first + i]->comm, &reqs[i], &regions[i]->lla2a.comm),
                "ncclDevCommCreate (LL all-to-all)");
    }
  });
  for (auto& r : regions) r->lla2a_comm_created = true;  // ReleaseUnpublished destroys them
  for (int i = 0; i < g.n; ++i) {
    Region& r = *regions[i];
    const int rank = g.all[g.first + i]->context.rank;
    if (r.lla2a.comm.rank != rank || r.lla2a.comm.lsaSize != g.world ||
        r.lla2a.comm.lsaRank != rank || r.lla2a.handle.nSlots != static_cast<uint32_t>(slots)) {
      std::ostringstream m;
      m << "jax_llar: the LL all-to-all device communicator of rank " << rank << " of "
        << g.world << " has rank " << r.lla2a.comm.rank << ", lsaRank " << r.lla2a.comm.lsaRank
        << ", lsaSize " << r.lla2a.comm.lsaSize << " and " << r.lla2a.handle.nSlots
        << " slots (expected " << slots << ")";
      Fail(m.str());
    }
    CheckCuda(cudaSetDevice(g.all[g.first + i]->context.ordinal), "cudaSetDevice");
    SetupStream setup;
    CheckCuda(cudaMalloc(&r.lla2a_device, sizeof(NcclLLA2AComm)), "cudaMalloc(LL all-to-all)");
    CheckCuda(cudaMemcpyAsync(r.lla2a_device, &r.lla2a, sizeof(NcclLLA2AComm),
                              cudaMemcpyHostToDevice, setup.stream),
              "cudaMemcpyAsync(LL all-to-all)");
    CheckCuda(cudaStreamSynchronize(setup.stream), "cudaStreamSynchronize");
  }
}

// The local allocations (scratch, peer table) on each local device, each
// region pushed before its first allocation so that a failure leaves every
// allocation reachable for ReleaseUnpublished.
void AllocateRegions(const GroupDevices& g, uint64_t bytes, const AlgorithmEntry& entry,
                     bool lla2a, Regions& regions) {
  for (int i = 0; i < g.n; ++i) {
    DeviceResources& d = *g.all[g.first + i];
    regions.push_back(std::make_unique<Region>());
    Region* r = regions.back().get();
    r->bytes = bytes;
    CheckCuda(cudaSetDevice(d.context.ordinal), "cudaSetDevice");
    SetupStream setup;
    if (!lla2a) {
      CheckNccl(ncclMemAlloc(&r->scratch, bytes), "ncclMemAlloc");
      CheckCuda(cudaMemsetAsync(r->scratch, entry.fill, bytes, setup.stream),
                "cudaMemsetAsync(scratch)");
    }
    CheckCuda(cudaMalloc(&r->peers, sizeof(PeerTable)), "cudaMalloc(peer table)");
    CheckCuda(cudaStreamSynchronize(setup.stream), "cudaStreamSynchronize");
  }
}

// The collective registration (a symmetric window, or NCCL's LL all-to-all
// buffer) and each local device's peer table and argument block.
void FinishRegions(const GroupDevices& g, int64_t algorithm, uint64_t bytes, bool lla2a,
                   Regions& regions) {
  if (lla2a) {
    CreateLLA2AComms(g, algorithm, regions);
  } else {
    CollectiveStep(g.bound, g.all, g.first, g.n, "ncclCommWindowRegister", [&] {
      for (int i = 0; i < g.n; ++i) {
        CheckStep(g.bound,
                  ncclCommWindowRegister(g.all[g.first + i]->comm, regions[i]->scratch, bytes,
                                         &regions[i]->window, NCCL_WIN_COLL_SYMMETRIC),
                  "ncclCommWindowRegister");
      }
    });
  }
  for (int i = 0; i < g.n; ++i) {
    DeviceResources& d = *g.all[g.first + i];
    Region& r = *regions[i];
    CheckCuda(cudaSetDevice(d.context.ordinal), "cudaSetDevice");
    SetupStream setup;
    PeerTable table{};
    if (lla2a) {
      table.nccl_lla2a = r.lla2a_device;
    } else {
      void* peers[kMaxRanks] = {};
      CheckCuda(ReadLsaPointers(r.window, g.world, peers, setup.stream),
                "reading LSA peer pointers");
      for (int p = 0; p < g.world; ++p) table.scratch[p] = static_cast<char*>(peers[p]);
    }
    table.error_claim = reinterpret_cast<int32_t*>(d.state + kClaimWord);
    CheckCuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&table.error), d.error, 0),
              "cudaHostGetDevicePointer");
    table.timeout_ns = d.timeout_ns;
    CheckCuda(cudaMemcpyAsync(r.peers, &table, sizeof(table), cudaMemcpyHostToDevice,
                              setup.stream),
              "cudaMemcpyAsync(peer table)");
    CheckCuda(cudaStreamSynchronize(setup.stream), "cudaStreamSynchronize");
    r.args.epochs = d.state + EpochSetOffset(static_cast<Algorithm>(algorithm));
    r.args.peers = r.peers;
    r.args.rank = static_cast<uint8_t>(d.context.rank);
    r.args.world = static_cast<uint8_t>(g.world);
  }
}

// Calls `agree` for `stage`; a throw counts as a refusal.
bool Agree(const RegionAgreement& agree, int group, const char* stage,
           const std::string& local_error) {
  try {
    return agree(group, stage, local_error);
  } catch (...) {
    return false;
  }
}

// A region up to publication: fills `regions` (one per local device of the
// group). Returns when every process of the group (this one alone without
// `agree`) completed it; throws CollectiveStepFailed when the set must be
// given up (EnsureRegion's rule), std::runtime_error for a failure that
// leaves the set as it was.
void BuildRegions(const GroupDevices& g, int64_t comm_id, int64_t algorithm, int group,
                  const RegionAgreement* agree, Regions& regions) {
  const AlgorithmEntry& entry = kAlgorithms[algorithm];
  const uint64_t bytes = RegionBytes(static_cast<Algorithm>(algorithm), g.world);
  const bool lla2a = entry.lla2a_slots != nullptr;  // NCCL's buffer, no scratch of ours
  std::string local_error;
  try {
    AllocateRegions(g, bytes, entry, lla2a, regions);
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  // Every process learns whether every process allocated before any enters
  // the collective calls below.
  if (agree != nullptr && !Agree(*agree, group, kStageAllocated, local_error) &&
      local_error.empty()) {
    Fail(std::string("jax_llar: another process of the group could not allocate its ") +
         entry.name + " region (its error is in that process's log)");
  }
  if (!local_error.empty()) Fail(local_error);

  // The registration, then (stage "registered") the outcome in every
  // process before anything is published: a registration can complete in
  // one process while another's bound ran out just before it saw its own.
  std::string error;
  bool collective = false;  // the step itself failed: the set must be given up
  try {
    FinishRegions(g, algorithm, bytes, lla2a, regions);
    RegistrationSeam(comm_id,
                     lla2a ? "ncclDevCommCreate (LL all-to-all)" : "ncclCommWindowRegister",
                     g.bound.who);
  } catch (const CollectiveStepFailed& e) {
    error = e.what();
    collective = true;
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (agree == nullptr) {  // this process holds every rank of the group
    if (collective) throw CollectiveStepFailed(error);
    if (!error.empty()) Fail(error);
    return;
  }
  // A spanning group: every process publishes, or every process gives up
  // the set (the others' registrations completed, or may still complete,
  // with this process's memory).
  if (Agree(*agree, group, kStageRegistered, error) && error.empty()) return;
  throw CollectiveStepFailed(
      error.empty() ? std::string("jax_llar: another process of the group could not "
                                  "complete the registration of its ") +
                          entry.name + " region (its error is in that process's log)"
                    : error);
}

// Frees what BuildRegions allocated for regions never published, so that a
// later EnsureRegion, which tries again, leaks nothing. Without
// `comms_alive` (the communicators were aborted, releasing NCCL's part) only
// our memory is freed. Best effort: errors are ignored and cleared.
void ReleaseUnpublished(Devices& all, size_t first, Regions& regions, bool comms_alive) {
  bool windows = false, lla2a = false;
  for (const auto& r : regions) {
    windows = windows || (comms_alive && r->window != nullptr);
    lla2a = lla2a || (comms_alive && r->lla2a_comm_created);
  }
  if (windows) {  // grouped like the registration
    (void)ncclGroupStart();
    for (size_t i = 0; i < regions.size(); ++i) {
      if (regions[i]->window != nullptr) {
        (void)ncclCommWindowDeregister(all[first + i]->comm, regions[i]->window);
      }
    }
    (void)ncclGroupEnd();
  }
  if (lla2a) {
    (void)ncclGroupStart();
    for (size_t i = 0; i < regions.size(); ++i) {
      if (regions[i]->lla2a_comm_created) {
        (void)ncclDevCommDestroy(all[first + i]->comm, &regions[i]->lla2a.comm);
      }
    }
    (void)ncclGroupEnd();
  }
  for (size_t i = 0; i < regions.size(); ++i) {
    Region& r = *regions[i];
    if (cudaSetDevice(all[first + i]->context.ordinal) != cudaSuccess) continue;
    if (r.scratch != nullptr) (void)ncclMemFree(r.scratch);
    if (r.peers != nullptr) (void)cudaFree(r.peers);
    if (r.lla2a_device != nullptr) (void)cudaFree(r.lla2a_device);
  }
  (void)cudaGetLastError();
  regions.clear();
}

// Gives up `set` by EnsureRegion's rule: records `why`, withdraws every call
// (HasRegion false, the handler finds none), then, if the set never published
// a region (no program was launched with it), aborts its communicators,
// which stops NCCL's threads and ends the other processes' steps in an error
// instead of their bound. A set that published one keeps its communicators
// (ncclCommAbort would unmap the load/store-accessible range the published
// peer tables point into) and makes no NCCL call again. Returns whether it
// aborted them.
bool FailSet(CommSet& set, int64_t comm_id, const std::string& why) {
  bool published = false;
  for (const auto& d : set.devices) {
    for (const auto& r : d->regions) published = published || r != nullptr;
  }
  set.failed = why + "; this process gave up communicator set " + std::to_string(comm_id) +
               (published ? " (its regions withdrawn; its communicators and memory kept for "
                            "the programs already compiled with it)"
                          : " (its regions withdrawn, its communicators aborted)");
  g_region_masks[comm_id].store(0, std::memory_order_release);
  for (auto& d : set.devices) {
    for (auto& call : d->context.calls) call.store(nullptr, std::memory_order_release);
  }
  if (published) return false;
  for (auto& d : set.devices) {
    if (d->comm != nullptr) (void)ncclCommAbort(d->comm);
    d->comm = nullptr;
  }
  (void)cudaGetLastError();
  return true;
}

// Creates and publishes `algorithm`'s region on group `group` of `set`, whose
// local devices start at set.devices[first]. The caller holds g_mutex and a
// DeviceGuard. The region that failed a registration is freed only when the
// communicators were aborted; otherwise it is kept (CommSet::abandoned).
void CreateRegion(CommSet& set, int64_t comm_id, size_t group, size_t first, int64_t algorithm,
                  const RegionAgreement* agree) {
  const GroupSpec& spec = set.groups[group];
  const int n = static_cast<int>(spec.ordinals.size());
  const GroupDevices g{set.devices, first, n, spec.world,
                       StepBound{Spans(spec), set.setup_timeout_ms,
                                 MembersText(spec.ranks, spec.ordinals, spec.world)}};
  Regions regions;
  try {
    BuildRegions(g, comm_id, algorithm, static_cast<int>(group), agree, regions);
  } catch (const CollectiveStepFailed& e) {
    if (FailSet(set, comm_id, e.what())) {
      ReleaseUnpublished(set.devices, first, regions, /*comms_alive=*/false);
    } else {
      for (size_t i = 0; i < regions.size(); ++i) {
        set.abandoned.emplace_back(first + i, std::move(regions[i]));
      }
    }
    Fail(set.failed);
  } catch (...) {
    ReleaseUnpublished(set.devices, first, regions, /*comms_alive=*/true);
    throw;
  }
  // Every device of the group is complete: publish.
  for (int i = 0; i < n; ++i) {
    DeviceResources& d = *set.devices[first + i];
    d.regions[algorithm] = std::move(regions[i]);
    Publish(d, algorithm);
  }
}

}  // namespace
}  // namespace registry

using namespace registry;  // the API below works on the registry's state

void EnsureRegion(int64_t comm_id, int64_t algorithm, const RegionAgreement* agree) {
  if (FindAlgorithm(algorithm) == nullptr) {
    Fail("jax_llar: unknown algorithm " + std::to_string(algorithm));
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  CommSet& set = SetOf(comm_id);
  if (!set.failed.empty()) Fail(set.failed);
  DeviceGuard guard;
  size_t first = 0;
  for (size_t gi = 0; gi < set.groups.size(); ++gi) {
    // Groups are created whole, so the first device tells for the group.
    if (!set.devices[first]->regions[algorithm]) {
      CreateRegion(set, comm_id, gi, first, algorithm, agree);
    }
    first += set.groups[gi].ordinals.size();
  }
  g_region_masks[comm_id].fetch_or(uint32_t(1) << algorithm, std::memory_order_release);
}

bool HasRegion(int64_t comm_id, int64_t algorithm) {
  if (FindAlgorithm(algorithm) == nullptr || comm_id <= 0 || comm_id >= kMaxCommSets) {
    return false;
  }
  return (g_region_masks[comm_id].load(std::memory_order_acquire) >> algorithm) & 1u;
}

std::vector<int64_t> RegionsOf(int64_t comm_id) {
  std::vector<int64_t> out;
  for (int64_t a = 1; a < kAlgorithmCount; ++a) {
    if (HasRegion(comm_id, a)) out.push_back(a);
  }
  return out;
}

uint64_t ScratchBytesOf(int64_t comm_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (comm_id <= 0 || comm_id >= static_cast<int64_t>(g_sets.size())) return 0;
  const CommSet& set = *g_sets[comm_id];
  std::vector<uint64_t> bytes(set.devices.size(), 0);
  for (size_t i = 0; i < set.devices.size(); ++i) {
    for (const auto& r : set.devices[i]->regions) bytes[i] += r ? r->bytes : 0;
  }
  for (const auto& [device, r] : set.abandoned) {
    if (r != nullptr && device < bytes.size()) bytes[device] += r->bytes;
  }
  uint64_t most = 0;
  for (const uint64_t b : bytes) most = std::max(most, b);
  return most;
}

}  // namespace llar
