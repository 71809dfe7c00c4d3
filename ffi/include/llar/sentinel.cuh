// Sentinel protocol: a 16-byte line is 16 bytes of payload, stored into a
// slot of the reader's scratch that was armed with a sentinel pattern; the
// reader re-arms the slot itself once it has used the line.
//
// Source: arXiv 2607.16100, section 4 (the one-shot's sentinel variant:
// full-width payload, no flag words).
//
// Contract
//   A slot is 16 bytes of the reader's scratch: two naturally aligned 8-byte
//   words. Armed, both words hold kSentinelWord (all ones; a region is armed
//   when it is allocated by filling it with kSentinelFill, args.h). A writer
//   stores a line {w0, w1} into an armed slot with one vector store
//   (StoreSentinelLine) and never stores kSentinelWord as a word of a line:
//   it passes each line through CanonicalLine<T> first. The reader polls its own slot
//   (WaitSentinelLine) until neither word equals kSentinelWord, uses the
//   line, and then re-arms the slot (ArmSlot) before its kernel ends. Between
//   the writer's store and the reader's re-arm nobody else writes the slot;
//   which call may write it next is the epoch protocol's business
//   (SentinelSession below; the reuse argument is in the kernel's header,
//   kernels/one_shot_sentinel.cuh).
//
// Memory-ordering argument
//   An aligned 8-byte store is never split, neither inside the GPU nor over
//   NVLink (ll.cuh); the two words of a 16-byte store may land in either
//   order. So each word of the slot that the reader sees is either the
//   sentinel or the writer's whole word, and since a writer's word is never
//   the sentinel, "neither word is the sentinel" means both have landed. The
//   payload is its own flag: no fence, no second store. A slot armed by the
//   reader's own earlier store is seen armed by the reader's later polls
//   (same thread, same address).
//
// Canonicalisation (CanonicalLine<T>)
//   All ones as an 8-byte word is, in every float dtype, a run of NaNs with
//   every bit set (f32: 2 x 0xFFFFFFFF; bf16 and f16: 4 x 0xFFFF). The writer
//   replaces such a word by the same word with the quiet bit (the top
//   mantissa bit) of its lowest element cleared: element 0 becomes
//   0xFFBFFFFF (f32), 0xFFBF (bf16) or 0xFDFF (f16), still a NaN. Every
//   other word goes unchanged. The writing rank adds the canonical line too,
//   not its input, so every rank reduces the same addends and gets the same
//   bits.
//
// NaN results: what happens to NaN payload bits
//   An output element with a NaN addend (or inf + -inf) is a NaN, stored as
//   the canonical NaN of its dtype whatever the addends' NaN bits, sign
//   included: reduce.cuh's rule for every algorithm. So the replacement
//   above never shows in an output: the sentinel's outputs equal the
//   one-shot LL's bit for bit, NaNs included (every non-NaN element: the
//   same additions in the same order). tests/gpu1/test_sentinel_loopback.py
//   checks it against the one-shot LL on every NaN pattern of f16 and bf16
//   and a sample of f32 ones in every position of a line, alone and beside
//   other NaNs.
//
//   int32 has no such freedom: a word whose bits are all ones is a pair of
//   -1 values and any change changes the sum. The protocol serves float32,
//   bfloat16 and float16 only (CanonicalLine has no int32 form).
//
// No call signature
//   The LL protocols put the call's signature in their flag words, so that a
//   wait never accepts a line of a mispaired call (ll.cuh, "Flags and
//   signatures"). A sentinel line has no flag word: all 16 bytes are
//   payload, and any payload but the sentinel is a ready line. So this
//   protocol cannot tell a line of another call from its own; a call
//   mispaired with another of the same size and epoch (two programs
//   interleaved differently per GPU, a rank-dependent extra call) is summed
//   with it. The algorithm is therefore not signature-checked
//   (args.h: CarriesSignature; jax_llar.algorithms.SIGNED) and the tuning
//   tables do not choose it unless asked to (jax_llar.tuning.build_tables).
//
// Error report (wait.cuh's ErrorRecord, when a wait runs out)
//   flag_expected = kSentinelFold, the fold of the sentinel word; flag_seen
//   and flag_seen2 = Fold(w0) and Fold(w1) of the last poll, Fold(w) = (low
//   32 bits) & (high 32 bits). A word still armed folds to kSentinelFold, so
//   flag_seen (flag_seen2) == flag_expected says word 0 (1) never arrived;
//   any other value says it did (a landed word folds to kSentinelFold only if
//   both halves are all ones, which CanonicalLine excludes).
#ifndef LLAR_SENTINEL_CUH_
#define LLAR_SENTINEL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "llar/args.h"
#include "llar/wait.cuh"

namespace llar {

inline constexpr uint64_t kSentinelWord = ~uint64_t(0);
static_assert(kSentinelWord == uint64_t(kSentinelFill) * 0x0101010101010101ull,
              "a region filled with kSentinelFill (args.h) is armed");
inline constexpr uint32_t kSentinelFold = ~uint32_t(0);
// Payload bytes of one sentinel line (= kLineBytes: every byte is payload).
inline constexpr int kSentinelLineBytes = 16;

// The quiet bit of element 0 of an 8-byte word of T (its top mantissa bit);
// int32_t has none (not served).
template <typename T>
struct QuietBit;
template <>
struct QuietBit<float> {
  static constexpr uint64_t kBit = uint64_t(1) << 22;
};
template <>
struct QuietBit<__nv_bfloat16> {
  static constexpr uint64_t kBit = uint64_t(1) << 6;
};
template <>
struct QuietBit<__half> {
  static constexpr uint64_t kBit = uint64_t(1) << 9;
};

// `line` with every word that equals kSentinelWord replaced (contract above).
template <typename T>
__device__ __forceinline__ ulonglong2 CanonicalLine(ulonglong2 line);

// One 16-byte store of `line` at `dst` (a peer's scratch or this rank's):
// st.volatile.global.v2.u64, two naturally aligned 8-byte elements.
__device__ __forceinline__ void StoreSentinelLine(char* dst, ulonglong2 line);
// One 16-byte poll of this rank's scratch, bypassing L1.
__device__ __forceinline__ ulonglong2 LoadSentinelLine(const char* src);
__device__ __forceinline__ bool SentinelLineReady(ulonglong2 v);
// Re-arms one slot of this rank's scratch (both words := kSentinelWord).
__device__ __forceinline__ void ArmSlot(char* dst);
// Fold(w) of the error report.
__device__ __forceinline__ uint32_t SentinelFold(uint64_t w);

// Polls the slot at `src` (this rank's scratch) until neither word is the
// sentinel; returns the line. Bounded by pt->timeout_ns with WaitLine's rule
// (wait.cuh: no clock read before kSpinsPerClockRead polls); on timeout it
// reports `site` and the folds above and traps, through an out-of-line call
// marked as never returning, so that nothing is kept live across it.
__device__ __forceinline__ ulonglong2 WaitSentinelLine(const PeerTable* pt, const char* src,
                                                       const WaitSite& site);

// Sentinel session: one thread's part in one one-shot sentinel exchange, as
// LLSession (ll_session.cuh) is for LL lines.
//
// Contract
//   Every thread of the kernel makes one session at its start. The
//   constructor loads the warp's epoch E from its counter (a.epochs: the
//   algorithm's own set, one counter per (block, warp), epoch.cuh) and the
//   scratch addresses: this rank's, and every peer's when the number of ranks
//   is a template argument (kWorld 2, 4 or 8; 0 reads it at run time). Slots
//   are the one-shot's (args.h: ScratchOffset(half, block, world, src, t)
//   with t the thread index in its block), in half E & 1. Then, in order:
//     Send(active, line)  warp-collective: every lane calls it once. An
//                         active lane stores `line` (already canonical) into
//                         its slot of every peer's scratch, next rank first;
//                         then lane 0 stores E + 1 in the warp's counter.
//     Recv(src)           active lanes, for every src other than this rank:
//                         src's line of epoch E from this rank's slot
//                         (bounded wait). Does not re-arm.
//     End(active)         every lane, once, after its last Recv: an active
//                         lane re-arms every slot it received in (each
//                         src != rank, half E & 1).
//   Re-arming after the last Recv rather than after each keeps the volatile
//   stores out from between the polls (a volatile store holds back the
//   thread's next volatile load). No re-zeroing window: there are no flags
//   to wrap, and a slot is armed again in the call that consumed it.
template <int kWorld>
class SentinelSession {
 public:
  static constexpr bool kStaticWorld = kWorld > 0;

  __device__ __forceinline__ SentinelSession(const AllReduceArgs& a, int block, int thread);
  SentinelSession(const SentinelSession&) = delete;
  SentinelSession& operator=(const SentinelSession&) = delete;

  __device__ __forceinline__ void Send(bool active, ulonglong2 line);
  __device__ __forceinline__ ulonglong2 Recv(int src) const;
  __device__ __forceinline__ void End(bool active) const;

  __device__ uint64_t epoch() const { return epoch_; }
  __device__ int rank() const { return rank_; }
  __device__ int world() const { return kStaticWorld ? kWorld : world_; }

 private:
  __device__ __forceinline__ uint32_t SlotOffset(int src) const;

  int world_;
  int rank_;
  int block_;
  int thread_;
  uint64_t* counter_;
  uint64_t epoch_;
  const PeerTable* peers_;
  char* own_;
  char* to_[kStaticWorld ? kWorld - 1 : 1];  // peers' scratch, next rank first
  int half_;                                  // set by Send
};

}  // namespace llar

#include "llar/impl/sentinel__funcs.cuh"

#endif  // LLAR_SENTINEL_CUH_
