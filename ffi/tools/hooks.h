// Diagnostics that act on the calls of XLA's programs: the call trace and the
// test hooks. They reach the production path only through the one-shot
// algorithm's launcher on a device (registry/seams.h: SetLauncherOverride)
// and, for the trace, the PeerTable's trace pointer. Each one synchronises
// the devices it changes where stated; call them while no other thread runs
// programs on the set.
// Before an override names a diagnostic variant, they load the tools'
// kernels on its devices (LoadToolKernels, preload.h); a failed load throws
// std::runtime_error and leaves the override as it was.
#ifndef LLAR_TOOLS_HOOKS_H_
#define LLAR_TOOLS_HOOKS_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace llar {

// Call trace (one_shot_ll_diag.h: kTraceSlots). EnableCallTrace synchronises
// the devices of the set and points each device's table at a zeroed trace
// buffer (allocated at the first call); programs captured into a CUDA graph
// after it launch the traced variant (programs captured before keep the
// all-reduce; uncaptured calls pick the launcher at each launch).
// DisableCallTrace points the tables back at nothing (traced variants
// already captured then store nothing) and restores the launcher.
// ReadCallTrace returns the epoch of warp 0 of block 0 on `ordinal`, which
// every non-empty call advances (so: the number of calls so far), and the
// 2 * kTraceSlots words of its buffer (empty when it was never enabled).
// Throw std::runtime_error for an unknown set or device.
void EnableCallTrace(int64_t comm_id);
void DisableCallTrace(int64_t comm_id);
std::pair<uint64_t, std::vector<uint64_t>> ReadCallTrace(int64_t comm_id, int32_t ordinal);

// F4: synchronises the devices of the set, stores `epoch` in every epoch
// counter and re-zeroes the scratch, on every device of the set, or with
// `ordinal` >= 0 on that device only (its peers then wait for lines of
// epochs it never sends: a peer that is gone, for programs captured before).
void SetEpochForTesting(int64_t comm_id, uint64_t epoch, int32_t ordinal = -1);

// The fault-injection modes (F13 and issue 12, item 5), compiled in (ffi/tools) and
// off by default: programs captured afterwards on device `ordinal` launch the
// one-shot variant of `fault` (one_shot_ll_diag.h); kNone restores the
// launcher (or the trace's). Each fault ends in a correct result or in the
// bounded-wait error: kDropPeerWrites and kCorruptFlag in the error, with a
// report of this rank; kDelayRank in correct sums when the timeout exceeds
// kDelayRankNs, else in the error. The foreign-signature fault is the
// loopback tool's (--extra_call_rank) and the off-by-one GPU test's.
enum class Fault { kNone = 0, kDropPeerWrites = 1, kCorruptFlag = 2, kDelayRank = 3 };
void SetFaultForTesting(int64_t comm_id, int32_t ordinal, Fault fault);

}  // namespace llar

#endif  // LLAR_TOOLS_HOOKS_H_
