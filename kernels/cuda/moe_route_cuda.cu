// MoeRoute on the GPU: one warp per token, four tokens a block. Scores and
// keys are double, as on the CPU, so near-ties resolve as the float64
// reference resolves them. The top_k picks are k rounds of a warp arg-max
// over the keys that come after the previous pick in the order (higher key,
// then lower index): no marks to keep, and no shared memory, so any expert
// count works; a lane recomputes its keys each round from the (cached)
// logits, a few exps per lane at K3's 384 experts and top-8.
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 32 * kWarpsPerBlock;

__device__ __forceinline__ double Score(float logit) {
  return 1.0 / (1.0 + exp(-static_cast<double>(logit)));
}

// Whether (key a, index ia) comes before (key b, index ib).
__device__ __forceinline__ bool Before(double a, int ia, double b, int ib) {
  return a > b || (a == b && ia < ib);
}

__global__ void __launch_bounds__(kThreads)
    MoeRouteKernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t t,
                   int64_t experts, int64_t top_k, bool renormalize, float scaling,
                   int32_t* __restrict__ idx, float* __restrict__ weights) {
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (token >= t) return;  // a whole warp leaves; no block barriers below
  const int lane = threadIdx.x % 32;
  const float* row = logits + token * experts;  // [experts]
  int32_t* row_idx = idx + token * top_k;       // [top_k]
  float* row_w = weights + token * top_k;
  // The previous pick; the first round takes the best of all.
  double last_key = INFINITY;
  int last = -1;
  double sum = 0.0;  // of the picked scores, in pick order
  for (int64_t j = 0; j < top_k; ++j) {
    double best_key = -INFINITY;
    int best = -1;
    for (int e = lane; e < experts; e += 32) {
      const double key = Score(row[e]) + (bias != nullptr ? static_cast<double>(bias[e]) : 0.0);
      if (last >= 0 && !Before(last_key, last, key, e)) continue;  // already picked
      if (best < 0 || Before(key, e, best_key, best)) {
        best_key = key;
        best = e;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const double other_key = __shfl_xor_sync(0xffffffffu, best_key, offset);
      const int other = __shfl_xor_sync(0xffffffffu, best, offset);
      if (other >= 0 && (best < 0 || Before(other_key, other, best_key, best))) {
        best_key = other_key;
        best = other;
      }
    }
    last_key = best_key;
    last = best;
    sum += Score(row[best]);
    if (lane == 0) row_idx[j] = best;
  }
  __syncwarp();
  const double norm = renormalize ? scaling / sum : scaling;
  for (int64_t j = lane; j < top_k; j += 32) {
    row_w[j] = static_cast<float>(Score(row[row_idx[j]]) * norm);
  }
}

}  // namespace

void MoeRoute(const float* logits, const float* bias, int64_t t, int64_t experts, int64_t top_k,
              bool renormalize, float scaling, int32_t* idx, float* weights, const Stream& stream) {
  if (t == 0 || top_k == 0) return;
  DELTASERVE_LAUNCH(MoeRouteKernel, dim3(BlocksFor(t, kWarpsPerBlock)), dim3(kThreads), 0, stream,
                    logits, bias, t, experts, top_k, renormalize, scaling, idx, weights);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
