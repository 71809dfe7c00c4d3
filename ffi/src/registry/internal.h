// The registry's state, shared by its sources (registry/*.cc) and nothing
// else. Every field below is guarded by g_mutex unless it says otherwise.
#ifndef LLAR_REGISTRY_INTERNAL_H_
#define LLAR_REGISTRY_INTERNAL_H_

#include <nccl.h>
#include <nccl_device.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "llar/args.h"
#include "llar/nccl_lla2a.h"
#include "registry.h"

namespace llar {
namespace registry {

// One algorithm's scratch region on one device.
struct Region {
  void* scratch = nullptr;
  uint64_t bytes = 0;
  ncclWindow_t window = nullptr;
  PeerTable* peers = nullptr;  // device copy of the region's peer table
  AllReduceArgs args{};        // what every published call of the region carries
  // An algorithm on NCCL's LL all-to-all session (AlgorithmEntry::lla2a_slots)
  // has no scratch or window; instead: its device communicator and session
  // handle (filled in by ncclDevCommCreate) and their device copy.
  NcclLLA2AComm lla2a{};
  NcclLLA2AComm* lla2a_device = nullptr;
  bool lla2a_comm_created = false;  // lla2a.comm holds a device communicator
  // Every call published for the region, one per launcher it was published
  // with (Publish). Never freed while the region lives: an execute handler may
  // still read one that was replaced.
  std::vector<std::unique_ptr<AlgorithmCall>> calls;
};

// One device of one communicator set.
struct DeviceResources {
  ncclComm_t comm = nullptr;
  ncclDevComm dev_comm{};
  uint64_t* state = nullptr;     // kStateWords: the claim word and the epoch counters
  ErrorRecord* error = nullptr;  // host-mapped
  uint64_t timeout_ns = 0;
  std::unique_ptr<Region> regions[kAlgorithmCount];
  // The launcher each algorithm's call is published with: kAlgorithms' at
  // creation; the tools' launcher seam (registry/seams.h) may replace one.
  Launcher launchers[kAlgorithmCount]{};
  DeviceContext context;
};

struct CommSet {
  std::vector<GroupSpec> groups;
  std::vector<std::unique_ptr<DeviceResources>> devices;  // the groups' local devices in order
  // The bound of each collective set-up step of a spanning group
  // (CollectiveStep); unused for groups held whole by this process.
  uint64_t setup_timeout_ms = 0;
  // Why the set was given up (FailSet) or that it was destroyed; empty while
  // it works. A failed set publishes no call and makes no NCCL call again.
  std::string failed;
  bool destroyed = false;  // DestroyCommSet released it; its id stays taken
  // Regions of a failed registration in a set that kept its communicators
  // (FailSet), with the index of their device in `devices`: NCCL's thread may
  // still write into them and the peers may have mapped their scratch, so
  // they are never freed (ScratchBytesOf counts them).
  std::vector<std::pair<size_t, std::unique_ptr<Region>>> abandoned;
};

// Guards set-up and every CommSet. The registry is never destroyed (a leak
// at exit, by rule): a kept communicator's NCCL thread may still write
// through pointers into it while static destructors run.
extern std::mutex g_mutex;
// Index = comm id; entry 0 unused.
extern std::vector<std::unique_ptr<CommSet>>& g_sets;
extern std::vector<cudaError_t (*)()> g_preloads;  // AddPreload
// Read without the lock (Lookup, KeyOf, HasRegion): the execute and
// instantiate stages must never wait for a set-up, which may be waiting for
// that very program's kernels.
extern std::array<std::array<std::atomic<const DeviceContext*>, kMaxOrdinals>, kMaxCommSets>
    g_table;
extern std::array<std::atomic<int64_t>, kMaxCommSets> g_keys;           // 0: no such set
extern std::array<std::atomic<uint32_t>, kMaxCommSets> g_region_masks;  // bit a: region of a

static_assert(kAlgorithmCount <= 32, "g_region_masks holds one bit per algorithm");

// The set `comm_id`; throws "jax_llar: no communicator set N" when there is
// none. The caller holds g_mutex.
CommSet& SetOf(int64_t comm_id);

// Publishes algorithm `algorithm`'s call on `d` from its region and
// d.launchers (reusing the region's call with that launcher, else adding
// one). The region exists; the caller holds g_mutex. (regions.cc)
void Publish(DeviceResources& d, int64_t algorithm);

// The one hook the production path calls into the test seams
// (registry/seams.cc): EnsureRegion calls it once a group's registration and
// peer tables are complete. It throws CollectiveStepFailed when the test seam
// armed a failure for `comm_id` (once), naming `step` and `who`; otherwise
// it returns (a lookup in an empty set, under g_mutex, on the set-up path
// only). The caller holds g_mutex.
void RegistrationSeam(int64_t comm_id, const char* step, const std::string& who);

}  // namespace registry
}  // namespace llar

#endif  // LLAR_REGISTRY_INTERNAL_H_
