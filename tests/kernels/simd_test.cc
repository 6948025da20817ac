// kernels/cpu/simd.h: the vector exponentials against float64 over their
// whole range (ulp bounds, overflow, flush to zero, inf and NaN), the row map
// on ragged lengths and the horizontal sums.
#include "kernels/cpu/simd.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numbers>
#include <vector>

#include "gtest/gtest.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA::simd {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Each of xs through f, eight lanes at a time.
template <typename F>
std::vector<float> Apply(F f, const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
  Map(static_cast<int64_t>(xs.size()), out.data(), f, xs.data());
  return out;
}

// n points evenly spread over [lo, hi].
std::vector<float> Grid(float lo, float hi, int n) {
  std::vector<float> xs(n);
  for (int i = 0; i < n; ++i) xs[i] = lo + (hi - lo) * (static_cast<double>(i) / (n - 1));
  return xs;
}

// |got - want| in units of the spacing of floats at want, for want in
// [FLT_MIN, FLT_MAX]; the binade's spacing also serves at FLT_MAX itself.
double UlpError(float got, double want) {
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

// Worst ulp error of f against ref over [lo, hi], where every result is a
// normal float.
template <typename F, typename R>
double MaxUlpError(F f, R ref, float lo, float hi) {
  const std::vector<float> xs = Grid(lo, hi, 1 << 20);
  const std::vector<float> got = Apply(f, xs);
  double worst = 0.0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double e = UlpError(got[i], ref(static_cast<double>(xs[i])));
    if (!(e <= worst)) worst = e;  // NaN sticks
  }
  return worst;
}

double ExpRef(double x) { return std::exp(x); }
double Exp2Ref(double x) { return std::exp2(x); }
// Lambdas rather than functions: inlined, so no Vf crosses a call.
constexpr auto ExpLanes = [](Vf x) { return Exp(x); };
constexpr auto Exp2Lanes = [](Vf x) { return Exp2(x); };

// Bound from the polynomial (0.03 ulp), the rounding of the reduced argument
// (r·log2 e: up to 0.35 ulp of the result) and of the Horner steps and the
// final product. The worst seen, over a denser sweep, is 1.25 ulp (e^x next
// to overflow, where f reaches 1); without FMA every Horner step rounds twice
// (seen: 1.50 ulp on an x86-64-v2 build).
constexpr double kMaxUlp = DELTASERVE_CPU_AVX2 ? 1.5 : 2.0;

TEST(SimdExpTest, WithinBoundFromFltMinToOverflow) {
  const float ln_min = std::log(FLT_MIN), ln_max = std::log(FLT_MAX);
  const double core = MaxUlpError(ExpLanes, ExpRef, -1.0f, 1.0f);
  const double low = MaxUlpError(ExpLanes, ExpRef, std::nextafter(ln_min, 0.0f), 0.0f);
  // The last half binade before overflow reduces with n held at 127.
  const double high = MaxUlpError(ExpLanes, ExpRef, 0.0f, std::nextafter(ln_max, 0.0f));
  std::printf("Exp max error: %.3f ulp on [-1, 1], %.3f below 0, %.3f above 0\n", core, low, high);
  EXPECT_LE(core, kMaxUlp);
  EXPECT_LE(low, kMaxUlp);
  EXPECT_LE(high, kMaxUlp);
}

TEST(SimdExpTest, Exp2WithinBoundFromFltMinToOverflow) {
  const double core = MaxUlpError(Exp2Lanes, Exp2Ref, -1.0f, 1.0f);
  const double low = MaxUlpError(Exp2Lanes, Exp2Ref, -126.0f, 0.0f);
  const double high = MaxUlpError(Exp2Lanes, Exp2Ref, 0.0f, std::nextafter(128.0f, 0.0f));
  std::printf("Exp2 max error: %.3f ulp on [-1, 1], %.3f below 0, %.3f above 0\n", core, low, high);
  EXPECT_LE(core, kMaxUlp);
  EXPECT_LE(low, kMaxUlp);
  EXPECT_LE(high, kMaxUlp);
}

// Below FLT_MIN a result is either the subnormal one (down to 2^-126.5) or
// 0: off by less than FLT_MIN / √2 either way, and never negative.
template <typename F, typename R>
void ExpectFlushBelowFltMin(F f, R ref, float lo, float hi) {
  const std::vector<float> xs = Grid(lo, hi, 1 << 16);
  const std::vector<float> got = Apply(f, xs);
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_GE(got[i], 0.0f) << xs[i];
    ASSERT_LE(std::fabs(got[i] - ref(xs[i])), FLT_MIN * 0.7072) << xs[i];
  }
}

TEST(SimdExpTest, FlushesBelowFltMin) {
  ExpectFlushBelowFltMin(ExpLanes, ExpRef, -120.0f, std::log(FLT_MIN));
  ExpectFlushBelowFltMin(Exp2Lanes, Exp2Ref, -170.0f, -126.0f);
}

TEST(SimdExpTest, EdgeValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float ln_max = std::log(FLT_MAX);
  const std::vector<float> xs = {-kInf, -1e30f, -200.0f, -88.0f, 0.0f, -0.0f,
                                 1.0f,  100.0f, 1e30f,   kInf,   nan,  std::nextafter(ln_max, 0.0f),
                                 88.8f, 89.5f};
  const std::vector<float> e = Apply(ExpLanes, xs);
  EXPECT_EQ(e[0], 0.0f);
  EXPECT_EQ(e[1], 0.0f);
  EXPECT_EQ(e[2], 0.0f);
  EXPECT_EQ(e[3], 0.0f);  // e^-88 < FLT_MIN / √2
  EXPECT_EQ(e[4], 1.0f);
  EXPECT_EQ(e[5], 1.0f);
  EXPECT_NEAR(e[6], std::numbers::e_v<float>, 1e-6f);
  for (int i : {7, 8, 9, 12, 13}) EXPECT_EQ(e[i], kInf) << xs[i];
  EXPECT_TRUE(std::isnan(e[10]));
  EXPECT_TRUE(std::isfinite(e[11]));
  EXPECT_GT(e[11], 3.4e38f);

  const std::vector<float> x2 = {-kInf,  -1e30f, -127.0f, -126.0f,
                                 0.0f,   10.0f,  127.0f,  std::nextafter(128.0f, 0.0f),
                                 128.0f, 1e30f,  kInf,    nan};
  const std::vector<float> p = Apply(Exp2Lanes, x2);
  EXPECT_EQ(p[0], 0.0f);
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_EQ(p[2], 0.0f);
  EXPECT_EQ(p[3], FLT_MIN);  // powers of two are exact
  EXPECT_EQ(p[4], 1.0f);
  EXPECT_EQ(p[5], 1024.0f);
  EXPECT_EQ(p[6], std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isfinite(p[7]));
  for (int i : {8, 9, 10}) EXPECT_EQ(p[i], kInf) << x2[i];
  EXPECT_TRUE(std::isnan(p[11]));
}

// Every length from 0 to past two vectors, in place and not: each element
// written once with f of its own inputs, nothing past len touched.
TEST(SimdMapTest, RaggedLengthsAndInPlace) {
  constexpr float kSentinel = -12345.0f;
  const auto f = [](Vf a, Vf b) { return Fma(a, b, Splat(1.0f)); };
  for (int64_t len = 0; len <= 2 * kLanes + 3; ++len) {
    std::vector<float> a(len + 4, kSentinel), b(len + 4, kSentinel), out(len + 4, kSentinel);
    for (int64_t i = 0; i < len; ++i) {
      a[i] = static_cast<float>(i + 1);
      b[i] = static_cast<float>(2 * i - 5);
    }
    Map(len, out.data(), f, a.data(), b.data());
    std::vector<float> inplace = a;
    Map(len, inplace.data(), f, inplace.data(), b.data());
    for (int64_t i = 0; i < len + 4; ++i) {
      const float want = i < len ? a[i] * b[i] + 1.0f : kSentinel;
      EXPECT_EQ(out[i], want) << "len " << len << " i " << i;
      EXPECT_EQ(inplace[i], want) << "len " << len << " i " << i;
    }
  }
}

#if DELTASERVE_CPU_AVX2
// Integer-valued lanes: the sums are exact whatever the order.
TEST(SimdHorizontalSumTest, SumsAllLanes) {
  EXPECT_EQ(HorizontalSum(_mm256_setr_ps(1, 2, 4, 8, 16, 32, 64, 128)), 255.0f);
  EXPECT_EQ(HorizontalSum(_mm256_setr_ps(-1, 2, -3, 4, -5, 6, -7, 8)), 4.0f);
  EXPECT_EQ(HorizontalSum(_mm256_setr_pd(1, 2, 4, 8)), 15.0);
  EXPECT_EQ(HorizontalSum(_mm256_setr_pd(-1e300, 3, 1e300, 5)), 8.0);  // pairs (0, 2), (1, 3)
}
#endif

}  // namespace
}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA::simd
