// kernels/activation.h against the float64 reference.
#include "kernels/activation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/activation_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::AllClose;
using testing::DeviceTest;
using testing::RandomFloats;
using testing::ToDouble;

// Elementwise, no reduction: a handful of roundings in exp, tanh and the
// products (measured at most ~7 ulp of 2^-24), so 16 float epsilons relative.
// The absolute part covers the underflow tail: for g < -88.7, exp(-g) is inf
// and the kernel returns ±0 where the exact value is |g·u|·e^g < 1e-36 here.
constexpr double kRtol = 16 * std::numeric_limits<float>::epsilon();
constexpr double kAtol = 1e-36;

ActivationParams Silu() { return ActivationParams{}; }
ActivationParams Situ(float beta = 4.0f, float lbeta = 25.0f) {
  ActivationParams p;
  p.kind = Activation::kSitu;
  p.situ_beta = beta;
  p.situ_linear_beta = lbeta;
  return p;
}

class GatedActivationTest : public DeviceTest {};

std::vector<double> Reference(const std::vector<float>& gu, int64_t rows, int64_t width,
                              const ActivationParams& p) {
  std::vector<double> want(rows * width);
  ref::GatedActivation(ToDouble(gu).data(), rows, width, p, want.data());
  return want;
}

TEST_P(GatedActivationTest, MatchesReferenceOverShapes) {
  uint64_t seed = 1;
  for (const ActivationParams& p : {Silu(), Situ(), Situ(2.0f, 10.0f)}) {
    for (int64_t rows : {1, 2, 5, 33}) {
      for (int64_t width : {1, 3, 7, 8, 9, 16, 100, 1000}) {
        SCOPED_TRACE(::testing::Message() << "kind " << static_cast<int>(p.kind) << " beta "
                                          << p.situ_beta << " rows " << rows << " width " << width);
        // Range wide enough for both tails of tanh and the sigmoid.
        const auto gu = RandomFloats(rows * 2 * width, ++seed, -40.0f, 40.0f);
        auto out = Output<float>(rows * width);
        auto gud = Input(gu);
        GatedActivation(gud.View(rows, 2 * width), p, out.View(rows, width));
        EXPECT_TRUE(AllClose(out.Values(), Reference(gu, rows, width, p), kAtol, kRtol));
        EXPECT_TRUE(out.GuardsIntact());
      }
    }
  }
}

// Around zero: tanh switches from its polynomial to the exp form at 0.25.
TEST_P(GatedActivationTest, SmallArguments) {
  const int64_t width = 4096;
  std::vector<float> gu(2 * width);
  for (int64_t c = 0; c < width; ++c) {
    // g/4 and u/25 sweep 0 .. ±0.6 and 0 .. ±0.25 on a log-ish grid.
    const float t = std::ldexp(1.0f, -24 + static_cast<int>(c % 48) / 2) *
                    (1.0f + 0.37f * static_cast<float>(c % 7));
    gu[c] = (c % 2 ? 1.0f : -1.0f) * std::min(t, 2.4f);
    gu[width + c] = (c % 3 ? -1.0f : 1.0f) * std::min(t * 5.0f, 15.0f);
  }
  for (const ActivationParams& p : {Silu(), Situ()}) {
    auto out = Output<float>(width);
    auto gud = Input(gu);
    GatedActivation(gud.View(1, 2 * width), p, out.View(1, width));
    EXPECT_TRUE(AllClose(out.Values(), Reference(gu, 1, width, p), kAtol, kRtol))
        << "kind " << static_cast<int>(p.kind);
    EXPECT_TRUE(out.GuardsIntact());
  }
}

// Large |g| and |u| must saturate, never give inf or NaN from exp overflow.
TEST_P(GatedActivationTest, ExtremeInputsStayFinite) {
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> g = {0.0f,    -0.0f, 1e-30f, -1e-30f, 87.0f,  -87.0f, 88.5f,
                                -88.5f,  88.8f, -88.8f, 89.0f,   -89.0f, 104.0f, -104.0f,
                                1000.0f, -1e4f, 1e30f,  -1e30f,  big,    -big};
  const int64_t width = static_cast<int64_t>(g.size());
  for (float u : {1.0f, -0.5f, 1e30f, -big}) {
    std::vector<float> gu(g);
    gu.resize(2 * width, u);
    for (const ActivationParams& p : {Silu(), Situ()}) {
      // SiLU(g)·u overflows float for g·u beyond FLT_MAX; keep those out.
      if (p.kind == Activation::kSilu && std::abs(u) > 1.0f) continue;
      auto buffer = Output<float>(width);
      auto gud = Input(gu);
      GatedActivation(gud.View(1, 2 * width), p, buffer.View(1, width));
      const auto out = buffer.Values();
      for (int64_t c = 0; c < width; ++c) {
        EXPECT_TRUE(std::isfinite(out[c])) << "g " << g[c] << " u " << u;
      }
      EXPECT_TRUE(AllClose(out, Reference(gu, 1, width, p), kAtol, kRtol))
          << "kind " << static_cast<int>(p.kind) << " u " << u;
      EXPECT_TRUE(buffer.GuardsIntact());
    }
  }
}

TEST_P(GatedActivationTest, ExactValues) {
  // act(0, u) = 0; SiTU saturates to beta · lbeta for large g and u.
  const std::vector<float> gu = {0.0f, 1000.0f, 7.0f, 1000.0f};
  auto gud = Input(gu);
  auto situ = Output<float>(2);
  GatedActivation(gud.View(1, 2 * 2), Situ(), situ.View(1, 2));
  EXPECT_EQ(situ.Values()[0], 0.0f);
  EXPECT_EQ(situ.Values()[1], 100.0f);
  EXPECT_TRUE(situ.GuardsIntact());
  auto silu = Output<float>(2);
  GatedActivation(gud.View(1, 2 * 2), Silu(), silu.View(1, 2));
  EXPECT_EQ(silu.Values()[0], 0.0f);
  EXPECT_EQ(silu.Values()[1], 1000.0f * 1000.0f);
  EXPECT_TRUE(silu.GuardsIntact());
}

TEST_P(GatedActivationTest, ThreadedRows) {
  const int64_t rows = 300, width = 512;
  const auto gu = RandomFloats(rows * 2 * width, 77, -10.0f, 10.0f);
  auto gud = Input(gu);
  for (const ActivationParams& p : {Silu(), Situ()}) {
    auto out = Output<float>(rows * width);
    GatedActivation(gud.View(rows, 2 * width), p, out.View(rows, width));
    EXPECT_TRUE(AllClose(out.Values(), Reference(gu, rows, width, p), kAtol, kRtol));
    EXPECT_TRUE(out.GuardsIntact());
  }
}

TEST_P(GatedActivationTest, EmptyIsNoOp) {
  auto out = Output<float>(0);
  auto gu = Input(std::vector<float>{});
  GatedActivation(gu.View(0, 2 * 16), Silu(), out.View(0, 16));
  GatedActivation(gu.View(4, 2 * 0), Situ(), out.View(4, 0));
  EXPECT_TRUE(out.GuardsIntact());
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(GatedActivationTest);

}  // namespace
}  // namespace deltaserve::kernels
