// Diagnostic variants of the one-shot LL kernel (one_shot_ll_diag.cu): the
// kernel bench runs them, and the call trace and the dropped-peer-writes test
// hook launch them from XLA's programs through the launcher override
// (registry.h). The production kernel has none of their code.
#ifndef LLAR_TOOLS_ONE_SHOT_LL_DIAG_H_
#define LLAR_TOOLS_ONE_SHOT_LL_DIAG_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {

enum class DiagVariant {
  // Stores every line into this rank's own scratch, in every peer's slot,
  // and never into a peer's: the kernel without the network. Each rank's
  // output is its own input summed world times.
  kLoopback,
  // kLoopback, plus the all-reduce's stores into every peer's diagnostic
  // window (never read; SendLoopbackTables): what outstanding remote stores
  // cost a kernel that does not wait for a peer. `args.peers` must be the
  // rank's table from SendLoopbackTables. (With more than two ranks the
  // peers' lines land on the same lines of a rank's window; the bytes per
  // link are still those of the all-reduce.)
  kSendLoopback,
  // The all-reduce plus the call trace (below).
  kTraced,
  // Test hook (F13): the all-reduce without its stores to peers; the peers'
  // bounded waits then time out and report this rank.
  kDropPeerWrites,
  // Test hook (issue 12, item 5): the all-reduce whose line 0 of block 0
  // carries a flag with one epoch bit flipped (kCorruptFlagBit): no reader
  // takes it as its line or as a foreign one, so the peers' bounded waits
  // time out and report this rank; every other line is the all-reduce's.
  kCorruptFlag,
  // Test hook (issue 12, item 5): the all-reduce after every thread of the
  // rank spun for kDelayRankNs: its peers wait that much longer, and the sums
  // are correct when the timeout is longer than the delay.
  kDelayRank,
  // The all-reduce compiled without call signatures (ll_session.cuh,
  // kSigned false: the flag low32(E) | 1 and no foreign-line check): the
  // kernel bench's baseline for what signatures cost. AllReduceArgs::signature
  // is ignored; pair it only with itself.
  kUnsigned,
};

// Launches `variant` like LaunchOneShotLLWith: the same grid rule and checks.
// kTraced, kUnsigned and the fault variants are compiled for 2, 4, 8 and any
// number of ranks, the others for 2 and any (the kernel bench runs them on the machine at hand).
cudaError_t LaunchOneShotLLDiag(DiagVariant variant, AllReduceArgs args, DType dtype,
                                cudaStream_t stream, const OneShotOptions& options);

// The Launcher-signature forms the launcher override takes.
cudaError_t LaunchOneShotLLTraced(AllReduceArgs args, DType dtype, cudaStream_t stream);
cudaError_t LaunchOneShotLLDropPeerWrites(AllReduceArgs args, DType dtype,
                                          cudaStream_t stream);
cudaError_t LaunchOneShotLLCorruptFlag(AllReduceArgs args, DType dtype, cudaStream_t stream);
cudaError_t LaunchOneShotLLDelayRank(AllReduceArgs args, DType dtype, cudaStream_t stream);
// The fault variants' constants: the flag bit kCorruptFlag flips (an epoch
// bit, ll.cuh: flag(E, S)), and kDelayRank's delay, nanoseconds.
inline constexpr uint32_t kCorruptFlagBit = 1u << 15;
inline constexpr uint64_t kDelayRankNs = 100'000'000ull;

// Loads every diagnostic variant on the current device.
cudaError_t PreloadOneShotLLDiag();

// Call trace: thread 0 of block 0 of each call of the traced variant stores
// the time its lines were sent and the time block 0 finished (%globaltimer,
// ns; it waits for all of block 0's warps before it reads the clock) in entry
// (epoch % kTraceSlots) of the buffer PeerTable::trace points at, two words
// per entry, where `epoch` is that of warp 0 of block 0: device timestamps of
// the last calls without a profiler. With PeerTable::trace null it stores
// nothing.
inline constexpr int kTraceSlots = 4096;

// The send-and-loopback variant's window per rank: one line per (block, line).
inline constexpr std::size_t kDiagBytes =
    std::size_t(kMaxBlocks) * kLinesPerBlock * kLineBytes;

}  // namespace llar

#endif  // LLAR_TOOLS_ONE_SHOT_LL_DIAG_H_
