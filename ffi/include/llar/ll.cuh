// LL protocol: one 16-byte line carries 8 bytes of payload and its own flag.
//
// Source: arXiv 2607.16100 ("Every Microsecond Matters"), section 3 (LL
// protocol); the line layout is the one NCCL's LL protocol uses.
//
// Contract
//   A line is {d0, flag, d1, flag}. The writer stores all 16 bytes with one
//   vector store into the reader's scratch; the reader polls its own scratch
//   until both flag words equal the flag it expects, then uses d0 and d1.
//
// Memory-ordering argument
//   Each 8-byte half {d, flag} is naturally aligned, and an aligned 8-byte
//   store is never split, neither inside the GPU nor over NVLink. A reader
//   that sees `flag` in a half therefore sees the `d` stored with it. Seeing
//   both flags means both halves have landed. Neither side needs a fence, and
//   the data never waits for a separate flag store.
//
// Flags
//   flag(E) = low32(E) | 1. It is never 0, so zero-filled scratch (the state
//   after allocation and after every re-zeroing, see epoch.cuh) never looks
//   ready. Two epochs that share a scratch half have the same parity, so the
//   `| 1` never merges two epochs of one half; two such epochs could share a
//   flag only 2^32 epochs apart, and epoch.cuh re-zeroes each half long before.
#ifndef LLAR_LL_CUH_
#define LLAR_LL_CUH_

#include <cstdint>

namespace llar {

__device__ __forceinline__ uint32_t FlagOf(uint64_t epoch) {
  return static_cast<uint32_t>(epoch) | 1u;
}

// Stores one LL line (payload {x, y}) at `dst`, which may be a peer's memory.
// st.volatile is not cached in L1 and is performed in order with respect to
// other volatile accesses of the thread; it is what makes the line visible to
// a polling peer without a fence.
__device__ __forceinline__ void StoreLine(char* dst, uint2 payload,
                                          uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst),
               "r"(payload.x), "r"(flag), "r"(payload.y), "r"(flag)
               : "memory");
}

// Loads one LL line from the caller's own scratch, bypassing L1 so that every
// poll observes the latest value in L2.
__device__ __forceinline__ uint4 LoadLine(const char* src) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src)
               : "memory");
  return v;
}

__device__ __forceinline__ bool LineReady(uint4 v, uint32_t flag) {
  return v.y == flag && v.w == flag;
}

__device__ __forceinline__ uint2 LinePayload(uint4 v) { return {v.x, v.z}; }

// Zeroes one line of the caller's own scratch (used by the epoch re-zeroing).
__device__ __forceinline__ void ClearLine(char* dst) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};" ::"l"(dst),
               "r"(0u)
               : "memory");
}

}  // namespace llar

#endif  // LLAR_LL_CUH_
