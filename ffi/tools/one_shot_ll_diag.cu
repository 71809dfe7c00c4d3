// The diagnostic variants of the one-shot LL kernel (one_shot_ll_diag.h),
// instantiated from the production template (src/kernels/one_shot_ll.cuh),
// each a variant policy of that template.
#include "one_shot_ll_diag.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"
#include "kernels/one_shot_ll.cuh"
#include "llar/args.h"
#include "llar/ll_session.cuh"
#include "llar/wait.cuh"

namespace llar {
namespace {

// Offset of this thread's line in a rank's diagnostic window.
__device__ __forceinline__ std::size_t DiagLineOffset(int block, int line) {
  return (std::size_t(block) * kLinesPerBlock + std::size_t(line)) * kLineBytes;
}

struct Loopback {
  __device__ __forceinline__ Loopback(const AllReduceArgs&, int, int) {}
  template <int kWorld>
  __device__ __forceinline__ void Send(LLSession<kWorld>& ll, bool active, uint2 payload) {
    ll.Send(active, payload, [](const LLSession<kWorld>& s, uint2 p) { s.StoreLoopback(p); });
  }
  template <int kWorld>
  __device__ __forceinline__ void End(const LLSession<kWorld>&) {}
};

// args.peers is the SendLoopbackTables table: its peer entries are the
// peers' diagnostic windows, its own entry this rank's protocol scratch.
struct SendLoopback {
  __device__ __forceinline__ SendLoopback(const AllReduceArgs&, int, int) {}
  template <int kWorld>
  __device__ __forceinline__ void Send(LLSession<kWorld>& ll, bool active, uint2 payload) {
    ll.Send(active, payload, [](const LLSession<kWorld>& s, uint2 p) {
      s.StoreToPeers(DiagLineOffset(s.block(), s.thread()), p);
      s.StoreLoopback(p);
    });
  }
  template <int kWorld>
  __device__ __forceinline__ void End(const LLSession<kWorld>&) {}
};

struct DropPeerWrites {
  __device__ __forceinline__ DropPeerWrites(const AllReduceArgs&, int, int) {}
  template <int kWorld>
  __device__ __forceinline__ void Send(LLSession<kWorld>& ll, bool active, uint2 payload) {
    ll.Send(active, payload, [](const LLSession<kWorld>&, uint2) {});
  }
  template <int kWorld>
  __device__ __forceinline__ void End(const LLSession<kWorld>&) {}
};

// Line 0 of block 0 goes out with a corrupted flag (kCorruptFlagBit).
struct CorruptFlag {
  __device__ __forceinline__ CorruptFlag(const AllReduceArgs&, int, int) {}
  template <int kWorld>
  __device__ __forceinline__ void Send(LLSession<kWorld>& ll, bool active, uint2 payload) {
    ll.Send(active, payload, [](const LLSession<kWorld>& s, uint2 p) {
      const bool corrupt = s.block() == 0 && s.thread() == 0;
      s.StoreToPeers(s.SlotOffset(), p, corrupt ? s.flag() ^ kCorruptFlagBit : s.flag());
    });
  }
  template <int kWorld>
  __device__ __forceinline__ void End(const LLSession<kWorld>&) {}
};

// The rank sends after kDelayRankNs (a spin bounded by the clock).
struct DelayRank {
  __device__ __forceinline__ DelayRank(const AllReduceArgs&, int, int) {}
  template <int kWorld>
  __device__ __forceinline__ void Send(LLSession<kWorld>& ll, bool active, uint2 payload) {
    const uint64_t t0 = GlobalTimerNs();
    while (GlobalTimerNs() - t0 < kDelayRankNs) {
    }
    ll.Send(active, payload);
  }
  template <int kWorld>
  __device__ __forceinline__ void End(const LLSession<kWorld>&) {}
};

// The production all-reduce on the session without signatures.
struct Unsigned {
  static constexpr bool kSigned = false;
  __device__ __forceinline__ Unsigned(const AllReduceArgs&, int, int) {}
  template <int kWorld>
  __device__ __forceinline__ void Send(LLSession<kWorld, false>& ll, bool active,
                                       uint2 payload) {
    ll.Send(active, payload);
  }
  template <int kWorld>
  __device__ __forceinline__ void End(const LLSession<kWorld, false>&) {}
};

// One thread loads the trace pointer with the session's loads and reads the
// clock once its lines are sent.
struct Traced {
  uint64_t* trace = nullptr;
  uint64_t t_sent = 0;
  __device__ __forceinline__ Traced(const AllReduceArgs& a, int block, int t) {
    if (block == 0 && t == 0) {
      trace = reinterpret_cast<uint64_t*>(
          __ldg(reinterpret_cast<const unsigned long long*>(&a.peers->trace)));
    }
  }
  template <int kWorld>
  __device__ __forceinline__ void Send(LLSession<kWorld>& ll, bool active, uint2 payload) {
    ll.Send(active, payload, [this](const LLSession<kWorld>& s, uint2 p) {
      s.StoreToPeers(s.SlotOffset(), p);
      if (trace != nullptr) t_sent = GlobalTimerNs();
    });
  }
  // The trace records when block 0 finished: wait for its other warps (the
  // all-reduce itself has no block barrier).
  template <int kWorld>
  __device__ __forceinline__ void End(const LLSession<kWorld>& ll) {
    __syncthreads();
    if (trace != nullptr) {
      const std::size_t e = 2 * std::size_t(ll.epoch() % kTraceSlots);
      trace[e] = t_sent;
      trace[e + 1] = GlobalTimerNs();
    }
  }
};

using LoopbackKernels = OneShotLLKernels<Loopback, 2>;
using SendLoopbackKernels = OneShotLLKernels<SendLoopback, 2>;
using TracedKernels = OneShotLLKernels<Traced, 2, 4, 8>;
using DropPeerWritesKernels = OneShotLLKernels<DropPeerWrites, 2>;
using UnsignedKernels = OneShotLLKernels<Unsigned, 2, 4, 8>;
using CorruptFlagKernels = OneShotLLKernels<CorruptFlag, 2, 4, 8>;
using DelayRankKernels = OneShotLLKernels<DelayRank, 2, 4, 8>;

}  // namespace

cudaError_t LaunchOneShotLLDiag(DiagVariant variant, AllReduceArgs args, DType dtype,
                                cudaStream_t stream, const OneShotOptions& options) {
  switch (variant) {
    case DiagVariant::kLoopback:
      return LoopbackKernels::Launch(args, dtype, stream, options);
    case DiagVariant::kSendLoopback:
      return SendLoopbackKernels::Launch(args, dtype, stream, options);
    case DiagVariant::kTraced:
      return TracedKernels::Launch(args, dtype, stream, options);
    case DiagVariant::kDropPeerWrites:
      return DropPeerWritesKernels::Launch(args, dtype, stream, options);
    case DiagVariant::kUnsigned:
      return UnsignedKernels::Launch(args, dtype, stream, options);
    case DiagVariant::kCorruptFlag:
      return CorruptFlagKernels::Launch(args, dtype, stream, options);
    case DiagVariant::kDelayRank:
      return DelayRankKernels::Launch(args, dtype, stream, options);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchOneShotLLTraced(AllReduceArgs args, DType dtype, cudaStream_t stream) {
  return TracedKernels::Launch(args, dtype, stream, OneShotOptions{});
}

cudaError_t LaunchOneShotLLDropPeerWrites(AllReduceArgs args, DType dtype,
                                          cudaStream_t stream) {
  return DropPeerWritesKernels::Launch(args, dtype, stream, OneShotOptions{});
}

cudaError_t LaunchOneShotLLCorruptFlag(AllReduceArgs args, DType dtype, cudaStream_t stream) {
  return CorruptFlagKernels::Launch(args, dtype, stream, OneShotOptions{});
}

cudaError_t LaunchOneShotLLDelayRank(AllReduceArgs args, DType dtype, cudaStream_t stream) {
  return DelayRankKernels::Launch(args, dtype, stream, OneShotOptions{});
}

cudaError_t PreloadOneShotLLDiag() {
  cudaError_t e = LoopbackKernels::Preload();
  if (e == cudaSuccess) e = SendLoopbackKernels::Preload();
  if (e == cudaSuccess) e = TracedKernels::Preload();
  if (e == cudaSuccess) e = DropPeerWritesKernels::Preload();
  if (e == cudaSuccess) e = UnsignedKernels::Preload();
  if (e == cudaSuccess) e = CorruptFlagKernels::Preload();
  if (e == cudaSuccess) e = DelayRankKernels::Preload();
  return e;
}

}  // namespace llar
