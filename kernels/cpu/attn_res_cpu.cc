// CPU kernel for kernels/attn_res.h. Memory bound (each candidate is read
// twice per token, once for its score and once for the weighted sum), so the
// arithmetic is done in float64 lanes: the scores of trained models sit close
// together and the extra precision costs nothing here.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/attn_res.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// *sq = Σ v[c]², *dot = Σ v[c] q[c], accumulated in float64.
void SumSquaresAndDot(const float* v, const float* q, int64_t d, double* sq, double* dot) {
  int64_t c = 0;
  double s = 0.0, p = 0.0;
#if DELTASERVE_CPU_AVX2
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  __m256d p0 = _mm256_setzero_pd(), p1 = _mm256_setzero_pd();
  for (; c + 8 <= d; c += 8) {
    const __m256 x = _mm256_loadu_ps(v + c), y = _mm256_loadu_ps(q + c);
    const __m256d xl = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d xh = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    const __m256d yl = _mm256_cvtps_pd(_mm256_castps256_ps128(y));
    const __m256d yh = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
    s0 = _mm256_fmadd_pd(xl, xl, s0);
    s1 = _mm256_fmadd_pd(xh, xh, s1);
    p0 = _mm256_fmadd_pd(xl, yl, p0);
    p1 = _mm256_fmadd_pd(xh, yh, p1);
  }
  s = simd::HorizontalSum(_mm256_add_pd(s0, s1));
  p = simd::HorizontalSum(_mm256_add_pd(p0, p1));
#endif
  for (; c < d; ++c) {
    const double x = v[c];
    s += x * x;
    p += x * static_cast<double>(q[c]);
  }
  *sq = s;
  *dot = p;
}

// out[c] = Σ_i w[i] v_i[c], accumulated in float64 and rounded once.
void WeightedSum(const float* const* v, const double* w, int64_t n, int64_t d, float* out) {
  int64_t c = 0;
#if DELTASERVE_CPU_AVX2
  for (; c + 8 <= d; c += 8) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (int64_t i = 0; i < n; ++i) {
      const __m256 x = _mm256_loadu_ps(v[i] + c);
      const __m256d wi = _mm256_set1_pd(w[i]);
      lo = _mm256_fmadd_pd(wi, _mm256_cvtps_pd(_mm256_castps256_ps128(x)), lo);
      hi = _mm256_fmadd_pd(wi, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), hi);
    }
    _mm256_storeu_ps(out + c, _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo)));
  }
#endif
  for (; c < d; ++c) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) acc += w[i] * v[i][c];
    out[c] = static_cast<float>(acc);
  }
}

}  // namespace

void AttnResMix(const float* const* candidates, int64_t n, int64_t t, int64_t d,
                const float* norm_w, const float* proj_w, float eps, float* out) {
  if (t == 0 || d == 0) return;
  std::vector<float> q(d);  // [D]
  for (int64_t c = 0; c < d; ++c) q[c] = norm_w[c] * proj_w[c];
  const double inv_d = 1.0 / static_cast<double>(d);

#pragma omp parallel if (t * n * d >= (1 << 16))
  {
    std::vector<double> w(n);
    std::vector<const float*> rows(n);
#pragma omp for schedule(static)
    for (int64_t tok = 0; tok < t; ++tok) {
      double mx = -HUGE_VAL;
      for (int64_t i = 0; i < n; ++i) {
        rows[i] = candidates[i] + tok * d;
        double sq, dot;
        SumSquaresAndDot(rows[i], q.data(), d, &sq, &dot);
        w[i] = dot / std::sqrt(sq * inv_d + eps);  // RMSNorm_no_gain(v_i) · q
        mx = std::max(mx, w[i]);
      }
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        w[i] = std::exp(w[i] - mx);
        sum += w[i];
      }
      for (int64_t i = 0; i < n; ++i) w[i] /= sum;
      WeightedSum(rows.data(), w.data(), n, d, out + tok * d);
    }
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
