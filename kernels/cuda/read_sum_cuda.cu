// ReadSum (kernels/cuda/ops.h) on the GPU: the sum of n floats, a kernel
// whose only work is reading them once, so that its time measures the
// device's read bandwidth (bench/model_bench.cc's limit for decode, which
// reads every active weight once per token). Each thread sums a grid-strided
// share, four independent loads in flight per step (one load at a time
// leaves HBM idle between a thread's requests); a warp and then the block add
// the shares, and one atomic per block adds the block's sum to *sum, which
// the caller zeroed. The float sum's order depends on the blocks' order on
// the GPU: it is a checksum that keeps the loads live, exact only for
// inputs whose sums are (small integers).
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;
// Enough blocks to keep every SM's loads in flight (an H200 has 132 SMs, 8
// blocks of 256 threads each at full occupancy), few enough that each
// thread strides several times and the atomics are a rounding error.
constexpr int64_t kMaxBlocks = 132 * 8;

__global__ void __launch_bounds__(kThreads)
    ReadSumKernel(const float* __restrict__ x, int64_t n, float* __restrict__ sum) {
  DELTASERVE_SHARED(float, partial, [kWarps]);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  float acc[kUnroll] = {};
  int64_t i = first;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    DELTASERVE_UNROLL
    for (int u = 0; u < kUnroll; ++u) acc[u] += __ldg(x + i + u * stride);
  }
  for (; i < n; i += stride) acc[0] += __ldg(x + i);
  float v = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float block = 0.0f;
    for (int w = 0; w < kWarps; ++w) block += partial[w];
    atomicAdd(sum, block);
  }
}

}  // namespace

void ReadSum(const float* x, int64_t n, float* sum, const Stream& stream) {
  if (n == 0) return;
  const int64_t per_block = int64_t{kThreads} * kUnroll;
  const int64_t blocks = (n + per_block - 1) / per_block;
  const unsigned grid = static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  DELTASERVE_LAUNCH(ReadSumKernel, dim3(grid), dim3(kThreads), 0, stream, x, n, sum);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
