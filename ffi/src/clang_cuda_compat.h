// Force-included (-include) into every .cu file when clang compiles CUDA
// (ffi/CMakeLists.txt, CMAKE_CUDA_COMPILER_ID Clang); nvcc never sees it.
// What nvcc's headers give and clang's CUDA wrapper headers do not, for this
// code and NCCL's device headers. Checked with clang 19.1 (Debian 12's
// clang-19) against CUDA 12.9 and NCCL 2.28.9 headers (scripts/build_cuda12.sh).
#pragma once

// clang's wrapper defines __CUDACC__ empty; NCCL's headers test
// `#if __CUDACC__` (nccl_device/utility.h), which needs a value as with nvcc.
#undef __CUDACC__
#define __CUDACC__ 1

// clang has __ldg but keeps CUDA's sm_32_intrinsics.hpp out, and with it the
// other cache-hint loads and stores. The ones used here (epoch.cuh and
// tools/sol.cu: __ldcg; NCCL's gin/proxy/gin_proxy.h: __stwt), with the
// instructions that CUDA's sm_32_intrinsics.hpp gives them.
static __device__ __inline__ unsigned long __ldcg(const unsigned long* ptr) {
  unsigned long ret;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(ret) : "l"(ptr));
  return ret;
}
static __device__ __inline__ unsigned int __ldcg(const unsigned int* ptr) {
  unsigned int ret;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(ret) : "l"(ptr));
  return ret;
}
static __device__ __inline__ void __stwt(uint4* ptr, uint4 value) {
  asm("st.global.wt.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(ptr), "r"(value.x), "r"(value.y),
      "r"(value.z), "r"(value.w)
      : "memory");
}

// NCCL's nccl::utility::declval is a host function that its device code
// names in unevaluated operands (ll_a2a.h: recvReduce's return type); nvcc
// allows that, clang's overload resolution drops host functions there. A
// device overload, declared only (clang overloads on __host__/__device__),
// for those operands.
namespace nccl {
namespace utility {
template <typename T>
__device__ T&& declval() noexcept;
}  // namespace utility
}  // namespace nccl
