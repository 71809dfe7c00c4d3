// Host-side entry points of the kernels: one launcher per algorithm. Each
// launcher only computes its grid and launches; it never allocates or
// synchronises, so it is safe inside CUDA stream capture.
#ifndef LLAR_KERNELS_H_
#define LLAR_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "llar/args.h"

namespace llar {

// Grid of the one-shot LL kernel for `lines` LL lines (host and tests use the
// same rule): up to `block_lines` lines per block (default kOneShotBlockLines)
// until 64 blocks, then up to 512. In three runs against 128 and 256 lines
// per block, 64 (two warps) was at most 0.06 us per call slower and up to
// 0.10 us faster, and neither other rule was faster at every size or in every
// run (benchmarks/NOTES.md, entries 11, 14 and 17; kernel bench rows _b128,
// _b256).
inline constexpr uint32_t kOneShotBlockLines = 64;
struct OneShotGrid {
  uint32_t blocks, lines_per_block, threads;
};
OneShotGrid OneShotGridFor(uint32_t lines, uint32_t block_lines = 0);

// How to launch: the production call uses the defaults.
struct OneShotOptions {
  bool trace = false;        // the call-trace variant (args.h)
  bool generic = false;      // the run-time world-size variant even for 2, 4, 8 ranks
                             // (kernel bench: measures and checks it on this machine)
  uint32_t block_lines = 0;  // grid rule's lines per block (0: kOneShotBlockLines)
};

// one_shot_ll.cu: a.vector_lines and a.lines_per_block are filled in by the
// launcher; a.peer_writes picks the variant (args.h).
cudaError_t LaunchOneShotLL(AllReduceArgs a, DType dtype, cudaStream_t stream,
                            const OneShotOptions& options = {});

// copy.cu: the trivial custom call that measures XLA's own cost per step.
cudaError_t LaunchCopy(const void* in, void* out, uint64_t n_bytes,
                       cudaStream_t stream);
// The same copy with a 208-byte parameter block (diagnostic, see copy.cu).
cudaError_t LaunchWideCopy(const void* in, void* out, uint64_t n_bytes,
                           cudaStream_t stream);

// Force each kernel's module to load on the current device, so that no lazy
// module load happens later inside a captured CUDA graph.
cudaError_t PreloadOneShotLL();
cudaError_t PreloadCopy();

}  // namespace llar

#endif  // LLAR_KERNELS_H_
