// Fast float32 gated activations. std::exp / std::tanh do not vectorise
// without -ffast-math, and GCC will not if-convert the range clamps a scalar
// exp needs while FP traps are honoured, so exp, tanh and the row loop are
// written on GCC vector types (eight lanes; AVX2 with -march=native, split
// into halves elsewhere). Both functions stay within a few ulp over the whole
// float range and saturate instead of producing inf - inf or 0 · inf NaNs.
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/activation.h"
#include "kernels/check.h"

namespace deltaserve::kernels {
namespace {

using Vf = float __attribute__((vector_size(32)));    // 8 floats
using Vi = int32_t __attribute__((vector_size(32)));  // 8 lanes of a mask or int
constexpr int64_t kLanes = 8;

// Below this many elements an OpenMP fork costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

inline Vf Splat(float x) { return Vf{} + x; }

// exp(x) per lane (Cephes expf): x = n ln2 + r, |r| <= ln2/2, a degree-7
// polynomial for exp(r), then 2^n applied as two halves so that n in
// [-150, 128] never needs an out-of-range exponent field (results below
// FLT_MIN come out subnormal, as from expf). +inf above 88.72, just below
// ln(FLT_MAX); the clamp keeps the arithmetic itself finite.
inline Vf Exp(Vf x) {
  constexpr float kMax = 88.72f;
  Vf xc = x < -104.0f ? Splat(-104.0f) : x;
  xc = xc > kMax ? Splat(kMax) : xc;
  // Round to nearest integer with the 1.5·2^23 trick.
  constexpr float kRound = 0x1.8p23f;
  const Vf n = (xc * 1.44269504088896341f + kRound) - kRound;
  // Cody-Waite: ln2 = C1 + C2 with C1 exact in 9 bits, so n·C1 is exact.
  Vf r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Vf p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const Vi ni = __builtin_convertvector(n, Vi);
  const Vi n1 = ni >> 1;
  const Vi n2 = ni - n1;
  const Vf s1 = reinterpret_cast<Vf>((n1 + 127) << 23);
  const Vf s2 = reinterpret_cast<Vf>((n2 + 127) << 23);
  const Vf e = p * s1 * s2;
  return x > kMax ? Splat(std::numeric_limits<float>::infinity()) : e;
}

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
  const Vf e = Exp(-2.0f * a);
  const Vf big = (1.0f - e) / (1.0f + e);
  const Vf signed_big = x < 0.0f ? -big : big;
  return a < 0.25f ? poly : signed_big;
}

// act(g, u) on eight lanes. The sigmoid enters as a division by 1 + exp(-g)
// rather than a multiply by a sigmoid: for g < -88 the sigmoid is subnormal
// and would lose digits, and exp(-g) = inf gives exactly ±0.
inline Vf SiluLanes(Vf g, Vf u) { return g / (1.0f + Exp(-g)) * u; }

inline Vf SituLanes(Vf g, Vf u, float beta, float lbeta) {
  return beta * Tanh(g / beta) / (1.0f + Exp(-g)) * (lbeta * Tanh(u / lbeta));
}

template <typename Act>
void Row(const float* g, const float* u, int64_t width, float* out, Act act) {
  int64_t c = 0;
  for (; c + kLanes <= width; c += kLanes) {
    Vf vg, vu;
    std::memcpy(&vg, g + c, sizeof(Vf));
    std::memcpy(&vu, u + c, sizeof(Vf));
    const Vf vo = act(vg, vu);
    std::memcpy(out + c, &vo, sizeof(Vf));
  }
  if (c < width) {  // ragged tail through zero-padded lanes
    const size_t bytes = static_cast<size_t>(width - c) * sizeof(float);
    Vf vg{}, vu{};
    std::memcpy(&vg, g + c, bytes);
    std::memcpy(&vu, u + c, bytes);
    const Vf vo = act(vg, vu);
    std::memcpy(out + c, &vo, bytes);
  }
}

}  // namespace

void GatedActivation(const float* gu, int64_t rows, int64_t width, const ActivationParams& params,
                     float* out) {
  DELTASERVE_CHECK(rows >= 0 && width >= 0);
  const bool situ = params.kind == Activation::kSitu;
  const float beta = params.situ_beta;
  const float lbeta = params.situ_linear_beta;
  const bool parallel = rows > 1 && rows * width >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * width;  // [width]
    const float* u = g + width;           // [width]
    float* o = out + r * width;           // [width]
    if (situ) {
      Row(g, u, width, o, [beta, lbeta](Vf vg, Vf vu) { return SituLanes(vg, vu, beta, lbeta); });
    } else {
      Row(g, u, width, o, SiluLanes);
    }
  }
}

}  // namespace deltaserve::kernels
