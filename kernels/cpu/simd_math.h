// Vector math shared by the CPU kernels. DELTASERVE_CPU_AVX2 is 1 when the
// build targets AVX2 + FMA (the -march=native default on x86), else 0 and the
// kernels use their scalar paths.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#define DELTASERVE_CPU_AVX2 1
#include <immintrin.h>
#else
#define DELTASERVE_CPU_AVX2 0
#endif

namespace deltaserve::kernels {

#if DELTASERVE_CPU_AVX2
// exp(x) for x <= 0 (Cephes expf: x = n ln2 + r, degree-7 polynomial for
// exp(r), within 2 ulp); flushes to 0 below ln(FLT_MIN). Written with
// intrinsics because GCC will not if-convert (and so not vectorise) the
// clamps of a scalar version under the default -ftrapping-math.
inline __m256 Exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}
#endif

}  // namespace deltaserve::kernels
