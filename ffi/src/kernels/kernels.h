// Host-side entry points of the production kernels: one launcher per
// algorithm, and the table the execute handler picks them from. A launcher
// only computes its grid and launches; it never allocates or synchronises,
// so it is safe inside CUDA stream capture.
#ifndef LLAR_KERNELS_H_
#define LLAR_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "api.h"
#include "llar/args.h"

namespace llar {

// Every algorithm's launcher has this signature: the argument block (the
// launcher fills in what depends on the grid), the dtype and XLA's stream.
using Launcher = cudaError_t (*)(AllReduceArgs args, DType dtype, cudaStream_t stream);

// Grid of the one-shot LL kernel for `lines` LL lines (host and tests use the
// same rule): up to `block_lines` lines per block (0: kOneShotBlockLines)
// until kMaxBlocks blocks, then up to kLinesPerBlock (the rule the kernel
// bench's block_lines sweeps measured fastest: benchmarks/NOTES.md).
inline constexpr uint32_t kOneShotBlockLines = 64;

// Lines of an `n_bytes` payload that the kernels move with one 8-byte access
// (AllReduceArgs::vector_lines): all of them when every one of `buffers` is
// 8-byte aligned, else 0 (the byte-wise path).
inline uint32_t VectorLines(uint32_t n_bytes, std::initializer_list<const void*> buffers) {
  uintptr_t bits = 0;
  for (const void* b : buffers) bits |= reinterpret_cast<uintptr_t>(b);
  return (bits & (kPayloadBytesPerLine - 1)) == 0 ? n_bytes / kPayloadBytesPerLine : 0;
}

// Loads, on the current device, the kernel `for_kernel(dtype, world)` gives
// for every dtype and for world 0 (any) and kWorlds..., so that no lazy
// module load happens later (inside a captured graph, or while a peer's
// kernel spins).
template <int... kWorlds, typename ForKernel>
cudaError_t PreloadKernels(ForKernel for_kernel) {
  cudaFuncAttributes attr;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    for (int world : {0, kWorlds...}) {
      const auto kernel = for_kernel(d, world);
      if (kernel == nullptr) continue;  // a dtype the algorithm does not serve
      const cudaError_t e =
          cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel));
      if (e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}
// The occupancy of the kernel `for_kernel(dtype, world)` with `threads`
// threads per block on the current device: its registers per thread and
// resident blocks per multiprocessor (the loopback harness's co-residency
// check). world 0 asks for the run-time world-size kernel.
template <typename ForKernel>
cudaError_t KernelOccupancy(ForKernel for_kernel, DType dtype, int world, uint32_t threads,
                            int* regs_per_thread, int* blocks_per_sm) {
  const void* kernel = reinterpret_cast<const void*>(for_kernel(dtype, world));
  if (kernel == nullptr) return cudaErrorInvalidValue;
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
  if (e != cudaSuccess) return e;
  *regs_per_thread = attr.numRegs;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel,
                                                       static_cast<int>(threads), 0);
}

// The grid of one call of an algorithm, as its launcher computes it:
// `blocks` blocks of `threads` threads. Contract of every algorithm: each
// warp of this grid advances its epoch counter (args.h: its algorithm's set)
// by exactly one per call, and no other counter changes (the loopback
// harness checks it). lines_per_block and steps are the algorithm's own
// (one-shot: LL lines per block, 1 step).
struct KernelGrid {
  uint32_t blocks, lines_per_block, threads, steps;
};

struct OneShotGrid {
  uint32_t blocks, lines_per_block, threads;
};
LLAR_API OneShotGrid OneShotGridFor(uint32_t lines, uint32_t block_lines = 0);

// Launch options the kernel bench varies; the production call uses the
// defaults.
struct OneShotOptions {
  bool generic = false;      // the run-time world-size kernel even for 2, 4, 8 ranks
  uint32_t block_lines = 0;  // grid rule's lines per block (0: kOneShotBlockLines)
};

// one_shot_ll.cu: the one-shot LL all-reduce.
LLAR_API cudaError_t LaunchOneShotLL(AllReduceArgs args, DType dtype, cudaStream_t stream);
LLAR_API cudaError_t LaunchOneShotLLWith(AllReduceArgs args, DType dtype, cudaStream_t stream,
                                         const OneShotOptions& options);

// Loads the production kernels' module on the current device, so that no
// lazy module load happens later inside a captured CUDA graph.
LLAR_API cudaError_t PreloadOneShotLL();
LLAR_API KernelGrid OneShotLLGrid(uint32_t n_bytes, int world);
LLAR_API cudaError_t OneShotLLOccupancy(DType dtype, int world, uint32_t threads,
                                        int* regs_per_thread, int* blocks_per_sm);

// one_shot_ll_add_rms_norm.cu: the one-shot LL all-reduce fused with the
// residual add and the RMSNorm that follow it (jax_llar.psum_add_rms_norm).
//
// Grid: one thread block cluster of `cluster_blocks` blocks per row (a row
// of one block is launched without a cluster dimension), one line (8 payload
// bytes) per thread. A row of d elements of `itemsize` bytes
// is row_lines = d * itemsize / 8 lines (d * itemsize must be a multiple of
// 8). cluster_blocks is the largest of 8, 4, 2, 1 that divides row_lines,
// is at most ceil(row_lines / kAddRmsNormBlockLines) (the one-shot's 64
// lines per block, benchmarks/NOTES.md) and keeps lines_per_block =
// row_lines / cluster_blocks <= kLinesPerBlock and rows * cluster_blocks <=
// kMaxBlocks; and the payload, rows * d * itemsize, is at most
// kOneShotMaxBytes. False (not served) when no cluster size fits.
// jax_llar's Python lowering mirrors this rule; keep them equal.
inline constexpr uint32_t kAddRmsNormBlockLines = 64;
inline constexpr uint32_t kAddRmsNormMaxClusterBlocks = kMaxClusterBlocks;
struct AddRmsNormGrid {
  uint32_t blocks, cluster_blocks, lines_per_block, threads;
};
LLAR_API bool AddRmsNormGridFor(uint32_t rows, uint32_t d, uint32_t itemsize,
                                AddRmsNormGrid* grid);

// Launches the fused kernel for `args` (the launcher fills in the grid
// fields, n_bytes, vector_lines, weight_vector_lines and inv_d). dtype: x's,
// kF32, kBF16 or kF16; weight: kF32 or dtype. cudaErrorInvalidValue for
// anything not served (grid rule, dtypes, missing pointers). Like every
// launcher it neither allocates nor synchronises (cudaLaunchKernelEx with the
// cluster dimension where cluster_blocks > 1, which CUDA graphs capture).
LLAR_API cudaError_t LaunchOneShotLLAddRmsNorm(AddRmsNormArgs args, DType dtype,
                                               DType weight, cudaStream_t stream);
LLAR_API cudaError_t PreloadOneShotLLAddRmsNorm();

// two_shot_ll.cu: the two-shot LL all-reduce (two_shot_ll.cuh), payloads up
// to kTwoShotMaxBytes per rank.
//
// Grid for a payload of `lines` LL lines over `world` ranks (host, loopback
// harness and tests use the same rule): the largest chunk, c =
// TwoShotChunkOf(lines, world, 0).lines (args.h), spread over up to
// kMaxBlocks blocks of about kTwoShotBlockLines chunk lines each (the
// one-shot's 64, not measured for the two-shot yet); lines_per_block =
// ceil(c / blocks) chunk lines per block, threads = that rounded up to a
// warp, at most kMaxThreads, and steps = ceil(lines_per_block / threads)
// lines per thread and chunk (at most TwoShotMaxSteps(world)).
inline constexpr uint32_t kTwoShotBlockLines = 64;
struct TwoShotGrid {
  uint32_t blocks, lines_per_block, threads, steps;
};
LLAR_API TwoShotGrid TwoShotGridFor(uint32_t lines, int world);
LLAR_API cudaError_t LaunchTwoShotLL(AllReduceArgs args, DType dtype, cudaStream_t stream);
LLAR_API cudaError_t PreloadTwoShotLL();
LLAR_API KernelGrid TwoShotLLGrid(uint32_t n_bytes, int world);
LLAR_API cudaError_t TwoShotLLOccupancy(DType dtype, int world, uint32_t threads,
                                        int* regs_per_thread, int* blocks_per_sm);

// one_shot_sentinel.cu: the one-shot sentinel all-reduce
// (one_shot_sentinel.cuh), payloads up to kOneShotSentinelMaxBytes per rank,
// float32, bfloat16 and float16 only (the launcher refuses int32 with
// cudaErrorInvalidValue). Grid: OneShotGridFor over 16-byte lines.
// LaunchOneShotSentinelWith takes the kernel bench's options (generic,
// block_lines) as LaunchOneShotLLWith does.
LLAR_API cudaError_t LaunchOneShotSentinel(AllReduceArgs args, DType dtype,
                                           cudaStream_t stream);
LLAR_API cudaError_t LaunchOneShotSentinelWith(AllReduceArgs args, DType dtype,
                                               cudaStream_t stream,
                                               const OneShotOptions& options);
LLAR_API cudaError_t PreloadOneShotSentinel();
LLAR_API KernelGrid OneShotSentinelGrid(uint32_t n_bytes, int world);
LLAR_API cudaError_t OneShotSentinelOccupancy(DType dtype, int world, uint32_t threads,
                                              int* regs_per_thread, int* blocks_per_sm);

// one_shot_ll128.cu: the one-shot LL128 all-reduce (one_shot_ll128.cuh),
// payloads up to kOneShotLL128MaxBytes per rank, every dtype.
//
// Grid for `lines` LL128 lines (120 payload bytes each): up to
// kOneShotLL128BlockLines lines per block until kMaxBlocks blocks, then up
// to kLL128LinesPerBlock; threads = the lines per block in whole warps of 4
// lines (8 lanes per line). kOneShotLL128BlockLines gives each block the
// one-shot LL's 2 warps at small sizes; it is not measured for LL128 yet.
inline constexpr uint32_t kOneShotLL128BlockLines = 8;
LLAR_API OneShotGrid OneShotLL128GridFor(uint32_t lines);
LLAR_API cudaError_t LaunchOneShotLL128(AllReduceArgs args, DType dtype, cudaStream_t stream);
LLAR_API cudaError_t PreloadOneShotLL128();
LLAR_API KernelGrid OneShotLL128Grid(uint32_t n_bytes, int world);
LLAR_API cudaError_t OneShotLL128Occupancy(DType dtype, int world, uint32_t threads,
                                           int* regs_per_thread, int* blocks_per_sm);

// two_shot_ll128.cu: the two-shot LL128 all-reduce (two_shot_ll128.cuh),
// payloads up to kTwoShotLL128MaxBytes per rank, every dtype.
//
// Grid for a payload of `lines` LL128 lines over `world` ranks: the largest
// chunk, c = TwoShotChunkOf(lines, world, 0).lines, spread over up to
// kMaxBlocks blocks of about kTwoShotLL128BlockLines chunk lines each (the
// one-shot LL128's rule, not measured for the two-shot);
// lines_per_block = ceil(c / blocks), threads = that in whole warps of 4 line
// slots, at most kMaxThreads, and steps = ceil(lines_per_block / (threads /
// 8)) (at most TwoShotLL128MaxSteps(world)).
inline constexpr uint32_t kTwoShotLL128BlockLines = 8;
LLAR_API TwoShotGrid TwoShotLL128GridFor(uint32_t lines, int world);
LLAR_API cudaError_t LaunchTwoShotLL128(AllReduceArgs args, DType dtype, cudaStream_t stream);
LLAR_API cudaError_t PreloadTwoShotLL128();
LLAR_API KernelGrid TwoShotLL128Grid(uint32_t n_bytes, int world);
LLAR_API cudaError_t TwoShotLL128Occupancy(DType dtype, int world, uint32_t threads,
                                           int* regs_per_thread, int* blocks_per_sm);

// two_shot_ll128_atomic.cu: the two-shot LL128 atomic all-reduce
// (two_shot_ll128_atomic.cuh), payloads up to kTwoShotLL128AtomicMaxBytes per
// rank, every dtype. NOT deterministic for the float dtypes (atomic additions
// in arrival order; the header states the rule it keeps); never in a tuning
// table. Grid: TwoShotLL128GridFor, as the two-shot LL128.
LLAR_API cudaError_t LaunchTwoShotLL128Atomic(AllReduceArgs args, DType dtype,
                                              cudaStream_t stream);
LLAR_API cudaError_t PreloadTwoShotLL128Atomic();
LLAR_API KernelGrid TwoShotLL128AtomicGrid(uint32_t n_bytes, int world);
LLAR_API cudaError_t TwoShotLL128AtomicOccupancy(DType dtype, int world, uint32_t threads,
                                                 int* regs_per_thread, int* blocks_per_sm);

// nccl_lla2a_one_shot.cu: the one-shot all-reduce on NCCL's LL all-to-all
// session (nccl_lla2a_one_shot.cuh), payloads up to kNcclLLA2AOneShotMaxBytes
// per rank, every dtype. Grid: OneShotGridFor over 8-byte lines, plus one
// watchdog warp per block (threads = the rule's + kWarpSize).
// NcclLLA2AOneShotSlots(world): the session's slots per block and parity,
// ncclLLA2ACalcSlots(world * kLinesPerBlock, kPayloadBytesPerLine).
LLAR_API cudaError_t LaunchNcclLLA2AOneShot(AllReduceArgs args, DType dtype,
                                            cudaStream_t stream);
LLAR_API cudaError_t PreloadNcclLLA2AOneShot();
LLAR_API KernelGrid NcclLLA2AOneShotGrid(uint32_t n_bytes, int world);
LLAR_API cudaError_t NcclLLA2AOneShotOccupancy(DType dtype, int world, uint32_t threads,
                                               int* regs_per_thread, int* blocks_per_sm);
LLAR_API int NcclLLA2AOneShotSlots(int world);

// The algorithms, indexed by the FFI attribute `algorithm` (Algorithm in
// args.h); entry 0 is no algorithm. Per entry:
//   name       the key of the Python module's ALGORITHMS and MAX_BYTES;
//   launch     the production launcher;
//   max_bytes  the largest payload per rank;
//   preload    loads every kernel of the algorithm on the current device (run
//              when a communicator's region for it is allocated);
//   grid       the grid its launcher uses for a payload and a world size;
//   occupancy  registers and resident blocks of its kernel for (dtype,
//              world, threads); world 0: the run-time world-size kernel;
//   fill       the byte its scratch region holds when allocated (the
//              protocol's idle state; the LL protocols' is 0, see ll.cuh; the
//              sentinel's kSentinelFill, see sentinel.cuh);
//   lla2a_slots  null, except for an algorithm on NCCL's LL all-to-all
//              session (nccl_lla2a_one_shot): the session's slots per block
//              and epoch parity for `world` ranks. Its region is then no
//              symmetric scratch of ours: the registry creates a device
//              communicator with ncclLLA2ACreateRequirement(kMaxBlocks,
//              slots) and points the region's PeerTable::nccl_lla2a at it
//              (llar/nccl_lla2a.h); such an algorithm advances none of its
//              epoch counters (the session keeps its epochs in NCCL's buffer),
//              so the KernelGrid contract above does not apply to it, and the
//              loopback harness, which makes no NCCL call, refuses it.
// The region's size is RegionBytes(algorithm, world) (args.h).
struct AlgorithmEntry {
  const char* name;
  Launcher launch;
  std::size_t max_bytes;
  cudaError_t (*preload)();
  KernelGrid (*grid)(uint32_t n_bytes, int world);
  cudaError_t (*occupancy)(DType dtype, int world, uint32_t threads, int* regs_per_thread,
                           int* blocks_per_sm);
  uint8_t fill;
  int (*lla2a_slots)(int world) = nullptr;
};
inline constexpr AlgorithmEntry kAlgorithms[] = {
    {nullptr, nullptr, 0, nullptr, nullptr, nullptr, 0},
    {"one_shot_ll", &LaunchOneShotLL, kOneShotMaxBytes, &PreloadOneShotLL, &OneShotLLGrid,
     &OneShotLLOccupancy, 0},  // Algorithm::kOneShotLL
    {"two_shot_ll", &LaunchTwoShotLL, kTwoShotMaxBytes, &PreloadTwoShotLL, &TwoShotLLGrid,
     &TwoShotLLOccupancy, 0},  // Algorithm::kTwoShotLL
    {"one_shot_sentinel", &LaunchOneShotSentinel, kOneShotSentinelMaxBytes,
     &PreloadOneShotSentinel, &OneShotSentinelGrid, &OneShotSentinelOccupancy,
     kSentinelFill},  // Algorithm::kOneShotSentinel
    {"one_shot_ll128", &LaunchOneShotLL128, kOneShotLL128MaxBytes, &PreloadOneShotLL128,
     &OneShotLL128Grid, &OneShotLL128Occupancy, 0},  // Algorithm::kOneShotLL128
    {"nccl_lla2a_one_shot", &LaunchNcclLLA2AOneShot, kNcclLLA2AOneShotMaxBytes,
     &PreloadNcclLLA2AOneShot, &NcclLLA2AOneShotGrid, &NcclLLA2AOneShotOccupancy, 0,
     &NcclLLA2AOneShotSlots},  // Algorithm::kNcclLLA2AOneShot
    {"two_shot_ll128", &LaunchTwoShotLL128, kTwoShotLL128MaxBytes, &PreloadTwoShotLL128,
     &TwoShotLL128Grid, &TwoShotLL128Occupancy, 0},  // Algorithm::kTwoShotLL128
    {"two_shot_ll128_atomic", &LaunchTwoShotLL128Atomic, kTwoShotLL128AtomicMaxBytes,
     &PreloadTwoShotLL128Atomic, &TwoShotLL128AtomicGrid, &TwoShotLL128AtomicOccupancy,
     0},  // Algorithm::kTwoShotLL128Atomic (accumulators and mask zeroed)
};
inline constexpr int64_t kAlgorithmCount =
    static_cast<int64_t>(sizeof(kAlgorithms) / sizeof(kAlgorithms[0]));
static_assert(static_cast<int64_t>(Algorithm::kOneShotLL) == 1, "kAlgorithms order");
static_assert(static_cast<int64_t>(Algorithm::kTwoShotLL) == 2, "kAlgorithms order");
static_assert(static_cast<int64_t>(Algorithm::kOneShotSentinel) == 3, "kAlgorithms order");
static_assert(static_cast<int64_t>(Algorithm::kOneShotLL128) == 4, "kAlgorithms order");
static_assert(static_cast<int64_t>(Algorithm::kNcclLLA2AOneShot) == 5, "kAlgorithms order");
static_assert(static_cast<int64_t>(Algorithm::kTwoShotLL128) == 6, "kAlgorithms order");
static_assert(static_cast<int64_t>(Algorithm::kTwoShotLL128Atomic) == 7, "kAlgorithms order");
static_assert(kAlgorithmCount <= kMaxAlgorithms, "args.h: kMaxAlgorithms counter sets");

// The table entry of `algorithm`, or nullptr outside the table.
inline const AlgorithmEntry* FindAlgorithm(int64_t algorithm) {
  if (algorithm <= 0 || algorithm >= kAlgorithmCount) return nullptr;
  return &kAlgorithms[algorithm];
}

}  // namespace llar

#endif  // LLAR_KERNELS_H_
