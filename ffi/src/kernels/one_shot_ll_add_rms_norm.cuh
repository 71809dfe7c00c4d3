// One-shot LL all-reduce + residual add + RMSNorm, fused: the kernel template
// and its launcher. one_shot_ll_add_rms_norm.cu instantiates the production
// kernels; the op's meaning is `reference` in jax_llar/fused.py.
//
// For rows x d tensors (x, residual of x's dtype T; weight of d elements, of
// T or float32):
//   new_residual = psum(x) + residual        rounded to T twice: the psum once
//                                            (the one-shot's rank-order sum),
//                                            then the add, in float
//   normed = (h * inv) * float(weight)       rounded to T once, where
//            h = float(new_residual), inv = rsqrtf(sum(h * h) * (1 / d) + eps)
//
// The exchange is the one-shot LL all-reduce's, step for step (one_shot_ll.cuh):
// each thread packs its 8 bytes of x into one LL line, sends it to every
// peer through LLSession (same scratch, same per-(block, warp) epoch
// counters, same bounded waits and re-zeroing), receives every peer's line
// and sums the ranks in rank order (RankOrderSum). Its lines carry the fused
// call's own signature (all_reduce.signature: the lowering gives each call
// site its own, ll.cuh), so a fused call paired with another call, a one-shot
// all-reduce included, ends in the foreign-signature report, never in a
// wrong sum. The epoch argument of
// epoch.cuh holds unchanged: every rank runs the same sequence of calls
// (all-reduces and fused calls alike) with the same grids, so each warp's
// counter advances in lockstep on every rank. No barrier across ranks.
//
// The epilogue is new: each thread holds one line (4 elements of a 16-bit
// dtype, 2 of float32) of one row of the reduced sum. It adds the residual
// (new_residual) and needs the row's sum of squares, which the blocks of the
// row share through a thread block cluster (sm_90): one cluster of
// `cluster_blocks` blocks per row; warp sums by shuffle, then every warp's
// sum into every block of the cluster and one fixed order of addition
// (cluster_sum.cuh: st.async and an mbarrier, no memory barrier). Every
// block (and every rank, whose new_residual is bitwise the same) therefore
// computes bitwise the same total. A row of one block (cluster_blocks == 1)
// is no cluster: the launcher gives such a grid no cluster dimension, and the
// cluster sum then runs no cluster operation (mapa and st.async are not
// defined in a cluster of one block; cluster_sum.cuh), with the same order of
// addition. Rounding-wise the sum of squares is not
// XLA's reduction order; the ops around it are XLA's: the mean is
// sum * float(1 / d), which is what XLA's algebraic simplifier makes of
// jnp.mean's division by a constant, fused with + eps into one fma, as XLA's
// GPU backend (FMA contraction on) emits a multiply feeding an add; rsqrtf is
// libdevice's __nv_rsqrtf (rsqrt.approx.f32, no flush to zero), which is what
// XLA's GPU backend calls; then two float multiplies in the reference's
// order. So new_residual is bitwise the reference's and normed, for 16-bit
// dtypes, within one unit in the last place.
//
// __launch_bounds__(kMaxThreads, 1): with the minimum of one block per
// multiprocessor ptxas keeps every variant free of spills (on sm_90 and
// sm_100) around the out-of-line cold paths (tail loads, timeout report,
// re-zeroing); without it some variants kept 40 registers and spilled.
//
// Work split: block b holds lines [b * lines_per_block, (b + 1) *
// lines_per_block) of x, i.e. part (b % cluster_blocks) of row
// (b / cluster_blocks), and is block b % cluster_blocks of cluster
// b / cluster_blocks; thread t holds line b * lines_per_block + t, which is
// the line index and scratch slot the one-shot all-reduce would give it.
// Grid rule: AddRmsNormGridFor (kernels.h). Barriers: none across ranks; one
// cluster barrier (arrived at the start, waited for just before the cluster
// sum) and the cluster sum's mbarrier, inside a row's cluster; for one-block
// rows one block barrier instead.
//
// Template parameters:
//   T        float, __nv_bfloat16 or __half (x, residual and the outputs).
//   W        the weight's type: T or float.
//   kWorld   2, 4 or 8 ranks known at compile time; 0: any, read at run time
//            (as in one_shot_ll.cuh).
#ifndef LLAR_KERNELS_ONE_SHOT_LL_ADD_RMS_NORM_CUH_
#define LLAR_KERNELS_ONE_SHOT_LL_ADD_RMS_NORM_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/kernels.h"
#include "kernels/one_shot_ll.cuh"  // ReceiveRankOrderSum
#include "llar/args.h"
#include "llar/cluster_sum.cuh"
#include "llar/ll_session.cuh"
#include "llar/reduce.cuh"

namespace llar {
namespace add_rms_norm {

// The weight's 8-byte lines per line of x: 1 when W is T; 2 for a float32
// weight of a 16-bit x (4 elements, 16 bytes).
template <typename T, typename W>
inline constexpr int kWeightLines =
    Payload<T>::kPerLine * static_cast<int>(sizeof(W)) / kPayloadBytesPerLine;

// The weight's 8-byte lines of the thread's kPerLine elements (element line
// `row_line` of a row), as loaded: kept packed until they are used, so that
// few registers are live across the out-of-line calls in between.
template <typename T, typename W>
struct WeightLines {
  static constexpr int kLines = kWeightLines<T, W>;
  static_assert(kLines * Payload<W>::kPerLine == Payload<T>::kPerLine, "weight lines");
  uint2 raw[kLines];

  __device__ __forceinline__ void Load(const AddRmsNormArgs& a, uint32_t row_line) {
    const uint32_t n_bytes = a.d * static_cast<uint32_t>(sizeof(W));
#pragma unroll
    for (int j = 0; j < kLines; ++j) {
      raw[j] = LoadPayload(a.weight, n_bytes, a.weight_vector_lines, row_line * kLines + j);
    }
  }

  // The weights in float (exact).
  __device__ __forceinline__ void Unpack(float (&w)[Payload<T>::kPerLine]) const {
    constexpr int kPer = Payload<W>::kPerLine;
#pragma unroll
    for (int j = 0; j < kLines; ++j) {
      float v[kPer];
      Payload<W>::Unpack(raw[j], v);
#pragma unroll
      for (int i = 0; i < kPer; ++i) w[j * kPer + i] = v[i];
    }
  }
};

// Sum over the warp, butterfly: every lane ends with bitwise the same value
// (each step adds the same two values, and float addition commutes).
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

}  // namespace add_rms_norm

template <typename T, typename W, int kWorld>
__global__ void __launch_bounds__(kMaxThreads, 1)
    OneShotLLAddRmsNormKernel(const AddRmsNormArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // thread block clusters: sm_90 and later (the launch fails before)
#else
  using P = Payload<T>;
  constexpr int kPer = P::kPerLine;
  static_assert(std::is_same_v<W, T> || std::is_same_v<W, float>, "weight: T or float");
  __shared__ ClusterSumStorage row_sum;

  const AllReduceArgs& ar = a.all_reduce;
  const int block = blockIdx.x;
  const int t = threadIdx.x;
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  LLSession<kWorld> ll(ar, block, t);  // loads the warp's epoch and the scratch addresses

  // Rows are whole lines and every block holds a whole part of one row, so
  // a thread below lines_per_block always has a line.
  const uint32_t line = block * ar.lines_per_block + t;
  const bool active = t < static_cast<int>(ar.lines_per_block);
  uint2 mine = {0u, 0u};
  if (active) mine = LoadPayload(ar.in, ar.n_bytes, ar.vector_lines, line);

  ll.Send(active, mine);  // and advance the warp's epoch

  // Issued while the lines are in flight: the cluster sum's set-up, and the
  // loads of the residual and the weight.
  ClusterSumBegin(row_sum, a.cluster_blocks, warps);
  // %cluster_ctarank is 0 in a launch without a cluster dimension.
  const uint32_t row_line = cluster_sum::BlockRank() * ar.lines_per_block + t;
  uint2 residual = {0u, 0u};
  add_rms_norm::WeightLines<T, W> weight = {};
  if (active) {
    residual = LoadPayload(a.residual, ar.n_bytes, ar.vector_lines, line);
    weight.Load(a, row_line);
  }

  float h[kPer] = {};  // new_residual, exactly, in float
  float squares = 0.0f;
  if (active) {
    // Receive and reduce in rank order: the one-shot all-reduce's psum.
    const uint2 psum = ReceiveRankOrderSum<T, kWorld>(ll, mine);
    // new_residual: the psum rounded to T, plus the residual, in float,
    // rounded to T (for T = float, the float add itself).
    float s[kPer], r[kPer];
    P::Unpack(psum, s);
    P::Unpack(residual, r);
#pragma unroll
    for (int i = 0; i < kPer; ++i) h[i] = __fadd_rn(s[i], r[i]);
    const uint2 new_residual = P::Pack(h);
    StorePayload(a.new_residual, ar.n_bytes, ar.vector_lines, line, new_residual);
    P::Unpack(new_residual, h);
    squares = __fmul_rn(h[0], h[0]);
#pragma unroll
    for (int i = 1; i < kPer; ++i) squares = __fmaf_rn(h[i], h[i], squares);
  }
  // The row's sum of squares: warps, then the blocks of the row's cluster.
  const float total =
      ClusterSum(row_sum, add_rms_norm::WarpSum(squares), a.cluster_blocks, warps);

  if (active) {
    const float inv = rsqrtf(__fmaf_rn(total, a.inv_d, a.eps));
    float w[kPer], normed[kPer];
    weight.Unpack(w);
#pragma unroll
    for (int i = 0; i < kPer; ++i) normed[i] = __fmul_rn(__fmul_rn(h[i], inv), w[i]);
    StorePayload(ar.out, ar.n_bytes, ar.vector_lines, line, P::Pack(normed));
  }
  // After the last Recv, as the session asks; last, so that nothing is live
  // across its out-of-line re-zeroing.
  ll.End();
#endif
}

// Host side: the kernels, compiled for the world sizes kWorlds... and for any
// world size (kWorld = 0), picked by dtype, weight dtype and the group's
// number of ranks.
template <int... kWorlds>
struct OneShotLLAddRmsNormKernels {
  using Kernel = void (*)(AddRmsNormArgs);

  template <typename T, typename W>
  static Kernel ForWorld(int world) {
    Kernel k = OneShotLLAddRmsNormKernel<T, W, 0>;
    ((world == kWorlds ? (k = OneShotLLAddRmsNormKernel<T, W, kWorlds>, 0) : 0), ...);
    return k;
  }

  template <typename T>
  static Kernel ForWeight(DType weight, int world) {
    if (weight == DType::kF32) return ForWorld<T, float>(world);
    return nullptr;
  }

  // nullptr for a combination that is not served.
  static Kernel For(DType dtype, DType weight, int world) {
    const bool same = weight == dtype;
    switch (dtype) {
      case DType::kF32: return same ? ForWorld<float, float>(world) : nullptr;
      case DType::kBF16:
        return same ? ForWorld<__nv_bfloat16, __nv_bfloat16>(world)
                    : ForWeight<__nv_bfloat16>(weight, world);
      case DType::kF16:
        return same ? ForWorld<__half, __half>(world) : ForWeight<__half>(weight, world);
      case DType::kI32: return nullptr;
    }
    return nullptr;
  }

  // Checks the arguments, fills in the grid-dependent fields of `a` and
  // launches one cluster of grid.cluster_blocks blocks per row, or, for rows
  // of one block, a grid without a cluster dimension (cluster_sum.cuh).
  static cudaError_t Launch(AddRmsNormArgs a, DType dtype, DType weight,
                            cudaStream_t stream) {
    AllReduceArgs& ar = a.all_reduce;
    const uint32_t itemsize = dtype == DType::kF32 ? 4u : 2u;
    AddRmsNormGrid g;
    if (!AddRmsNormGridFor(a.rows, a.d, itemsize, &g) || ar.world < 2 ||
        ar.world > kMaxRanks || ar.rank >= ar.world || ar.peers == nullptr ||
        ar.epochs == nullptr || ar.in == nullptr || ar.out == nullptr ||
        a.residual == nullptr || a.weight == nullptr || a.new_residual == nullptr) {
      return cudaErrorInvalidValue;
    }
    const Kernel fn = For(dtype, weight, ar.world);
    if (fn == nullptr) return cudaErrorInvalidValue;
    const uint32_t weight_bytes = a.d * (weight == DType::kF32 ? 4u : itemsize);
    ar.n_bytes = a.rows * a.d * itemsize;
    ar.vector_lines = VectorLines(ar.n_bytes, {ar.in, ar.out, a.residual, a.new_residual});
    a.weight_vector_lines = VectorLines(weight_bytes, {a.weight});
    ar.lines_per_block = static_cast<uint16_t>(g.lines_per_block);
    a.cluster_blocks = static_cast<uint8_t>(g.cluster_blocks);
    a.inv_d = 1.0f / static_cast<float>(a.d);  // XLA's InvertConstant

    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(g.blocks);
    config.blockDim = dim3(g.threads);
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = g.cluster_blocks;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = g.cluster_blocks > 1 ? 1 : 0;
    return cudaLaunchKernelEx(&config, fn, a);
  }

  // Loads every kernel on the current device.
  static cudaError_t Preload() {
    cudaFuncAttributes attr;
    const DType pairs[][2] = {{DType::kF32, DType::kF32},   {DType::kBF16, DType::kBF16},
                              {DType::kBF16, DType::kF32},  {DType::kF16, DType::kF16},
                              {DType::kF16, DType::kF32}};
    for (const auto& p : pairs) {
      for (int world : {0, kWorlds...}) {
        const cudaError_t e =
            cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(For(p[0], p[1], world)));
        if (e != cudaSuccess) return e;
      }
    }
    return cudaSuccess;
  }
};

}  // namespace llar

#endif  // LLAR_KERNELS_ONE_SHOT_LL_ADD_RMS_NORM_CUH_
