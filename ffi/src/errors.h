// Host-side error checks shared by the set-up, tool and benchmark code: a
// failed CUDA or NCCL call becomes a std::runtime_error (a RuntimeError in
// Python) naming the call. Never used on the execute path, which returns
// ffi::Error.
#ifndef LLAR_ERRORS_H_
#define LLAR_ERRORS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace llar {

[[noreturn]] inline void Fail(const std::string& what) { throw std::runtime_error(what); }

inline void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    Fail(std::string("jax_llar: ") + what + ": " + cudaGetErrorString(e));
  }
}

inline void CheckNccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    Fail(std::string("jax_llar: ") + what + ": " + ncclGetErrorString(r) + " (" +
         ncclGetLastError(nullptr) + ")");
  }
}

// Restores the caller's current CUDA device when it goes out of scope, also
// when a check throws.
class DeviceGuard {
 public:
  DeviceGuard() { cudaGetDevice(&prev_); }
  ~DeviceGuard() { cudaSetDevice(prev_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

// CheckNccl for a call on a non-blocking communicator (ncclConfig_t::blocking
// = 0): ncclInProgress means that NCCL took the work and goes on with it in a
// thread of its own, which is not a failure here. Whoever calls it must wait
// for that work (registry/collective_step.cc: AwaitComms) before reading anything the call
// writes.
inline void CheckNcclStarted(ncclResult_t r, const char* what) {
  if (r != ncclInProgress) CheckNccl(r, what);
}

// Runs `calls` between ncclGroupStart and ncclGroupEnd. The group is closed
// even when a call throws, so a failed set-up leaves no open NCCL group.
// With `nonblocking` (the group's communicators are non-blocking),
// ncclGroupEnd may answer ncclInProgress: the grouped work then continues in
// NCCL's thread, and the caller must wait for it (CheckNcclStarted).
template <typename F>
void GroupedCalls(const char* what, F&& calls, bool nonblocking = false) {
  CheckNccl(ncclGroupStart(), "ncclGroupStart");
  try {
    calls();
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  const ncclResult_t r = ncclGroupEnd();
  if (nonblocking) {
    CheckNcclStarted(r, what);
  } else {
    CheckNccl(r, what);
  }
}

}  // namespace llar

#endif  // LLAR_ERRORS_H_
