// RMSNorm and L2Norm on the GPU: one block per row; each thread sums the
// squares of a strided share of the row in double (float squares overflow
// for |x| > 1.8e19, as on the CPU), a warp and then the block add the shares,
// and every thread scales its share.
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// The sum of every thread's `v`, returned to each thread of the block.
__device__ double BlockSum(double v) {
  DELTASERVE_SHARED(double, partial, [kWarps]);
  DELTASERVE_SHARED(double, total, );
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int w = 0; w < kWarps; ++w) sum += partial[w];
    total = sum;
  }
  __syncthreads();
  return total;
}

// y[r] = x[r] * s (* w): s = 1 / sqrt(mean(x²) + eps) for RMSNorm
// (mean = true), scale / sqrt(sum(x²) + eps) for L2Norm. In place is safe:
// each thread writes only what it read itself, after the block's sum.
__global__ void __launch_bounds__(kThreads)
    NormKernel(const float* x, int64_t ldx, const float* w, int64_t dim, float eps, float scale,
               bool mean, float* y, int64_t ldy) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * ldx;
  float* yr = y + r * ldy;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const double v = xr[i];
    sum += v * v;
  }
  sum = BlockSum(sum);
  const float s = mean ? static_cast<float>(1.0 / sqrt(sum / static_cast<double>(dim) + eps))
                       : static_cast<float>(scale / sqrt(sum + eps));
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    yr[i] = w != nullptr ? xr[i] * s * w[i] : xr[i] * s;
  }
}

}  // namespace

void RmsNorm(const float* x, int64_t ldx, const float* w, int64_t rows, int64_t dim, float eps,
             float* y, int64_t ldy, const Stream& stream) {
  if (rows == 0 || dim == 0) return;
  DELTASERVE_LAUNCH(NormKernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, x,
                    ldx, w, dim, eps, 1.0f, true, y, ldy);
}

void L2Norm(const float* x, int64_t rows, int64_t dim, float eps, float scale, float* y,
            const Stream& stream) {
  if (rows == 0 || dim == 0) return;
  DELTASERVE_LAUNCH(NormKernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, x,
                    dim, nullptr, dim, eps, scale, false, y, dim);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
