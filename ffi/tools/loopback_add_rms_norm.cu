// Loopback harness of the fused all-reduce + residual add + RMSNorm
// (loopback_add_rms_norm.h). The production kernels are compiled here a
// second time, from the same template with the same options, only so that
// the plan can ask CUDA how many of their clusters the device holds (the
// production library exports no kernel); the run launches the production
// launchers.
#include "loopback_add_rms_norm.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "errors.h"
#include "kernels/kernels.h"
#include "kernels/one_shot_ll_add_rms_norm.cuh"
#include "llar/args.h"
#include "loopback.h"

namespace llar {
namespace {

using Clock = std::chrono::steady_clock;

// The production instantiation: one_shot_ll_add_rms_norm.cu's `Production`.
using ProductionCopy = OneShotLLAddRmsNormKernels<2, 4, 8>;

constexpr int kPoison = 0x7b;  // as loopback.cc: a finite value in every dtype
constexpr uint64_t kMaxTimeoutNs = 600'000'000'000ull;

[[noreturn]] void BadArgument(const std::string& what) {
  throw std::invalid_argument("jax_llar fused loopback: " + what);
}

uint32_t ItemSize(DType d) { return d == DType::kF32 ? 4u : 2u; }

void Validate(const FusedLoopbackSpec& s, AddRmsNormGrid* grid) {
  if (s.world < 2 || s.world > kMaxRanks) {
    BadArgument("world must be 2-" + std::to_string(kMaxRanks));
  }
  if (s.dtype != DType::kF32 && s.dtype != DType::kBF16 && s.dtype != DType::kF16) {
    BadArgument("dtype must be float32, bfloat16 or float16");
  }
  if (s.weight != s.dtype && s.weight != DType::kF32) {
    BadArgument("the weight's dtype must be x's or float32");
  }
  if (!AddRmsNormGridFor(s.rows, s.d, ItemSize(s.dtype), grid)) {
    BadArgument(std::to_string(s.rows) + " rows of " + std::to_string(s.d) +
                " elements are not served by the fused kernel's grid rule");
  }
  if (s.timeout_ns == 0 || s.timeout_ns > kMaxTimeoutNs) {
    BadArgument("the timeout must be 1-600000 ms");
  }
  if (s.calls < 1) BadArgument("calls must be positive");
}

// Calls whose grid launched warp w of block b: `calls` fused calls, and as
// many one-shot all-reduces when interleaved.
std::string CheckEpochs(const std::vector<uint64_t>& counters, const FusedLoopbackSpec& s,
                        const AddRmsNormGrid& fused, const OneShotGrid& all_reduce,
                        int rank) {
  for (uint32_t b = 0; b < static_cast<uint32_t>(kMaxBlocks); ++b) {
    for (uint32_t w = 0; w < static_cast<uint32_t>(kMaxWarps); ++w) {
      uint64_t want = s.start_epoch;
      if (b < fused.blocks && w < fused.threads / kWarpSize) want += s.calls;
      if (s.interleave && b < all_reduce.blocks && w < all_reduce.threads / kWarpSize) {
        want += s.calls;
      }
      const uint64_t got = counters[b * kMaxWarps + w];
      if (got != want) {
        std::ostringstream m;
        m << "rank " << rank << " block " << b << " warp " << w << ": epoch " << got
          << ", expected " << want;
        return m.str();
      }
    }
  }
  return "";
}

}  // namespace

FusedLoopbackPlan PlanFusedLoopback(const FusedLoopbackSpec& s) {
  FusedLoopbackPlan p;
  Validate(s, &p.grid);
  DeviceGuard guard;
  CheckCuda(cudaSetDevice(s.ordinal), "cudaSetDevice");
  const ProductionCopy::Kernel kernel = ProductionCopy::For(s.dtype, s.weight, s.world);
  cudaFuncAttributes attr;
  CheckCuda(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel)),
            "cudaFuncGetAttributes(fused kernel)");
  p.regs_per_thread = attr.numRegs;
  if (p.grid.cluster_blocks > 1) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(p.grid.blocks);
    config.blockDim = dim3(p.grid.threads);
    cudaLaunchAttribute cluster[1];
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = p.grid.cluster_blocks;
    cluster[0].val.clusterDim.y = 1;
    cluster[0].val.clusterDim.z = 1;
    config.attrs = cluster;
    config.numAttrs = 1;
    CheckCuda(cudaOccupancyMaxActiveClusters(&p.max_active_clusters, kernel, &config),
              "cudaOccupancyMaxActiveClusters(fused kernel)");
  } else {
    // One-block rows launch without a cluster dimension (the launcher's
    // rule): each row's "cluster" is one resident block.
    int per_sm = 0, sms = 0;
    CheckCuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                  &per_sm, reinterpret_cast<const void*>(kernel),
                  static_cast<int>(p.grid.threads), 0),
              "cudaOccupancyMaxActiveBlocksPerMultiprocessor(fused kernel)");
    CheckCuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s.ordinal),
              "cudaDeviceGetAttribute(multiprocessors)");
    p.max_active_clusters = per_sm * sms;
  }
  p.clusters = static_cast<uint32_t>(s.world) * s.rows;
  p.co_resident = p.clusters <= static_cast<uint32_t>(p.max_active_clusters);
  if (s.interleave) {
    // The all-reduce's grid must fit too (loopback.h's rule).
    const uint32_t n_bytes = s.rows * s.d * ItemSize(s.dtype);
    const OneShotGrid g = OneShotGridFor(n_bytes / kPayloadBytesPerLine);  // whole lines
    int regs = 0, per_sm = 0, sms = 0;
    CheckCuda(OneShotLLOccupancy(s.dtype, s.world, g.threads, &regs, &per_sm),
              "occupancy of the one-shot kernel");
    CheckCuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s.ordinal),
              "cudaDeviceGetAttribute(multiprocessors)");
    p.co_resident = p.co_resident && static_cast<uint64_t>(s.world) * g.blocks <=
                                         static_cast<uint64_t>(sms) * per_sm;
  }
  return p;
}

FusedLoopbackResult RunFusedLoopback(const FusedLoopbackSpec& s, const std::vector<uint8_t>& x,
                                     const std::vector<uint8_t>& residual,
                                     const std::vector<uint8_t>& weight) {
  FusedLoopbackResult res;
  res.plan = PlanFusedLoopback(s);
  const int W = s.world;
  const size_t n_bytes = size_t(s.rows) * s.d * ItemSize(s.dtype);
  const size_t w_bytes = size_t(s.d) * ItemSize(s.weight);
  if (x.size() != W * n_bytes || residual.size() != n_bytes || weight.size() != w_bytes) {
    BadArgument("x must hold world x rows x d elements, residual rows x d, weight d");
  }
  if (!res.plan.co_resident) {
    std::ostringstream m;
    m << "the " << W << " ranks' " << res.plan.clusters << " clusters of "
      << res.plan.grid.cluster_blocks << " blocks of " << res.plan.grid.threads
      << " threads do not fit on the device at once (at most "
      << res.plan.max_active_clusters << "), or the interleaved all-reduce's grids do not";
    BadArgument(m.str());
  }
  res.records.assign(W, ErrorRecord{});

  DeviceGuard guard;
  CheckCuda(cudaSetDevice(s.ordinal), "cudaSetDevice");
  CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before the set-up)");
  // Load every kernel first, as the registry does: a lazily loaded module can
  // wait for the kernels already running, and a rank's kernel spins until its
  // peers' kernels run, so a first launch inside the loop can deadlock.
  CheckCuda(PreloadOneShotLL(), "loading the one-shot kernels");
  CheckCuda(PreloadOneShotLLAddRmsNorm(), "loading the fused kernels");
  // What CreateGroup and EnsureRegion (registry/) give each rank, on one
  // device: the fused kernel runs on the one-shot's region and counters.
  constexpr Algorithm kExchange = Algorithm::kOneShotLL;
  SimulatedRanks rs(W, RegionBytes(kExchange, W),
                    kAlgorithms[static_cast<int>(kExchange)].fill, s.start_epoch,
                    s.timeout_ns);
  char* d_x = rs.Alloc(W * n_bytes, "cudaMalloc(x)");
  char* d_normed = rs.Alloc(W * n_bytes, "cudaMalloc(normed)");
  char* d_new_residual = rs.Alloc(W * n_bytes, "cudaMalloc(new_residual)");
  char* d_all_reduce = rs.Alloc(W * n_bytes, "cudaMalloc(all-reduce output)");
  char* d_residual = rs.Alloc(n_bytes, "cudaMalloc(residual)");
  char* d_weight = rs.Alloc(w_bytes, "cudaMalloc(weight)");
  CheckCuda(cudaMemcpy(d_x, x.data(), W * n_bytes, cudaMemcpyHostToDevice), "cudaMemcpy(x)");
  CheckCuda(cudaMemcpy(d_residual, residual.data(), n_bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy(residual)");
  CheckCuda(cudaMemcpy(d_weight, weight.data(), w_bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy(weight)");
  CheckCuda(cudaMemset(d_normed, kPoison, W * n_bytes), "cudaMemset(normed)");
  CheckCuda(cudaMemset(d_new_residual, kPoison, W * n_bytes), "cudaMemset(new_residual)");
  CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after the set-up)");

  const auto timeout = std::chrono::nanoseconds(2 * s.timeout_ns + kHostMarginNs);
  cudaError_t launch_error = cudaSuccess;
  cudaError_t error = cudaSuccess;
  for (int c = 0; c < s.calls && error == cudaSuccess && launch_error == cudaSuccess; ++c) {
    for (int r = 0; r < W && launch_error == cudaSuccess; ++r) {
      AllReduceArgs base{};
      base.epochs = rs.state[r] + EpochSetOffset(kExchange);
      base.peers = rs.tables[r];
      base.rank = static_cast<uint8_t>(r);
      base.world = static_cast<uint8_t>(W);
      if (s.interleave) {
        AllReduceArgs a = base;
        a.in = d_x + r * n_bytes;
        a.out = d_all_reduce + r * n_bytes;
        a.n_bytes = static_cast<uint32_t>(n_bytes);
        a.signature = LoopbackSignature(0, 2 * c);  // a call site of its own
        launch_error = LaunchOneShotLL(a, s.dtype, rs.streams[r]);
        if (launch_error != cudaSuccess) break;
      }
      AddRmsNormArgs f{};
      f.all_reduce = base;
      f.all_reduce.in = d_x + r * n_bytes;
      f.all_reduce.out = d_normed + r * n_bytes;
      f.all_reduce.signature = LoopbackSignature(0, 2 * c + 1);
      f.residual = d_residual;
      f.weight = d_weight;
      f.new_residual = d_new_residual + r * n_bytes;
      f.eps = s.eps;
      f.d = s.d;
      f.rows = static_cast<uint16_t>(s.rows);
      launch_error = LaunchOneShotLLAddRmsNorm(f, s.dtype, s.weight, rs.streams[r]);
    }
    // Every call is waited for: a rank's calls are ordered by its stream, but
    // the harness checks each call's completion before it launches the next.
    error = rs.Wait(Clock::now() + timeout);
  }
  rs.CopyRecords(&res.records);
  if (error == cudaErrorNotReady) {
    res.deadline_exceeded = true;
    res.cuda_error = "host deadline passed with kernels still running";
    if (launch_error != cudaSuccess) {
      res.cuda_error = "launch: " + CudaErrorText(launch_error) + "; " + res.cuda_error;
    }
    rs.leak = true;
    return res;
  }
  if (error != cudaSuccess || launch_error != cudaSuccess) {
    if (launch_error != cudaSuccess) res.cuda_error = "launch: " + CudaErrorText(launch_error);
    if (error != cudaSuccess) {
      res.cuda_error += (res.cuda_error.empty() ? "" : "; ") + CudaErrorText(error);
    }
    return res;
  }
  res.normed.resize(W * n_bytes);
  res.new_residual.resize(W * n_bytes);
  error = cudaMemcpy(res.normed.data(), d_normed, W * n_bytes, cudaMemcpyDeviceToHost);
  if (error == cudaSuccess) {
    error = cudaMemcpy(res.new_residual.data(), d_new_residual, W * n_bytes,
                       cudaMemcpyDeviceToHost);
  }
  const OneShotGrid all_reduce_grid =
      OneShotGridFor(static_cast<uint32_t>(n_bytes / kPayloadBytesPerLine));
  std::vector<uint64_t> counters(kEpochCounters);
  for (int r = 0; r < W && error == cudaSuccess; ++r) {
    error = cudaMemcpy(counters.data(), rs.state[r] + EpochSetOffset(kExchange),
                       sizeof(uint64_t) * kEpochCounters,
                       cudaMemcpyDeviceToHost);
    if (error == cudaSuccess && res.epoch_mismatch.empty()) {
      res.epoch_mismatch = CheckEpochs(counters, s, res.plan.grid, all_reduce_grid, r);
    }
  }
  if (error != cudaSuccess) {
    res.cuda_error = CudaErrorText(error);
    res.normed.clear();
    res.new_residual.clear();
    return res;
  }
  res.epochs_checked = true;
  return res;
}

}  // namespace llar
