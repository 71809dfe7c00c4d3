// Payload per dtype: unpack 8 bytes of payload, accumulate in a fixed rank
// order, round once to the output dtype; and the payload's loads and stores.
//
// Why this is bitwise the float64 reference: every rank adds the same values
// in the same order (rank 0 first), so every rank gets bitwise the same
// result, and the tests compare with a float64 sum in rank order rounded once
// to the dtype.
//   * World size 2 (known at compile time): one addition a + b, in float.
//     For float32 inputs that is the correctly rounded sum (IEEE 754). For
//     bf16 (p = 8 bits) and f16 (p = 11) the float sum (q = 24) is rounded once
//     more to the dtype; rounding twice is harmless when q >= 2p + 2
//     (S. A. Figueroa, "When is double rounding innocuous?", SIGNUM Newsletter
//     30(3), 1995): 24 >= 18 and 24 >= 24. So every result is the correctly
//     rounded sum, which is also what the float64 reference produces
//     (53 >= 2 * 24 + 2). Float has bf16's exponent range and a wider one than
//     f16, and subnormals are kept, so this holds over the whole range.
//     The CPU tests check it over random and special pairs
//     (tests/test_accumulation.py); the GPU suite checks the kernel against
//     the float64 reference.
//   * Larger or run-time world sizes: float64 accumulation, rounded once. For
//     three or more addends, only float64 gives the reference's result.
// The accumulator starts from rank 0's value, not from +0.0, so -0.0 + -0.0
// stays -0.0.
//
// int32 sums are exact modulo 2^32 (accumulated in uint32_t, which wraps by
// definition), so every order gives the reference's result, which wraps as
// XLA's int32 addition does.
//
// No fast-math: conversions keep subnormals (no flush to zero) and NaN stays
// NaN.
//
// NaN results: every NaN element of a sum is stored as the canonical NaN of
// its dtype, kCanonicalNaN32 (0x7fffffff, f32) or kCanonicalNaN16 (0x7fff,
// bf16 and f16), whatever the addends' NaN bits. The float addition of two
// ranks returns it anyway; the double additions of three or more ranks carry
// one NaN operand's payload into the sum (a signalling one before a quiet
// one, else whichever operand the compiled instruction takes first), so
// without this rule the output's NaN bits would depend on the addends'
// payloads and on code generation, and differ between algorithms that add
// the same values in the same order. With it
// every algorithm's output is one bit pattern per input, NaNs included. That
// holds among jax_llar's algorithms only: a psum that falls back to lax.psum
// (above a threshold, another dtype) gets NCCL's NaN bits.
#ifndef LLAR_REDUCE_CUH_
#define LLAR_REDUCE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "llar/args.h"

namespace llar {

// The canonical NaNs every NaN result is stored as (above).
inline constexpr uint32_t kCanonicalNaN32 = 0x7FFFFFFFu;
inline constexpr uint32_t kCanonicalNaN16 = 0x7FFFu;

// Adds in the accumulator's precision with round-to-nearest-even, never fused;
// for uint32_t (the int32 accumulator) the sum modulo 2^32.
__device__ __forceinline__ float AddRn(float a, float b);
__device__ __forceinline__ double AddRn(double a, double b);
__device__ __forceinline__ uint32_t AddRn(uint32_t a, uint32_t b);

// Payload<T> (float, __nv_bfloat16, __half, int32_t) packs kPerLine elements of T in
// the 8 payload bytes of a line:
//   static constexpr int kPerLine;
//   template <typename Acc> static void Unpack(uint2 p, Acc (&v)[kPerLine]);
//       exact: every element is representable in Acc (float or double;
//       uint32_t for int32_t, the same bits)
//   template <typename Acc> static uint2 Pack(const Acc (&v)[kPerLine]);
//       rounds each element once, to nearest even
template <typename T>
struct Payload;

// The accumulator of T for a world size known at compile time (0: run time):
// float for two ranks, double otherwise; uint32_t for int32_t.
template <typename T, int kWorld>
using AccumulatorFor =
    std::conditional_t<std::is_same_v<T, int32_t>, uint32_t,
                       std::conditional_t<kWorld == 2, float, double>>;

// Fixed-order accumulation: rank 0 initialises, ranks 1.. add in order.
template <typename T, typename Acc>
struct RankOrderSum {
  Acc acc[Payload<T>::kPerLine];
  __device__ __forceinline__ void Add(int src_rank, uint2 payload) {
    Acc v[Payload<T>::kPerLine];
    Payload<T>::Unpack(payload, v);
#pragma unroll
    for (int i = 0; i < Payload<T>::kPerLine; ++i) {
      acc[i] = (src_rank == 0) ? v[i] : AddRn(acc[i], v[i]);
    }
  }
  __device__ __forceinline__ uint2 Result() const { return Payload<T>::Pack(acc); }
};

// Reads the 8 payload bytes of `line` of `in` (n_bytes long): one vector load
// for the first `vector_lines` lines (AllReduceArgs), a byte-wise copy out of
// line for the rest (missing bytes read as zero).
__device__ __forceinline__ uint2 LoadPayload(const void* in, uint32_t n_bytes,
                                             uint32_t vector_lines, uint32_t line);

// Writes the payload of `line` to `out`, never past n_bytes.
__device__ __forceinline__ void StorePayload(void* out, uint32_t n_bytes,
                                             uint32_t vector_lines, uint32_t line,
                                             uint2 p);

}  // namespace llar

#include "llar/impl/reduce__funcs.cuh"

#endif  // LLAR_REDUCE_CUH_
