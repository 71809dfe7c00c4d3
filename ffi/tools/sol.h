// Speed-of-light microbenchmarks: the latencies the one-shot all-reduce is
// built from (benchmarks/METHOD.md, speed of light). Set-up and measurement
// only; enables peer access between the given devices.
#ifndef LLAR_TOOLS_SOL_H_
#define LLAR_TOOLS_SOL_H_

#include <vector>

namespace llar {

struct SolResult {
  double fence_ns = 0;           // __threadfence(), per call, one thread
  double fence_system_ns = 0;    // __threadfence_system()
  double l2_chase_ns = 0;        // dependent ld.global.cg over 8 MiB (L2 hits)
  double remote_4b_ns = 0;       // 4-byte store -> peer sees it (half round trip)
  double remote_ll_ns = 0;       // the same with one 16-byte LL line
  std::vector<double> fanout_ll_ns;  // [k-1]: half round trip storing to k peers
  double empty_kernel_graph_us = 0;  // per empty kernel, 1000 in one CUDA graph
};

// Throws std::runtime_error on a CUDA error or a timed-out (5 s) wait.
SolResult RunSol(const std::vector<int>& ordinals, int iters);

}  // namespace llar

#endif  // LLAR_TOOLS_SOL_H_
