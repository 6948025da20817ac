// What every kernels/cuda/<op>_cuda.cu includes first: the one source
// compiles for the GPU under nvcc and for the host SIMT harness
// (kernels/cuda/simt.h) under the host compiler, into the namespace of its
// target, cuda::gpu or cuda::sim (DELTASERVE_CUDA_TARGET; kernels/cuda/ops.h
// declares both). A kernel is written in plain CUDA, but for these:
//   - shared memory is declared with DELTASERVE_SHARED(type, name, [dims])
//     and DELTASERVE_DYNAMIC_SHARED(type, name), not __shared__;
//   - it is launched with DELTASERVE_LAUNCH(kernel, grid, block,
//     shared_bytes, stream, args...), not <<<...>>>; a failed launch is
//     reported to the CUDA workspace and comes back from its Synchronize;
//     a launch with more than 48 KiB of dynamic shared memory is preceded by
//     DELTASERVE_ALLOW_DYNAMIC_SHARED(kernel, bytes) (the opt-in of
//     cudaFuncSetAttribute on the GPU, nothing under the harness);
//   - a loop nvcc must unroll (a register array's index) is marked
//     DELTASERVE_UNROLL, not #pragma unroll, which the host compiler warns of;
//   - bf16 values are their bits (uint16_t), read through Bf16Bits; no
//     cuda_bf16.h, whose types the host does not have.
// Under the harness the CUDA keywords and intrinsics used here are defined
// in terms of it; nothing else of CUDA is, so a kernel that uses more fails
// to compile for the host rather than running untested.
#pragma once

#include <math.h>  // the C names (expf, rsqrtf on the device) at global scope

#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/cuda/ops.h"
#include "kernels/stream.h"

#ifdef __CUDACC__

#define DELTASERVE_CUDA_TARGET gpu
#define DELTASERVE_UNROLL _Pragma("unroll")
#define DELTASERVE_SHARED(type, name, dims) __shared__ type name dims
#define DELTASERVE_DYNAMIC_SHARED(type, name)                              \
  extern __shared__ __align__(16) unsigned char deltaserve_dynamic_smem[]; \
  type* name = reinterpret_cast<type*>(deltaserve_dynamic_smem)
#define DELTASERVE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                       \
  do {                                                                                          \
    kernel<<<(grid), (block), (shared_bytes), static_cast<cudaStream_t>((stream).handle)>>>(    \
        __VA_ARGS__);                                                                           \
    ::deltaserve::kernels::cuda::ReportLaunch(#kernel, cudaGetErrorString(cudaGetLastError())); \
  } while (0)
#define DELTASERVE_ALLOW_DYNAMIC_SHARED(kernel, bytes)  \
  ::deltaserve::kernels::cuda::ReportLaunch(            \
      #kernel, cudaGetErrorString(cudaFuncSetAttribute( \
                   kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes))))

#else  // the host SIMT harness

#include "kernels/cuda/simt.h"

#define DELTASERVE_CUDA_TARGET sim
#define DELTASERVE_UNROLL
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define threadIdx (::deltaserve::kernels::simt::ThreadIdx())
#define blockIdx (::deltaserve::kernels::simt::BlockIdx())
#define blockDim (::deltaserve::kernels::simt::BlockDim())
#define gridDim (::deltaserve::kernels::simt::GridDim())
#define warpSize (::deltaserve::kernels::simt::kWarpSize)
#define __syncthreads() ::deltaserve::kernels::simt::SyncThreads()
#define DELTASERVE_SHARED(type, name, dims)                                        \
  using name##_shared_type = type dims;                                            \
  name##_shared_type& name =                                                       \
      *static_cast<name##_shared_type*>(::deltaserve::kernels::simt::StaticShared( \
          sizeof(name##_shared_type), alignof(name##_shared_type)))
#define DELTASERVE_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::deltaserve::kernels::simt::DynamicShared())
#define DELTASERVE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                   \
  do {                                                                                      \
    static_cast<void>(stream); /* the harness runs the launch before it returns */          \
    ::deltaserve::kernels::cuda::ReportLaunch(                                              \
        #kernel,                                                                            \
        ::deltaserve::kernels::simt::Launch(#kernel, (grid), (block), (shared_bytes), [&] { \
          kernel(__VA_ARGS__);                                                              \
        }).c_str());                                                                        \
  } while (0)

// The harness lets every launch have what a block of sm_90 may hold.
#define DELTASERVE_ALLOW_DYNAMIC_SHARED(kernel, bytes) static_cast<void>(bytes)

using dim3 = ::deltaserve::kernels::simt::Dim3;

inline void __syncwarp(unsigned mask = 0xffffffffu) { ::deltaserve::kernels::simt::SyncWarp(mask); }
template <typename T>
T __shfl_sync(unsigned mask, T value, int src, int width = 32) {
  return ::deltaserve::kernels::simt::ShflSync(mask, value, src, width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  return ::deltaserve::kernels::simt::ShflXorSync(mask, value, lane_mask, width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  return ::deltaserve::kernels::simt::ShflDownSync(mask, value, delta, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  return ::deltaserve::kernels::simt::ShflUpSync(mask, value, delta, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::deltaserve::kernels::simt::BallotSync(mask, predicate);
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) == __ballot_sync(mask, 1);
}
template <typename T>
T atomicAdd(T* address, T value) {
  return ::deltaserve::kernels::simt::AtomicAdd(address, value);
}
template <typename T>
T atomicMax(T* address, T value) {
  return ::deltaserve::kernels::simt::AtomicMax(address, value);
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}
inline long long __double_as_longlong(double x) {
  long long u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
inline double __longlong_as_double(long long u) {
  double x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}

#endif  // __CUDACC__

namespace deltaserve::kernels::cuda {

// bf16 bits to float: the upper half of the float's bits.
__device__ __forceinline__ float Bf16Bits(uint16_t bits) {
  return __uint_as_float(static_cast<unsigned>(bits) << 16);
}
// float to bf16 bits, rounded to nearest even (NaN stays a quiet NaN), as
// kernels/bf16.h rounds on the CPU.
__device__ __forceinline__ uint16_t ToBf16Bits(float x) {
  const unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Blocks of `per_block` for n items.
inline unsigned BlocksFor(int64_t n, int64_t per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

}  // namespace deltaserve::kernels::cuda
