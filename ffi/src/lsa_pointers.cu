// Reads the peer addresses of a symmetric window through NCCL's device API
// (ncclGetLsaPointer), once per communicator, at set-up time.
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include "lsa_pointers.h"

namespace llar {
namespace {

__global__ void ReadLsaPointersKernel(ncclWindow_t window, int n, void** out) {
  for (int peer = threadIdx.x; peer < n; peer += blockDim.x) {
    out[peer] = ncclGetLsaPointer(window, 0, peer);
  }
}

}  // namespace

cudaError_t ReadLsaPointers(ncclWindow_t window, int n, void** host_out, cudaStream_t stream) {
  void** dev = nullptr;
  cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&dev), sizeof(void*) * n, stream);
  if (e != cudaSuccess) return e;
  ReadLsaPointersKernel<<<1, 32, 0, stream>>>(window, n, dev);
  e = cudaGetLastError();
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(host_out, dev, sizeof(void*) * n, cudaMemcpyDeviceToHost, stream);
  }
  const cudaError_t f = cudaFreeAsync(dev, stream);
  const cudaError_t s = cudaStreamSynchronize(stream);
  if (e == cudaSuccess) e = f;
  if (e == cudaSuccess) e = s;
  return e;
}

}  // namespace llar
