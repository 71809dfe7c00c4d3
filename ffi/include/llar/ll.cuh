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
// Flags and signatures
//   flag(E, S) = (S << 16) | (low16(E) | 1): the call's 16-bit signature S
//   (AllReduceArgs::signature, args.h: kSignatureBits) in the high half, the
//   low 16 bits of the epoch with bit 0 set in the low half. Every rank runs
//   the same calls with the same signatures (the lowering derives S from the
//   program and the call site, jax_llar/signature.py), so two calls that pair
//   correctly store and expect the same flag. The flag is never 0 (bit 0), so
//   zero-filled scratch (after allocation and after every re-zeroing,
//   epoch.cuh) never looks ready. Two epochs that share a scratch half have
//   the same parity, so the `| 1` never merges two epochs of one half; two
//   such epochs have the same epoch bits only 2^16 epochs apart, and
//   epoch.cuh re-zeroes each half long before (kRezeroPeriod).
//
//   A line is foreign (LineForeign) when it is complete (both flag words
//   equal: both 8-byte halves come from one store, or from two stores of the
//   same flag) and carries the epoch bits the wait expects but another
//   signature. A correctly paired call never sees one: the slot holds either
//   a line of this epoch from the peer's call of this epoch (same signature)
//   or older content, which epoch.cuh bounds to fewer than 2^16 epochs of age,
//   so its epoch bits differ. Seeing one therefore proves that the peer ran
//   another call at this epoch (two programs interleaved differently per GPU,
//   a rank-dependent extra call), and the wait reports it at once (wait.cuh,
//   ErrorRecord code 2) instead of accepting a line of another call, which
//   would have been a wrong sum. What it cannot tell apart: two calls of the
//   same signature (the same call site of the same program, e.g. one
//   program dispatched by two threads at once), and signatures off (S = 0
//   everywhere). A mispaired line of another epoch is not foreign: the wait
//   keeps polling and ends in the timeout (code 1), never in a wrong sum.
#ifndef LLAR_LL_CUH_
#define LLAR_LL_CUH_

#include <cstdint>

namespace llar {

// The epoch's bits of an LL flag word, and its signature's.
inline constexpr uint32_t kFlagEpochMask = (1u << 16) - 1u;
inline constexpr uint32_t kFlagEpochBits = 16;

// flag(E, S) above; `signature` < 2^16.
__device__ __forceinline__ uint32_t FlagOf(uint64_t epoch, uint32_t signature) {
  return (signature << kFlagEpochBits) | (static_cast<uint32_t>(epoch) & kFlagEpochMask) | 1u;
}

__device__ __forceinline__ uint32_t FlagSignature(uint32_t flag) { return flag >> kFlagEpochBits; }

// The flag rule before signatures, low32(E) | 1: only the kernel bench's
// unsigned variant (ffi/tools/one_shot_ll_diag.h) uses it, to measure what
// the signature costs.
__device__ __forceinline__ uint32_t UnsignedFlagOf(uint64_t epoch) {
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

// A line that is not ready (LineReady false) and is foreign (above): both
// flag words equal, with `flag`'s epoch bits and so another signature.
__device__ __forceinline__ bool LineForeign(uint4 v, uint32_t flag) {
  return v.y == v.w && ((v.y ^ flag) & kFlagEpochMask) == 0u;
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
