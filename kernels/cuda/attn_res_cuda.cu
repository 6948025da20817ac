// AttnResMix on the GPU: one block per token. Each warp takes candidates in
// turn and reduces Σ v² and Σ v·q over D (float64, as on the CPU, with
// q = norm_w * proj_w rounded to float as there) with shuffles, into a score
// in shared memory; one thread turns the n scores into softmax weights; then
// every thread mixes its strided share of columns over the candidates
// (coalesced, a float64 sum rounded once). Memory bound: each candidate row
// is read twice, the second time mostly from L2.
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// Dynamic shared memory: the n weights (double), then the n row pointers.
__global__ void __launch_bounds__(kThreads)
    AttnResMixKernel(const float* const* __restrict__ candidates, int64_t n, int64_t d,
                     const float* __restrict__ norm_w, const float* __restrict__ proj_w, float eps,
                     float* __restrict__ out) {
  DELTASERVE_DYNAMIC_SHARED(double, w);  // [n], then const float* [n]
  const float** rows = reinterpret_cast<const float**>(w + n);
  const int64_t tok = blockIdx.x;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) rows[i] = candidates[i] + tok * d;
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const double inv_d = 1.0 / static_cast<double>(d);
  for (int64_t i = warp; i < n; i += kWarps) {
    const float* v = rows[i];  // [d]
    double sq = 0.0, dot = 0.0;
    for (int64_t c = lane; c < d; c += 32) {
      const double x = v[c];
      sq += x * x;
      dot += x * static_cast<double>(norm_w[c] * proj_w[c]);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      sq += __shfl_xor_sync(0xffffffffu, sq, offset);
      dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    }
    if (lane == 0) w[i] = dot / sqrt(sq * inv_d + eps);  // RMSNorm_no_gain(v_i) · q
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double mx = -HUGE_VAL;
    for (int64_t i = 0; i < n; ++i) mx = fmax(mx, w[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      w[i] = exp(w[i] - mx);
      sum += w[i];
    }
    for (int64_t i = 0; i < n; ++i) w[i] /= sum;
  }
  __syncthreads();
  float* o = out + tok * d;  // [d]
  for (int64_t c = threadIdx.x; c < d; c += kThreads) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) acc += w[i] * rows[i][c];
    o[c] = static_cast<float>(acc);
  }
}

}  // namespace

void AttnResMix(const float* const* candidates, int64_t n, int64_t t, int64_t d,
                const float* norm_w, const float* proj_w, float eps, float* out,
                const Stream& stream) {
  if (t == 0 || d == 0) return;
  const size_t shared = static_cast<size_t>(n) * (sizeof(double) + sizeof(const float*));
  DELTASERVE_LAUNCH(AttnResMixKernel, dim3(static_cast<unsigned>(t)), dim3(kThreads), shared,
                    stream, candidates, n, d, norm_w, proj_w, eps, out);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
