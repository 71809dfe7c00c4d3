// Kernel-level benchmark (benchmarks/METHOD.md, kernel level): every rank
// captures `iters` back-to-back calls into a CUDA graph; all ranks launch
// together; per-call time is elapsed / iters from CUDA events on each rank's
// stream.
#ifndef LLAR_TOOLS_KERNEL_BENCH_H_
#define LLAR_TOOLS_KERNEL_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "llar/args.h"

namespace llar {

// What to run.
struct KernelBenchSpec {
  // An algorithm's name in kAlgorithms (its production launcher, on the
  // set's region for it, allocated if absent), "copy" (the copy kernel,
  // copy.h) or "nccl" (ncclAllReduce, sum, on the set's communicator).
  std::string kind;
  // one_shot_ll only: "" (the all-reduce), "loopback", "send_loopback",
  // "traced" (one_shot_ll_diag.h; the traced variant's pointer is null unless
  // the set's call trace is on) or "unsigned" (compiled without call
  // signatures: the baseline of what they cost).
  std::string variant;
  // AllReduceArgs::signature of every call (the same on every rank), below
  // 2^kSignatureBits; 0 turns the check off at run time (the same code runs).
  uint32_t signature = 0;
  bool generic = false;      // one_shot_ll only: the run-time world-size kernel
  uint32_t block_lines = 0;  // one_shot_ll only: grid rule's lines per block
                             // (0: the production rule, else 1..kLinesPerBlock)
};

struct KernelBenchResult {
  // [rep][rank] microseconds per call.
  std::vector<std::vector<double>> us_per_call;
  // Each rank's output after the timed replays (bytes), for the caller to check.
  std::vector<std::vector<uint8_t>> outputs;
};

// `inputs` holds one byte vector per rank of group 0 of `comm_id`, all of one
// size. Synchronises the devices; never call while XLA runs programs that use
// the same communicator set (the one-shot kinds advance its epochs). Throws
// std::invalid_argument for a bad spec, dtype or inputs, std::runtime_error
// on a CUDA or NCCL failure.
KernelBenchResult RunKernelBench(int64_t comm_id, const KernelBenchSpec& spec, DType dtype,
                                 const std::vector<std::vector<uint8_t>>& inputs,
                                 int iters, int reps);

}  // namespace llar

#endif  // LLAR_TOOLS_KERNEL_BENCH_H_
