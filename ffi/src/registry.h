// Communicator registry: NCCL communicators, per-device epoch counters and,
// per algorithm, a symmetric scratch region with its peer addresses; created
// once per set of replica groups and kept for the life of the process (except
// a set that nothing ever used: DestroyCommSet).
//
// A set is created without scratch. The region of an algorithm is allocated
// (and registered as an NCCL window) the first time a lowering picks that
// algorithm for the set (EnsureRegion), so a process holds only the scratch
// its programs use (args.h: RegionBytes).
//
// Creation is serialised and happens before tracing (from Python, at lowering
// time). Lookup is lock-free: the execute handler of every device thread reads
// atomic pointers and never waits for another thread.
//
// For groups that span processes, every collective set-up step (NCCL's
// communicator creation, device communicators, window registration) runs on
// non-blocking communicators and waits a bounded time for the other
// processes; a failed creation releases what it made, and a failed
// registration gives up the set (EnsureRegion says what it keeps).
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

// What one device of a communicator set needs at execute time. Immutable
// after publication, except that regions are added (each entry of `args` is
// set once, from null; all are set back to null when the set is given up,
// EnsureRegion) and the launcher overrides.
struct DeviceContext {
  int32_t ordinal = -1;
  int32_t rank = -1;
  int32_t world = 0;             // number of ranks (NCCL's nRanks)
  // Per algorithm (indexed like kAlgorithms): the argument block with its
  // epoch counters, its region's peer table, rank and world; null until the
  // algorithm's region exists (EnsureRegion). Published with release order
  // after the region and its table are complete on the device.
  std::atomic<const AllReduceArgs*> args[kAlgorithmCount]{};
  // The one diagnostic seam, one entry per algorithm (indexed like
  // kAlgorithms): when entry `a` is set, the execute handler launches calls
  // of algorithm `a` through it instead of kAlgorithms[a].launch; calls of
  // the other algorithms are unaffected. All null in production; only the
  // tools module sets them (SetLauncherOverride: the call trace's variant,
  // the dropped-peer-writes test hook, both for the one-shot entry), and a
  // change applies to programs captured afterwards.
  std::atomic<Launcher> launcher_override[kAlgorithmCount]{};
};

// Creates NCCL communicators for `groups` (lists of local CUDA ordinals; one
// communicator per group, ranks in list order), the device communicators and
// the per-device state, and publishes one DeviceContext per ordinal, with no
// scratch region yet. Returns the communicator-set id (>= 1).
// Throws std::runtime_error with a readable message on any failure, after
// releasing whatever it had created.
LLAR_API int CreateCommSet(const std::vector<std::vector<int>>& groups,
                           uint64_t timeout_ns);

// One replica group of a communicator set as one process sees it: the
// group's number of ranks, this process's members of it (their ranks,
// ascending, and local CUDA ordinals) and, when the group spans processes,
// NCCL's unique id for it (the 128 bytes of ncclGetUniqueId, made by the
// process holding rank 0 and handed to the others by the caller). An empty
// unique id means this process holds every rank (ncclCommInitAll).
struct GroupSpec {
  int world = 0;
  std::vector<int> ranks;
  std::vector<int> ordinals;
  std::string unique_id;
};

// CreateCommSet for groups that may span processes (one process per GPU,
// jax.distributed): every process of a group calls it with its own members
// and the group's unique id, at about the same time (ncclCommInitRank and
// ncclDevCommCreate are collective over the group; NCCL waits for the
// others). Regions (EnsureRegion) are then collective over the processes
// too: each must call EnsureRegion for the same algorithms in the same
// order.
//
// A spanning group's communicators are non-blocking (ncclCommInitRankConfig,
// blocking = 0), and each collective step, here and in EnsureRegion, waits at
// most `setup_timeout_ms` for the other processes (polling
// ncclCommGetAsyncError); it must be > 0 when a group spans processes and is
// unused otherwise. NCCL_COMM_BLOCKING=1, which would make those steps
// blocking, is refused, whether it is set in the environment or in one of
// NCCL's configuration files (NcclSettingOf). `timeout_ns` is the kernels'
// bounded wait.
//
// Throws std::runtime_error on any failure, after aborting every
// communicator it created (ncclCommAbort: local, it waits for no other
// process) and freeing its memory: a step that does not complete in time
// ("jax_llar: ncclCommInitRank did not complete within N ms for rank R of W
// (CUDA device D): a process of the group may have died or not reached this
// step; ..."), an error NCCL reports, NCCL placing the ranks in more than
// one load/store-accessible (LSA) team (ranks on different nodes, or GPUs
// that are not NVLink peers).
LLAR_API int CreateCommSetOfRanks(const std::vector<GroupSpec>& groups, uint64_t timeout_ns,
                                  uint64_t setup_timeout_ms);

// Releases communicator set `comm_id` that no program can have used: one
// whose devices hold no scratch region (EnsureRegion never published one;
// a set given up by a failed registration keeps the regions it published,
// and its communicators, EnsureRegion, so it is refused too). The rule is
// what makes it safe: the FFI instantiate stage refuses an algorithm
// without its region (HasRegion), and a kernel reaches the set's memory
// (state words, error records, scratch) only through a region's argument
// block, so a set without a region has never been launched with, and after
// this call no program can be: its id is withdrawn first (KeyOf answers 0,
// Lookup null, EnsureRegion throws "... was destroyed") and is never given
// to another set. Then every
// communicator is aborted (ncclCommAbort: local and bounded, it waits for
// no other process, so a set whose peers are gone or are destroying theirs
// is released alike; ncclCommDestroy would be collective), which frees
// NCCL's resources, device communicators included, and the state words and
// error records are freed. The caller must hold the id alone: the tools
// (MembersOf) keep raw handles of a set's members across a run without the
// registry's lock, which this call would free under them.
// jax_llar.distributed calls it in a process whose creation succeeded when
// another process's failed (the set is refused everywhere and would
// otherwise stay allocated; its id has not been handed out). A second call
// for the same id does nothing. Throws std::runtime_error for an unknown id or a
// set that holds a region (then nothing changes).
LLAR_API void DestroyCommSet(int64_t comm_id);

// A fresh NCCL unique id (ncclGetUniqueId), 128 bytes. Throws
// std::runtime_error when NCCL fails.
LLAR_API std::string NcclUniqueId();

// Allocates `algorithm`'s scratch region (RegionBytes bytes, filled with the
// entry's fill byte) on every device of `comm_id`, registers it as a
// symmetric NCCL window (collective over each group), reads the peer
// addresses, loads the algorithm's kernels and publishes its argument block;
// a no-op when the region exists. Serialised with creation; safe while
// programs of the set run (nothing they use changes). Throws
// std::runtime_error for an unknown set or algorithm or a CUDA/NCCL failure
// before the registration (then the region's allocations are freed, the
// region stays absent and a later call tries again).
//
// For a group that spans processes, the collective registration is bounded
// like CreateCommSetOfRanks' steps. When the registration fails in any
// process of the group (an error, or the bound passes: another process may
// still be inside it), or a step after it fails locally, every process gives
// up the whole set: its regions are withdrawn (HasRegion false; the execute
// handler finds no argument block), and this and every later EnsureRegion of
// the set throws that failure. What happens to the set's NCCL resources
// depends on whether programs can hold its memory:
// - a set that published a region (of any algorithm, any group) keeps its
//   communicators and everything they map, the region that failed included.
//   ncclCommAbort would unmap the whole load/store-accessible address range
//   of each communicator (NCCL 2.28: ncclDevrFinalize), which the published
//   regions' peer tables point into, while programs captured earlier may
//   still run their kernels (in flight, or CUDA graph replays, which never
//   call the handler again): they would touch unmapped memory (an illegal
//   address, with no error record), or memory mapped there later. Kept, those
//   kernels end like any call whose peer is gone: in the bounded-wait error.
//   The set's memory stays allocated for the life of the process.
// - a set that never published a region has never been launched with (the
//   instantiate stage refuses an algorithm without its region): its
//   communicators are aborted (ncclCommAbort, local: it stops NCCL's thread
//   and closes this process's connections, so the other processes' steps end
//   in an error instead of waiting out their bound) and the failed region's
//   memory is freed.
//
// For groups that span processes, `agree` (may be null) is called twice per
// group whose region is created, with the group's index in the set (the
// order of CreateCommSetOfRanks' groups), a stage and this process's error
// ("" when none); it must tell every process of the group the same outcome
// (jax_llar.distributed: one verdict per stage in the key-value store) and
// return true only when every process succeeded. It must not throw (a throw
// counts as false).
// - stage "allocated": after this process's local allocations, before the
//   collective registration. On false (or a local error) the allocations are
//   freed and EnsureRegion throws, in every process alike, before any of them
//   enters the collective call that the others would never join.
// - stage "registered": after the registration and the peer tables (the
//   steps FinishRegions takes), before publication; the error is the
//   registration's (a timeout included: NCCL may have completed it in
//   another process, whose barrier this one had reached) or that of a later
//   local step. The region is published only on true; on false (or a local
//   error) the set is given up as above, in every process alike, so that no
//   process runs the fast path with a peer that fell back to NCCL.
using RegionAgreement =
    std::function<bool(int group, const std::string& stage, const std::string& local_error)>;
inline constexpr const char* kStageAllocated = "allocated";
inline constexpr const char* kStageRegistered = "registered";
LLAR_API void EnsureRegion(int64_t comm_id, int64_t algorithm,
                           const RegionAgreement* agree = nullptr);

// True when every device of `comm_id` holds `algorithm`'s region. Lock-free
// (the FFI instantiate stage calls it, and KeyOf; neither may wait for a
// creation in progress).
LLAR_API bool HasRegion(int64_t comm_id, int64_t algorithm);

// The argument block of `algorithm` on `ctx`, or nullptr when its region
// does not exist (one acquire load; the execute path's lookup).
inline const AllReduceArgs* ArgsOf(const DeviceContext* ctx, int64_t algorithm) {
  if (algorithm <= 0 || algorithm >= kAlgorithmCount) return nullptr;
  return ctx->args[algorithm].load(std::memory_order_acquire);
}

// A 63-bit fingerprint of the set's groups (FNV-1a over each group's
// number of ranks and this process's ranks and ordinals). The lowering
// passes it with the id, so an executable built in another process (where
// the same id may name other devices or ranks) fails at instantiation
// instead of pairing the wrong devices. 0 when the id is unknown.
LLAR_API int64_t KeyOf(int64_t comm_id);
LLAR_API int64_t KeyOfGroups(const std::vector<GroupSpec>& groups);

// Lock-free lookup used by the execute handler; nullptr when absent.
LLAR_API const DeviceContext* Lookup(int64_t comm_id, int32_t ordinal);

// Bytes of symmetric scratch one device of `comm_id` holds: the sum of its
// regions' RegionBytes for the largest group, the regions kept in a given-up
// set (CommSet::abandoned: never freed) included; 0 when the id is unknown.
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

// For the tools module (kernel bench, call trace, test hooks); never used on
// the execute path.
//
// One device of a set: its NCCL communicator, its state words and, per
// algorithm, its region (local address and bytes; null and 0 while absent).
struct MemberRegion {
  void* scratch = nullptr;
  uint64_t bytes = 0;
};
struct Member {
  int32_t ordinal;
  int32_t rank;
  int32_t world;
  ncclComm_t comm;
  uint64_t* state;               // kStateWords (args.h)
  std::vector<MemberRegion> regions;  // kAlgorithmCount entries
  const DeviceContext* context;
};
// The members of `comm_id`, one list per group in rank order; empty when the
// id is unknown. Throws std::runtime_error for a set that spans processes
// (its groups hold ranks of other processes, which the tools cannot reach).
LLAR_API std::vector<std::vector<Member>> MembersOf(int64_t comm_id);
// Sets (or, with nullptr, clears) the launcher override of `algorithm` (an
// id of kAlgorithms) on one device. Throws std::runtime_error when the set
// has no such device or the algorithm is unknown.
LLAR_API void SetLauncherOverride(int64_t comm_id, int32_t ordinal, int64_t algorithm,
                                  Launcher launcher);
// Adds a function that loads kernels on the current device (the tools'
// kernels), run best-effort: at once on every device of every set that
// exists, and on the devices of every set created later, after that set is
// published. Its result is ignored, so it can never fail or undo the
// creation of a set; whoever needs the kernels loads them again, checked,
// where it uses them. Without communicator sets it makes no CUDA call.
// Idempotent per function; never throws.
LLAR_API void AddPreload(cudaError_t (*preload)());

// Test hook (bound only by the tools module): the next region that
// EnsureRegion creates for `comm_id` fails in this process once its
// registration and peer tables are complete, as when the set-up bound passes
// just as NCCL completes the step; the set is then given up as for a failed
// registration of a spanning group (EnsureRegion), whichever kind of group it
// holds. Throws std::runtime_error for an unknown set.
LLAR_API void FailNextRegistrationForTesting(int64_t comm_id);

// A setting as NCCL 2.28 reads it (src/misc/param.cc): the process
// environment first (a variable that is set wins, even empty), else the
// first line `NAME=VALUE` for it in NCCL's configuration files, in NCCL's
// order (NcclConfFiles): the first file that sets it wins, and within a file
// its first line. A file line is NAME, '=', VALUE with nothing trimmed;
// lines starting with '#' and lines without '=' are skipped. (NCCL copies
// the files' values into the environment without overwriting when it first
// reads a setting, which gives this precedence.) An NCCL environment plugin
// (NCCL_ENV_PLUGIN), which may answer otherwise, is not consulted.
struct NcclSetting {
  bool found = false;
  std::string value;
  std::string source;  // "the environment" or the file's path
};
LLAR_API NcclSetting NcclSettingOf(const std::string& name,
                                   const std::vector<std::string>& files);
// NCCL 2.28's configuration files, highest precedence first: $NCCL_CONF_FILE
// when set and not empty, else ~/.nccl.conf (the home directory of the
// password database's entry for this user, not $HOME); then /etc/nccl.conf.
LLAR_API std::vector<std::string> NcclConfFiles();
// NCCL's integer reading of a setting's value (ncclLoadParam: strtoll with
// base 0, so "1", " 1", "0x1" and "1abc" are all 1); `fallback` for an
// empty value or one out of range.
LLAR_API int64_t NcclIntValue(const std::string& value, int64_t fallback);

LLAR_API int NcclRuntimeVersion();
LLAR_API int NcclCompiledVersion();
LLAR_API int CudaDeviceCount();
LLAR_API bool CanAccessPeer(int a, int b);

}  // namespace llar

#endif  // LLAR_REGISTRY_H_
