// Communicator registry: NCCL communicators, symmetric scratch windows, peer
// addresses and per-device epoch counters, created once per set of replica
// groups and kept for the life of the process.
//
// Creation is serialised and happens before tracing (from Python, at lowering
// time). Lookup is lock-free: the execute handler of every device thread reads
// one atomic pointer and never waits for another thread.
#ifndef LLAR_REGISTRY_H_
#define LLAR_REGISTRY_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "api.h"
#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {

inline constexpr int kMaxCommSets = 256;
inline constexpr int kMaxOrdinals = 64;

// What one device of a communicator set needs at execute time. Immutable
// after publication, except the launcher overrides.
struct DeviceContext {
  int32_t ordinal = -1;
  int32_t rank = -1;
  int32_t world = 0;             // number of ranks (NCCL's nRanks)
  AllReduceArgs base{};          // epochs, peer table, rank, world
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
// communicator per group, ranks in list order), allocates and registers the
// symmetric scratch, reads the peer addresses and publishes one
// DeviceContext per ordinal. Returns the communicator-set id (>= 1).
// Throws std::runtime_error with a readable message on any failure.
LLAR_API int CreateCommSet(const std::vector<std::vector<int>>& groups,
                           uint64_t timeout_ns);

// A 63-bit fingerprint of the set's groups (FNV-1a over the ordinals). The
// lowering passes it with the id, so an executable built in another process
// (where the same id may name other devices) fails at instantiation instead
// of pairing the wrong devices. 0 when the id is unknown.
LLAR_API int64_t KeyOf(int64_t comm_id);
LLAR_API int64_t KeyOfGroups(const std::vector<std::vector<int>>& groups);

// Lock-free lookup used by the execute handler; nullptr when absent.
LLAR_API const DeviceContext* Lookup(int64_t comm_id, int32_t ordinal);

// Bytes of symmetric scratch one device of `comm_id` holds (ScratchBytes of
// its largest group); 0 when the id is unknown.
LLAR_API uint64_t ScratchBytesOf(int64_t comm_id);

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
// One device of a set: its NCCL communicator and its scratch window (local
// address, ScratchBytes(world, <last algorithm>) bytes: every algorithm's region).
struct Member {
  int32_t ordinal;
  int32_t rank;
  int32_t world;
  ncclComm_t comm;
  void* scratch;
  uint64_t scratch_bytes;
  const DeviceContext* context;
};
// The members of `comm_id`, one list per group in rank order; empty when the
// id is unknown.
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

LLAR_API int NcclRuntimeVersion();
LLAR_API int NcclCompiledVersion();
LLAR_API int CudaDeviceCount();
LLAR_API bool CanAccessPeer(int a, int b);

}  // namespace llar

#endif  // LLAR_REGISTRY_H_
