// The host table of one algorithm's kernels: which compiled kernel serves a
// dtype and a number of ranks, and loading them all. One definition of that
// rule for every algorithm's Kernels struct (one_shot_ll.cuh, two_shot_ll.cuh,
// ...), each of which adds its grid rule and its Launch; and what every
// Launch does before and after its grid (LaunchArgsValid, Run).
//
//   Pick      names the kernels: Pick::Get<T, kWorld>() is the kernel of
//             dtype T compiled for kWorld ranks (0: any number, read from
//             AllReduceArgs::world at run time).
//   kInt32    whether the algorithm serves int32 (For gives nullptr if not).
//   kWorlds   the numbers of ranks compiled as constants; every other number
//             runs the kWorld = 0 kernel.
#ifndef LLAR_KERNELS_KERNEL_TABLE_CUH_
#define LLAR_KERNELS_KERNEL_TABLE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"
#include "llar/args.h"

namespace llar {

// The checks every Launch makes on its argument block (n_bytes > 0 is the
// caller's: a Launch returns cudaSuccess for 0 bytes first): at most
// `max_bytes` payload bytes per rank, 2 to kMaxRanks ranks, a rank below the
// world, a peer table and epoch counters.
inline bool LaunchArgsValid(const AllReduceArgs& a, std::size_t max_bytes) {
  return a.n_bytes <= max_bytes && a.world >= 2 && a.world <= kMaxRanks && a.rank < a.world &&
         a.peers != nullptr && a.epochs != nullptr;
}

template <typename Pick, bool kInt32, int... kWorlds>
struct KernelTable {
  using Kernel = void (*)(AllReduceArgs);

  template <typename T>
  static Kernel ForWorld(int world) {
    Kernel k = Pick::template Get<T, 0>();
    ((world == kWorlds ? (k = Pick::template Get<T, kWorlds>(), 0) : 0), ...);
    return k;
  }

  static Kernel For(DType dtype, int world) {
    switch (dtype) {
      case DType::kF32: return ForWorld<float>(world);
      case DType::kBF16: return ForWorld<__nv_bfloat16>(world);
      case DType::kF16: return ForWorld<__half>(world);
      case DType::kI32:
        if constexpr (kInt32) {
          return ForWorld<int32_t>(world);
        } else {
          return nullptr;
        }
    }
    return nullptr;
  }

  // Loads every kernel of the table on the current device (kernels.h).
  static cudaError_t Preload() { return PreloadKernels<kWorlds...>(&For); }

  // Launches the kernel For(dtype, world) with `a` on a grid of `blocks`
  // blocks of `threads` threads; cudaErrorInvalidValue when the table has
  // none for that dtype, else the launch's error.
  static cudaError_t Run(const AllReduceArgs& a, DType dtype, int world, uint32_t blocks,
                         uint32_t threads, cudaStream_t stream) {
    const Kernel fn = For(dtype, world);
    if (fn == nullptr) return cudaErrorInvalidValue;
    fn<<<blocks, threads, 0, stream>>>(a);
    return cudaGetLastError();
  }
};

}  // namespace llar

#endif  // LLAR_KERNELS_KERNEL_TABLE_CUH_
