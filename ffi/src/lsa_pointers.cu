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

cudaError_t ReadLsaPointers(ncclWindow_t window, int n, void** host_out) {
  void** dev = nullptr;
  cudaError_t e = cudaMalloc(&dev, sizeof(void*) * n);
  if (e != cudaSuccess) return e;
  ReadLsaPointersKernel<<<1, 32>>>(window, n, dev);
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) {
    e = cudaMemcpy(host_out, dev, sizeof(void*) * n, cudaMemcpyDeviceToHost);
  }
  cudaFree(dev);
  return e;
}

}  // namespace llar
