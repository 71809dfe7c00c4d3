#include "kernel_bench.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "copy.h"
#include "diag_window.h"
#include "errors.h"
#include "kernels/kernels.h"
#include "one_shot_ll_diag.h"
#include "preload.h"
#include "registry.h"

namespace llar {
namespace {

[[noreturn]] void BadArgument(const std::string& what) {
  throw std::invalid_argument("jax_llar kernel bench: " + what);
}

ncclDataType_t NcclType(DType d) {
  switch (d) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32: return ncclInt32;
  }
  return ncclFloat32;
}

// kAlgorithm: one of the extension's algorithms (kAlgorithms), on the set's
// region for it.
enum class Kind { kAlgorithm, kCopy, kNccl };

constexpr int64_t kOneShot = static_cast<int64_t>(Algorithm::kOneShotLL);

// What one rank launches per call of an algorithm kind.
struct OneShotPlan {
  int64_t algorithm = 0;    // kAlgorithms id
  bool diagnostic = false;  // one_shot_ll only; else the production launcher
  DiagVariant variant = DiagVariant::kLoopback;
  OneShotOptions options;
};

Kind ParseSpec(const KernelBenchSpec& spec, OneShotPlan* plan) {
  Kind kind;
  if (spec.kind == "copy") {
    kind = Kind::kCopy;
  } else if (spec.kind == "nccl") {
    kind = Kind::kNccl;
  } else {
    kind = Kind::kAlgorithm;
    for (int64_t a = 1; a < kAlgorithmCount; ++a) {
      if (spec.kind == kAlgorithms[a].name) plan->algorithm = a;
    }
    if (plan->algorithm == 0) {
      std::string known;
      for (int64_t a = 1; a < kAlgorithmCount; ++a) known += std::string(kAlgorithms[a].name) + ", ";
      BadArgument("unknown kind '" + spec.kind + "' (" + known + "copy or nccl)");
    }
  }
  if (kind != Kind::kAlgorithm || plan->algorithm != kOneShot) {
    if (!spec.variant.empty() || spec.generic || spec.block_lines != 0) {
      BadArgument("variant, generic and block_lines apply to kind one_shot_ll only");
    }
    return kind;
  }
  if (spec.block_lines > static_cast<uint32_t>(kLinesPerBlock)) {
    BadArgument("block_lines must be 0 (the production rule) or 1-" +
                std::to_string(kLinesPerBlock));
  }
  plan->options.generic = spec.generic;
  plan->options.block_lines = spec.block_lines;
  if (spec.variant.empty()) {
    plan->diagnostic = false;
  } else if (spec.variant == "loopback") {
    plan->diagnostic = true;
    plan->variant = DiagVariant::kLoopback;
  } else if (spec.variant == "send_loopback") {
    plan->diagnostic = true;
    plan->variant = DiagVariant::kSendLoopback;
  } else if (spec.variant == "traced") {
    plan->diagnostic = true;
    plan->variant = DiagVariant::kTraced;
  } else if (spec.variant == "unsigned") {
    plan->diagnostic = true;
    plan->variant = DiagVariant::kUnsigned;
  } else {
    BadArgument("unknown variant '" + spec.variant +
                "' ('', loopback, send_loopback, traced or unsigned)");
  }
  return kind;
}

struct Rank {
  int ordinal = 0;
  cudaStream_t stream = nullptr;
  void* in = nullptr;
  void* out = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
};

}  // namespace

KernelBenchResult RunKernelBench(int64_t comm_id, const KernelBenchSpec& spec, DType dtype,
                                 const std::vector<std::vector<uint8_t>>& inputs,
                                 int iters, int reps) {
  OneShotPlan plan;
  const Kind kind = ParseSpec(spec, &plan);
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16 &&
      dtype != DType::kI32) {
    BadArgument("unknown dtype code " + std::to_string(static_cast<int>(dtype)));
  }
  if (iters < 1 || reps < 1) BadArgument("iters and reps must be positive");
  if (spec.signature >= (uint32_t(1) << kSignatureBits)) {
    BadArgument("signature must be below 2^" + std::to_string(kSignatureBits));
  }
  if (MembersOf(comm_id).empty()) {
    BadArgument("unknown communicator set " + std::to_string(comm_id));
  }
  if (kind == Kind::kAlgorithm) EnsureRegion(comm_id, plan.algorithm);
  const auto groups = MembersOf(comm_id);
  const std::vector<Member>& group = groups[0];
  const int n = static_cast<int>(group.size());
  if (static_cast<int>(inputs.size()) != n) BadArgument("need one input per rank");
  const size_t bytes = inputs[0].size();
  for (const auto& x : inputs) {
    if (x.size() != bytes) BadArgument("the inputs differ in size");
  }
  const size_t elem = (dtype == DType::kF32 || dtype == DType::kI32) ? 4 : 2;
  if (kind == Kind::kAlgorithm && bytes > kAlgorithms[plan.algorithm].max_bytes) {
    BadArgument(std::string("larger than the ") + kAlgorithms[plan.algorithm].name + " limit");
  }
  std::vector<const PeerTable*> diag_tables;
  if (kind == Kind::kAlgorithm && plan.diagnostic &&
      plan.variant == DiagVariant::kSendLoopback) {
    diag_tables = SendLoopbackTables(comm_id);
  }
  DeviceGuard guard;
  // The bench advances the set's epoch counters: nothing else may be running
  // on these devices (XLA programs using the same set) while it does.
  // The tools' kernels it captures (copy, diagnostic variants) are loaded
  // before the capture.
  const bool tool_kernels = kind == Kind::kCopy || (kind == Kind::kAlgorithm && plan.diagnostic);
  for (const Member& m : group) {
    CheckCuda(cudaSetDevice(m.ordinal), "cudaSetDevice");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (tool_kernels) LoadToolKernels(m.ordinal);
  }
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[r];
    k.ordinal = group[r].ordinal;
    CheckCuda(cudaSetDevice(k.ordinal), "cudaSetDevice");
    CheckCuda(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking), "stream");
    CheckCuda(cudaMalloc(&k.in, bytes + 16), "cudaMalloc");
    CheckCuda(cudaMalloc(&k.out, bytes + 16), "cudaMalloc");
    CheckCuda(cudaMemcpy(k.in, inputs[r].data(), bytes, cudaMemcpyHostToDevice), "memcpy");
    CheckCuda(cudaMemset(k.out, 0xff, bytes), "memset");  // poison
    CheckCuda(cudaEventCreate(&k.start), "event");
    CheckCuda(cudaEventCreate(&k.stop), "event");
  }
  // Capture. NCCL calls of all ranks are grouped per step, so the streams are
  // captured together (relaxed mode: one thread drives every device).
  for (int r = 0; r < n; ++r) {
    CheckCuda(cudaSetDevice(ranks[r].ordinal), "cudaSetDevice");
    CheckCuda(cudaStreamBeginCapture(ranks[r].stream, cudaStreamCaptureModeRelaxed), "capture");
  }
  for (int i = 0; i < iters; ++i) {
    if (kind == Kind::kNccl) {
      CheckNccl(ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < n; ++r) {
        CheckNccl(ncclAllReduce(ranks[r].in, ranks[r].out, bytes / elem, NcclType(dtype),
                                ncclSum, group[r].comm, ranks[r].stream),
                  "ncclAllReduce");
      }
      CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
      continue;
    }
    for (int r = 0; r < n; ++r) {
      CheckCuda(cudaSetDevice(ranks[r].ordinal), "cudaSetDevice");
      if (kind == Kind::kCopy) {
        CheckCuda(LaunchCopy(ranks[r].in, ranks[r].out, bytes, ranks[r].stream), "copy launch");
        continue;
      }
      AllReduceArgs a = *ArgsOf(group[r].context, plan.algorithm);  // ensured above
      a.in = ranks[r].in;
      a.out = ranks[r].out;
      a.n_bytes = static_cast<uint32_t>(bytes);
      a.signature = spec.signature;
      if (!diag_tables.empty()) a.peers = diag_tables[r];
      cudaError_t e;
      if (plan.algorithm != kOneShot) {
        e = kAlgorithms[plan.algorithm].launch(a, dtype, ranks[r].stream);
      } else if (plan.diagnostic) {
        e = LaunchOneShotLLDiag(plan.variant, a, dtype, ranks[r].stream, plan.options);
      } else {
        e = LaunchOneShotLLWith(a, dtype, ranks[r].stream, plan.options);
      }
      CheckCuda(e, "all-reduce launch");
    }
  }
  for (int r = 0; r < n; ++r) {
    CheckCuda(cudaSetDevice(ranks[r].ordinal), "cudaSetDevice");
    CheckCuda(cudaStreamEndCapture(ranks[r].stream, &ranks[r].graph), "end capture");
    CheckCuda(cudaGraphInstantiate(&ranks[r].exec, ranks[r].graph, 0), "instantiate");
  }
  auto launch_all = [&](bool timed) {
    for (int r = 0; r < n; ++r) {
      CheckCuda(cudaSetDevice(ranks[r].ordinal), "cudaSetDevice");
      if (timed) CheckCuda(cudaEventRecord(ranks[r].start, ranks[r].stream), "record");
      CheckCuda(cudaGraphLaunch(ranks[r].exec, ranks[r].stream), "graph launch");
      if (timed) CheckCuda(cudaEventRecord(ranks[r].stop, ranks[r].stream), "record");
    }
    for (int r = 0; r < n; ++r) {
      CheckCuda(cudaSetDevice(ranks[r].ordinal), "cudaSetDevice");
      CheckCuda(cudaStreamSynchronize(ranks[r].stream), "sync");
    }
  };
  KernelBenchResult result;
  launch_all(false);  // warm-up
  for (int rep = 0; rep < reps; ++rep) {
    launch_all(true);
    std::vector<double> per_rank(n);
    for (int r = 0; r < n; ++r) {
      float ms = 0;
      CheckCuda(cudaEventElapsedTime(&ms, ranks[r].start, ranks[r].stop), "elapsed");
      per_rank[r] = 1000.0 * ms / iters;
    }
    result.us_per_call.push_back(per_rank);
  }
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[r];
    CheckCuda(cudaSetDevice(k.ordinal), "cudaSetDevice");
    std::vector<uint8_t> out(bytes);
    CheckCuda(cudaMemcpy(out.data(), k.out, bytes, cudaMemcpyDeviceToHost), "memcpy");
    result.outputs.push_back(std::move(out));
    cudaGraphExecDestroy(k.exec);
    cudaGraphDestroy(k.graph);
    cudaEventDestroy(k.start);
    cudaEventDestroy(k.stop);
    cudaFree(k.in);
    cudaFree(k.out);
    cudaStreamDestroy(k.stream);
  }
  return result;
}

}  // namespace llar
