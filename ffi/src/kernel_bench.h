// Kernel-level benchmark (BENCHMARK.md level 1): every rank captures `iters`
// back-to-back calls into a CUDA graph; all ranks launch together; per-call
// time is elapsed / iters from CUDA events on each rank's stream.
#ifndef LLAR_KERNEL_BENCH_H_
#define LLAR_KERNEL_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "llar/args.h"

namespace llar {

struct KernelBenchResult {
  // [rep][rank] microseconds per call.
  std::vector<std::vector<double>> us_per_call;
  // Each rank's output after the timed replays (bytes), for the caller to check.
  std::vector<std::vector<uint8_t>> outputs;
};

// impl: "one_shot_ll", "copy" or "nccl" (ncclAllReduce, sum, on the set's
// communicator). `inputs` holds one byte vector per rank of group 0 of
// `comm_id`. Synchronises the devices; never call while XLA runs programs
// that use the same communicator set. Throws std::runtime_error on failure.
KernelBenchResult RunKernelBench(int64_t comm_id, const std::string& impl,
                                 DType dtype,
                                 const std::vector<std::vector<uint8_t>>& inputs,
                                 int iters, int reps);

}  // namespace llar

#endif  // LLAR_KERNEL_BENCH_H_
