// Bodies of the payload helpers (reduce.cuh, which states the contract and
// the accumulation argument).
#ifndef LLAR_IMPL_REDUCE__FUNCS_CUH_
#define LLAR_IMPL_REDUCE__FUNCS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "llar/args.h"
#include "llar/reduce.cuh"

namespace llar {

__device__ __forceinline__ float AddRn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double AddRn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ uint32_t AddRn(uint32_t a, uint32_t b) { return a + b; }

template <>
struct Payload<int32_t> {
  static constexpr int kPerLine = 2;
  template <typename Acc>
  __device__ __forceinline__ static void Unpack(uint2 p, Acc (&v)[kPerLine]) {
    static_assert(std::is_same_v<Acc, uint32_t>, "int32 accumulates in uint32_t");
    v[0] = p.x;
    v[1] = p.y;
  }
  template <typename Acc>
  __device__ __forceinline__ static uint2 Pack(const Acc (&v)[kPerLine]) {
    return {v[0], v[1]};
  }
};

template <>
struct Payload<float> {
  static constexpr int kPerLine = 2;
  template <typename Acc>
  __device__ __forceinline__ static void Unpack(uint2 p, Acc (&v)[kPerLine]) {
    v[0] = static_cast<Acc>(__uint_as_float(p.x));
    v[1] = static_cast<Acc>(__uint_as_float(p.y));
  }
  // NaN results are the canonical NaN (reduce.cuh).
  __device__ __forceinline__ static uint32_t Bits(float v) {
    return v != v ? kCanonicalNaN32 : __float_as_uint(v);
  }
  __device__ __forceinline__ static uint32_t Bits(double v) {
    return v != v ? kCanonicalNaN32 : __float_as_uint(__double2float_rn(v));
  }
  template <typename Acc>
  __device__ __forceinline__ static uint2 Pack(const Acc (&v)[kPerLine]) {
    return {Bits(v[0]), Bits(v[1])};
  }
};

namespace internal {

// Two 16-bit elements per 32-bit word, element 0 in the low half (little endian).
template <typename Half, float (*ToFloat)(Half), Half (*FromFloat)(float),
          Half (*FromDouble)(double)>
struct Payload16 {
  static constexpr int kPerLine = 4;
  __device__ __forceinline__ static float Lo(uint32_t w) {
    return ToFloat(FromBits(static_cast<uint16_t>(w & 0xffffu)));
  }
  __device__ __forceinline__ static float Hi(uint32_t w) {
    return ToFloat(FromBits(static_cast<uint16_t>(w >> 16)));
  }
  __device__ __forceinline__ static Half FromBits(uint16_t b) {
    Half h;
    __builtin_memcpy(&h, &b, 2);
    return h;
  }
  __device__ __forceinline__ static uint32_t Raw(Half h) {
    uint16_t b;
    __builtin_memcpy(&b, &h, 2);
    return b;
  }
  // Rounded once; NaN results are the canonical NaN (reduce.cuh).
  __device__ __forceinline__ static uint32_t Raw(float v) {
    return v != v ? kCanonicalNaN16 : Raw(FromFloat(v));
  }
  __device__ __forceinline__ static uint32_t Raw(double v) {
    return v != v ? kCanonicalNaN16 : Raw(FromDouble(v));
  }
  // Exact: every 16-bit value is a float.
  template <typename Acc>
  __device__ __forceinline__ static void Unpack(uint2 p, Acc (&v)[kPerLine]) {
    v[0] = static_cast<Acc>(Lo(p.x));
    v[1] = static_cast<Acc>(Hi(p.x));
    v[2] = static_cast<Acc>(Lo(p.y));
    v[3] = static_cast<Acc>(Hi(p.y));
  }
  template <typename Acc>
  __device__ __forceinline__ static uint2 Pack(const Acc (&v)[kPerLine]) {
    return {Raw(v[0]) | (Raw(v[1]) << 16), Raw(v[2]) | (Raw(v[3]) << 16)};
  }
};

__device__ __forceinline__ float Bf16ToFloat(__nv_bfloat16 h) { return __bfloat162float(h); }
__device__ __forceinline__ __nv_bfloat16 FloatToBf16(float f) { return __float2bfloat16_rn(f); }
__device__ __forceinline__ __nv_bfloat16 DoubleToBf16(double d) { return __double2bfloat16(d); }
__device__ __forceinline__ float F16ToFloat(__half h) { return __half2float(h); }
__device__ __forceinline__ __half FloatToF16(float f) { return __float2half_rn(f); }
__device__ __forceinline__ __half DoubleToF16(double d) { return __double2half(d); }

}  // namespace internal

// The tail paths: the last line, or every line of a buffer that is not
// 8-byte aligned. Out of line: the common path is one vector access.
inline __device__ __noinline__ uint2 LoadPayloadTail(const char* in, uint32_t n_bytes,
                                                     uint32_t line) {
  const uint32_t off = line * kPayloadBytesPerLine;
  uint8_t b[kPayloadBytesPerLine] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < kPayloadBytesPerLine; ++i) {
    if (off + i < n_bytes) b[i] = static_cast<uint8_t>(in[off + i]);
  }
  uint2 p;
  __builtin_memcpy(&p, b, sizeof(p));
  return p;
}

inline __device__ __noinline__ void StorePayloadTail(char* out, uint32_t n_bytes,
                                                     uint32_t line, uint2 p) {
  const uint32_t off = line * kPayloadBytesPerLine;
  uint8_t b[kPayloadBytesPerLine];
  __builtin_memcpy(b, &p, sizeof(p));
#pragma unroll
  for (int i = 0; i < kPayloadBytesPerLine; ++i) {
    if (off + i < n_bytes) out[off + i] = static_cast<char>(b[i]);
  }
}

template <>
struct Payload<__nv_bfloat16>
    : internal::Payload16<__nv_bfloat16, internal::Bf16ToFloat, internal::FloatToBf16,
                          internal::DoubleToBf16> {};
template <>
struct Payload<__half> : internal::Payload16<__half, internal::F16ToFloat,
                                             internal::FloatToF16, internal::DoubleToF16> {};

__device__ __forceinline__ uint2 LoadPayload(const void* in, uint32_t n_bytes,
                                             uint32_t vector_lines, uint32_t line) {
  if (line < vector_lines) return __ldg(static_cast<const uint2*>(in) + line);
  return LoadPayloadTail(static_cast<const char*>(in), n_bytes, line);
}

__device__ __forceinline__ void StorePayload(void* out, uint32_t n_bytes,
                                             uint32_t vector_lines, uint32_t line,
                                             uint2 p) {
  if (line < vector_lines) {
    static_cast<uint2*>(out)[line] = p;
    return;
  }
  StorePayloadTail(static_cast<char*>(out), n_bytes, line, p);
}

}  // namespace llar

#endif  // LLAR_IMPL_REDUCE__FUNCS_CUH_
