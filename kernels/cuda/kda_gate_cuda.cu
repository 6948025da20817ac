// KDA decay gates on the GPU, elementwise as the CPU variant
// (kernels/cpu/kda_gate_cpu.cc): a 2-D grid, x tiling the heads · head_dim
// channels of a token (coalesced reads of graw and dt_bias, a_log from
// cache), y walking the tokens past 65535 by striding. exp is HostExpf
// (kernels/cuda/host_expf.h), the CPU's std::exp to the bit; log1p is the
// CUDA library's. In place is safe: each thread reads its element first.
#include "kernels/cuda/compat.h"
#include "kernels/cuda/host_expf.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

// 1 / (1 + exp(-x)) without overflow for either sign.
__device__ __forceinline__ float Sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + HostExpf(-x));
  const float e = HostExpf(x);
  return e / (1.0f + e);
}

// softplus(z) = log(1 + exp(z)), = z for z > 20 as on the CPU.
__device__ __forceinline__ float Softplus(float z) { return z > 20.0f ? z : log1pf(HostExpf(z)); }

// graw, g: [t, heads * head_dim]; dt_bias: [heads * head_dim]; a_log:
// [heads]. softplus selects the Kimi Linear form, else K3's lower bound.
__global__ void __launch_bounds__(kThreads)
    KdaGateKernel(const float* graw, const float* __restrict__ dt_bias,
                  const float* __restrict__ a_log, int64_t t, int64_t head_dim, bool softplus,
                  float lower_bound, int64_t width, float* g) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= width) return;
  const float a = HostExpf(a_log[c / head_dim]);
  const float bias = dt_bias[c];
  for (int64_t s = blockIdx.y; s < t; s += gridDim.y) {
    const float raw = graw[s * width + c];
    g[s * width + c] =
        softplus ? -a * Softplus(raw + bias) : lower_bound * Sigmoid(a * (raw + bias));
  }
}

void Launch(const float* graw, const float* dt_bias, const float* a_log, int64_t t, int64_t heads,
            int64_t head_dim, bool softplus, float lower_bound, float* g, const Stream& stream) {
  const int64_t width = heads * head_dim;
  if (t == 0 || width == 0) return;
  const dim3 grid(BlocksFor(width, kThreads), static_cast<unsigned>(t < kMaxGridY ? t : kMaxGridY));
  DELTASERVE_LAUNCH(KdaGateKernel, grid, dim3(kThreads), 0, stream, graw, dt_bias, a_log, t,
                    head_dim, softplus, lower_bound, width, g);
}

}  // namespace

void KdaGateLowerBound(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                       int64_t heads, int64_t head_dim, float lower_bound, float* g,
                       const Stream& stream) {
  Launch(graw, dt_bias, a_log, t, heads, head_dim, false, lower_bound, g, stream);
}

void KdaGateSoftplus(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                     int64_t heads, int64_t head_dim, float* g, const Stream& stream) {
  Launch(graw, dt_bias, a_log, t, heads, head_dim, true, 0.0f, g, stream);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
