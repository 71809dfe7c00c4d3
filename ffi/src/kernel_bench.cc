#include "kernel_bench.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "errors.h"
#include "kernels/kernels.h"
#include "registry.h"

namespace llar {
namespace {

ncclDataType_t NcclType(DType d) {
  switch (d) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
  }
  return ncclFloat32;
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

KernelBenchResult RunKernelBench(int64_t comm_id, const std::string& impl,
                                 DType dtype,
                                 const std::vector<std::vector<uint8_t>>& inputs,
                                 int iters, int reps) {
  const auto groups = GroupsOf(comm_id);
  if (groups.empty()) throw std::runtime_error("jax_llar kernel bench: unknown comm set");
  const std::vector<int>& group = groups[0];
  const int n = static_cast<int>(group.size());
  if (static_cast<int>(inputs.size()) != n) {
    throw std::runtime_error("jax_llar kernel bench: need one input per rank");
  }
  const size_t bytes = inputs[0].size();
  const size_t elem = dtype == DType::kF32 ? 4 : 2;
  if (impl.rfind("one_shot_ll", 0) == 0 && bytes > kOneShotMaxBytes) {
    throw std::runtime_error("jax_llar kernel bench: larger than the one-shot limit");
  }
  // one_shot_ll[_loopback|_send_loopback|_traced|_generic][_b<lines per block>]
  OneShotOptions options;
  PeerWrites writes = PeerWrites::kSend;
  if (impl.rfind("one_shot_ll", 0) == 0) {
    std::string rest = impl.substr(std::string("one_shot_ll").size());
    // An optional trailing _b<1-3 digits>: the grid rule's lines per block.
    const size_t b = rest.rfind("_b");
    if (b != std::string::npos && b + 2 < rest.size() && rest.size() - b - 2 <= 3 &&
        rest.find_first_not_of("0123456789", b + 2) == std::string::npos) {
      const unsigned long lines = std::stoul(rest.substr(b + 2));
      if (lines == 0 || lines > static_cast<unsigned long>(kLinesPerBlock)) {
        throw std::runtime_error("jax_llar kernel bench: lines per block must be 1-" +
                                 std::to_string(kLinesPerBlock) + " in " + impl);
      }
      options.block_lines = static_cast<uint32_t>(lines);
      rest = rest.substr(0, b);
    }
    if (rest == "_loopback") {
      writes = PeerWrites::kLoopback;
    } else if (rest == "_send_loopback") {
      writes = PeerWrites::kSendLoopback;
    } else if (rest == "_traced") {
      options.trace = true;
    } else if (rest == "_generic") {
      options.generic = true;
    } else if (!rest.empty()) {
      throw std::runtime_error("jax_llar kernel bench: unknown impl " + impl);
    }
  } else if (impl != "copy" && impl != "nccl") {
    throw std::runtime_error("jax_llar kernel bench: unknown impl " + impl);
  }
  int prev = 0;
  cudaGetDevice(&prev);
  // The bench advances the set's epoch counters: nothing else may be running
  // on these devices (XLA programs using the same set) while it does.
  for (int d : group) {
    CheckCuda(cudaSetDevice(d), "cudaSetDevice");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[r];
    k.ordinal = group[r];
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
    if (impl == "nccl") {
      CheckNccl(ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < n; ++r) {
        CheckNccl(ncclAllReduce(ranks[r].in, ranks[r].out, bytes / elem, NcclType(dtype),
                                ncclSum, static_cast<ncclComm_t>(NcclCommOf(comm_id, ranks[r].ordinal)),
                                ranks[r].stream),
                  "ncclAllReduce");
      }
      CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
      continue;
    }
    for (int r = 0; r < n; ++r) {
      CheckCuda(cudaSetDevice(ranks[r].ordinal), "cudaSetDevice");
      if (impl == "copy") {
        CheckCuda(LaunchCopy(ranks[r].in, ranks[r].out, bytes, ranks[r].stream), "copy launch");
      } else {
        const DeviceContext* c = Lookup(comm_id, ranks[r].ordinal);
        AllReduceArgs a = c->base;
        a.in = ranks[r].in;
        a.out = ranks[r].out;
        a.n_bytes = static_cast<uint32_t>(bytes);
        // Loopback: the same kernel with every peer store sent to this rank's
        // own scratch; what it costs over the copy kernel is the kernel's own
        // work, and one_shot_ll minus loopback is what the network adds.
        // Send-and-loopback: loopback plus the remote stores (never read).
        // Traced: the call-trace variant (its trace pointer may be null).
        // Generic: the run-time world-size variant.
        a.peer_writes = writes;
        CheckCuda(LaunchOneShotLL(a, dtype, ranks[r].stream, options), "one-shot launch");
      }
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
  cudaSetDevice(prev);
  return result;
}

}  // namespace llar
