// LL session: one thread's part in one one-shot LL exchange, in the style of
// NCCL's ncclLLA2ASession (nccl_device/ll_a2a.h). An algorithm's kernel
// writes its steps with it (send, receive, end) and the session applies the
// protocol rules, each stated with its ordering argument in one header:
// the line and its flag (ll.cuh), the epoch, its parity and the re-zeroing
// (epoch.cuh), the bounded wait (wait.cuh).
//
// Source: arXiv 2607.16100, sections 3 and 4.1.
//
// Contract
//   Every thread of the kernel makes one session at its start, with the
//   block and thread index it runs as. The constructor loads the warp's epoch
//   E from its counter and the scratch addresses: this rank's, and every
//   peer's when the number of ranks is a template argument (kWorld 2, 4 or
//   8; 0 reads it from the arguments at run time). Then, in this order:
//     Send(active, payload)  warp-collective: every lane of the warp calls it
//                            once. It computes flag(E, S) (S: the call's
//                            signature, AllReduceArgs::signature) and the
//                            half of E; an active lane stores its line
//                            {payload, flag(E, S)}
//                            into its slot of every peer's scratch, starting
//                            with the next rank; then lane 0 stores E + 1 in
//                            the warp's counter.
//     Recv(src)              active lanes, for every src other than this
//                            rank: the payload of src's line of epoch E, from
//                            this rank's scratch (bounded wait; a line of E
//                            with another signature ends it at once in the
//                            foreign-signature report, wait.cuh).
//     End()                  every lane, once, after its last Recv: in the
//                            last two epochs of each re-zeroing window, clears
//                            the lane's lines of the half it used.
//   The counter moves right after the sends, not at End (NCCL's session
//   writes its epoch back in its destructor): every lane has read E once the
//   warp is past its sends, and the counter is read again only by the next
//   kernel on the stream, so the store overlaps the flight of the lines.
//
// Where a line goes is Send's third argument, `store(session, payload)`,
// called in active lanes only: ToPeerSlots by default. The diagnostic
// variants (ffi/tools) pass their own, built from StoreToPeers(offset,
// payload) (at `offset` of every peer's window) and StoreLoopback(payload)
// (into this rank's own scratch, in every peer's slot); the epoch steps stay
// Send's. Recv, End and the Store* functions use the flag and the half that
// Send computes, so they are called after Send (the Store* ones from within
// it). Computing them there rather than in the constructor keeps the
// generated code of the kernels what it was before the session existed.
//
// kSigned false gives the session as it was before signatures (the flag
// low32(E) | 1, no foreign check): only the kernel bench's unsigned variant
// uses it (ffi/tools/one_shot_ll_diag.h), to measure what signatures cost.
#ifndef LLAR_LL_SESSION_CUH_
#define LLAR_LL_SESSION_CUH_

#include <cstddef>
#include <cstdint>

#include "llar/args.h"

namespace llar {

// Send's default placement of a line: this rank's slot of every peer.
struct ToPeerSlots {
  template <typename Session>
  __device__ __forceinline__ void operator()(const Session& s, uint2 payload) const {
    s.StoreToPeers(s.SlotOffset(), payload);
  }
};

template <int kWorld, bool kSigned = true>
class LLSession {
 public:
  static constexpr bool kStaticWorld = kWorld > 0;

  __device__ __forceinline__ LLSession(const AllReduceArgs& a, int block, int thread);
  LLSession(const LLSession&) = delete;
  LLSession& operator=(const LLSession&) = delete;

  template <typename Store = ToPeerSlots>
  __device__ __forceinline__ void Send(bool active, uint2 payload, Store store = Store());
  __device__ __forceinline__ uint2 Recv(int src) const;
  __device__ __forceinline__ void End() const;

  // The stores a Send's `store` is built from (contract above). The form
  // with a `flag` of the caller's is the fault-injection variants' (ffi/tools:
  // a line whose flag no reader expects); every other store uses flag(E, S).
  __device__ __forceinline__ void StoreToPeers(std::size_t offset, uint2 payload) const;
  __device__ __forceinline__ void StoreToPeers(std::size_t offset, uint2 payload,
                                               uint32_t flag) const;
  __device__ __forceinline__ void StoreLoopback(uint2 payload) const;
  // Offset of this thread's slot (its line, sent by this rank) in the half
  // of E, in any rank's scratch.
  __device__ __forceinline__ std::size_t SlotOffset() const;

  __device__ uint64_t epoch() const { return epoch_; }
  __device__ int rank() const { return rank_; }
  __device__ int world() const { return kStaticWorld ? kWorld : world_; }
  __device__ int block() const { return block_; }
  __device__ int thread() const { return thread_; }
  // flag(E, S), valid from within Send's `store` on (contract above).
  __device__ uint32_t flag() const { return flag_; }

 private:
  __device__ __forceinline__ void AdvanceEpoch() const;

  // In the order the kernel needs them.
  int world_;           // number of ranks (NCCL's nRanks)
  int rank_;
  int block_;
  int thread_;          // the line this thread owns in its block's region
  uint64_t* counter_;   // the warp's epoch counter
  uint64_t epoch_;      // E
  const PeerTable* peers_;
  char* own_;           // this rank's scratch
  char* to_[kStaticWorld ? kWorld - 1 : 1];  // the peers' scratch, next rank
                                             // first (kStaticWorld only)
  uint32_t signature_;  // S (AllReduceArgs::signature)
  uint32_t flag_;       // flag(E, S) (ll.cuh); set by Send
  int half_;            // the scratch half of E (epoch.cuh); set by Send
};

}  // namespace llar

#include "llar/impl/ll_session__funcs.cuh"

#endif  // LLAR_LL_SESSION_CUH_
