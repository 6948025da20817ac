// Fast float32 KDA decay gates: elementwise, threaded over tokens. The
// transcendental calls are libm's (exp, log1p) for accuracy: the gate is
// O(T·H·K), small next to the recurrence it feeds.
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/kda_gate.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Below this many elements an OpenMP fork costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 14;

// 1 / (1 + exp(-x)) without overflow for either sign.
inline float Sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

// softplus(z) = log(1 + exp(z)), = z for z > 20 (where exp(-z) < 2e-9 is
// below float precision relative to z) as in the reference implementation.
inline float Softplus(float z) { return z > 20.0f ? z : std::log1p(std::exp(z)); }

// exp(A_log[h]) per head, computed once.
std::vector<float> HeadScales(const float* a_log, int64_t heads) {
  std::vector<float> a(heads);
  for (int64_t h = 0; h < heads; ++h) a[h] = std::exp(a_log[h]);
  return a;
}

}  // namespace

void KdaGateLowerBound(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                       int64_t heads, int64_t head_dim, float lower_bound, float* g) {
  const int64_t width = heads * head_dim;
  const std::vector<float> a = HeadScales(a_log, heads);
#pragma omp parallel for schedule(static) if (t * width >= kParallelMinElements)
  for (int64_t s = 0; s < t; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < head_dim; ++d) {
        const int64_t c = h * head_dim + d;
        const float z = a[h] * (graw[s * width + c] + dt_bias[c]);
        g[s * width + c] = lower_bound * Sigmoid(z);
      }
    }
  }
}

void KdaGateSoftplus(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                     int64_t heads, int64_t head_dim, float* g) {
  const int64_t width = heads * head_dim;
  const std::vector<float> a = HeadScales(a_log, heads);
#pragma omp parallel for schedule(static) if (t * width >= kParallelMinElements)
  for (int64_t s = 0; s < t; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < head_dim; ++d) {
        const int64_t c = h * head_dim + d;
        g[s * width + c] = -a[h] * Softplus(graw[s * width + c] + dt_bias[c]);
      }
    }
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
