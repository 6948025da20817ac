// Fast float32 gated activations. std::exp / std::tanh do not vectorise
// without -ffast-math, and GCC will not if-convert the range clamps a scalar
// exp needs while FP traps are honoured, so tanh and the activations are
// written on the eight-lane vectors of kernels/cpu/simd.h, with its exp and
// row map. Both functions stay within a few ulp over the whole float range
// and saturate instead of producing inf - inf or 0 · inf NaNs.
#include <cstdint>

#include "kernels/activation.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

using simd::Splat;
using simd::Vf;

// Below this many elements an OpenMP fork costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

// tanh(x) per lane: an odd Taylor polynomial for |x| < 0.25 (where 1 - e
// cancels; the first omitted term is below 0.2 ulp there), else
// ±(1 - e) / (1 + e) with e = exp(-2|x|) in (0, 0.61], which cannot overflow.
inline Vf Tanh(Vf x) {
  const Vf a = x < 0.0f ? -x : x;
  const Vf x2 = x * x;
  Vf poly = Splat(62.0f / 2835.0f);
  poly = poly * x2 - 17.0f / 315.0f;
  poly = poly * x2 + 2.0f / 15.0f;
  poly = poly * x2 - 1.0f / 3.0f;
  poly = x + x * x2 * poly;
  const Vf e = simd::Exp(-2.0f * a);
  const Vf big = (1.0f - e) / (1.0f + e);
  const Vf signed_big = x < 0.0f ? -big : big;
  return a < 0.25f ? poly : signed_big;
}

// act(g, u) on eight lanes. The sigmoid enters as a division by 1 + exp(-g)
// rather than a multiply by a sigmoid: for g < -88 the sigmoid is subnormal
// and would lose digits, and exp(-g) = inf gives exactly ±0.
inline Vf SiluLanes(Vf g, Vf u) { return g / (1.0f + simd::Exp(-g)) * u; }

inline Vf SituLanes(Vf g, Vf u, float beta, float lbeta) {
  return beta * Tanh(g / beta) / (1.0f + simd::Exp(-g)) * (lbeta * Tanh(u / lbeta));
}

}  // namespace

void GatedActivation(const float* gu, int64_t rows, int64_t width, const ActivationParams& params,
                     float* out) {
  const bool situ = params.kind == Activation::kSitu;
  const float beta = params.situ_beta;
  const float lbeta = params.situ_linear_beta;
  const auto situ_lanes = [beta, lbeta](Vf g, Vf u) { return SituLanes(g, u, beta, lbeta); };
  const bool parallel = rows > 1 && rows * width >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * width;  // [width]
    const float* u = g + width;           // [width]
    float* o = out + r * width;           // [width]
    if (situ) {
      simd::Map(width, o, situ_lanes, g, u);
    } else {
      simd::Map(width, o, SiluLanes, g, u);
    }
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
