// Loopback harness: a group of `world` ranks simulated on ONE GPU, to test
// the all-reduce protocol where fewer GPUs than ranks are at hand. (Not the
// diagnostic variant DiagVariant::kLoopback, which runs one real rank
// without the network.)
//
// The kernels see their peers only through PeerTable::scratch[p] (registry.h
// resolves those addresses from NCCL at set-up). Here every simulated rank
// gets, on the one device, what CreateGroup and EnsureRegion give a real
// rank: the algorithm's region (RegionBytes, its fill), zeroed epoch
// counters (every set, args.h) and claim word, a
// host-mapped ErrorRecord and a PeerTable whose scratch[p] is simulated rank
// p's scratch on the same device. Each call launches the production launcher
// (kAlgorithms[algorithm], or LaunchOneShotLLWith / LaunchOneShotSentinelWith
// for the generic kernel or another grid rule) once per rank, rank 0 first,
// each rank on a non-blocking stream of its own, so that all ranks' kernels
// run at once.
// No NCCL call is made, so an algorithm on NCCL's LL all-to-all session
// (AlgorithmEntry::lla2a_slots: nccl_lla2a_one_shot) is refused with the
// reason (std::invalid_argument).
//
// What it tests: the protocol logic (LL lines and flags, per-warp epochs,
// scratch parity over consecutive calls, the re-zeroing window, the
// rank-order reduction, the bounded wait and its report) for any world size
// 2..kMaxRanks, the kernels specialised for 2, 4 and 8 ranks and the
// run-time-world one. Every call carries a signature of its own
// (LoopbackSignature, as a program's call sites do), so the runs also show
// that correctly paired calls never see a foreign line; two fault modes pair
// a call with one of another signature (extra_call_rank, swap_signature_rank)
// and must end in the foreign-signature report (ErrorRecord code 2). What it
// does not test: NVLink (every store is local, so neither the ordering of
// remote stores nor any speed is exercised), NCCL windows, XLA or CUDA graphs.
//
// Co-residency: a block of one rank spins until the same block of every
// other rank has sent, so all ranks' grids must be resident on the device at
// once; otherwise the resident blocks wait for blocks that cannot start and
// the bounded waits fail the call. PlanLoopback says whether they fit (from
// the occupancy of the production kernel, the entry's occupancy query) and
// RunLoopback refuses a case that does not. Streams map onto
// CUDA_DEVICE_MAX_CONNECTIONS hardware queues (the driver reads it when the
// context is created); the Python tool sets it to 32 so that every rank's
// stream has a queue of its own.
//
// Every host wait is bounded: the harness polls the streams with
// cudaStreamQuery until a deadline of twice the kernel timeout plus
// kHostMarginNs after the last launch, and reports instead of hanging. A
// timed-out kernel traps and loses the CUDA context of the process (wait.cuh),
// so a run that is meant to fail (skip_rank, extra_call_rank,
// swap_signature_rank) belongs in a child process.
#ifndef LLAR_TOOLS_LOOPBACK_H_
#define LLAR_TOOLS_LOOPBACK_H_

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llar/args.h"

namespace llar {

// Beyond twice the kernel timeout (which covers the trap's wait for the
// published report), how long the host waits for the streams.
inline constexpr uint64_t kHostMarginNs = 5'000'000'000ull;

// What both loopback harnesses (this one and loopback_add_rms_norm.h) give
// every simulated rank, on the current device, as CreateGroup and
// EnsureRegion (registry/regions.cc) give a real rank: one algorithm's region of
// `scratch_bytes` filled with `fill` (kAlgorithms[a].fill), the kStateWords
// state words zeroed with every epoch counter of every set (args.h) at
// `start_epoch` (as SetEpochForTesting), a host-mapped zeroed ErrorRecord, a
// PeerTable whose scratch[p] is simulated rank p's region with the bound
// `timeout_ns`, and a non-blocking stream. A launch points
// AllReduceArgs::epochs at state[r] + EpochSetOffset(algorithm). Everything is freed by the
// destructor unless `leak` (the host deadline passed while kernels may still
// use it). Throws std::runtime_error for a CUDA failure.
struct SimulatedRanks {
  int world = 0;
  std::vector<char*> scratch;
  std::vector<uint64_t*> state;       // kStateWords: counters and the claim word
  std::vector<PeerTable*> tables;     // device copies
  std::vector<ErrorRecord*> records;  // host-mapped
  std::vector<cudaStream_t> streams;
  std::vector<char*> buffers;         // what Alloc gave out
  bool leak = false;

  SimulatedRanks(int world, size_t scratch_bytes, uint8_t fill, uint64_t start_epoch,
                 uint64_t timeout_ns);
  ~SimulatedRanks();
  SimulatedRanks(const SimulatedRanks&) = delete;
  SimulatedRanks& operator=(const SimulatedRanks&) = delete;

  // Device memory freed with the rest; `what` names it in an error.
  char* Alloc(size_t bytes, const char* what);
  // Polls every rank's stream until all are idle, one fails, or `deadline`
  // passes: cudaSuccess, the first error, or cudaErrorNotReady at the
  // deadline.
  cudaError_t Wait(std::chrono::steady_clock::time_point deadline) const;
  // Copies each rank's error record into `out` (one per rank).
  void CopyRecords(std::vector<ErrorRecord>* out) const;
};

// "cudaErrorX: description".
std::string CudaErrorText(cudaError_t e);

// Polls `streams` (cudaStreamQuery) until all are idle, one fails, or
// `deadline` passes: cudaSuccess, the first error, or cudaErrorNotReady at
// the deadline. The bounded host wait of both harnesses and the loopback
// group.
cudaError_t WaitForStreams(const std::vector<cudaStream_t>& streams,
                           std::chrono::steady_clock::time_point deadline);

// The signature the harness gives call `call` (AllReduceArgs::signature):
// 1 + (seed + call) mod 65535, never 0, and different for consecutive calls
// (jax_llar.tools.loopback.harness.call_signature is the same rule).
constexpr uint32_t LoopbackSignature(uint32_t seed, int call) {
  return 1u + static_cast<uint32_t>((uint64_t(seed) + uint64_t(call)) % 65535u);
}

// A nonzero signature other than the nonzero `signature`: the fault modes'
// (jax_llar.tools.loopback.harness.other_signature).
constexpr uint32_t OtherSignature(uint32_t signature) {
  return 1u + (signature - 1u + 32768u) % 65535u;
}

struct LoopbackSpec {
  int32_t ordinal = 0;          // CUDA device
  int world = 2;                // simulated ranks, 2..kMaxRanks
  DType dtype = DType::kF32;
  uint32_t n_bytes = 0;         // payload per rank, 1..the algorithm's max_bytes
  int64_t algorithm = static_cast<int64_t>(Algorithm::kOneShotLL);  // kAlgorithms id
  bool generic = false;         // the run-time world-size kernel even for 2, 4, 8
  uint32_t block_lines = 0;     // grid rule's lines per block (0: production)
  uint64_t timeout_ns = 0;      // PeerTable::timeout_ns, > 0
  int calls = 1;                // consecutive all-reduce calls
  bool sync_between_calls = true;  // false: launch every call at once (each
                                   // rank's calls are ordered by its stream only)
  int keep = 0;                 // outputs of the last `keep` calls come back
                                // (1..calls; 0: all); earlier calls write a
                                // discarded buffer
  uint64_t start_epoch = 0;     // every epoch counter starts here (as
                                // SetEpochForTesting), e.g. just below a
                                // re-zeroing window (epoch.cuh) or the flags'
                                // epoch period (2^16 in LL lines, 2^32 in
                                // LL128 lines)
  uint32_t misalign = 0;        // bytes (0..15) added to the input and output
                                // addresses: buffers misaligned for a
                                // kernel's vector accesses (8 bytes for LL
                                // lines, 16 for sentinel lines) take its
                                // byte-wise path
  int skip_rank = -1;           // fault: this rank's kernel is not launched on
  int skip_call = 0;            // call skip_call, and no call follows it
  bool signed_calls = true;     // call c carries LoopbackSignature(signature_seed,
  uint32_t signature_seed = 0;  // c); false: every call carries 0 (signatures off)
  // Signature faults (algorithms that CarriesSignature, signed_calls; one
  // fault at a time): on call fault_call, and no call follows it,
  int extra_call_rank = -1;     // this rank first runs one extra call (its
                                // inputs of that call, output discarded) with
                                // OtherSignature of the call's signature: the
                                // ranks are paired off by one from there
  int swap_signature_rank = -1; // this rank's call carries OtherSignature of
                                // the call's signature (two programs
                                // interleaved differently on its GPU)
  int fault_call = 0;
};

// The grid of one rank and whether all ranks' grids fit on the device at once.
struct LoopbackPlan {
  uint32_t blocks = 0, lines_per_block = 0, threads = 0;  // per rank (the entry's grid)
  uint32_t steps = 1;           // lines per thread and chunk (two-shot; 1 for the one-shot)
  int regs_per_thread = 0;      // of the kernel (the entry's occupancy query)
  int blocks_per_sm = 0;        // resident blocks of `threads` threads per SM
  int sms = 0;                  // multiprocessors of the device
  bool co_resident = false;     // world * blocks <= sms * blocks_per_sm
  bool generic_kernel = false;  // the run-time world-size kernel runs
  uint64_t device_bytes = 0;    // device memory RunLoopback allocates
};

struct LoopbackResult {
  LoopbackPlan plan;
  int calls_launched = 0;       // calls whose kernels were launched
  int first_kept_call = 0;      // outputs[k] is call first_kept_call + k
  int kept = 0;
  // kept x world x n_bytes: every kept call's output of every rank; empty
  // after a CUDA error or a missed deadline.
  std::vector<uint8_t> outputs;
  // One per rank (code 0: that rank reported nothing). Read from host-mapped
  // memory, so also after a trap.
  std::vector<ErrorRecord> records;
  std::string cuda_error;       // empty, or the first CUDA error seen
  int failed_call = -1;         // the call after whose launch it was seen
  bool deadline_exceeded = false;  // kernels still ran at the host deadline:
                                   // nothing was freed, the device is busy
  double seconds = 0;           // from the first launch to the end
  double seconds_to_error = 0;  // from the last launch to the error
  // Epoch counters after a clean run: every warp of the grid advanced once
  // per call, every other warp not at all. Empty when they did; else the
  // first counter that did not.
  std::string epoch_mismatch;
  bool epochs_checked = false;
  std::string max_connections;  // CUDA_DEVICE_MAX_CONNECTIONS ("" if unset)
  std::vector<uint32_t> signatures;  // call c's signature, for every call run
  uint32_t fault_signature = 0;      // a signature fault's other signature, else 0
};

// Throws std::invalid_argument for a spec outside the limits above and
// std::runtime_error for a CUDA failure of the occupancy query.
LoopbackPlan PlanLoopback(const LoopbackSpec& spec, int n_sets);

// `inputs` holds n_sets x world x n_bytes bytes; call c uses set c % n_sets.
// Synchronises the device before and after (the caller must have nothing
// running on it that waits for these kernels). Throws std::invalid_argument
// for a bad spec or a case whose ranks are not co-resident, and
// std::runtime_error for a CUDA failure while setting up (before any
// launch); after the first launch every failure is reported in the result.
LoopbackResult RunLoopback(const LoopbackSpec& spec, const uint8_t* inputs, int n_sets);

}  // namespace llar

#endif  // LLAR_TOOLS_LOOPBACK_H_
