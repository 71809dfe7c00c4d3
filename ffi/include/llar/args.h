// Plain data shared by the host (FFI handlers, registry) and the kernels.
//
// Nothing in this header knows about XLA, NCCL or Python: it fixes the
// geometry of the symmetric scratch, the kernel argument block and the error
// record that a bounded wait fills in before it fails the call.
//
// Names: `world` is the number of ranks of a replica group, what NCCL calls
// `nRanks`; `rank` is a device's index in its group, NCCL's `rank`.
#ifndef LLAR_ARGS_H_
#define LLAR_ARGS_H_

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define LLAR_HOST_DEVICE __host__ __device__
#else
#define LLAR_HOST_DEVICE
#endif

namespace llar {

// Largest replica group a communicator serves (one NVLink domain of H200s is
// 8; 16 leaves room for larger domains without changing the argument block).
inline constexpr int kMaxRanks = 16;

// One-shot LL geometry. Every block of the kernel owns a fixed region of the
// scratch, and each of its warps 32 lines of that region with an epoch
// counter of its own (epoch.cuh).
inline constexpr int kMaxBlocks = 64;          // blocks per call, at most
inline constexpr int kLinesPerBlock = 512;     // LL lines per block and source rank
inline constexpr int kLineBytes = 16;          // {d0, flag, d1, flag}
inline constexpr int kPayloadBytesPerLine = 8; // d0 and d1
inline constexpr int kMaxThreads = 512;        // one line per thread
inline constexpr int kWarpSize = 32;
inline constexpr int kMaxWarps = kMaxThreads / kWarpSize;  // warps per block, at most
// Largest thread block cluster a kernel uses (the portable cluster size;
// cluster_sum.cuh).
inline constexpr int kMaxClusterBlocks = 8;
// Epoch counters per device and communicator: one per (block, warp) (epoch.cuh).
inline constexpr int kEpochCounters = kMaxBlocks * kMaxWarps;

// Largest payload per rank the one-shot LL kernel takes: 64 * 512 * 8 B = 256 KiB.
inline constexpr std::size_t kOneShotMaxBytes =
    std::size_t(kMaxBlocks) * kLinesPerBlock * kPayloadBytesPerLine;

// Largest payload per rank the one-shot sentinel kernel takes: the
// one-shot's slots, each carrying 16 payload bytes (sentinel.cuh, no flag
// words): 64 * 512 * 16 B = 512 KiB in a region of OneShotScratchBytes.
inline constexpr std::size_t kOneShotSentinelMaxBytes =
    std::size_t(kMaxBlocks) * kLinesPerBlock * kLineBytes;
// The byte a sentinel region is filled with when allocated: every slot
// armed (sentinel.cuh: kSentinelWord is this byte eight times).
inline constexpr uint8_t kSentinelFill = 0xFF;

enum class DType : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2, kI32 = 3 };

// The FFI attribute `algorithm`; the execute handler's launcher table
// (kernels/kernels.h) is indexed by it. Ids are dense, from 1.
//
// Scratch regions: every algorithm has a symmetric scratch region of its own
// (RegionBytes below), allocated per communicator the first time a lowering
// picks the algorithm (registry.h: EnsureRegion), and a set of
// kEpochCounters epoch counters of its own (EpochSetOffset). A kernel sees
// its region through its PeerTable (scratch[p] is the base of the region on
// rank p; offsets below are from that base) and its counters through
// AllReduceArgs::epochs.
enum class Algorithm : int32_t {
  kOneShotLL = 1, kTwoShotLL = 2, kOneShotSentinel = 3, kOneShotLL128 = 4,
  kNcclLLA2AOneShot = 5, kTwoShotLL128 = 6, kTwoShotLL128Atomic = 7 };

// Ids an algorithm may take: 1 .. kMaxAlgorithms - 1. Sizes the per-device
// state words (one counter set per id), not the launcher table.
inline constexpr int kMaxAlgorithms = 8;

// Bytes of the one-shot's scratch region per rank for a group of `world`
// ranks: two halves (epoch parity) x blocks x source ranks x lines x 16 B.
constexpr std::size_t OneShotScratchBytes(int world) {
  return std::size_t(2) * kMaxBlocks * std::size_t(world) * kLinesPerBlock *
         kLineBytes;
}

// Byte offset of line `line` of block `block`, sent by rank `src`, in half
// `half` of the one-shot's region. Computed in 32 bits (every region is
// below 2 GiB: RegionsFit32Bits): fewer instructions before the first store
// than 64-bit arithmetic.
LLAR_HOST_DEVICE constexpr std::size_t ScratchOffset(int half, int block,
                                                     int world, int src,
                                                     int line) {
  return std::size_t(
      (((uint32_t(half) * kMaxBlocks + uint32_t(block)) * uint32_t(world) +
        uint32_t(src)) * kLinesPerBlock + uint32_t(line)) * kLineBytes);
}

// Two-shot LL geometry (kernels/two_shot_ll.cuh, which states the protocol).
// Largest payload per rank: 4 MiB.
inline constexpr std::size_t kTwoShotMaxBytes = std::size_t(4) * 1024 * 1024;
// Lines of one step: one line per thread of the largest grid. A chunk of more
// lines takes more than one step per thread.
inline constexpr uint32_t kTwoShotStepLines = uint32_t(kMaxBlocks) * kLinesPerBlock;
// The phases, each with a region of its own: reduce-scatter, all-gather.
inline constexpr int kTwoShotReduceScatter = 0;
inline constexpr int kTwoShotAllGather = 1;
inline constexpr int kTwoShotPhases = 2;

// Chunk `owner` of a payload of `lines` LL lines cut into `world` chunks as
// equal as possible: the first lines % world chunks have one line more, so
// chunk 0 is the largest and, for lines >= 1, never empty.
struct TwoShotChunk {
  uint32_t start, lines;
};
LLAR_HOST_DEVICE constexpr TwoShotChunk TwoShotChunkOf(uint32_t lines, int world, int owner) {
  const uint32_t base = lines / uint32_t(world);
  const uint32_t extra = lines % uint32_t(world);
  const uint32_t o = uint32_t(owner);
  return {o * base + (o < extra ? o : extra), base + (o < extra ? 1u : 0u)};
}

// Steps per thread the two-shot's region holds for `world` ranks: enough for
// the largest chunk of kTwoShotMaxBytes (8 for 2 ranks, 1 for 16).
LLAR_HOST_DEVICE constexpr uint32_t TwoShotMaxSteps(int world) {
  const uint32_t lines = uint32_t(kTwoShotMaxBytes / kPayloadBytesPerLine);
  const uint32_t chunk = (lines + uint32_t(world) - 1) / uint32_t(world);
  return (chunk + kTwoShotStepLines - 1) / kTwoShotStepLines;
}

// Bytes of the two-shot's region per rank: steps x two halves x two phases x
// source ranks x kTwoShotStepLines lines x 16 B (32 MiB for 2, 4, 8 or 16
// ranks; 36 MiB for 3).
constexpr std::size_t TwoShotScratchBytes(int world) {
  return std::size_t(TwoShotMaxSteps(world)) * 2 * kTwoShotPhases * std::size_t(world) *
         kTwoShotStepLines * kLineBytes;
}

// Byte offset of the slot (step, half, phase, src, block, thread t) in the
// two-shot's region. Its position depends only on (step, block, t) besides
// the half, the phase and the source, never on the grid of the call, so the
// slot always belongs to warp (block, t / 32) (two_shot_ll.cuh). 32-bit
// arithmetic as ScratchOffset.
LLAR_HOST_DEVICE constexpr uint32_t TwoShotOffset(int step, int half, int phase, int world,
                                                  int src, int block, int t) {
  return (((((uint32_t(step) * 2 + uint32_t(half)) * kTwoShotPhases + uint32_t(phase)) *
                uint32_t(world) + uint32_t(src)) * kMaxBlocks + uint32_t(block)) *
              kLinesPerBlock + uint32_t(t)) * kLineBytes;
}

// One-shot LL128 geometry (ll128.cuh, kernels/one_shot_ll128.cuh). A line
// is 128 bytes, 120 of them payload and 8 the flag word, carried by 8 lanes;
// a block of kMaxThreads threads carries kMaxThreads / 8 lines. Every block
// owns a fixed part of the region, each of its warps 4 lines of it.
inline constexpr int kLL128LineBytes = 128;
inline constexpr int kLL128PayloadBytes = 120;
inline constexpr int kLL128LinesPerBlock = kMaxThreads / 8;  // lines per block and source
// Largest payload per rank the one-shot LL128 kernel takes:
// 64 blocks * 64 lines * 120 B = 491520 B (480 KiB).
inline constexpr std::size_t kOneShotLL128MaxBytes =
    std::size_t(kMaxBlocks) * kLL128LinesPerBlock * kLL128PayloadBytes;

// Bytes of the one-shot LL128's region per rank: two halves (epoch parity)
// x blocks x source ranks x lines x 128 B (1 MiB per rank of the group).
constexpr std::size_t OneShotLL128RegionBytes(int world) {
  return std::size_t(2) * kMaxBlocks * std::size_t(world) * kLL128LinesPerBlock *
         kLL128LineBytes;
}

// Byte offset of line `line` of block `block`, sent by rank `src`, in half
// `half` of the one-shot LL128's region (32-bit arithmetic as ScratchOffset).
// A lane's 16-byte part j of the line is at this offset + 16 j.
LLAR_HOST_DEVICE constexpr uint32_t OneShotLL128Offset(int half, int block, int world, int src,
                                                       int line) {
  return (((uint32_t(half) * kMaxBlocks + uint32_t(block)) * uint32_t(world) + uint32_t(src)) *
              kLL128LinesPerBlock + uint32_t(line)) * kLL128LineBytes;
}

// Two-shot LL128 geometry (kernels/two_shot_ll128.cuh, which states the
// protocol): two_shot_ll's phases and steps, in LL128 lines. Largest payload
// per rank: 4 MiB.
inline constexpr std::size_t kTwoShotLL128MaxBytes = std::size_t(4) * 1024 * 1024;
// Line slots of one step: kLL128LinesPerBlock per block of the largest grid.
inline constexpr uint32_t kTwoShotLL128StepLines = uint32_t(kMaxBlocks) * kLL128LinesPerBlock;

// Steps the two-shot LL128's region holds for `world` ranks: enough for the
// largest chunk of kTwoShotLL128MaxBytes (5 for 2 ranks, 1 for 16).
LLAR_HOST_DEVICE constexpr uint32_t TwoShotLL128MaxSteps(int world) {
  const uint32_t lines = uint32_t((kTwoShotLL128MaxBytes + kLL128PayloadBytes - 1) /
                                  kLL128PayloadBytes);
  const uint32_t chunk = (lines + uint32_t(world) - 1) / uint32_t(world);
  return (chunk + kTwoShotLL128StepLines - 1) / kTwoShotLL128StepLines;
}

// Bytes of the two-shot LL128's region per rank: steps x two halves x two
// phases x source ranks x kTwoShotLL128StepLines slots x 128 B.
constexpr std::size_t TwoShotLL128RegionBytes(int world) {
  return std::size_t(TwoShotLL128MaxSteps(world)) * 2 * kTwoShotPhases * std::size_t(world) *
         kTwoShotLL128StepLines * kLL128LineBytes;
}

// Byte offset of the line slot (step, half, phase, src, block, slot) in the
// two-shot LL128's region (32-bit arithmetic as ScratchOffset). A lane's
// 16-byte part j of the line is at this offset + 16 j.
LLAR_HOST_DEVICE constexpr uint32_t TwoShotLL128Offset(int step, int half, int phase, int world,
                                                       int src, int block, int slot) {
  return (((((uint32_t(step) * 2 + uint32_t(half)) * kTwoShotPhases + uint32_t(phase)) *
                uint32_t(world) + uint32_t(src)) * kMaxBlocks + uint32_t(block)) *
              kLL128LinesPerBlock + uint32_t(slot)) * kLL128LineBytes;
}

// Two-shot LL128 atomic geometry (kernels/two_shot_ll128_atomic.cuh, which
// states the protocol): the two-shot LL128's chunks, grid and steps; the
// reduce-scatter adds into an accumulator slot per chunk line on its owner,
// the all-gather is the two-shot LL128's, in LL128 lines. Largest payload per
// rank: 4 MiB, the two-shot LL128's (so TwoShotLL128MaxSteps gives the steps).
inline constexpr std::size_t kTwoShotLL128AtomicMaxBytes = kTwoShotLL128MaxBytes;
// An accumulator slot per chunk line: lane j of the line's 8 adds into the
// kAtomicLanePartBytes at kAtomicLanePartBytes * j (float32 words for the
// float dtypes, a line's 16-bit elements widened, uint32 words for int32);
// lane 7 uses at most 16 of its bytes, and the 32-bit arrival mask lives at
// kAtomicArrivalsOffset, inside lane 7's part.
inline constexpr int kAtomicSlotBytes = 256;
inline constexpr int kAtomicLanePartBytes = 32;
inline constexpr int kAtomicArrivalsOffset = 240;

// Bytes of the accumulator slots of the two-shot LL128 atomic's region:
// steps x two halves x blocks x line slots x kAtomicSlotBytes.
LLAR_HOST_DEVICE constexpr uint32_t TwoShotLL128AtomicAccBytes(int world) {
  return TwoShotLL128MaxSteps(world) * 2u * uint32_t(kMaxBlocks) *
         uint32_t(kLL128LinesPerBlock) * uint32_t(kAtomicSlotBytes);
}

// Bytes of the two-shot LL128 atomic's region per rank: the accumulator
// slots, then the all-gather's LL128 line slots (steps x two halves x source
// ranks x blocks x line slots x 128 B).
constexpr std::size_t TwoShotLL128AtomicRegionBytes(int world) {
  return std::size_t(TwoShotLL128AtomicAccBytes(world)) +
         std::size_t(TwoShotLL128MaxSteps(world)) * 2 * std::size_t(world) *
             kTwoShotLL128StepLines * kLL128LineBytes;
}

// Byte offset of the accumulator slot (step, half, block, slot) in the
// two-shot LL128 atomic's region (32-bit arithmetic as ScratchOffset). Lane
// j's part is at this offset + kAtomicLanePartBytes * j, the arrival mask at
// this offset + kAtomicArrivalsOffset.
LLAR_HOST_DEVICE constexpr uint32_t TwoShotLL128AtomicAccOffset(int step, int half, int block,
                                                                int slot) {
  return (((uint32_t(step) * 2 + uint32_t(half)) * kMaxBlocks + uint32_t(block)) *
              kLL128LinesPerBlock + uint32_t(slot)) * kAtomicSlotBytes;
}

// Byte offset of the all-gather line slot (step, half, src, block, slot) in
// the two-shot LL128 atomic's region, after the accumulator slots. A lane's
// 16-byte part j of the line is at this offset + 16 j.
LLAR_HOST_DEVICE constexpr uint32_t TwoShotLL128AtomicGatherOffset(int step, int half, int world,
                                                                   int src, int block, int slot) {
  return TwoShotLL128AtomicAccBytes(world) +
         ((((uint32_t(step) * 2 + uint32_t(half)) * uint32_t(world) + uint32_t(src)) *
               kMaxBlocks + uint32_t(block)) * kLL128LinesPerBlock + uint32_t(slot)) *
             kLL128LineBytes;
}

// NCCL LL all-to-all one-shot (llar/nccl_lla2a.h,
// kernels/nccl_lla2a_one_shot.cuh). Its exchange lives in NCCL's buffer, not
// in a symmetric region of ours: kMaxBlocks sessions (one per thread block),
// each a line for its epoch and, per epoch parity, world x kLinesPerBlock
// 16-byte slots of one 8-byte element (ncclLLA2ACalcSlots(world *
// kLinesPerBlock, 8)). Largest payload per rank: the one-shot LL's grid,
// kMaxBlocks x kLinesPerBlock lines of 8 bytes (256 KiB).
inline constexpr std::size_t kNcclLLA2AOneShotMaxBytes = kOneShotMaxBytes;

// Bytes of that buffer per rank for `world` ranks: what
// ncclLLA2ACreateRequirement(kMaxBlocks, slots) asks NCCL's device
// communicator for, kMaxBlocks x (1 + 2 x slots) x 16 B (the registry checks
// that NCCL asks for exactly this). It is the algorithm's RegionBytes, so that
// jax_llar.status() counts the memory it holds.
constexpr std::size_t NcclLLA2ABufferBytes(int world) {
  return std::size_t(kMaxBlocks) * (1 + 2 * std::size_t(world) * kLinesPerBlock) * kLineBytes;
}

// Bytes of `algorithm`'s scratch region per rank for a group of `world`
// ranks; 0 for an id that is no algorithm. What a communicator allocates per
// algorithm it serves (ffi/src/registry/) and the loopback harness gives each
// simulated rank.
constexpr std::size_t RegionBytes(Algorithm algorithm, int world) {
  switch (algorithm) {
    case Algorithm::kOneShotLL: return OneShotScratchBytes(world);
    case Algorithm::kTwoShotLL: return TwoShotScratchBytes(world);
    case Algorithm::kOneShotSentinel: return OneShotScratchBytes(world);  // the same slots
    case Algorithm::kOneShotLL128: return OneShotLL128RegionBytes(world);
    case Algorithm::kNcclLLA2AOneShot: return NcclLLA2ABufferBytes(world);  // NCCL's
    case Algorithm::kTwoShotLL128: return TwoShotLL128RegionBytes(world);
    case Algorithm::kTwoShotLL128Atomic: return TwoShotLL128AtomicRegionBytes(world);
  }
  return 0;
}

constexpr bool RegionsFit32Bits() {
  for (int a = 1; a < kMaxAlgorithms; ++a) {
    for (int w = 2; w <= kMaxRanks; ++w) {
      if (RegionBytes(static_cast<Algorithm>(a), w) > (std::size_t(1) << 31)) return false;
    }
  }
  return true;
}
static_assert(RegionsFit32Bits(), "the kernels' 32-bit offset arithmetic");

// Call signatures (ll.cuh, "Signatures"): a 16-bit value per call, the same
// on every rank, that the flag words of the flag-carrying protocols carry, so
// that a wait never accepts a line of another call.
inline constexpr int kSignatureBits = 16;

// Whether `algorithm`'s lines carry AllReduceArgs::signature, so that a
// mispaired call ends in the foreign-signature error (ErrorRecord code 2) or
// the timeout, never in a wrong sum. The LL and LL128 protocols do; the
// sentinel's lines carry no flag word at all (sentinel.cuh), NCCL's LL
// all-to-all session writes NCCL's own flags (nccl_lla2a.h), and any
// algorithm not listed here is taken as unsigned (jax_llar.algorithms.SIGNED
// must list the same ones).
constexpr bool CarriesSignature(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kOneShotLL: return true;
    case Algorithm::kTwoShotLL: return true;
    case Algorithm::kOneShotLL128: return true;
    case Algorithm::kTwoShotLL128: return true;
    default: return false;
  }
}

// The per-device state words (device memory, zeroed at creation): the error
// claim word, then one set of kEpochCounters epoch counters per algorithm id
// (an algorithm's counters advance only with its own calls; the fused
// all-reduce + add + RMSNorm is the one-shot's exchange and shares its set).
inline constexpr int kClaimWord = 0;
LLAR_HOST_DEVICE constexpr int EpochSetOffset(Algorithm algorithm) {
  return 1 + (static_cast<int>(algorithm) - 1) * kEpochCounters;
}
inline constexpr int kStateWords = 1 + (kMaxAlgorithms - 1) * kEpochCounters;

// Filled by the first thread whose bounded wait runs out, in host-mapped
// memory, so the host can read it even after the kernel has trapped.
// Codes (wait.cuh): kErrorTimeout, kErrorForeignSignature.
struct ErrorRecord {
  int32_t code;            // 0: none; 1: timeout waiting for a peer's line;
                           // 2: a peer's line of this epoch carries another
                           // call's signature (a mispaired call, ll.cuh)
  int32_t rank;            // rank that waited
  int32_t peer;            // rank whose line never arrived (code 2: whose
                           // line carried the other signature)
  int32_t block;           // block index (owner of the scratch region)
  int32_t line;            // line index inside the block's region (two-shot:
                           // the payload's line index)
  uint32_t flag_expected;  // flag word the epoch asks for
  uint32_t flag_seen;      // flag words last read (first of the two)
  uint32_t flag_seen2;     // second flag word last read
  uint64_t epoch;          // the waiting warp's epoch for this call
  uint64_t waited_ns;      // time spent waiting when it gave up
  uint32_t signature_expected;  // the waiting call's signature (AllReduceArgs)
  uint32_t signature_seen;      // the signature of the line last read (code 1:
                                // of whatever the slot held, often 0)
  uint32_t flag_epoch_bits;     // how many low bits of the flag words are the
                                // epoch's: 16 (LL lines, ll.cuh), 32 (the LL128
                                // flag word's low half, ll128.cuh: flag_seen2 is
                                // its high half), 0 (a protocol without
                                // signatures: the signature fields are 0)
};

// One device's view of its communicator, in device memory: the part of
// NCCL's device communicator (`ncclDevComm`) that these kernels use, already
// resolved. Where a kernel on `ncclDevComm` asks `ncclGetLsaPointer(window,
// offset, peer)` for a peer's address, this table holds the answer for every
// peer (read once at set-up, lsa_pointers.h), so the kernel's first stores
// wait for one load, not for NCCL's address arithmetic. It adds what NCCL's
// struct has no place for: the error record and the bound on every wait.
// The host writes it when the communicator is created and afterwards only
// `trace` (with the devices synchronised), never while a kernel runs, so
// kernels read it through the read-only cache.
struct PeerTable {
  char* scratch[kMaxRanks];        // every rank's scratch, as mapped on this device
  ErrorRecord* error;              // host-mapped, device-visible
  int32_t* error_claim;            // device word: the first failing thread claims the record
  uint64_t timeout_ns;             // bound on every wait
  uint64_t* trace;                 // the call trace's buffer (ffi/tools): null unless
                                   // a tool enabled it; the all-reduce never reads it
  const void* nccl_lla2a;          // nccl_lla2a_one_shot's region only: its
                                   // NcclLLA2AComm (llar/nccl_lla2a.h) in device
                                   // memory; null in every other table
};

// Kernel parameters, passed by value (48 bytes). What the first instructions
// need (epochs, rank, world) is here; the peer addresses come from the
// PeerTable, loaded while the epoch and payload loads are in flight.
struct AllReduceArgs {
  const void* in;
  void* out;
  uint64_t* epochs;                // kEpochCounters per-warp epoch counters (device memory)
  const PeerTable* peers;          // device memory
  uint32_t n_bytes;                // payload bytes per rank (<= kOneShotMaxBytes)
  uint32_t vector_lines;           // lines moved with one 8-byte access: n_bytes / 8
                                   // when in and out are 8-byte aligned, else 0
                                   // (the launcher fills it in)
  uint16_t lines_per_block;        // <= kLinesPerBlock (the launcher fills it in)
  uint8_t rank;
  uint8_t world;                   // number of ranks (NCCL's nRanks)
  uint32_t signature;              // the call's signature, < 2^kSignatureBits, the
                                   // same on every rank (0: signatures off); the
                                   // algorithms that CarriesSignature put it in
                                   // their flag words (ll.cuh, ll128.cuh), the
                                   // others ignore it
};
static_assert(sizeof(AllReduceArgs) == 48, "kernel parameter block grew");

// Kernel parameters of the fused all-reduce + residual add + RMSNorm
// (kernels/one_shot_ll_add_rms_norm.cuh), passed by value (96 bytes). The
// exchange is the one-shot LL all-reduce's, unchanged: `all_reduce.in` is x
// (this rank's partial sum), `all_reduce.out` is normed, and the epochs,
// peers, rank, world and grid fields mean what they mean there. The tensors
// are `rows` rows of `d` elements, row-major, d * itemsize a multiple of 8,
// so every LL line holds elements of one row only.
struct AddRmsNormArgs {
  AllReduceArgs all_reduce;        // the exchange; n_bytes = rows * d * itemsize;
                                   // vector_lines covers x, residual, normed and
                                   // new_residual (all 8-byte aligned, else 0)
  const void* residual;            // rows x d, x's dtype
  const void* weight;              // d elements, x's dtype or float32 (the kernel's W)
  void* new_residual;              // rows x d, x's dtype: psum(x) + residual
  float eps;                       // added to the mean square
  float inv_d;                     // 1.0f / d rounded to float: the mean is
                                   // sum * inv_d, as XLA computes it (the
                                   // launcher fills it in)
  uint32_t d;                      // elements per row
  uint32_t weight_vector_lines;    // 8-byte lines of weight read with one vector
                                   // load: d * sizeof(W) / 8 when weight is
                                   // 8-byte aligned, else 0 (the launcher fills it in)
  uint16_t rows;                   // rows (the product of x's leading dimensions)
  uint8_t cluster_blocks;          // blocks per row, one thread block cluster
                                   // (1, 2, 4 or kMaxClusterBlocks; the launcher
                                   // fills it in)
};
static_assert(sizeof(AddRmsNormArgs) == 96, "fused kernel parameter block grew");

}  // namespace llar

#endif  // LLAR_ARGS_H_
