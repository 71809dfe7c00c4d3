// The one launch path of every algorithm of kAlgorithms (kernels.h), written
// once: an algorithm's kernel header gives its Rule, its .cu defines the
// Rule's grid rule and names its production kernels, and this file does the
// rest.
//
//   KernelTable<Rule, kWorlds...>       which compiled kernel serves a dtype
//                                       and a number of ranks; loading them
//                                       all; their occupancy; one launch.
//   AlgorithmKernels<Rule, kWorlds...>  a call: the argument checks, the grid
//                                       and the fields of AllReduceArgs that
//                                       depend on it, the kernel, the launch.
//   ProductionKernels<kA>               the AlgorithmKernels of kAlgorithms'
//                                       row kA: the algorithm's .cu
//                                       specializes it and instantiates
//                                       AlgorithmHost<kA> (kernels.h, defined
//                                       below) from it:
//     template <>
//     struct ProductionKernels<Algorithm::kX> : AlgorithmKernels<XRule, 0, 2, 4, 8> {};
//     template struct AlgorithmHost<Algorithm::kX>;
//
// A Rule, one struct in the algorithm's kernel header (most of it from its
// base, RuleOf<Algorithm::kX, its line protocol, OneShotSteps for a
// one-shot>, below), has:
//   kAlgorithm         its row of kAlgorithms: a call may carry at most the
//                      row's max_bytes, and needs epoch counters unless the
//                      row has lla2a_slots;
//   Get<T, kWorld>()   its kernel of dtype T compiled for kWorld ranks (0: any
//                      number, read from AllReduceArgs::world at run time);
//   kInt32             whether it serves int32 (For gives nullptr if not);
//   kLinePayloadBytes  payload bytes per line, the unit of its grid rule;
//   kVectorBytes       bytes of one vector access (AllReduceArgs::
//                      vector_lines counts them);
//                      these three are its line protocol's (LLLines,
//                      LL128Lines below; one_shot_sentinel.cuh's);
//   Grid(lines, world, block_lines)  its grid rule for `lines` lines over
//                      `world` ranks; block_lines is OneShotOptions'
//                      (0: the rule's own), which only the rules over
//                      OneShotGridFor read;
//   MaxSteps(world)    the steps per thread its region holds (OneShotSteps
//                      below: 1, the one-shots).
// kWorlds: the kernels compiled: 0 (any number of ranks) and the numbers of
// ranks compiled as constants; every other number runs the kWorld = 0
// kernel. Their order is the order in which nvcc emits the kernels, which
// ptxas's output depends on: keep an algorithm's order when it moves here
// (the SASS record, scripts/sass_record.py, checks it).
//
// nvcc and the SASS: nvcc names a unit's internal-linkage device functions
// (anonymous namespaces) after the first ordinary external function the unit
// defines; a unit with an explicit instantiation (AlgorithmHost) but no such
// function gets the process id in those names instead, which changes ptxas's
// placement of them ("instructions reordered") from build to build. So every
// algorithm's .cu defines at least one ordinary function: its grid rule
// (Rule::Grid, or the named rule the Rule calls).
#ifndef LLAR_KERNELS_KERNEL_TABLE_CUH_
#define LLAR_KERNELS_KERNEL_TABLE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {

// The line protocols' part of a Rule. LL (ll.cuh): 8 payload bytes per
// 16-byte line, moved 8 bytes at a time.
struct LLLines {
  static constexpr bool kInt32 = true;
  static constexpr uint32_t kLinePayloadBytes = kPayloadBytesPerLine;
  static constexpr uint32_t kVectorBytes = kPayloadBytesPerLine;
};
// LL128 (ll128.cuh): 120 payload bytes per 128-byte line, moved 8 bytes at a
// time.
struct LL128Lines {
  static constexpr bool kInt32 = true;
  static constexpr uint32_t kLinePayloadBytes = kLL128PayloadBytes;
  static constexpr uint32_t kVectorBytes = kPayloadBytesPerLine;
};

// The arithmetic every grid rule shares: `lines` lines spread over up to
// kMaxBlocks blocks of about `block_lines` lines each (one block at least);
// lines_per_block = ceil(lines / blocks); threads: lines_per_block in whole
// warps of `lines_per_warp` line slots, one warp at least and `max_warps` at
// most; steps = ceil(lines_per_block / line slots per block) (0 for 0 lines).
inline constexpr uint32_t kNoWarpBound = UINT32_MAX;  // max_warps of the one-shots
constexpr KernelGrid LineGrid(uint32_t lines, uint32_t block_lines, uint32_t lines_per_warp,
                              uint32_t max_warps) {
  uint32_t blocks = (lines + block_lines - 1) / block_lines;
  if (blocks > uint32_t(kMaxBlocks)) blocks = kMaxBlocks;
  if (blocks == 0) blocks = 1;
  const uint32_t per_block = (lines + blocks - 1) / blocks;
  uint32_t warps = (per_block + lines_per_warp - 1) / lines_per_warp;
  if (warps > max_warps) warps = max_warps;
  if (warps == 0) warps = 1;
  const uint32_t slots = warps * lines_per_warp;
  return {blocks, per_block, warps * kWarpSize, (per_block + slots - 1) / slots};
}

// A one-shot's grid: every line of a block has its own line slot, 1 step.
constexpr KernelGrid OneStep(KernelGrid g) {
  g.steps = 1;
  return g;
}

// The lines of a two-shot's largest chunk, chunk 0 (args.h: TwoShotChunkOf),
// which its grid spreads over the blocks.
constexpr uint32_t TwoShotLargestChunk(uint32_t lines, int world) {
  return world >= 1 ? TwoShotChunkOf(lines, world, 0).lines : lines;
}

// The steps of a one-shot's Rule: every line of a block has its own line
// slot (OneStep), so its region holds 1 step.
struct OneShotSteps {
  static uint32_t MaxSteps(int) { return 1; }
};

// The base of a Rule: its row kA (kAlgorithm) and the Parts it shares with
// other rules (its line protocol, OneShotSteps).
template <Algorithm kA, typename... Parts>
struct RuleOf : Parts... {
  static constexpr Algorithm kAlgorithm = kA;
};

// The checks every call makes on its argument block (n_bytes > 0 is the
// caller's: a call of 0 bytes returns cudaSuccess first): at most the row's
// max_bytes payload bytes per rank, 2 to kMaxRanks ranks, a rank below the
// world, a peer table, and epoch counters unless the algorithm keeps its
// epochs in NCCL's session (kernels.h: lla2a_slots).
inline bool LaunchArgsValid(const AllReduceArgs& a, const AlgorithmEntry& row) {
  return a.n_bytes <= row.max_bytes && a.world >= 2 && a.world <= kMaxRanks && a.rank < a.world &&
         a.peers != nullptr && (a.epochs != nullptr || row.lla2a_slots != nullptr);
}

template <typename Rule, int... kWorlds>
struct KernelTable {
  using Kernel = void (*)(AllReduceArgs);

  static_assert(((kWorlds == 0) || ...), "kWorlds: the run-time world-size kernel, 0, is missing");

  // The kernel compiled for `world` ranks, else the kWorld = 0 one.
  template <typename T>
  static Kernel ForWorld(int world) {
    Kernel exact = nullptr, any = nullptr;
    const auto pick = [&](int compiled, Kernel kernel) {
      if (compiled == 0) {
        any = kernel;
      } else if (compiled == world) {
        exact = kernel;
      }
    };
    (pick(kWorlds, Rule::template Get<T, kWorlds>()), ...);  // in kWorlds' order
    return exact != nullptr ? exact : any;
  }

  static Kernel For(DType dtype, int world) {
    switch (dtype) {
      case DType::kF32: return ForWorld<float>(world);
      case DType::kBF16: return ForWorld<__nv_bfloat16>(world);
      case DType::kF16: return ForWorld<__half>(world);
      case DType::kI32:
        if constexpr (Rule::kInt32) {
          return ForWorld<int32_t>(world);
        } else {
          return nullptr;
        }
    }
    return nullptr;
  }

  // Loads, on the current device, the kernel of every dtype served and of
  // every one of kWorlds, so that no lazy module load happens later.
  static cudaError_t Preload() {
    cudaFuncAttributes attr;
    for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
      for (int world : {kWorlds...}) {
        const Kernel kernel = For(d, world);
        if (kernel == nullptr) continue;  // a dtype the algorithm does not serve
        const cudaError_t e =
            cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel));
        if (e != cudaSuccess) return e;
      }
    }
    return cudaSuccess;
  }

  // The occupancy of the kernel For(dtype, world) with `threads` threads per
  // block on the current device (kernels.h: AlgorithmHost::Occupancy).
  static cudaError_t Occupancy(DType dtype, int world, uint32_t threads, int* regs_per_thread,
                               int* blocks_per_sm) {
    const void* kernel = reinterpret_cast<const void*>(For(dtype, world));
    if (kernel == nullptr) return cudaErrorInvalidValue;
    cudaFuncAttributes attr;
    const cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
    if (e != cudaSuccess) return e;
    *regs_per_thread = attr.numRegs;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel,
                                                         static_cast<int>(threads), 0);
  }

  // Launches the kernel For(dtype, world) with `a` on a grid of `blocks`
  // blocks of `threads` threads; cudaErrorInvalidValue when the table has
  // none for that dtype, else the launch's error.
  static cudaError_t Run(const AllReduceArgs& a, DType dtype, int world, uint32_t blocks,
                         uint32_t threads, cudaStream_t stream) {
    const Kernel fn = For(dtype, world);
    if (fn == nullptr) return cudaErrorInvalidValue;
    fn<<<blocks, threads, 0, stream>>>(a);
    return cudaGetLastError();
  }
};

template <typename RuleT, int... kWorlds>
struct AlgorithmKernels : KernelTable<RuleT, kWorlds...> {
  using Rule = RuleT;
  using Table = KernelTable<Rule, kWorlds...>;

  // The grid of a call of `n_bytes` per rank over `world` ranks.
  static KernelGrid Grid(uint32_t n_bytes, int world, uint32_t block_lines = 0) {
    const uint32_t lines = (n_bytes + Rule::kLinePayloadBytes - 1) / Rule::kLinePayloadBytes;
    return Rule::Grid(lines, world, block_lines);
  }

  // Checks `a`, fills in its grid-dependent fields and launches; a.world
  // picks the kernel unless options.generic asks for the run-time one.
  static cudaError_t Launch(AllReduceArgs a, DType dtype, cudaStream_t stream,
                            const OneShotOptions& options = {}) {
    if (a.n_bytes == 0) return cudaSuccess;
    if (!LaunchArgsValid(a, kAlgorithms[static_cast<int>(Rule::kAlgorithm)])) {
      return cudaErrorInvalidValue;
    }
    a.vector_lines = VectorLines(a.n_bytes, {a.in, a.out}, Rule::kVectorBytes);
    const KernelGrid g = Grid(a.n_bytes, a.world, options.block_lines);
    // The region holds MaxSteps steps (the two-shots' kernels for 2 ranks
    // batch that many and compute offsets for all of them).
    if (g.steps > Rule::MaxSteps(a.world)) return cudaErrorInvalidValue;
    a.lines_per_block = static_cast<uint16_t>(g.lines_per_block);
    return Table::Run(a, dtype, options.generic ? 0 : a.world, g.blocks, g.threads, stream);
  }
};

template <Algorithm kA>
struct ProductionKernels;  // specialized by the algorithm's .cu

template <Algorithm kA>
cudaError_t AlgorithmHost<kA>::Launch(AllReduceArgs args, DType dtype, cudaStream_t stream) {
  static_assert(ProductionKernels<kA>::Rule::kAlgorithm == kA, "another algorithm's kernels");
  return ProductionKernels<kA>::Launch(args, dtype, stream);
}

template <Algorithm kA>
cudaError_t AlgorithmHost<kA>::LaunchWith(AllReduceArgs args, DType dtype, cudaStream_t stream,
                                          const OneShotOptions& options) {
  return ProductionKernels<kA>::Launch(args, dtype, stream, options);
}

template <Algorithm kA>
cudaError_t AlgorithmHost<kA>::Preload() {
  return ProductionKernels<kA>::Preload();
}

template <Algorithm kA>
KernelGrid AlgorithmHost<kA>::Grid(uint32_t n_bytes, int world) {
  return ProductionKernels<kA>::Grid(n_bytes, world);
}

template <Algorithm kA>
cudaError_t AlgorithmHost<kA>::Occupancy(DType dtype, int world, uint32_t threads,
                                         int* regs_per_thread, int* blocks_per_sm) {
  return ProductionKernels<kA>::Occupancy(dtype, world, threads, regs_per_thread,
                                          blocks_per_sm);
}

}  // namespace llar

#endif  // LLAR_KERNELS_KERNEL_TABLE_CUH_
