// Store-atomicity test of 128-byte warp stores (store_atomicity.h states the
// method). The stores and loads are the LL128 protocol's own (ll128.cuh).
#include "store_atomicity.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "errors.h"
#include "llar/ll128.cuh"
#include "llar/wait.cuh"

namespace llar {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kLinesPerGroup = kLL128LinesPerWarp;  // one warp store
constexpr uint32_t kWordsPerLine = kLL128LineBytes / 8;
constexpr uint32_t kRoundsPerAbortCheck = 64;
// Words between two groups' acks: each ack in a 128-byte line of its own, so
// that pollers of different groups do not share a line.
constexpr uint32_t kAckStride = 16;
// Beyond the kernels' own bound, how long the host waits for them after it
// asked them to stop.
constexpr uint64_t kHostMarginNs = 5'000'000'000ull;

// How the run ends early, one per kernel, in its device's memory: the
// waiting warps poll it from L2, never from host memory (a host-mapped word
// slows every round). The host sets `stop` in
// both at max_seconds (a copy on a stream of its own); a warp whose wait
// runs out records itself in its kernel's control and sets `stop` in both.
struct Control {
  int32_t stop;           // 0: run; else stop
  int32_t side;           // 0: no timeout; 1: a writer's wait, 2: a reader's
  uint32_t group, round;
};

// Reader device memory: what the readers found.
struct Findings {
  unsigned long long line_rounds, polls, torn_lines, torn_loads, bad_words;
  int32_t first_claim;
  uint32_t first_line, first_round;
  unsigned long long first_words[kWordsPerLine];
};

struct Params {
  char* lines;                // lines x 128 B on the reader's device
  unsigned long long* acks;   // one per group, kAckStride apart, on the writer's device
  Control* writer_control;    // on the writer's device
  Control* reader_control;    // on the reader's device
  Findings* findings;         // on the reader's device
  uint32_t groups, rounds, stride, max_delay_ns, split_delay_ns;
  uint64_t seed, timeout_ns;
  int32_t split;
};

__device__ __forceinline__ uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Warp-uniform random delay for (side, group, round): none in about half
// the rounds, else up to max_delay_ns.
__device__ __forceinline__ void RandomDelay(const Params& p, uint32_t side, uint32_t g,
                                            uint32_t round) {
  if (p.max_delay_ns == 0) return;
  const uint64_t h = Mix(p.seed ^ (uint64_t(side) << 62) ^ (uint64_t(g) << 32) ^ round);
  if (h & 1) return;
  __nanosleep(static_cast<uint32_t>((h >> 1) % (p.max_delay_ns + 1)));
}

__device__ __forceinline__ uint64_t Word(uint32_t round, uint32_t line, uint32_t w) {
  return (uint64_t(round) << 32) | (line << 4) | w;
}

__device__ __forceinline__ uint64_t Join(uint32_t lo, uint32_t hi) {
  return (uint64_t(hi) << 32) | lo;
}

// The control of the kernel on this side (1: writer, 2: reader).
__device__ __forceinline__ Control* OwnControl(const Params& p, int32_t side) {
  return side == 1 ? p.writer_control : p.reader_control;
}

__device__ __forceinline__ bool Stopped(const Params& p, int32_t side) {
  return *reinterpret_cast<volatile int32_t*>(&OwnControl(p, side)->stop) != 0;
}

// Warp-uniform: lane 0 reads the stop word, every lane gets its answer.
__device__ __forceinline__ bool WarpStopped(const Params& p, int32_t side) {
  int stop = 0;
  if ((threadIdx.x & 31) == 0) stop = Stopped(p, side);
  return __shfl_sync(0xffffffffu, stop, 0) != 0;
}

// A timed-out wait: the first warp of this kernel to time out records
// itself; both kernels are told to stop (the other one's control may be a
// peer device's memory: a plain store, the host only reads it afterwards).
__device__ void Stop(const Params& p, int32_t side, uint32_t g, uint32_t round) {
  Control* own = OwnControl(p, side);
  if (atomicCAS(&own->side, 0, side) == 0) {
    own->group = g;
    own->round = round;
  }
  *reinterpret_cast<volatile int32_t*>(&p.writer_control->stop) = 1;
  *reinterpret_cast<volatile int32_t*>(&p.reader_control->stop) = 1;
  __threadfence_system();
}

// Bounds a warp's wait: every kSpinsPerClockRead polls, reads the clock and
// the stop word; false once either says to give up.
struct Bound {
  uint64_t start = 0;
  uint32_t spins = 0;
  __device__ __forceinline__ bool Ok(const Params& p, int32_t side, uint32_t g,
                                     uint32_t round) {
    if (++spins != kSpinsPerClockRead) return true;
    spins = 0;
    if (Stopped(p, side)) return false;
    const uint64_t now = GlobalTimerNs();
    if (start == 0) {
      start = now;
    } else if (now - start > p.timeout_ns) {
      Stop(p, side, g, round);
      return false;
    }
    return true;
  }
};

__global__ void WriterKernel(const Params p) {
  const int lane = threadIdx.x & 31;
  const int j = LL128LaneInLine(lane);
  const uint32_t warp = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (warp >= p.groups) return;
  for (uint32_t round = 1; round <= p.rounds; ++round) {
    const uint32_t g = static_cast<uint32_t>((warp + uint64_t(round) * p.stride) % p.groups);
    // Wait until the reader acked round - 1 of group g.
    int ok = 1;
    if (lane == 0) {
      const volatile unsigned long long* ack = p.acks + size_t(g) * kAckStride;
      Bound bound;
      while (*ack != round - 1) {
        if (!bound.Ok(p, 1, g, round)) {
          ok = 0;
          break;
        }
      }
    }
    if (!__shfl_sync(0xffffffffu, ok, 0)) return;
    if (round % kRoundsPerAbortCheck == 0 && WarpStopped(p, 1)) return;
    RandomDelay(p, 1, g, round);
    const uint32_t line = g * kLinesPerGroup + lane / kLL128LanesPerLine;
    const uint64_t w0 = Word(round, line, 2 * j), w1 = Word(round, line, 2 * j + 1);
    const uint2 a = {static_cast<uint32_t>(w0), static_cast<uint32_t>(w0 >> 32)};
    const uint2 b = {static_cast<uint32_t>(w1), static_cast<uint32_t>(w1 >> 32)};
    char* dst = p.lines + size_t(line) * kLL128LineBytes + j * kLL128PartBytes;
    __syncwarp();
    if (!p.split) {
      StoreLL128Part(dst, a, b);  // the protocol's store: one instruction per warp
    } else {
      if (j >= 4) StoreLL128Part(dst, a, b);  // the flag's half first
      __syncwarp();
      __nanosleep(p.split_delay_ns);
      __syncwarp();
      if (j < 4) StoreLL128Part(dst, a, b);
    }
  }
}

__global__ void ReaderKernel(const Params p) {
  const int lane = threadIdx.x & 31;
  const int j = LL128LaneInLine(lane);
  const uint32_t g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (g >= p.groups) return;
  const uint32_t line = g * kLinesPerGroup + lane / kLL128LanesPerLine;
  const int flag_src = lane | kLL128FlagLane;
  const unsigned line_mask = 0xffu << (lane & ~7);
  const char* src = p.lines + size_t(line) * kLL128LineBytes + j * kLL128PartBytes;
  unsigned long long polls = 0, rounds_done = 0;
  for (uint32_t round = 1; round <= p.rounds; ++round) {
    if (round % kRoundsPerAbortCheck == 0 && WarpStopped(p, 2)) break;
    RandomDelay(p, 2, g, round);
    bool done = false, counted = false;
    Bound bound;
    bool gave_up = false;
    while (true) {
      const uint4 v = LoadLL128Part(src);  // the protocol's load
      ++polls;
      const uint64_t w0 = Join(v.x, v.y), w1 = Join(v.z, v.w);
      // The flag lane: does the flag word carry this round?
      const bool flag_now = (j == kLL128FlagLane) && w1 == Word(round, line, 15);
      const bool ready = __shfl_sync(0xffffffffu, flag_now, flag_src);
      // Every lane: are its words this round's? Stale: an earlier round's
      // word for this place, or never written. Anything else is bad.
      bool ok = true;
      unsigned bad = 0;
      if (ready && !done) {
        const uint64_t want0 = Word(round, line, 2 * j), want1 = Word(round, line, 2 * j + 1);
        const bool ok0 = w0 == want0, ok1 = (j == kLL128FlagLane) || w1 == want1;
        ok = ok0 && ok1;
        auto is_bad = [&](uint64_t w, uint64_t want) {
          const bool stale = w == 0 || (static_cast<uint32_t>(w) == static_cast<uint32_t>(want) &&
                                        (w >> 32) < round);
          return w != want && !stale;
        };
        bad = (ok0 ? 0u : is_bad(w0, want0)) + (ok1 ? 0u : is_bad(w1, want1));
      }
      const unsigned not_ok = __ballot_sync(0xffffffffu, !ok) & line_mask;
      if (ready && !done) {
        if (not_ok == 0) {
          done = true;
        } else {
          // A torn load: the flag lane counts it and claims the first report.
          if (bad) atomicAdd(&p.findings->bad_words, bad);
          int won = 0;
          if (j == kLL128FlagLane) {
            atomicAdd(&p.findings->torn_loads, 1ull);
            if (!counted) atomicAdd(&p.findings->torn_lines, 1ull);
            won = atomicCAS(&p.findings->first_claim, 0, 1) == 0;
          }
          counted = true;
          won = __shfl_sync(line_mask, won, flag_src);
          if (won) {
            p.findings->first_words[2 * j] = w0;
            p.findings->first_words[2 * j + 1] = w1;
            if (j == kLL128FlagLane) {
              p.findings->first_line = line;
              p.findings->first_round = round;
            }
          }
        }
      }
      if (__all_sync(0xffffffffu, done)) break;
      // Lane 0 bounds the warp's wait; the warp leaves together.
      int give_up = 0;
      if (lane == 0) give_up = !bound.Ok(p, 2, g, round);
      if (__shfl_sync(0xffffffffu, give_up, 0)) {
        gave_up = true;
        break;
      }
    }
    if (gave_up) break;
    ++rounds_done;
    __syncwarp();
    if (lane == 0) {
      asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p.acks + size_t(g) * kAckStride),
                   "l"(uint64_t(round))
                   : "memory");
    }
  }
  if (lane == 0) {
    atomicAdd(&p.findings->polls, polls);
    atomicAdd(&p.findings->line_rounds, rounds_done * kLinesPerGroup);
  }
}

std::string DeviceName(int ordinal) {
  cudaDeviceProp prop;
  CheckCuda(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  return prop.name;
}

std::string PciBusId(int ordinal) {
  char id[32] = {0};
  CheckCuda(cudaDeviceGetPCIBusId(id, sizeof(id), ordinal), "cudaDeviceGetPCIBusId");
  return id;
}

[[noreturn]] void BadSpec(const std::string& what) {
  throw std::invalid_argument("jax_llar store atomicity: " + what);
}

void Validate(const StoreAtomicitySpec& s, int devices) {
  if (s.writer_device < 0 || s.writer_device >= devices || s.reader_device < 0 ||
      s.reader_device >= devices) {
    BadSpec("devices must be CUDA ordinals 0-" + std::to_string(devices - 1));
  }
  if (s.iterations < 1 || s.iterations > 0xfffffffeu) BadSpec("iterations must be 1-4294967294");
  if (s.lines < kLinesPerGroup || s.lines > 65536 || s.lines % kLinesPerGroup != 0) {
    BadSpec("lines must be a multiple of 4 in 4-65536");
  }
  if (s.warps_per_block < 1 || s.warps_per_block > 32) BadSpec("warps_per_block must be 1-32");
  if (s.max_delay_ns > 1000000 || s.split_delay_ns > 1000000) {
    BadSpec("delays must be at most 1000000 ns");
  }
  if (s.timeout_ns == 0 || s.timeout_ns > 600'000'000'000ull) {
    BadSpec("the timeout must be 1 ns to 600 s");
  }
  if (!(s.max_seconds > 0) || s.max_seconds > 3600) BadSpec("max_seconds must be in (0, 3600]");
}

void EnablePeer(int from, int to) {
  int can = 0;
  CheckCuda(cudaDeviceCanAccessPeer(&can, from, to), "cudaDeviceCanAccessPeer");
  if (!can) {
    throw std::runtime_error("jax_llar store atomicity: device " + std::to_string(from) +
                             " cannot access device " + std::to_string(to) +
                             " (no peer access)");
  }
  CheckCuda(cudaSetDevice(from), "cudaSetDevice");
  const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
  if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
    CheckCuda(e, "cudaDeviceEnablePeerAccess");
  }
  (void)cudaGetLastError();  // clear "already enabled"
}

}  // namespace

StoreAtomicityResult RunStoreAtomicity(const StoreAtomicitySpec& s) {
  int devices = 0;
  CheckCuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  Validate(s, devices);
  DeviceGuard guard;
  StoreAtomicityResult r;
  r.same_device = s.writer_device == s.reader_device;
  r.writer_name = DeviceName(s.writer_device);
  r.reader_name = DeviceName(s.reader_device);
  r.writer_pci_bus_id = PciBusId(s.writer_device);
  r.reader_pci_bus_id = PciBusId(s.reader_device);
  CheckCuda(cudaDeviceGetAttribute(&r.writer_sms, cudaDevAttrMultiProcessorCount,
                                   s.writer_device), "cudaDeviceGetAttribute");
  CheckCuda(cudaDeviceGetAttribute(&r.reader_sms, cudaDevAttrMultiProcessorCount,
                                   s.reader_device), "cudaDeviceGetAttribute");
  if (!r.same_device) {
    EnablePeer(s.writer_device, s.reader_device);
    EnablePeer(s.reader_device, s.writer_device);
    CheckCuda(cudaDeviceGetP2PAttribute(&r.p2p_native_atomics,
                                        cudaDevP2PAttrNativeAtomicSupported,
                                        s.writer_device, s.reader_device),
              "cudaDeviceGetP2PAttribute");
    CheckCuda(cudaDeviceGetP2PAttribute(&r.p2p_performance_rank, cudaDevP2PAttrPerformanceRank,
                                        s.writer_device, s.reader_device),
              "cudaDeviceGetP2PAttribute");
  }
  const uint32_t groups = s.lines / kLinesPerGroup;
  const uint32_t threads = 32 * s.warps_per_block;
  const uint32_t blocks = (groups + s.warps_per_block - 1) / s.warps_per_block;
  r.writer_blocks = r.reader_blocks = blocks;
  r.threads_per_block = threads;
  if (r.same_device) {
    // Both grids must be resident at once: writers wait for readers' acks.
    int per_sm_w = 0, per_sm_r = 0;
    CheckCuda(cudaSetDevice(s.writer_device), "cudaSetDevice");
    CheckCuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                  &per_sm_w, reinterpret_cast<const void*>(WriterKernel), threads, 0),
              "occupancy");
    CheckCuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                  &per_sm_r, reinterpret_cast<const void*>(ReaderKernel), threads, 0),
              "occupancy");
    const int per_sm = per_sm_w < per_sm_r ? per_sm_w : per_sm_r;
    if (uint64_t(2) * blocks > uint64_t(per_sm) * r.writer_sms) {
      BadSpec("the writer and reader grids (2 x " + std::to_string(blocks) +
              " blocks) do not fit on the device at once");
    }
  }

  // Set-up: lines, findings and the readers' control on the reader's device;
  // acks and the writers' control on the writer's; a pinned stop value and a
  // stream per device for the host's stop copies.
  char* lines = nullptr;
  Findings* findings = nullptr;
  unsigned long long* acks = nullptr;
  Control* wc = nullptr;
  Control* rc = nullptr;
  int32_t* stop_value = nullptr;
  cudaStream_t ws = nullptr, rs = nullptr, wcs = nullptr, rcs = nullptr;
  bool leak = false;
  auto cleanup = [&]() {
    if (leak) return;
    cudaSetDevice(s.writer_device);
    if (ws) cudaStreamDestroy(ws);
    if (wcs) cudaStreamDestroy(wcs);
    if (acks) cudaFree(acks);
    if (wc) cudaFree(wc);
    cudaSetDevice(s.reader_device);
    if (rs) cudaStreamDestroy(rs);
    if (rcs) cudaStreamDestroy(rcs);
    if (lines) cudaFree(lines);
    if (findings) cudaFree(findings);
    if (rc) cudaFree(rc);
    if (stop_value) cudaFreeHost(stop_value);
    (void)cudaGetLastError();
  };
  try {
    CheckCuda(cudaSetDevice(s.reader_device), "cudaSetDevice");
    CheckCuda(cudaMalloc(&lines, size_t(s.lines) * kLL128LineBytes), "cudaMalloc(lines)");
    CheckCuda(cudaMemset(lines, 0, size_t(s.lines) * kLL128LineBytes), "cudaMemset(lines)");
    CheckCuda(cudaMalloc(&findings, sizeof(Findings)), "cudaMalloc(findings)");
    CheckCuda(cudaMemset(findings, 0, sizeof(Findings)), "cudaMemset(findings)");
    CheckCuda(cudaMalloc(&rc, sizeof(Control)), "cudaMalloc(control)");
    CheckCuda(cudaMemset(rc, 0, sizeof(Control)), "cudaMemset(control)");
    CheckCuda(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking), "cudaStreamCreate");
    CheckCuda(cudaStreamCreateWithFlags(&rcs, cudaStreamNonBlocking), "cudaStreamCreate");
    CheckCuda(cudaHostAlloc(reinterpret_cast<void**>(&stop_value), sizeof(int32_t),
                            cudaHostAllocPortable),
              "cudaHostAlloc(stop value)");
    *stop_value = 2;
    CheckCuda(cudaSetDevice(s.writer_device), "cudaSetDevice");
    const size_t ack_bytes = sizeof(unsigned long long) * kAckStride * groups;
    CheckCuda(cudaMalloc(&acks, ack_bytes), "cudaMalloc(acks)");
    CheckCuda(cudaMemset(acks, 0, ack_bytes), "cudaMemset(acks)");
    CheckCuda(cudaMalloc(&wc, sizeof(Control)), "cudaMalloc(control)");
    CheckCuda(cudaMemset(wc, 0, sizeof(Control)), "cudaMemset(control)");
    CheckCuda(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking), "cudaStreamCreate");
    CheckCuda(cudaStreamCreateWithFlags(&wcs, cudaStreamNonBlocking), "cudaStreamCreate");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    CheckCuda(cudaSetDevice(s.reader_device), "cudaSetDevice");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  } catch (...) {
    cleanup();
    throw;
  }
  Params p{};
  p.lines = lines;
  p.acks = acks;
  p.writer_control = wc;
  p.reader_control = rc;
  p.findings = findings;
  p.groups = groups;
  p.rounds = s.iterations;
  // A different block in consecutive rounds whenever there is more than one.
  p.stride = groups > s.warps_per_block ? s.warps_per_block + 1 : 1;
  p.max_delay_ns = s.max_delay_ns;
  p.split_delay_ns = s.split_delay_ns;
  p.seed = s.seed;
  p.timeout_ns = s.timeout_ns;
  p.split = s.split ? 1 : 0;

  // Tells both kernels to stop: a copy of the pinned value into each
  // control's stop word, on streams of their own (the copy engines run
  // beside the spinning kernels).
  auto ask_to_stop = [&]() {
    cudaSetDevice(s.writer_device);
    cudaMemcpyAsync(&wc->stop, stop_value, sizeof(int32_t), cudaMemcpyHostToDevice, wcs);
    cudaSetDevice(s.reader_device);
    cudaMemcpyAsync(&rc->stop, stop_value, sizeof(int32_t), cudaMemcpyHostToDevice, rcs);
  };

  // Readers first: they only poll until the writers start.
  const Clock::time_point t0 = Clock::now();
  CheckCuda(cudaSetDevice(s.reader_device), "cudaSetDevice");
  ReaderKernel<<<blocks, threads, 0, rs>>>(p);
  cudaError_t launch_error = cudaGetLastError();
  if (launch_error == cudaSuccess) {
    CheckCuda(cudaSetDevice(s.writer_device), "cudaSetDevice");
    WriterKernel<<<blocks, threads, 0, ws>>>(p);
    launch_error = cudaGetLastError();
  }
  // A launched reader without writers gives up at its next bound check.
  if (launch_error != cudaSuccess) ask_to_stop();
  const auto stop_at = t0 + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(s.max_seconds));
  const auto last = stop_at + std::chrono::nanoseconds(2 * s.timeout_ns + kHostMarginNs);
  bool idle = false, asked = launch_error != cudaSuccess;
  cudaError_t error = cudaSuccess;
  while (error == cudaSuccess) {
    cudaSetDevice(s.writer_device);
    const cudaError_t ew = cudaStreamQuery(ws);
    cudaSetDevice(s.reader_device);
    const cudaError_t er = cudaStreamQuery(rs);
    if (ew != cudaSuccess && ew != cudaErrorNotReady) error = ew;
    if (er != cudaSuccess && er != cudaErrorNotReady) error = er;
    if (ew == cudaSuccess && er == cudaSuccess) {
      idle = true;
      break;
    }
    const Clock::time_point now = Clock::now();
    if (now > stop_at && !asked) {
      ask_to_stop();
      asked = true;
      r.stopped_by_host = true;
    }
    if (now > last) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!idle && error == cudaSuccess) {
    r.deadline_exceeded = true;
    r.cuda_error = "host deadline passed with kernels still running";
    leak = true;  // they may still use every buffer
    return r;
  }
  if (error == cudaSuccess) {
    // Which side timed out, if any (read once the kernels have ended).
    Control c[2];
    cudaSetDevice(s.writer_device);
    error = cudaMemcpy(&c[0], wc, sizeof(Control), cudaMemcpyDeviceToHost);
    cudaSetDevice(s.reader_device);
    if (error == cudaSuccess) error = cudaMemcpy(&c[1], rc, sizeof(Control), cudaMemcpyDeviceToHost);
    for (const Control& x : c) {
      if (error == cudaSuccess && x.side != 0 && !r.timed_out) {
        r.timed_out = true;
        r.timeout_side = x.side == 1 ? "writer" : "reader";
        r.timeout_group = x.group;
        r.timeout_round = x.round;
      }
    }
  }
  if (error == cudaSuccess) error = launch_error;
  if (error != cudaSuccess) {
    r.cuda_error = std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
    cleanup();
    return r;
  }
  Findings f;
  CheckCuda(cudaSetDevice(s.reader_device), "cudaSetDevice");
  const cudaError_t e = cudaMemcpy(&f, findings, sizeof(f), cudaMemcpyDeviceToHost);
  cleanup();
  CheckCuda(e, "cudaMemcpy(findings)");
  r.line_rounds = f.line_rounds;
  r.rounds_completed = f.line_rounds / s.lines;
  r.polls = f.polls;
  r.torn_lines = f.torn_lines;
  r.torn_loads = f.torn_loads;
  r.bad_words = f.bad_words;
  r.has_first_torn = f.first_claim != 0;
  if (r.has_first_torn) {
    r.first_torn_line = f.first_line;
    r.first_torn_round = f.first_round;
    r.first_torn_words.assign(f.first_words, f.first_words + kWordsPerLine);
  }
  return r;
}

}  // namespace llar
