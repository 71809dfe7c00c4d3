// Speed-of-light microbenchmarks (benchmarks/METHOD.md; the model of arXiv
// 2607.16100: L_SoL = 2 * L_L2 + L_remote_store). One thread per measurement,
// device timestamps from %globaltimer, every wait bounded.
#include "sol.h"

#include "errors.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace llar {
namespace {

constexpr uint64_t kSolTimeoutNs = 5'000'000'000ull;

__device__ __forceinline__ uint64_t Now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t LoadVolatile(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void StoreVolatile(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void StoreLine16(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};" ::"l"(p), "r"(v)
               : "memory");
}

__device__ __forceinline__ bool LineIs(const uint32_t* p, uint32_t v) {
  uint32_t w[4];
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "l"(p)
               : "memory");
  return w[1] == v && w[3] == v;
}

// Bounded wait for *p == v (or for a 16-byte line carrying v); false on timeout.
__device__ bool WaitWord(const uint32_t* p, uint32_t v, bool line) {
  const uint64_t t0 = Now();
  while (line ? !LineIs(p, v) : LoadVolatile(p) != v) {
    if (Now() - t0 > kSolTimeoutNs) return false;
  }
  return true;
}

__global__ void FenceKernel(int n, int system, uint64_t* out) {
  const uint64_t t0 = Now();
  for (int i = 0; i < n; ++i) {
    if (system) {
      __threadfence_system();
    } else {
      __threadfence();
    }
  }
  out[0] = Now() - t0;
}

__global__ void ChaseKernel(const uint32_t* next, int n, uint64_t* out, uint32_t* sink) {
  uint32_t idx = 0;
  const uint64_t t0 = Now();
  for (int i = 0; i < n; ++i) idx = __ldcg(next + idx);
  out[0] = Now() - t0;
  sink[0] = idx;
}

// Leader: per iteration, store `i` into every follower's flag, then wait for
// every follower's echo in its ack slot. Followers wait for `i`, then echo.
__global__ void LeaderKernel(uint32_t** follower_flags, int k, uint32_t* acks, int n,
                             int line, uint64_t* out) {
  const uint64_t t0 = Now();
  for (int i = 1; i <= n; ++i) {
    for (int p = 0; p < k; ++p) {
      if (line) StoreLine16(follower_flags[p], i); else StoreVolatile(follower_flags[p], i);
    }
    for (int p = 0; p < k; ++p) {
      if (!WaitWord(acks + 4 * p, i, line)) { out[1] = i; out[0] = 0; return; }
    }
  }
  out[0] = Now() - t0;
  out[1] = 0;
}

__global__ void FollowerKernel(const uint32_t* flag, uint32_t* ack, int n, int line,
                               uint64_t* out) {
  for (int i = 1; i <= n; ++i) {
    if (!WaitWord(flag, i, line)) { out[0] = i; return; }
    if (line) StoreLine16(ack, i); else StoreVolatile(ack, i);
  }
  out[0] = 0;
}

__global__ void EmptyKernel() {}

template <typename T>
T* DevAlloc(size_t n) {
  T* p = nullptr;
  CheckCuda(cudaMalloc(&p, sizeof(T) * n), "cudaMalloc");
  CheckCuda(cudaMemset(p, 0, sizeof(T) * n), "cudaMemset");
  return p;
}

uint64_t ReadU64(const uint64_t* dev, int i = 0) {
  uint64_t v = 0;
  CheckCuda(cudaMemcpy(&v, dev + i, sizeof(v), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return v;
}

double FenceNs(bool system, int n) {
  uint64_t* out = DevAlloc<uint64_t>(1);
  FenceKernel<<<1, 1>>>(n, system, out);
  CheckCuda(cudaDeviceSynchronize(), "fence kernel");
  const double ns = double(ReadU64(out)) / n;
  cudaFree(out);
  return ns;
}

double ChaseNs(int n) {
  constexpr size_t kWords = (8u << 20) / sizeof(uint32_t);  // 8 MiB: in L2 (60 MB)
  std::vector<uint32_t> order(kWords);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin() + 1, order.end(), std::mt19937(12345));
  std::vector<uint32_t> next(kWords);
  for (size_t i = 0; i < kWords; ++i) next[order[i]] = order[(i + 1) % kWords];
  uint32_t* d = DevAlloc<uint32_t>(kWords);
  CheckCuda(cudaMemcpy(d, next.data(), kWords * sizeof(uint32_t), cudaMemcpyHostToDevice), "memcpy");
  uint64_t* out = DevAlloc<uint64_t>(1);
  uint32_t* sink = DevAlloc<uint32_t>(1);
  ChaseKernel<<<1, 1>>>(d, n, out, sink);  // warm: pulls the chain into L2
  ChaseKernel<<<1, 1>>>(d, n, out, sink);
  CheckCuda(cudaDeviceSynchronize(), "chase kernel");
  const double ns = double(ReadU64(out)) / n;
  cudaFree(d);
  cudaFree(out);
  cudaFree(sink);
  return ns;
}

double EmptyKernelInGraphUs(int n) {
  cudaStream_t s;
  CheckCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CheckCuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < n; ++i) EmptyKernel<<<1, 32, 0, s>>>();
  CheckCuda(cudaStreamEndCapture(s, &g), "end capture");
  CheckCuda(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  cudaEvent_t a, b;
  CheckCuda(cudaEventCreate(&a), "event");
  CheckCuda(cudaEventCreate(&b), "event");
  CheckCuda(cudaGraphLaunch(ge, s), "launch");  // warm
  CheckCuda(cudaEventRecord(a, s), "record");
  CheckCuda(cudaGraphLaunch(ge, s), "launch");
  CheckCuda(cudaEventRecord(b, s), "record");
  CheckCuda(cudaStreamSynchronize(s), "sync");
  float ms = 0;
  CheckCuda(cudaEventElapsedTime(&ms, a, b), "elapsed");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return 1000.0 * ms / n;
}

// Half round trip (ns) between ordinals[0] and ordinals[1..k]: the leader
// stores to k followers and waits for k echoes, n times.
double FanoutHalfRoundTripNs(const std::vector<int>& ordinals, int k, int n, bool line) {
  const int leader = ordinals[0];
  std::vector<uint32_t*> flags(k), outs_f(k);
  std::vector<uint64_t*> fouts(k);
  CheckCuda(cudaSetDevice(leader), "cudaSetDevice");
  uint32_t* acks = DevAlloc<uint32_t>(4 * k);
  uint64_t* lout = DevAlloc<uint64_t>(2);
  uint32_t** dflags = DevAlloc<uint32_t*>(k);
  for (int p = 0; p < k; ++p) {
    CheckCuda(cudaSetDevice(ordinals[p + 1]), "cudaSetDevice");
    flags[p] = DevAlloc<uint32_t>(4);
    fouts[p] = DevAlloc<uint64_t>(1);
  }
  CheckCuda(cudaSetDevice(leader), "cudaSetDevice");
  CheckCuda(cudaMemcpy(dflags, flags.data(), sizeof(uint32_t*) * k, cudaMemcpyHostToDevice), "memcpy");
  std::vector<cudaStream_t> streams(k + 1);
  for (int p = 0; p <= k; ++p) {
    CheckCuda(cudaSetDevice(ordinals[p]), "cudaSetDevice");
    CheckCuda(cudaStreamCreateWithFlags(&streams[p], cudaStreamNonBlocking), "stream");
  }
  for (int p = 0; p < k; ++p) {
    CheckCuda(cudaSetDevice(ordinals[p + 1]), "cudaSetDevice");
    FollowerKernel<<<1, 1, 0, streams[p + 1]>>>(flags[p], acks + 4 * p, n, line, fouts[p]);
  }
  CheckCuda(cudaSetDevice(leader), "cudaSetDevice");
  LeaderKernel<<<1, 1, 0, streams[0]>>>(dflags, k, acks, n, line, lout);
  for (int p = 0; p <= k; ++p) {
    CheckCuda(cudaSetDevice(ordinals[p]), "cudaSetDevice");
    CheckCuda(cudaStreamSynchronize(streams[p]), "ping-pong");
    cudaStreamDestroy(streams[p]);
  }
  CheckCuda(cudaSetDevice(leader), "cudaSetDevice");
  const uint64_t total = ReadU64(lout, 0), failed_at = ReadU64(lout, 1);
  cudaFree(acks);
  cudaFree(lout);
  cudaFree(dflags);
  for (int p = 0; p < k; ++p) {
    CheckCuda(cudaSetDevice(ordinals[p + 1]), "cudaSetDevice");
    cudaFree(flags[p]);
    cudaFree(fouts[p]);
  }
  if (failed_at != 0 || total == 0) {
    throw std::runtime_error("jax_llar sol: ping-pong timed out at iteration " +
                             std::to_string(failed_at));
  }
  return double(total) / (2.0 * n);
}

}  // namespace

SolResult RunSol(const std::vector<int>& ordinals, int iters) {
  if (ordinals.empty()) throw std::runtime_error("jax_llar sol: no devices");
  int prev = 0;
  cudaGetDevice(&prev);
  for (int a : ordinals) {
    CheckCuda(cudaSetDevice(a), "cudaSetDevice");
    for (int b : ordinals) {
      if (a == b) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        CheckCuda(e, "cudaDeviceEnablePeerAccess");
      }
      cudaGetLastError();  // clear "already enabled"
    }
  }
  SolResult r;
  CheckCuda(cudaSetDevice(ordinals[0]), "cudaSetDevice");
  r.fence_ns = FenceNs(false, iters);
  r.fence_system_ns = FenceNs(true, iters);
  r.l2_chase_ns = ChaseNs(iters);
  r.empty_kernel_graph_us = EmptyKernelInGraphUs(1000);
  if (ordinals.size() >= 2) {
    r.remote_4b_ns = FanoutHalfRoundTripNs(ordinals, 1, iters, false);
    r.remote_ll_ns = FanoutHalfRoundTripNs(ordinals, 1, iters, true);
    for (int k = 1; k < static_cast<int>(ordinals.size()); ++k) {
      r.fanout_ll_ns.push_back(FanoutHalfRoundTripNs(ordinals, k, iters, true));
    }
  }
  cudaSetDevice(prev);
  return r;
}

}  // namespace llar
