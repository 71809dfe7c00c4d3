// Communicator registry: NCCL communicators, symmetric scratch windows, peer
// addresses and per-device epoch counters, created once per set of replica
// groups and kept for the life of the process.
//
// Creation is serialised and happens before tracing (from Python, at lowering
// time). Lookup is lock-free: the execute handler of every device thread reads
// one atomic pointer and never waits for another thread.
#ifndef LLAR_REGISTRY_H_
#define LLAR_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "llar/args.h"

namespace llar {

inline constexpr int kMaxCommSets = 256;
inline constexpr int kMaxOrdinals = 64;

// What one device of a communicator set needs at execute time. Immutable
// after publication, except the test hook.
struct DeviceContext {
  int32_t ordinal = -1;
  int32_t rank = -1;
  int32_t world = 0;
  AllReduceArgs base{};          // epochs, peer table, rank, world
  std::atomic<uint64_t*> trace{nullptr};  // call-trace buffer while tracing is on
  uint64_t* trace_buffer = nullptr;       // allocated at the first EnableCallTrace
  std::atomic<int32_t> drop_peer_writes{0};  // test hook (F13): 1 = PeerWrites::kDrop
};

// Creates NCCL communicators for `groups` (lists of local CUDA ordinals; one
// communicator per group, ranks in list order), allocates and registers the
// symmetric scratch, reads the peer addresses and publishes one
// DeviceContext per ordinal. Returns the communicator-set id (>= 1).
// Throws std::runtime_error with a readable message on any failure.
int CreateCommSet(const std::vector<std::vector<int>>& groups,
                  uint64_t timeout_ns);

// A 63-bit fingerprint of the set's groups (FNV-1a over the ordinals). The
// lowering passes it with the id, so an executable built in another process
// (where the same id may name other devices) fails at instantiation instead
// of pairing the wrong devices. 0 when the id is unknown.
int64_t KeyOf(int64_t comm_id);
int64_t KeyOfGroups(const std::vector<std::vector<int>>& groups);

// Lock-free lookup used by the execute handler; nullptr when absent.
const DeviceContext* Lookup(int64_t comm_id, int32_t ordinal);

// The CUDA ordinals of communicator set `comm_id`, one list per group in rank
// order, and the NCCL communicator of one member (set-up and benchmarks only).
std::vector<std::vector<int>> GroupsOf(int64_t comm_id);
void* NcclCommOf(int64_t comm_id, int32_t ordinal);

// Bytes of symmetric scratch one device of `comm_id` holds.
uint64_t ScratchBytesOf(int64_t comm_id);

// Error records of every device context that reported a failure.
struct ErrorReport {
  int64_t comm_id;
  int32_t ordinal;
  ErrorRecord record;
};
std::vector<ErrorReport> ErrorReports();

// Test hooks. SetEpochForTesting synchronises the devices of the set, stores
// `epoch` in every block counter and re-zeroes the scratch (F4).
void SetEpochForTesting(int64_t comm_id, uint64_t epoch);
void SetDropPeerWritesForTesting(int64_t comm_id, int32_t ordinal, bool drop);

// Call trace (args.h), a diagnostic: call these while no other thread runs
// programs on the set's devices. EnableCallTrace synchronises the devices
// and points each device's table at a zeroed trace buffer; calls captured
// into a CUDA graph after it launch the trace variant of the kernel (calls
// captured before keep the plain one; uncaptured calls pick the variant at
// each launch). DisableCallTrace points the tables back at nothing (trace
// variants already captured then store nothing); ReadCallTrace returns the
// epoch of warp 0 of block 0, which every non-empty call launches (so: the
// number of calls so far), and the 2 * kTraceSlots words of one device's
// buffer (empty when tracing is off).
void EnableCallTrace(int64_t comm_id);
void DisableCallTrace(int64_t comm_id);
std::pair<uint64_t, std::vector<uint64_t>> ReadCallTrace(int64_t comm_id, int32_t ordinal);

int NcclRuntimeVersion();
int NcclCompiledVersion();
int CudaDeviceCount();
bool CanAccessPeer(int a, int b);

}  // namespace llar

#endif  // LLAR_REGISTRY_H_
