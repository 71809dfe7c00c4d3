// XLA FFI handlers of the loopback group's targets (loopback_group.h):
// execute only, kCmdBufferCompatible. Each checks what the production
// handler checks (handlers.cc) for every rank's row, then forks the group's
// rank streams from XLA's stream, launches the production launcher once per
// rank and joins them back.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/kernels.h"
#include "llar/args.h"
#include "loopback_group.h"
#include "loopback_group_internal.h"
#include "ffi_operands.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llar {
namespace {

ffi::Error Invalid(const std::string& what) {
  return ffi::Error::InvalidArgument("jax_llar loopback group: " + what);
}

// The group `id` on device `ordinal`, or the error to return.
ffi::Error Resolve(int64_t id, int32_t ordinal, int64_t signature,
                   std::shared_ptr<LoopbackGroup>* out) {
  *out = FindLoopbackGroup(id);
  if (*out == nullptr) {
    return Invalid("no loopback group " + std::to_string(id) +
                   " (destroyed, or made in another process); make one and trace again");
  }
  if ((*out)->ordinal != ordinal) {
    return Invalid("group " + std::to_string(id) + " lives on CUDA device " +
                   std::to_string((*out)->ordinal) + ", not " + std::to_string(ordinal));
  }
  if (signature < 0 || signature >= (int64_t(1) << kSignatureBits)) {
    return Invalid("call signature " + std::to_string(signature) + " is outside 0.." +
                   std::to_string((1 << kSignatureBits) - 1));
  }
  return ffi::Error::Success();
}

// Where `stream` and the group's rank streams stand in stream capture: the
// rank streams may be capturing only into the capture `stream` is in (the
// calls of one captured program share them); another capture holding them
// (a program being captured in another thread) is refused, since its
// launches would land in the wrong graph. cudaSuccess, or the error.
cudaError_t CheckCapture(const LoopbackGroup& g, cudaStream_t stream, std::string* why) {
  cudaStreamCaptureStatus status;
  unsigned long long id = 0;
  cudaError_t e = cudaStreamGetCaptureInfo(stream, &status, &id);
  if (e != cudaSuccess) return e;
  const unsigned long long ours = status == cudaStreamCaptureStatusActive ? id : 0;
  for (const LoopbackRank& r : g.ranks) {
    cudaStreamCaptureStatus rs;
    unsigned long long rid = 0;
    e = cudaStreamGetCaptureInfo(r.stream, &rs, &rid);
    if (e != cudaSuccess) return e;
    if (rs != cudaStreamCaptureStatusNone && (rs != cudaStreamCaptureStatusActive || rid != ours)) {
      *why = "the group's rank streams are held by another stream capture (a program of "
             "this group being captured in another thread): use a group from one thread";
      return cudaErrorStreamCaptureIsolation;
    }
  }
  return cudaSuccess;
}

// Forks every rank's stream from `stream`, then runs launch(rank,
// rank_stream) for every rank, rank 0 first, then joins every rank's stream
// back into `stream`: breadth first, so that no rank's kernel is queued
// behind a join that waits for an earlier rank (a rank's kernel spins until
// every rank's has run). The joins are made also after a failed launch (a
// stream capture must end with every forked stream joined). Returns the
// first error. The caller holds g.mu.
template <typename LaunchRank>
cudaError_t ForkLaunchJoin(LoopbackGroup& g, cudaStream_t stream, LaunchRank&& launch) {
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  cudaError_t first = cudaEventRecord(g.fork, stream);
  if (first != cudaSuccess) return first;
  int forked = 0;
  for (; forked < g.world && first == cudaSuccess; ++forked) {
    first = cudaStreamWaitEvent(g.ranks[forked].stream, g.fork, 0);
  }
  if (first != cudaSuccess) --forked;  // that rank's stream did not join
  // A failed launch leaves the ranks launched before it waiting in vain
  // (they end in the bounded wait's report): launch no more.
  for (int r = 0; r < forked && first == cudaSuccess; ++r) {
    first = launch(r, g.ranks[r].stream);
  }
  for (int r = 0; r < forked; ++r) {
    cudaError_t joined = cudaEventRecord(g.ranks[r].done, g.ranks[r].stream);
    if (joined == cudaSuccess) joined = cudaStreamWaitEvent(stream, g.ranks[r].done, 0);
    if (first == cudaSuccess) first = joined;
  }
  return first;
}

ffi::Error Failed(const char* what, cudaError_t e) {
  return ffi::Error::Internal(std::string("jax_llar loopback group: ") + what + ": " +
                              cudaGetErrorString(e));
}

ffi::Error AllReduceExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                            ffi::Result<ffi::AnyBuffer> y, int64_t group_id,
                            int64_t algorithm, int64_t signature) {
  std::shared_ptr<LoopbackGroup> g;
  if (ffi::Error e = Resolve(group_id, ordinal, signature, &g); e.failure()) return e;
  const AlgorithmEntry* entry = FindAlgorithm(algorithm);
  if (entry == nullptr || !g->Has(algorithm)) {
    return Invalid("group " + std::to_string(group_id) + " holds no region of algorithm " +
                   std::to_string(algorithm));
  }
  DType dtype;
  const auto dims = x.dimensions();
  if (!ToDType(x.element_type(), &dtype) || y->element_type() != x.element_type() ||
      y->size_bytes() != x.size_bytes() || dims.size() < 1 || dims[0] != g->world) {
    return Invalid("x must be float32, bfloat16, float16 or int32 of shape (" +
                   std::to_string(g->world) + ", ...), and y of x's shape and dtype");
  }
  const size_t per_rank = x.size_bytes() / static_cast<size_t>(g->world);
  if (per_rank == 0) return ffi::Error::Success();
  if (per_rank > entry->max_bytes) {
    return Invalid(std::to_string(per_rank) + " bytes per rank exceed the " + entry->name +
                   " limit of " + std::to_string(entry->max_bytes));
  }
  char* in = static_cast<char*>(x.untyped_data());
  char* out = static_cast<char*>(y->untyped_data());
  std::lock_guard<std::mutex> lock(g->mu);
  std::string why;
  if (const cudaError_t c = CheckCapture(*g, stream, &why); c != cudaSuccess) {
    return why.empty() ? Failed("cudaStreamGetCaptureInfo", c) : Invalid(why);
  }
  const cudaError_t e = ForkLaunchJoin(*g, stream, [&](int r, cudaStream_t s) {
    AllReduceArgs a = g->args[algorithm][r];
    a.in = in + r * per_rank;
    a.out = out + r * per_rank;
    a.n_bytes = static_cast<uint32_t>(per_rank);  // <= max_bytes, checked above
    a.signature = static_cast<uint32_t>(signature);
    return entry->launch(a, dtype, s);
  });
  if (e != cudaSuccess) return Failed("kernel launch failed", e);
  return ffi::Error::Success();
}

ffi::Error AddRmsNormExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                             ffi::AnyBuffer residual, ffi::AnyBuffer weight,
                             ffi::Result<ffi::AnyBuffer> normed,
                             ffi::Result<ffi::AnyBuffer> new_residual, int64_t group_id,
                             float eps, int64_t signature) {
  std::shared_ptr<LoopbackGroup> g;
  if (ffi::Error e = Resolve(group_id, ordinal, signature, &g); e.failure()) return e;
  constexpr int64_t kExchange = static_cast<int64_t>(Algorithm::kOneShotLL);
  if (!g->Has(kExchange)) {
    return Invalid("the fused op runs on the one_shot_ll region, which group " +
                   std::to_string(group_id) + " does not hold");
  }
  DType dtype, weight_dtype;
  const auto dims = x.dimensions();
  if (!ToDType(x.element_type(), &dtype) || dtype == DType::kI32 || dims.size() < 2 ||
      dims[0] != g->world || !SameShape(residual, x) || !SameShape(*normed, x) ||
      !SameShape(*new_residual, x)) {
    return Invalid("x must be float32, bfloat16 or float16 of shape (" +
                   std::to_string(g->world) +
                   ", ..., d), and residual, normed and new_residual of x's shape and dtype");
  }
  const int64_t d = dims[dims.size() - 1];
  const auto wdims = weight.dimensions();
  if (wdims.size() != 1 || wdims[0] != d || !ToDType(weight.element_type(), &weight_dtype) ||
      (weight_dtype != dtype && weight_dtype != DType::kF32)) {
    return Invalid("weight must have shape (d,) and x's dtype or float32");
  }
  if (x.element_count() == 0) return ffi::Error::Success();
  int64_t rows = 1;
  for (size_t i = 1; i + 1 < dims.size(); ++i) rows *= dims[i];
  const uint32_t itemsize = dtype == DType::kF32 ? 4u : 2u;
  AddRmsNormGrid grid;
  if (rows > kMaxBlocks || d > static_cast<int64_t>(kOneShotMaxBytes) ||
      !AddRmsNormGridFor(static_cast<uint32_t>(rows), static_cast<uint32_t>(d), itemsize,
                         &grid)) {
    return Invalid(std::to_string(rows) + " rows of " + std::to_string(d) +
                   " elements per rank are not served by the fused kernel (AddRmsNormGridFor)");
  }
  const size_t per_rank = static_cast<size_t>(rows) * static_cast<size_t>(d) * itemsize;
  char* xs = static_cast<char*>(x.untyped_data());
  char* rs = static_cast<char*>(residual.untyped_data());
  char* ns = static_cast<char*>(normed->untyped_data());
  char* nr = static_cast<char*>(new_residual->untyped_data());
  std::lock_guard<std::mutex> lock(g->mu);
  std::string why;
  if (const cudaError_t c = CheckCapture(*g, stream, &why); c != cudaSuccess) {
    return why.empty() ? Failed("cudaStreamGetCaptureInfo", c) : Invalid(why);
  }
  const cudaError_t e = ForkLaunchJoin(*g, stream, [&](int r, cudaStream_t s) {
    AddRmsNormArgs a{};
    a.all_reduce = g->args[kExchange][r];
    a.all_reduce.in = xs + r * per_rank;
    a.all_reduce.out = ns + r * per_rank;
    a.all_reduce.signature = static_cast<uint32_t>(signature);
    a.residual = rs + r * per_rank;
    a.weight = weight.untyped_data();
    a.new_residual = nr + r * per_rank;
    a.eps = eps;
    a.d = static_cast<uint32_t>(d);
    a.rows = static_cast<uint16_t>(rows);
    return LaunchOneShotLLAddRmsNorm(a, dtype, weight_dtype, s);
  });
  if (e != cudaSuccess) return Failed("fused kernel launch failed", e);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kLoopbackAllReduceExecute, AllReduceExecute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<int64_t>("group_id")
                           .Attr<int64_t>("algorithm")
                           .Attr<int64_t>("signature"),
                       {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER(kLoopbackAddRmsNormExecute, AddRmsNormExecute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>()
                           .Arg<ffi::AnyBuffer>()   // x
                           .Arg<ffi::AnyBuffer>()   // residual
                           .Arg<ffi::AnyBuffer>()   // weight
                           .Ret<ffi::AnyBuffer>()   // normed
                           .Ret<ffi::AnyBuffer>()   // new_residual
                           .Attr<int64_t>("group_id")
                           .Attr<float>("eps")
                           .Attr<int64_t>("signature"),
                       {ffi::Traits::kCmdBufferCompatible});

LoopbackHandlers GetLoopbackHandlers() {
  return {reinterpret_cast<void*>(kLoopbackAllReduceExecute),
          reinterpret_cast<void*>(kLoopbackAddRmsNormExecute)};
}

}  // namespace llar
