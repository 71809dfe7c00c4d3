#include "loopback.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "errors.h"
#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {
namespace {

using Clock = std::chrono::steady_clock;

// Output buffers are poisoned with this byte: 0x7b7b... is a finite value in
// every dtype that no test input sums to, so an element a kernel never wrote
// shows as a mismatch, not as a NaN that a NaN reference would accept.
constexpr int kPoison = 0x7b;

// Bound on the kernel timeout a spec may ask for (ten minutes): keeps the
// host deadline's arithmetic far from overflow.
constexpr uint64_t kMaxTimeoutNs = 600'000'000'000ull;

[[noreturn]] void BadArgument(const std::string& what) {
  throw std::invalid_argument("jax_llar loopback: " + what);
}

size_t ElementBytes(DType d) {
  return (d == DType::kF32 || d == DType::kI32) ? 4 : 2;
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Bytes between two ranks' (or calls') buffers: room for the misalignment,
// every buffer starting on its own 256-byte boundary.
size_t SlotStride(const LoopbackSpec& s) { return RoundUp(s.n_bytes + s.misalign, 256); }

bool IsSentinel(const LoopbackSpec& s) {
  return s.algorithm == static_cast<int64_t>(Algorithm::kOneShotSentinel);
}

// The algorithms whose launchers take OneShotOptions (generic, block_lines).
bool OneShotOptionsApply(const LoopbackSpec& s) {
  return s.algorithm == static_cast<int64_t>(Algorithm::kOneShotLL) || IsSentinel(s);
}

bool SignatureFault(const LoopbackSpec& s) {
  return s.extra_call_rank >= 0 || s.swap_signature_rank >= 0;
}

// The grid-independent checks of a spec; returns the algorithm's entry.
const AlgorithmEntry& Validate(const LoopbackSpec& s, int n_sets) {
  const AlgorithmEntry* entry = FindAlgorithm(s.algorithm);
  if (entry == nullptr) BadArgument("unknown algorithm id " + std::to_string(s.algorithm));
  if (entry->lla2a_slots != nullptr) {
    BadArgument(std::string(entry->name) +
                " runs on NCCL's LL all-to-all session, which needs a device communicator "
                "(ncclDevCommCreate) over distinct GPUs; the loopback harness makes no NCCL "
                "call. Run it on two GPUs instead (tests/gpu/test_lla2a.py, the kernel level)");
  }
  if (!OneShotOptionsApply(s) && (s.generic || s.block_lines != 0)) {
    BadArgument("generic and block_lines apply to the one-shot LL and sentinel algorithms only");
  }
  if (IsSentinel(s) && s.dtype == DType::kI32) {
    BadArgument("one_shot_sentinel does not serve int32 (sentinel.cuh: an all-ones payload "
                "word cannot be changed without changing an int32 sum)");
  }
  if (s.world < 2 || s.world > kMaxRanks) {
    BadArgument("world must be 2-" + std::to_string(kMaxRanks) + ", not " +
                std::to_string(s.world));
  }
  if (s.dtype != DType::kF32 && s.dtype != DType::kBF16 && s.dtype != DType::kF16 &&
      s.dtype != DType::kI32) {
    BadArgument("unknown dtype code " + std::to_string(static_cast<int>(s.dtype)));
  }
  if (s.n_bytes == 0 || s.n_bytes > entry->max_bytes) {
    BadArgument("n_bytes must be 1-" + std::to_string(entry->max_bytes) + " (" +
                entry->name + "), not " + std::to_string(s.n_bytes));
  }
  if (s.n_bytes % ElementBytes(s.dtype) != 0) {
    BadArgument("n_bytes is not a whole number of elements");
  }
  if (s.block_lines > static_cast<uint32_t>(kLinesPerBlock)) {
    BadArgument("block_lines must be 0 (the production rule) or 1-" +
                std::to_string(kLinesPerBlock));
  }
  if (s.timeout_ns == 0 || s.timeout_ns > kMaxTimeoutNs) {
    BadArgument("the timeout must be 1-600000 ms");
  }
  if (s.calls < 1) BadArgument("calls must be positive");
  if (s.keep < 0 || s.keep > s.calls) BadArgument("keep must be 0 (all) or 1-calls");
  if (s.misalign > 15) BadArgument("misalign must be 0-15 bytes");
  if (s.skip_rank >= s.world || s.skip_rank < -1) BadArgument("skip_rank must be -1 or a rank");
  if (s.skip_rank >= 0 && (s.skip_call < 0 || s.skip_call >= s.calls)) {
    BadArgument("skip_call must be one of the calls");
  }
  if (s.extra_call_rank >= s.world || s.extra_call_rank < -1 ||
      s.swap_signature_rank >= s.world || s.swap_signature_rank < -1) {
    BadArgument("extra_call_rank and swap_signature_rank must be -1 or a rank");
  }
  if ((s.skip_rank >= 0) + (s.extra_call_rank >= 0) + (s.swap_signature_rank >= 0) > 1) {
    BadArgument("one fault at a time: skip_rank, extra_call_rank or swap_signature_rank");
  }
  if (s.signature_seed > 65535u) BadArgument("signature_seed must be 0-65535");
  if (SignatureFault(s)) {
    if (!CarriesSignature(static_cast<Algorithm>(s.algorithm))) {
      BadArgument(std::string(entry->name) +
                  " carries no call signature (args.h: CarriesSignature), so a signature "
                  "fault cannot be detected");
    }
    if (!s.signed_calls) BadArgument("a signature fault needs signed calls");
    if (s.fault_call < 0 || s.fault_call >= s.calls) {
      BadArgument("fault_call must be one of the calls");
    }
  }
  if (n_sets < 1) BadArgument("need at least one input set");
  return *entry;
}

int CallsToRun(const LoopbackSpec& s) {
  if (s.skip_rank >= 0) return s.skip_call + 1;
  return SignatureFault(s) ? s.fault_call + 1 : s.calls;
}
int KeptCalls(const LoopbackSpec& s) {
  const int run = CallsToRun(s);
  const int keep = s.keep == 0 ? s.calls : s.keep;
  return keep < run ? keep : run;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The first epoch counter of `rank` (the kStateWords state words) that is
// not start + calls for a warp of the grid in the set of the algorithm that
// ran (args.h: EpochSetOffset), or start for any other warp of any set; ""
// when all are.
std::string CheckEpochs(const std::vector<uint64_t>& state, const LoopbackPlan& plan,
                        uint64_t start, int calls, int rank, int64_t algorithm) {
  const uint32_t warps = plan.threads / kWarpSize;
  for (int a = 1; a < kMaxAlgorithms; ++a) {
    const int set = EpochSetOffset(static_cast<Algorithm>(a));
    const bool ran = a == algorithm;
    for (int b = 0; b < kMaxBlocks; ++b) {
      for (int w = 0; w < kMaxWarps; ++w) {
        const bool in_grid =
            ran && static_cast<uint32_t>(b) < plan.blocks && static_cast<uint32_t>(w) < warps;
        const uint64_t want = in_grid ? start + static_cast<uint64_t>(calls) : start;
        const uint64_t got = state[set + static_cast<size_t>(b) * kMaxWarps + w];
        if (got != want) {
          std::ostringstream m;
          m << "rank " << rank << " algorithm " << a
            << (a < kAlgorithmCount ? std::string(" (") + kAlgorithms[a].name + ")" : "")
            << " block " << b << " warp " << w << ": epoch " << got << ", expected " << want;
          return m.str();
        }
      }
    }
  }
  return "";
}

}  // namespace

LoopbackPlan PlanLoopback(const LoopbackSpec& s, int n_sets) {
  Validate(s, n_sets);
  const AlgorithmEntry& entry = *FindAlgorithm(s.algorithm);  // Validate checked it
  LoopbackPlan p;
  if (s.block_lines != 0) {  // a one-shot under another grid rule (Validate)
    const uint32_t line_bytes = IsSentinel(s) ? kLineBytes : kPayloadBytesPerLine;
    const OneShotGrid g = OneShotGridFor((s.n_bytes + line_bytes - 1) / line_bytes,
                                         s.block_lines);
    p.blocks = g.blocks;
    p.lines_per_block = g.lines_per_block;
    p.threads = g.threads;
    p.steps = 1;
  } else {
    const KernelGrid g = entry.grid(s.n_bytes, s.world);
    p.blocks = g.blocks;
    p.lines_per_block = g.lines_per_block;
    p.threads = g.threads;
    p.steps = g.steps;
  }
  p.generic_kernel = s.generic || (s.world != 2 && s.world != 4 && s.world != 8);
  DeviceGuard guard;
  CheckCuda(cudaSetDevice(s.ordinal), "cudaSetDevice");
  CheckCuda(cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, s.ordinal),
            "cudaDeviceGetAttribute(multiprocessors)");
  CheckCuda(entry.occupancy(s.dtype, s.generic ? 0 : s.world, p.threads, &p.regs_per_thread,
                            &p.blocks_per_sm),
            (std::string("occupancy of the ") + entry.name + " kernel").c_str());
  p.co_resident = static_cast<uint64_t>(s.world) * p.blocks <=
                  static_cast<uint64_t>(p.sms) * static_cast<uint64_t>(p.blocks_per_sm);
  const uint64_t slots = static_cast<uint64_t>(n_sets) + KeptCalls(s) + 1;
  p.device_bytes = static_cast<uint64_t>(s.world) *
                   (RegionBytes(static_cast<Algorithm>(s.algorithm), s.world) +
                    sizeof(uint64_t) * kStateWords +
                    sizeof(PeerTable) + slots * SlotStride(s));
  return p;
}

LoopbackResult RunLoopback(const LoopbackSpec& s, const uint8_t* inputs, int n_sets) {
  const AlgorithmEntry& entry = Validate(s, n_sets);
  LoopbackResult res;
  res.plan = PlanLoopback(s, n_sets);
  if (!res.plan.co_resident) {
    std::ostringstream m;
    m << "the " << s.world << " ranks' grids (" << res.plan.blocks << " blocks of "
      << res.plan.threads << " threads each) do not fit on the device at once ("
      << res.plan.sms << " multiprocessors x " << res.plan.blocks_per_sm
      << " blocks); the ranks would wait for blocks that cannot start";
    BadArgument(m.str());
  }
  if (const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS")) res.max_connections = v;
  const int W = s.world;
  const size_t stride = SlotStride(s);
  const int run_calls = CallsToRun(s);
  res.kept = KeptCalls(s);
  res.first_kept_call = run_calls - res.kept;
  res.records.assign(W, ErrorRecord{});

  DeviceGuard guard;
  CheckCuda(cudaSetDevice(s.ordinal), "cudaSetDevice");
  CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before the set-up)");
  // As EnsureRegion: no lazy module load once kernels that wait on each other run.
  CheckCuda(entry.preload(), (std::string("loading the ") + entry.name + " kernels").c_str());
  const Algorithm algorithm = static_cast<Algorithm>(s.algorithm);
  SimulatedRanks rs(W, RegionBytes(algorithm, W), entry.fill, s.start_epoch, s.timeout_ns);
  // Inputs: set i of rank r in slot i * W + r. Outputs: kept call k of rank r
  // in slot k * W + r, and every earlier call of rank r in slot kept * W + r.
  const size_t in_slots = static_cast<size_t>(n_sets) * W;
  const size_t out_slots = static_cast<size_t>(res.kept + 1) * W;
  char* d_inputs = rs.Alloc(in_slots * stride, "cudaMalloc(inputs)");
  char* d_outputs = rs.Alloc(out_slots * stride, "cudaMalloc(outputs)");
  CheckCuda(cudaMemcpy2D(d_inputs + s.misalign, stride, inputs, s.n_bytes, s.n_bytes, in_slots,
                         cudaMemcpyHostToDevice),
            "cudaMemcpy2D(inputs)");
  CheckCuda(cudaMemset(d_outputs, kPoison, out_slots * stride), "cudaMemset(outputs)");
  CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after the set-up)");

  const bool production = !s.generic && s.block_lines == 0;
  OneShotOptions options;
  options.generic = s.generic;
  options.block_lines = s.block_lines;
  const auto timeout = std::chrono::nanoseconds(2 * s.timeout_ns + kHostMarginNs);

  const Clock::time_point t0 = Clock::now();
  Clock::time_point last_launch = t0;
  cudaError_t launch_error = cudaSuccess;
  cudaError_t error = cudaSuccess;
  auto launch = [&](const AllReduceArgs& a, int r) {
    return production ? entry.launch(a, s.dtype, rs.streams[r])
           : IsSentinel(s) ? LaunchOneShotSentinelWith(a, s.dtype, rs.streams[r], options)
                           : LaunchOneShotLLWith(a, s.dtype, rs.streams[r], options);
  };
  for (int c = 0; c < run_calls && error == cudaSuccess && launch_error == cudaSuccess; ++c) {
    const size_t set = static_cast<size_t>(c % n_sets);
    const size_t out_row = c >= res.first_kept_call
                               ? static_cast<size_t>(c - res.first_kept_call)
                               : static_cast<size_t>(res.kept);
    const uint32_t signature = s.signed_calls ? LoopbackSignature(s.signature_seed, c) : 0u;
    res.signatures.push_back(signature);
    const bool fault = SignatureFault(s) && c == s.fault_call;
    if (fault) res.fault_signature = OtherSignature(signature);
    for (int r = 0; r < W; ++r) {
      if (c == s.skip_call && r == s.skip_rank) continue;
      AllReduceArgs a{};
      a.in = d_inputs + (set * W + r) * stride + s.misalign;
      a.out = d_outputs + (out_row * W + r) * stride + s.misalign;
      a.epochs = rs.state[r] + EpochSetOffset(algorithm);
      a.peers = rs.tables[r];
      a.n_bytes = s.n_bytes;
      a.rank = static_cast<uint8_t>(r);
      a.world = static_cast<uint8_t>(W);
      a.signature = signature;
      if (fault && r == s.swap_signature_rank) a.signature = res.fault_signature;
      if (fault && r == s.extra_call_rank) {
        // The extra call: this call's inputs, another signature, the output
        // row of discarded calls; the rank's call `c` follows it.
        AllReduceArgs extra = a;
        extra.signature = res.fault_signature;
        extra.out = d_outputs + (static_cast<size_t>(res.kept) * W + r) * stride + s.misalign;
        launch_error = launch(extra, r);
        if (launch_error != cudaSuccess) break;
      }
      launch_error = launch(a, r);
      if (launch_error != cudaSuccess) break;
    }
    last_launch = Clock::now();
    res.calls_launched = c + 1;
    // After a failed launch the ranks launched before it still run (and, when
    // they wait for the missing one, fail): wait for them too.
    if (s.sync_between_calls || c + 1 == run_calls || launch_error != cudaSuccess) {
      error = rs.Wait(last_launch + timeout);
    }
    if (error != cudaSuccess || launch_error != cudaSuccess) res.failed_call = c;
  }
  const Clock::time_point t1 = Clock::now();
  res.seconds = Seconds(t0, t1);

  // The records are host memory: readable also after a trap.
  rs.CopyRecords(&res.records);
  std::string launch_text;
  if (launch_error != cudaSuccess) launch_text = "launch: " + CudaErrorText(launch_error);
  if (error == cudaErrorNotReady) {
    res.deadline_exceeded = true;
    res.cuda_error = "host deadline passed with kernels still running";
    if (!launch_text.empty()) res.cuda_error = launch_text + "; " + res.cuda_error;
    rs.leak = true;  // they may still use every buffer
    return res;
  }
  if (error != cudaSuccess || launch_error != cudaSuccess) {
    res.cuda_error = launch_text;
    if (error != cudaSuccess) {
      res.cuda_error += (launch_text.empty() ? "" : "; ") + CudaErrorText(error);
    }
    res.seconds_to_error = Seconds(last_launch, t1);
    return res;
  }

  // A clean run: outputs and epoch counters.
  res.outputs.resize(static_cast<size_t>(res.kept) * W * s.n_bytes);
  if (res.kept > 0) {
    error = cudaMemcpy2D(res.outputs.data(), s.n_bytes, d_outputs + s.misalign, stride,
                         s.n_bytes, static_cast<size_t>(res.kept) * W, cudaMemcpyDeviceToHost);
  }
  std::vector<uint64_t> state(kStateWords);
  for (int r = 0; r < W && error == cudaSuccess; ++r) {
    error = cudaMemcpy(state.data(), rs.state[r], sizeof(uint64_t) * kStateWords,
                       cudaMemcpyDeviceToHost);
    if (error == cudaSuccess && res.epoch_mismatch.empty()) {
      res.epoch_mismatch =
          CheckEpochs(state, res.plan, s.start_epoch, run_calls, r, s.algorithm);
    }
  }
  if (error != cudaSuccess) {
    res.cuda_error = CudaErrorText(error);
    res.outputs.clear();
    return res;
  }
  res.epochs_checked = true;
  return res;
}

std::string CudaErrorText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

SimulatedRanks::SimulatedRanks(int w, size_t scratch_bytes, uint8_t fill, uint64_t start_epoch,
                               uint64_t timeout_ns)
    : world(w), scratch(w), state(w), tables(w), records(w), streams(w) {
  const size_t state_bytes = sizeof(uint64_t) * kStateWords;
  const std::vector<uint64_t> epochs(kEpochCounters, start_epoch);
  for (int r = 0; r < w; ++r) {
    CheckCuda(cudaMalloc(&scratch[r], scratch_bytes), "cudaMalloc(scratch)");
    CheckCuda(cudaMemset(scratch[r], fill, scratch_bytes), "cudaMemset(scratch)");
    CheckCuda(cudaMalloc(&state[r], state_bytes), "cudaMalloc(epochs)");
    CheckCuda(cudaMemset(state[r], 0, state_bytes), "cudaMemset(epochs)");
    for (int a = 1; a < kMaxAlgorithms; ++a) {  // every algorithm's counters
      if (start_epoch == 0) break;
      CheckCuda(cudaMemcpy(state[r] + EpochSetOffset(static_cast<Algorithm>(a)), epochs.data(),
                           sizeof(uint64_t) * kEpochCounters, cudaMemcpyHostToDevice),
                "cudaMemcpy(epochs)");
    }
    CheckCuda(cudaMalloc(&tables[r], sizeof(PeerTable)), "cudaMalloc(peer table)");
    CheckCuda(cudaHostAlloc(reinterpret_cast<void**>(&records[r]), sizeof(ErrorRecord),
                            cudaHostAllocMapped | cudaHostAllocPortable),
              "cudaHostAlloc(error record)");
    std::memset(records[r], 0, sizeof(ErrorRecord));
    CheckCuda(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
  }
  for (int r = 0; r < w; ++r) {
    PeerTable table{};
    for (int p = 0; p < w; ++p) table.scratch[p] = scratch[p];
    table.error_claim = reinterpret_cast<int32_t*>(state[r] + kClaimWord);
    CheckCuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&table.error), records[r], 0),
              "cudaHostGetDevicePointer");
    table.timeout_ns = timeout_ns;
    CheckCuda(cudaMemcpy(tables[r], &table, sizeof(table), cudaMemcpyHostToDevice),
              "cudaMemcpy(peer table)");
  }
}

SimulatedRanks::~SimulatedRanks() {
  if (leak) return;
  // After a trap the context is lost and these fail; nothing to do then.
  for (int r = 0; r < world; ++r) {
    if (streams[r] != nullptr) (void)cudaStreamDestroy(streams[r]);
    if (scratch[r] != nullptr) (void)cudaFree(scratch[r]);
    if (state[r] != nullptr) (void)cudaFree(state[r]);
    if (tables[r] != nullptr) (void)cudaFree(tables[r]);
    if (records[r] != nullptr) (void)cudaFreeHost(records[r]);
  }
  for (char* b : buffers) (void)cudaFree(b);
  (void)cudaGetLastError();
}

char* SimulatedRanks::Alloc(size_t bytes, const char* what) {
  char* p = nullptr;
  CheckCuda(cudaMalloc(&p, bytes), what);
  buffers.push_back(p);
  return p;
}

cudaError_t SimulatedRanks::Wait(std::chrono::steady_clock::time_point deadline) const {
  return WaitForStreams(streams, deadline);
}

cudaError_t WaitForStreams(const std::vector<cudaStream_t>& streams,
                           std::chrono::steady_clock::time_point deadline) {
  while (true) {
    bool idle = true;
    for (cudaStream_t s : streams) {
      const cudaError_t e = cudaStreamQuery(s);
      if (e == cudaErrorNotReady) {
        idle = false;
      } else if (e != cudaSuccess) {
        return e;
      }
    }
    if (idle) return cudaSuccess;
    if (std::chrono::steady_clock::now() > deadline) return cudaErrorNotReady;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void SimulatedRanks::CopyRecords(std::vector<ErrorRecord>* out) const {
  // Host memory: readable also after a trap.
  out->resize(world);
  for (int r = 0; r < world; ++r) {
    std::memcpy(&(*out)[r], const_cast<const ErrorRecord*>(records[r]), sizeof(ErrorRecord));
  }
}

}  // namespace llar
