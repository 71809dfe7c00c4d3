// Host-side entry points of the production kernels: the table the execute
// handler picks an algorithm's launcher from (kAlgorithms), the grid rules
// that host code and the Python mirror share, and the fused add + RMSNorm's
// launcher. Every algorithm of the table is launched by one generic path
// (kernel_table.cuh: AlgorithmKernels, AlgorithmHost); an algorithm gives
// only its kernels, its grid rule and its row. A launcher only computes its
// grid and launches; it never allocates or synchronises, so it is safe
// inside CUDA stream capture.
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

// Lines of an `n_bytes` payload that the kernels move with one access of
// `access_bytes` bytes (AllReduceArgs::vector_lines): all of them when every
// one of `buffers` is aligned to access_bytes (a power of two), else 0 (the
// byte-wise path).
inline uint32_t VectorLines(uint32_t n_bytes, std::initializer_list<const void*> buffers,
                            uint32_t access_bytes = kPayloadBytesPerLine) {
  uintptr_t bits = 0;
  for (const void* b : buffers) bits |= reinterpret_cast<uintptr_t>(b);
  return (bits & (access_bytes - 1)) == 0 ? n_bytes / access_bytes : 0;
}

// The grid of one call of an algorithm, as its launcher computes it:
// `blocks` blocks of `threads` threads. Contract of every algorithm: each
// warp of this grid advances its epoch counter (args.h: its algorithm's set)
// by exactly one per call, and no other counter changes (the loopback
// harness checks it). lines_per_block and steps are the algorithm's own
// (one-shot: lines per block, 1 step; two-shot: chunk lines per block and
// lines per thread and chunk).
struct KernelGrid {
  uint32_t blocks, lines_per_block, threads, steps;
};
using OneShotGrid = KernelGrid;  // a one-shot's grid: steps = 1

// one_shot_ll.cu: the grid of the one-shot LL kernel for `lines` LL lines
// (host and tests use the same rule; the sentinel and nccl_lla2a_one_shot use
// it too): up to `block_lines` lines per block (0: kOneShotBlockLines) until
// kMaxBlocks blocks, then up to kLinesPerBlock (the rule the kernel bench's
// block_lines sweeps measured fastest: benchmarks/NOTES.md); one thread per
// line.
inline constexpr uint32_t kOneShotBlockLines = 64;
LLAR_API OneShotGrid OneShotGridFor(uint32_t lines, uint32_t block_lines = 0);

// two_shot_ll.cu: the grid of the two-shot LL (two_shot_ll.cuh) for a
// payload of `lines` LL lines over `world` ranks (host, loopback harness and
// tests use the same rule): the largest chunk, c = TwoShotChunkOf(lines,
// world, 0).lines (args.h), spread over up to kMaxBlocks blocks of about
// kTwoShotBlockLines chunk lines each (the one-shot's 64, not measured for
// the two-shot yet); lines_per_block = ceil(c / blocks) chunk lines per
// block, threads = that rounded up to a warp, at most kMaxThreads, and
// steps = ceil(lines_per_block / threads) lines per thread and chunk (at
// most TwoShotMaxSteps(world)).
inline constexpr uint32_t kTwoShotBlockLines = 64;
LLAR_API KernelGrid TwoShotGridFor(uint32_t lines, int world);

// Launch options the kernel bench varies (LaunchWith); the production call
// uses the defaults.
struct OneShotOptions {
  bool generic = false;      // the run-time world-size kernel even for 2, 4, 8 ranks
  uint32_t block_lines = 0;  // grid rule's lines per block (0: the rule's own); only
                             // the rules over OneShotGridFor read it
};

// The host side of the algorithm `kA` of kAlgorithms: the functions of its
// row. Written once, for every algorithm, in kernel_table.cuh; the
// algorithm's .cu instantiates them for its production kernels
// (kernel_table.cuh: ProductionKernels).
//   Launch      the production launcher (Launcher); cudaErrorInvalidValue for
//               a call it does not serve (size, ranks, dtype, pointers);
//   LaunchWith  Launch with the kernel bench's OneShotOptions;
//   Preload     loads every kernel of the algorithm on the current device, so
//               that no lazy module load happens later (inside a captured
//               graph, or while a peer's kernel spins);
//   Grid        the grid Launch uses for a payload and a world size;
//   Occupancy   registers per thread and resident blocks per multiprocessor
//               of its kernel for (dtype, world, threads); world 0: the
//               run-time world-size kernel (the loopback harness's
//               co-residency check).
template <Algorithm kA>
struct LLAR_API AlgorithmHost {
  static cudaError_t Launch(AllReduceArgs args, DType dtype, cudaStream_t stream);
  static cudaError_t LaunchWith(AllReduceArgs args, DType dtype, cudaStream_t stream,
                                const OneShotOptions& options);
  static cudaError_t Preload();
  static KernelGrid Grid(uint32_t n_bytes, int world);
  static cudaError_t Occupancy(DType dtype, int world, uint32_t threads, int* regs_per_thread,
                               int* blocks_per_sm);
};
// One .cu instantiates each (the one of the algorithm); no other unit does.
// These declarations carry LLAR_API themselves: without it clang (the CUDA 12
// build) leaves the instantiations hidden and the modules fail to load.
extern template struct LLAR_API AlgorithmHost<Algorithm::kOneShotLL>;
extern template struct LLAR_API AlgorithmHost<Algorithm::kTwoShotLL>;
extern template struct LLAR_API AlgorithmHost<Algorithm::kOneShotSentinel>;
extern template struct LLAR_API AlgorithmHost<Algorithm::kOneShotLL128>;
extern template struct LLAR_API AlgorithmHost<Algorithm::kNcclLLA2AOneShot>;
extern template struct LLAR_API AlgorithmHost<Algorithm::kTwoShotLL128>;
extern template struct LLAR_API AlgorithmHost<Algorithm::kTwoShotLL128Atomic>;

// The host functions the tools (ffi/tools) call by name.
inline constexpr auto& LaunchOneShotLL = AlgorithmHost<Algorithm::kOneShotLL>::Launch;
inline constexpr auto& LaunchOneShotLLWith = AlgorithmHost<Algorithm::kOneShotLL>::LaunchWith;
inline constexpr auto& PreloadOneShotLL = AlgorithmHost<Algorithm::kOneShotLL>::Preload;
inline constexpr auto& OneShotLLOccupancy = AlgorithmHost<Algorithm::kOneShotLL>::Occupancy;
inline constexpr auto& LaunchOneShotSentinelWith =
    AlgorithmHost<Algorithm::kOneShotSentinel>::LaunchWith;

// nccl_lla2a_one_shot.cu: the slots per block and epoch parity of NCCL's LL
// all-to-all session for `world` ranks, ncclLLA2ACalcSlots(world *
// kLinesPerBlock, kPayloadBytesPerLine) (its row's lla2a_slots).
LLAR_API int NcclLLA2AOneShotSlots(int world);

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

// The algorithms, indexed by the FFI attribute `algorithm` (Algorithm in
// args.h); entry 0 is no algorithm. Per entry:
//   id         the Algorithm it describes (its index in kAlgorithms);
//   name       the key of the Python module's ALGORITHMS and MAX_BYTES;
//   launch     the production launcher (AlgorithmHost<id>::Launch);
//   max_bytes  the largest payload per rank (the launcher refuses more);
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
//              epoch counters (the session keeps its epochs in NCCL's buffer;
//              its launcher needs no AllReduceArgs::epochs), so the
//              KernelGrid contract above does not apply to it, and the
//              loopback harness, which makes no NCCL call, refuses it.
// The region's size is RegionBytes(algorithm, world) (args.h).
struct AlgorithmEntry {
  Algorithm id;
  const char* name;
  Launcher launch;
  std::size_t max_bytes;
  cudaError_t (*preload)();
  KernelGrid (*grid)(uint32_t n_bytes, int world);
  cudaError_t (*occupancy)(DType dtype, int world, uint32_t threads, int* regs_per_thread,
                           int* blocks_per_sm);
  uint8_t fill;
  int (*lla2a_slots)(int world);
};

// A row of kAlgorithms by field name (C++17 has no designated initializers):
//   AlgorithmRow<Algorithm::kX>("x").MaxBytes(n)[.Fill(b)][.Lla2aSlots(&f)]
// names id, name and max_bytes; launch, preload, grid and occupancy are
// AlgorithmHost<Algorithm::kX>'s; fill is 0 and lla2a_slots null unless set.
template <Algorithm kA>
class AlgorithmRow {
 public:
  constexpr explicit AlgorithmRow(const char* name)
      : e_{kA,
           name,
           &AlgorithmHost<kA>::Launch,
           0,
           &AlgorithmHost<kA>::Preload,
           &AlgorithmHost<kA>::Grid,
           &AlgorithmHost<kA>::Occupancy,
           0,
           nullptr} {}
  constexpr AlgorithmRow MaxBytes(std::size_t n) const {
    return With(&AlgorithmEntry::max_bytes, n);
  }
  constexpr AlgorithmRow Fill(uint8_t b) const { return With(&AlgorithmEntry::fill, b); }
  constexpr AlgorithmRow Lla2aSlots(int (*f)(int)) const {
    return With(&AlgorithmEntry::lla2a_slots, f);
  }
  constexpr operator AlgorithmEntry() const { return e_; }

 private:
  template <typename Field, typename Value>
  constexpr AlgorithmRow With(Field AlgorithmEntry::*field, Value v) const {
    AlgorithmRow r = *this;
    r.e_.*field = v;
    return r;
  }
  AlgorithmEntry e_;
};

inline constexpr AlgorithmEntry kAlgorithms[] = {
    AlgorithmEntry{},  // id 0: no algorithm
    AlgorithmRow<Algorithm::kOneShotLL>("one_shot_ll").MaxBytes(kOneShotMaxBytes),
    AlgorithmRow<Algorithm::kTwoShotLL>("two_shot_ll").MaxBytes(kTwoShotMaxBytes),
    AlgorithmRow<Algorithm::kOneShotSentinel>("one_shot_sentinel")
        .MaxBytes(kOneShotSentinelMaxBytes)
        .Fill(kSentinelFill),
    AlgorithmRow<Algorithm::kOneShotLL128>("one_shot_ll128").MaxBytes(kOneShotLL128MaxBytes),
    AlgorithmRow<Algorithm::kNcclLLA2AOneShot>("nccl_lla2a_one_shot")
        .MaxBytes(kNcclLLA2AOneShotMaxBytes)
        .Lla2aSlots(&NcclLLA2AOneShotSlots),
    AlgorithmRow<Algorithm::kTwoShotLL128>("two_shot_ll128").MaxBytes(kTwoShotLL128MaxBytes),
    // accumulators and mask zeroed: fill 0
    AlgorithmRow<Algorithm::kTwoShotLL128Atomic>("two_shot_ll128_atomic")
        .MaxBytes(kTwoShotLL128AtomicMaxBytes),
};
inline constexpr int64_t kAlgorithmCount =
    static_cast<int64_t>(sizeof(kAlgorithms) / sizeof(kAlgorithms[0]));
static_assert(kAlgorithmCount <= kMaxAlgorithms, "args.h: kMaxAlgorithms counter sets");

// Row i describes Algorithm i, with a name and a payload limit.
constexpr bool AlgorithmRowsInOrder() {
  for (int64_t i = 1; i < kAlgorithmCount; ++i) {
    const AlgorithmEntry& e = kAlgorithms[i];
    if (static_cast<int64_t>(e.id) != i || e.name == nullptr || e.max_bytes == 0) return false;
  }
  return true;
}
static_assert(AlgorithmRowsInOrder(), "kAlgorithms: row i is Algorithm i, named, with max_bytes");

// The table entry of `algorithm`, or nullptr outside the table.
inline const AlgorithmEntry* FindAlgorithm(int64_t algorithm) {
  if (algorithm <= 0 || algorithm >= kAlgorithmCount) return nullptr;
  return &kAlgorithms[algorithm];
}

}  // namespace llar

#endif  // LLAR_KERNELS_H_
