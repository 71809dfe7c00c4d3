// One-shot LL all-reduce (arXiv 2607.16100, section 4.1): the kernel template
// and its Rule (host side). one_shot_ll.cu instantiates the production
// all-reduce; the diagnostic variants are instantiated beside the kernel
// bench (ffi/tools/one_shot_ll_diag.cu).
//
// Every rank stores its payload, packed in LL lines (ll.cuh), into its slot of
// every peer's symmetric scratch; then it polls its own scratch for each
// peer's lines and reduces all ranks in rank order (reduce.cuh). There is no
// barrier at entry or exit: scratch reuse is proven by the epoch protocol
// (epoch.cuh), and every wait is bounded (wait.cuh). LLSession
// (ll_session.cuh) applies those rules; the kernel is the algorithm's steps.
//
// Work split: thread t of block b owns line b * lines_per_block + t. One line
// is 8 payload bytes; a 4 KiB tensor is 512 lines (grid rule: OneShotGridFor).
//
// Template parameters:
//   T        float, __nv_bfloat16, __half or int32_t.
//   kWorld   2, 4 or 8: the number of ranks known at compile time (loops
//            unrolled, peer addresses loaded with the first loads, float
//            accumulation for 2 ranks, see reduce.cuh); 0: any number of
//            ranks, read at run time.
//   Variant  what the kernel does with its lines and what it records. A
//            variant is constructed once per thread, as
//            Variant(args, block, thread), after the session, and provides
//              Send(session, active, payload)  calls session.Send, with its
//                                              own `store` if it sends
//                                              elsewhere (ll_session.cuh)
//              End(session)                    after session.End()
//            AllReduce below is the production one and adds no instruction;
//            the diagnostic ones live in ffi/tools. A variant with `static constexpr bool kSigned =
//            false` gets the session without signatures (ll_session.cuh:
//            the kernel bench's measure of what they cost); every other
//            variant's lines carry the call's signature.
// Everything off the fast path (byte-wise tail lines, the timeout report, the
// epoch re-zeroing) is out of line, so the hot instructions stay together.
#ifndef LLAR_KERNELS_ONE_SHOT_LL_CUH_
#define LLAR_KERNELS_ONE_SHOT_LL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/kernel_table.cuh"
#include "kernels/kernels.h"
#include "llar/args.h"
#include "llar/ll_session.cuh"
#include "llar/reduce.cuh"

namespace llar {

// The all-reduce: every line goes to every peer.
struct AllReduce {
  __device__ __forceinline__ AllReduce(const AllReduceArgs&, int, int) {}
  template <int kWorld>
  __device__ __forceinline__ void Send(LLSession<kWorld>& ll, bool active, uint2 payload) {
    ll.Send(active, payload);
  }
  template <int kWorld>
  __device__ __forceinline__ void End(const LLSession<kWorld>&) {}
};

// Whether a variant's session carries signatures (above).
template <typename Variant, typename = void>
inline constexpr bool kVariantSigned = true;
template <typename Variant>
inline constexpr bool kVariantSigned<Variant, std::void_t<decltype(Variant::kSigned)>> =
    Variant::kSigned;

// The one-shot's psum of the thread's line: receives every peer's line
// through the session `ll` and sums all ranks' lines in rank order
// (RankOrderSum, reduce.cuh), `mine` for this rank's. The fused add +
// RMSNorm (one_shot_ll_add_rms_norm.cuh) sums the same way.
template <typename T, int kWorld, typename Session>
__device__ __forceinline__ uint2 ReceiveRankOrderSum(Session& ll, uint2 mine) {
  constexpr int kUnroll = kWorld > 0 ? kWorld : 1;
  RankOrderSum<T, AccumulatorFor<T, kWorld>> sum;
#pragma unroll kUnroll
  for (int src = 0; src < ll.world(); ++src) {
    uint2 p = mine;
    if (src != ll.rank()) p = ll.Recv(src);
    sum.Add(src, p);
  }
  return sum.Result();
}

template <typename T, int kWorld, typename Variant>
__global__ void __launch_bounds__(kMaxThreads) OneShotLLKernel(const AllReduceArgs a) {
  const int block = blockIdx.x;
  const int t = threadIdx.x;
  // Loads the warp's epoch and the scratch addresses.
  LLSession<kWorld, kVariantSigned<Variant>> ll(a, block, t);
  Variant variant(a, block, t);

  const uint32_t line = block * a.lines_per_block + t;
  const uint32_t lines = (a.n_bytes + kPayloadBytesPerLine - 1) / kPayloadBytesPerLine;
  const bool active = t < static_cast<int>(a.lines_per_block) && line < lines;
  uint2 mine = {0u, 0u};
  if (active) mine = LoadPayload(a.in, a.n_bytes, a.vector_lines, line);

  variant.Send(ll, active, mine);  // and advance the warp's epoch

  if (active) {
    // Receive and reduce in rank order; store.
    StorePayload(a.out, a.n_bytes, a.vector_lines, line, ReceiveRankOrderSum<T, kWorld>(ll, mine));
  }
  ll.End();
  variant.End(ll);
}

// Host side (kernel_table.cuh): the kernels of one variant on the one-shot
// grid over LL lines, the row of Algorithm::kOneShotLL (its limit).
template <typename Variant>
struct OneShotLLRule : RuleOf<Algorithm::kOneShotLL, LLLines, OneShotSteps> {
  template <typename T, int kWorld>
  static constexpr auto Get() { return &OneShotLLKernel<T, kWorld, Variant>; }
  static KernelGrid Grid(uint32_t lines, int, uint32_t block_lines) {
    return OneShotGridFor(lines, block_lines);
  }
};
// The kernels of one variant, compiled for any world size (kWorld = 0) and
// for the world sizes kWorlds..., picked by dtype and the group's number of
// ranks.
template <typename Variant, int... kWorlds>
using OneShotLLKernels = AlgorithmKernels<OneShotLLRule<Variant>, 0, kWorlds...>;

}  // namespace llar

#endif  // LLAR_KERNELS_ONE_SHOT_LL_CUH_
