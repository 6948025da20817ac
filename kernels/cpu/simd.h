// The one SIMD layer of the CPU kernels: the feature switch, an eight-lane
// float vector with the few operations the kernels share on it (loads and
// stores with ragged tails, fused multiply-add, a row map), the vector
// exponentials and the horizontal sums. Kernels take their vector code from
// here rather than writing their own.
//
// DELTASERVE_CPU_AVX2 (always 0 or 1, tested with #if) is the single switch
// between the AVX2 + FMA intrinsic paths and the portable ones; no kernel
// tests __AVX2__ or __FMA__ itself. It follows the flags of the level being
// compiled (kernels/isa.h: generic has it off, avx2 and avx512 on), and the
// level is chosen at run time, so everything here lives in that level's
// namespace.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#define DELTASERVE_CPU_AVX2 1
#include <immintrin.h>
#else
#define DELTASERVE_CPU_AVX2 0
#endif

#include <cstdint>
#include <cstring>

#include "kernels/cpu/dispatch.h"

#if !DELTASERVE_CPU_AVX2 && defined(__GNUC__) && !defined(__clang__)
// Without AVX, GCC warns that passing a 32-byte vector by value has another
// ABI. Vf never crosses a library boundary (the helpers here are inline and
// each kernel keeps its lane functions in its own file), so the warning is
// off in every file that includes this header.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA::simd {

// Eight float lanes as a GCC vector: one AVX register under
// DELTASERVE_CPU_AVX2, split into halves by the compiler elsewhere. It
// converts implicitly to and from __m256, so intrinsic code calls the helpers
// below directly.
using Vf = float __attribute__((vector_size(32)));
using Vi = int32_t __attribute__((vector_size(32)));  // lanes of a mask or int
inline constexpr int64_t kLanes = 8;

inline Vf Splat(float x) { return Vf{} + x; }

inline Vf Load(const float* p) {
  Vf v;
  std::memcpy(&v, p, sizeof(Vf));
  return v;
}

inline void Store(float* p, Vf v) { std::memcpy(p, &v, sizeof(Vf)); }

// The first n < kLanes lanes from p; the others are 0.
inline Vf LoadPartial(const float* p, int64_t n) {
  Vf v{};
  std::memcpy(&v, p, static_cast<size_t>(n) * sizeof(float));
  return v;
}

// The first n < kLanes lanes of v to p.
inline void StorePartial(float* p, int64_t n, Vf v) {
  std::memcpy(p, &v, static_cast<size_t>(n) * sizeof(float));
}

// a·b + c, rounded once where the hardware has FMA: said explicitly rather
// than left to the compiler's -ffp-contract.
inline Vf Fma(Vf a, Vf b, Vf c) {
#if DELTASERVE_CPU_AVX2
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

// out[c] = f(in[c]...) for c < len, kLanes at a time; a ragged tail goes
// through zero-padded lanes, so every element takes the same path. out may
// be one of the inputs.
template <typename F, typename... In>
inline void Map(int64_t len, float* out, F f, const In*... in) {
  int64_t c = 0;
  for (; c + kLanes <= len; c += kLanes) Store(out + c, f(Load(in + c)...));
  if (c < len) StorePartial(out + c, len - c, f(LoadPartial(in + c, len - c)...));
}

// max(a, b) and min(a, b) per lane with the x86 rule for NaN: where either
// lane is NaN the result is b's lane, so Max(Splat(lo), x) keeps a NaN x.
inline Vf Max(Vf a, Vf b) {
#if DELTASERVE_CPU_AVX2
  return _mm256_max_ps(a, b);
#else
  return a > b ? a : b;
#endif
}

inline Vf Min(Vf a, Vf b) {
#if DELTASERVE_CPU_AVX2
  return _mm256_min_ps(a, b);
#else
  return a < b ? a : b;
#endif
}

// x rounded to the nearest integer, ties to even (|x| < 2^22 off AVX2).
inline Vf Round(Vf x) {
#if DELTASERVE_CPU_AVX2
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  constexpr float kRound = 0x1.8p23f;  // adding 1.5·2^23 rounds away the fraction
  return (x + kRound) - kRound;
#endif
}

namespace internal {

// 2^n · 2^f per lane for integer-valued n in [-127, 127] and f in [-1/2, 1]
// (f > 1/2 only in the half binade below overflow, where n is held at 127).
// The polynomial is the degree-7 interpolant of 2^f at the Chebyshev nodes of
// [-1/2, 1]: relative error 1.7e-9 (0.03 ulp) before its coefficients are
// rounded to float. 2^n comes from the exponent bits; n = -127 gives the bit
// pattern of +0, which is how the callers flush to zero.
inline Vf ScaledExp2(Vf n, Vf f) {
  Vf p = Splat(1.827528831e-05f);
  p = Fma(p, f, Splat(1.529734873e-04f));
  p = Fma(p, f, Splat(1.332141575e-03f));
  p = Fma(p, f, Splat(9.618738666e-03f));
  p = Fma(p, f, Splat(5.550425500e-02f));
  p = Fma(p, f, Splat(2.402264327e-01f));
  p = Fma(p, f, Splat(6.931471825e-01f));
  p = Fma(p, f, Splat(1.0f));
  const Vi bits = (__builtin_convertvector(n, Vi) + 127) << 23;
  return p * reinterpret_cast<Vf>(bits);
}

}  // namespace internal

// The vector exponentials, one polynomial for both; tests/kernels/
// simd_test.cc measures them against float64. Within 1.5 ulp from FLT_MIN up
// to overflow (2 ulp without FMA), +inf beyond it (x = +inf included), NaN in
// gives NaN. Below FLT_MIN results are subnormal down to 2^-126.5 and 0 under
// it (-inf gives 0): no caller needs tinier values, and a subnormal result
// costs several times a normal one (8.0 against 3.4 ns for eight lanes on a
// Zen 4).

// e^x per lane: x = n ln2 + r (Cody-Waite: ln2 = C1 + C2 with C1 exact in
// 9 bits, so n·C1 is exact), then 2^n · 2^(r log2 e).
inline Vf Exp(Vf x) {
  x = Max(Splat(-88.0f), x);  // n >= -127
  const Vf n = Min(Round(x * 1.44269504088896341f), Splat(127.0f));
  Vf r = Fma(n, Splat(-0.693359375f), x);
  r = Fma(n, Splat(2.12194440e-4f), r);
  return internal::ScaledExp2(n, r * 1.44269504088896341f);
}

// 2^x per lane: x = n + f, f exact.
inline Vf Exp2(Vf x) {
  x = Max(Splat(-127.0f), x);
  const Vf n = Min(Round(x), Splat(127.0f));
  return internal::ScaledExp2(n, x - n);
}

#if DELTASERVE_CPU_AVX2
inline float HorizontalSum(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline double HorizontalSum(__m256d x) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(x), _mm256_extractf128_pd(x, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
#endif  // DELTASERVE_CPU_AVX2

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA::simd
