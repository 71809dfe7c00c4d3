// Communicator registry: per set of replica groups, NCCL communicators,
// per-device state words (the epoch counters) and, per algorithm, a symmetric
// scratch region with its peer addresses. Kept for the life of the process,
// except a set that nothing ever used (DestroyCommSet).
//
// Rules:
// - A set is created without scratch; an algorithm's region is added the
//   first time a lowering picks the algorithm for the set (EnsureRegion).
// - Creation and region set-up are serialised and run before tracing (from
//   Python, at lowering time). Lookup is lock-free: the execute handler reads
//   atomic pointers and never waits for another thread.
// - For groups that span processes, every collective set-up step runs on
//   non-blocking communicators and waits a bounded time for the other
//   processes.
//
// Sources: registry/comm_set.cc (sets), registry/regions.cc (regions),
// registry/nccl_settings.h (NCCL's settings), registry/seams.h (the tools'
// test and diagnostic seams).
#ifndef LLAR_REGISTRY_H_
#define LLAR_REGISTRY_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api.h"
#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {

inline constexpr int kMaxCommSets = 256;
inline constexpr int kMaxOrdinals = 64;

// What the execute handler needs to launch one algorithm on one device: the
// argument block (epoch counters, peer table, rank, world) and the launcher.
// Immutable once published; one cache line.
struct alignas(64) AlgorithmCall {
  AllReduceArgs args{};
  Launcher launch = nullptr;
};

// What one device of a communicator set needs at execute time. `calls[a]`
// (indexed like kAlgorithms) is null until algorithm a's region exists on
// every local device of the group (EnsureRegion); it is published with
// release order and may later be replaced by another call (the tools' launcher
// seam) or withdrawn (a set given up); a call once published is never freed.
struct DeviceContext {
  int32_t ordinal = -1;
  int32_t rank = -1;
  int32_t world = 0;  // number of ranks (NCCL's nRanks)
  std::atomic<const AlgorithmCall*> calls[kAlgorithmCount]{};
};

// Creates NCCL communicators for `groups` (lists of local CUDA ordinals, one
// communicator per group, ranks in list order), their device communicators
// and per-device state, and publishes one DeviceContext per ordinal, with no
// scratch region yet. Returns the set's id (>= 1). Throws std::runtime_error
// on any failure, after releasing what it created.
LLAR_API int CreateCommSet(const std::vector<std::vector<int>>& groups,
                           uint64_t timeout_ns);

// One replica group as one process sees it: the group's number of ranks, this
// process's members (ranks ascending, with their local CUDA ordinals) and,
// for a group that spans processes, NCCL's unique id for it (128 bytes, made
// by the process holding rank 0). An empty id: this process holds every rank.
struct GroupSpec {
  int world = 0;
  std::vector<int> ranks;
  std::vector<int> ordinals;
  std::string unique_id;
};

// CreateCommSet for groups that may span processes: every process of a group
// calls it with its own members and the group's unique id, at about the same
// time (collective over the group). A spanning group's communicators are
// non-blocking, and each collective step, here and in EnsureRegion, waits at
// most `setup_timeout_ms` (> 0 when a group spans processes, else unused)
// for the other processes. NCCL_COMM_BLOCKING=1, in the environment or in an
// NCCL configuration file (registry/nccl_settings.h), is refused: it would
// make those steps unbounded. `timeout_ns` is the kernels' bounded wait.
// Throws std::runtime_error on any failure (a step that does not complete in
// time, an NCCL error, ranks NCCL places in more than one load/store-
// accessible team), after aborting every communicator it created
// (ncclCommAbort: local, it waits for no other process) and freeing its
// memory.
LLAR_API int CreateCommSetOfRanks(const std::vector<GroupSpec>& groups, uint64_t timeout_ns,
                                  uint64_t setup_timeout_ms);

// Releases set `comm_id` if no program can have used it: it holds no region
// (the instantiate stage refuses an algorithm without its region, and kernels
// reach a set's memory only through a region's argument block). Its id is
// withdrawn first (KeyOf 0, Lookup null, EnsureRegion throws "... was
// destroyed") and never reused; then its communicators are aborted (local,
// bounded) and its state freed. A second call does nothing. The caller must
// hold the id alone (MembersOf's handles would dangle). Throws
// std::runtime_error for an unknown id or a set that holds a region (then
// nothing changes).
LLAR_API void DestroyCommSet(int64_t comm_id);

// A fresh NCCL unique id (ncclGetUniqueId), 128 bytes. Throws
// std::runtime_error when NCCL fails.
LLAR_API std::string NcclUniqueId();

// For a spanning group, EnsureRegion asks `agree(group, stage, local_error)`
// (group: its index in the set; local_error: "" when none) at two stages; it
// must give every process of the group the same answer, true only when every
// process succeeded, and must not throw (a throw counts as false).
// - kStageAllocated: after the local allocations, before the collective
//   registration. On false every process frees them and throws, before any
//   enters the collective call.
// - kStageRegistered: after the registration and peer tables, before
//   publication. On false every process gives up the set (EnsureRegion).
using RegionAgreement =
    std::function<bool(int group, const std::string& stage, const std::string& local_error)>;
inline constexpr const char* kStageAllocated = "allocated";
inline constexpr const char* kStageRegistered = "registered";

// Creates `algorithm`'s region on every device of `comm_id` if absent:
// allocates RegionBytes (filled with the entry's fill byte), registers it as
// a symmetric NCCL window (collective over each group), reads the peer
// addresses and publishes the device's AlgorithmCall. Serialised with
// creation; safe while programs of the set run. For a spanning group, every
// process must call it for the same algorithms in the same order, with
// `agree` (may be null otherwise).
//
// Throws std::runtime_error for an unknown set or algorithm. A failure
// before the registration frees the region's allocations and throws; a later
// call tries again. A failed registration (in any process of a spanning
// group, the bound passing included), or a failure after it, gives up the
// whole set in every process: its calls are withdrawn (HasRegion false, the
// handler finds none) and every later EnsureRegion throws that failure. A
// given-up set that had published a region keeps its communicators and
// memory for the life of the process (aborting them would unmap memory that
// kernels captured earlier may still touch); one that had not aborts its
// communicators and frees the failed region.
LLAR_API void EnsureRegion(int64_t comm_id, int64_t algorithm,
                           const RegionAgreement* agree = nullptr);

// True when every device of `comm_id` holds `algorithm`'s region. Lock-free:
// the FFI instantiate stage calls it and must not wait for a set-up.
LLAR_API bool HasRegion(int64_t comm_id, int64_t algorithm);

// The published call of `algorithm` on `ctx`, or nullptr when its region
// does not exist (one acquire load: the execute path's lookup).
inline const AlgorithmCall* CallOf(const DeviceContext* ctx, int64_t algorithm) {
  if (algorithm <= 0 || algorithm >= kAlgorithmCount) return nullptr;
  return ctx->calls[algorithm].load(std::memory_order_acquire);
}

// The argument block of `algorithm` on `ctx`, or nullptr (CallOf).
inline const AllReduceArgs* ArgsOf(const DeviceContext* ctx, int64_t algorithm) {
  const AlgorithmCall* call = CallOf(ctx, algorithm);
  return call != nullptr ? &call->args : nullptr;
}

// A 63-bit fingerprint of a set's groups (each group's number of ranks and
// this process's ranks and ordinals). The lowering passes it with the id, so
// an executable built in another process fails at instantiation instead of
// pairing the wrong devices. KeyOf is lock-free and answers 0 for an unknown
// id.
LLAR_API int64_t KeyOf(int64_t comm_id);
LLAR_API int64_t KeyOfGroups(const std::vector<GroupSpec>& groups);

// Lock-free lookup used by the execute handler; nullptr when absent.
LLAR_API const DeviceContext* Lookup(int64_t comm_id, int32_t ordinal);

// Bytes of symmetric scratch one device of `comm_id` holds: the largest sum
// over its devices of their regions' RegionBytes, regions kept by a given-up
// set included; 0 for an unknown id.
LLAR_API uint64_t ScratchBytesOf(int64_t comm_id);
// The algorithms whose regions `comm_id` holds, in id order.
LLAR_API std::vector<int64_t> RegionsOf(int64_t comm_id);

// Error records of every device context that reported a failure.
struct ErrorReport {
  int64_t comm_id;
  int32_t ordinal;
  ErrorRecord record;
};
LLAR_API std::vector<ErrorReport> ErrorReports();

// For the tools module (kernel bench, call trace, test hooks), never the
// execute path: one device of a set, with its NCCL communicator, state words
// and, per algorithm, its region (null and 0 while absent).
struct MemberRegion {
  void* scratch = nullptr;
  uint64_t bytes = 0;
};
struct Member {
  int32_t ordinal;
  int32_t rank;
  int32_t world;
  ncclComm_t comm;
  uint64_t* state;                    // kStateWords (args.h)
  std::vector<MemberRegion> regions;  // kAlgorithmCount entries
  const DeviceContext* context;
};
// The members of `comm_id`, one list per group in rank order; empty for an
// unknown id. Throws std::runtime_error for a set that spans processes.
LLAR_API std::vector<std::vector<Member>> MembersOf(int64_t comm_id);

// Adds a function that loads kernels on the current device (the tools'
// kernels), run best-effort on every device of every set, now and after each
// later set is published. Its result is ignored: it can never fail a set's
// creation. Without sets it makes no CUDA call. Idempotent per function;
// never throws.
LLAR_API void AddPreload(cudaError_t (*preload)());

LLAR_API int NcclRuntimeVersion();
LLAR_API int NcclCompiledVersion();
LLAR_API int CudaDeviceCount();
LLAR_API bool CanAccessPeer(int a, int b);

}  // namespace llar

#endif  // LLAR_REGISTRY_H_
