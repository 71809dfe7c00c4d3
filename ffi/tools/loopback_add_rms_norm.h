// Loopback harness of the fused all-reduce + residual add + RMSNorm
// (src/kernels/one_shot_ll_add_rms_norm.cuh): `world` ranks simulated on ONE
// GPU, as the all-reduce's loopback harness (loopback.h) simulates them, and
// with the same set-up per rank (the one-shot's region, RegionBytes, zeroed;
// zeroed epoch counters and claim word, a host-mapped ErrorRecord, a
// PeerTable whose scratch[p] is simulated rank p's scratch on the same
// device), each rank's calls on a non-blocking stream of its own. Each call
// launches the production launcher LaunchOneShotLLAddRmsNorm once per rank;
// with `interleave`, a one-shot LL all-reduce of x (the production launcher,
// its own grid) runs between two fused calls, so the two kernels share the
// epoch counters and the scratch as they do under XLA, each with a call
// signature of its own (LoopbackSignature of 2c and 2c + 1 for call c: two
// call sites, as the lowering gives them). Every rank reads the same
// residual and weight (a tensor-parallel layer's replicated operands).
//
// What it tests: the fused kernel's exchange (the one-shot protocol, over
// consecutive calls, scratch parity, the re-zeroing window with
// start_epoch), its cluster reduction and epilogue, against the host's
// reference; what it does not: NVLink, XLA, CUDA graphs (loopback.h).
//
// Co-residency: every rank's clusters must be resident at once (a block
// waits for the same block of every other rank); the plan asks
// cudaOccupancyMaxActiveClusters of a copy of the production kernel and the
// run refuses a case that does not fit. Host waits are bounded as in
// loopback.h (twice the kernel timeout plus kHostMarginNs).
//
// Python side: jax_llar.tools.loopback.fused (inputs, checks against the
// host emulation of the reference); command line: python -m
// jax_llar.tools.loopback --op add_rms_norm.
#ifndef LLAR_TOOLS_LOOPBACK_ADD_RMS_NORM_H_
#define LLAR_TOOLS_LOOPBACK_ADD_RMS_NORM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {

struct FusedLoopbackSpec {
  int32_t ordinal = 0;          // CUDA device
  int world = 2;                // simulated ranks, 2..kMaxRanks
  DType dtype = DType::kBF16;   // x's: kF32, kBF16 or kF16
  DType weight = DType::kBF16;  // dtype or kF32
  uint32_t rows = 1;            // rows of d elements (the grid rule must serve them)
  uint32_t d = 0;
  float eps = 1e-6f;
  uint64_t timeout_ns = 0;      // PeerTable::timeout_ns, > 0 (loopback.h's bound)
  int calls = 1;                // consecutive fused calls on the same inputs; the
                                // outputs of the last come back
  bool interleave = false;      // a one-shot all-reduce of x before every fused call
  uint64_t start_epoch = 0;     // every epoch counter starts here
};

struct FusedLoopbackPlan {
  AddRmsNormGrid grid{};        // per rank (AddRmsNormGridFor)
  int regs_per_thread = 0;      // of the fused kernel (its copy in the tools library)
  int max_active_clusters = 0;  // clusters of this grid the device holds at once
  uint32_t clusters = 0;        // world * rows (plus the all-reduce's blocks when
                                // interleaved: they never run at the same time)
  bool co_resident = false;     // clusters <= max_active_clusters
};

struct FusedLoopbackResult {
  FusedLoopbackPlan plan;
  // world x rows * d * itemsize bytes each, the last call's; empty after an
  // error or a missed deadline.
  std::vector<uint8_t> normed, new_residual;
  std::vector<ErrorRecord> records;  // one per rank (code 0: nothing reported)
  std::string cuda_error;            // empty, or the first CUDA error seen
  bool deadline_exceeded = false;    // kernels still ran at the host deadline
  // Epoch counters after a clean run: each warp advanced once per call whose
  // grid launched it (fused and interleaved all-reduce). "" when they did.
  std::string epoch_mismatch;
  bool epochs_checked = false;
};

// Throws std::invalid_argument for a spec outside the limits above (also one
// the grid rule does not serve) and std::runtime_error for a CUDA failure.
FusedLoopbackPlan PlanFusedLoopback(const FusedLoopbackSpec& spec);

// x: world x rows * d * itemsize bytes (rank r's partial sum at r); residual:
// rows * d * itemsize; weight: d * weight itemsize. Synchronises the device
// before and after. Throws as PlanFusedLoopback, and std::invalid_argument
// when the ranks' clusters are not co-resident or the input sizes are wrong;
// after the first launch every failure is reported in the result.
FusedLoopbackResult RunFusedLoopback(const FusedLoopbackSpec& spec,
                                     const std::vector<uint8_t>& x,
                                     const std::vector<uint8_t>& residual,
                                     const std::vector<uint8_t>& weight);

}  // namespace llar

#endif  // LLAR_TOOLS_LOOPBACK_ADD_RMS_NORM_H_
