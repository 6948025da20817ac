#include "kernels/kda_gate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/reference/kda_gate_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

struct GateCase {
  int64_t t, heads, head_dim;
};

// A gate is a handful of elementwise operations (exp, log1p, a product):
// a few ulp, no reduction.
const double kGateTolerance = testing::ReductionTolerance(1);

// Elementwise check with the condition number of the gate: float32 rounds
// the argument z of exp (relative error u), which exp turns into a relative
// error |z|·u of the result, so the tolerance grows with 1 + |z|. Results
// below float's normal range (exp(z) for z < -87) carry no relative precision.
::testing::AssertionResult GateClose(const std::vector<float>& got, const std::vector<double>& want,
                                     const std::vector<double>& z) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = kGateTolerance * (1.0 + std::abs(z[i])) * std::abs(want[i]) +
                       std::numeric_limits<float>::min();
    if (!(std::abs(got[i] - want[i]) <= tol)) {
      return ::testing::AssertionFailure()
             << "[" << i << "] got " << got[i] << " want " << want[i] << " (z " << z[i] << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

class KdaGateTest : public testing::DeviceTest {};

TEST_P(KdaGateTest, MatchesReference) {
  uint64_t seed = 1;
  double worst_lb = 0.0, worst_sp = 0.0;
  for (const GateCase& c : {GateCase{0, 2, 4}, GateCase{1, 1, 1}, GateCase{3, 2, 5},
                            GateCase{17, 3, 16}, GateCase{200, 4, 128}}) {
    SCOPED_TRACE("t=" + std::to_string(c.t) + " heads=" + std::to_string(c.heads) +
                 " head_dim=" + std::to_string(c.head_dim));
    const int64_t width = c.heads * c.head_dim;
    // graw spans both softplus branches (z > 20) and deep negatives.
    const std::vector<float> graw = testing::RandomFloats(c.t * width, ++seed, -40, 40);
    const std::vector<float> dt_bias = testing::RandomFloats(width, ++seed, -2, 2);
    const std::vector<float> a_log = testing::RandomFloats(c.heads, ++seed, -3, 2);
    const std::vector<double> graw_d = testing::ToDouble(graw);
    const std::vector<double> dt_d = testing::ToDouble(dt_bias);
    const std::vector<double> a_d = testing::ToDouble(a_log);

    // The arguments of exp in each gate.
    std::vector<double> z_lb(c.t * width), z_sp(c.t * width);
    for (int64_t i = 0; i < c.t * width; ++i) {
      z_sp[i] = graw_d[i] + dt_d[i % width];
      z_lb[i] = std::exp(a_d[(i % width) / c.head_dim]) * z_sp[i];
    }
    auto graw_dev = Input(graw), dt_dev = Input(dt_bias), a_dev = Input(a_log);
    std::vector<double> want(c.t * width);
    kernels::ref::KdaGateLowerBound(graw_d.data(), dt_d.data(), a_d.data(), c.t, c.heads,
                                    c.head_dim, -5.0, want.data());
    auto out = Output<float>(c.t * width);
    kernels::KdaGateLowerBound(graw_dev.View(c.t, c.heads * c.head_dim),
                               dt_dev.View(1, c.heads * c.head_dim), a_dev.View(1, c.heads),
                               c.heads, c.head_dim, -5.0f, out.View(c.t, c.heads * c.head_dim));
    std::vector<float> got = out.Values();
    EXPECT_TRUE(GateClose(got, want, z_lb));
    EXPECT_TRUE(out.GuardsIntact());
    // In place (g == graw) is allowed.
    auto inplace = Output<float>(c.t * width);
    inplace.Fill(graw);
    kernels::KdaGateLowerBound(inplace.View(c.t, c.heads * c.head_dim),
                               dt_dev.View(1, c.heads * c.head_dim), a_dev.View(1, c.heads),
                               c.heads, c.head_dim, -5.0f, inplace.View(c.t, c.heads * c.head_dim));
    EXPECT_EQ(inplace.Values(), got);
    EXPECT_TRUE(inplace.GuardsIntact());
    if (c.t > 0) worst_lb = std::max(worst_lb, testing::RelL2(got, want));

    kernels::ref::KdaGateSoftplus(graw_d.data(), dt_d.data(), a_d.data(), c.t, c.heads, c.head_dim,
                                  want.data());
    auto out_sp = Output<float>(c.t * width);
    kernels::KdaGateSoftplus(graw_dev.View(c.t, c.heads * c.head_dim),
                             dt_dev.View(1, c.heads * c.head_dim), a_dev.View(1, c.heads), c.heads,
                             c.head_dim, out_sp.View(c.t, c.heads * c.head_dim));
    got = out_sp.Values();
    EXPECT_TRUE(GateClose(got, want, z_sp));
    EXPECT_TRUE(out_sp.GuardsIntact());
    auto inplace_sp = Output<float>(c.t * width);
    inplace_sp.Fill(graw);
    kernels::KdaGateSoftplus(inplace_sp.View(c.t, c.heads * c.head_dim),
                             dt_dev.View(1, c.heads * c.head_dim), a_dev.View(1, c.heads), c.heads,
                             c.head_dim, inplace_sp.View(c.t, c.heads * c.head_dim));
    EXPECT_EQ(inplace_sp.Values(), got);
    EXPECT_TRUE(inplace_sp.GuardsIntact());
    if (c.t > 0) worst_sp = std::max(worst_sp, testing::RelL2(got, want));
  }
  std::printf("KdaGateLowerBound max rel L2 %.3g, KdaGateSoftplus max rel L2 %.3g\n", worst_lb,
              worst_sp);
}

TEST_P(KdaGateTest, SoftplusIsStableAtExtremes) {
  const std::vector<float> graw = {-80.0f, -30.0f, 0.0f, 19.9f, 20.1f, 80.0f, 1e30f};
  const std::vector<float> dt_bias(graw.size(), 0.0f);
  const std::vector<float> a_log = {0.0f};  // exp(0) = 1: g = -softplus
  const auto n = static_cast<int64_t>(graw.size());
  auto g = Output<float>(n);
  auto graw_dev = Input(graw), dt_dev = Input(dt_bias), a_dev = Input(a_log);
  kernels::KdaGateSoftplus(graw_dev.View(1, n), dt_dev.View(1, n), a_dev.View(1, 1), 1, n,
                           g.View(1, n));
  std::vector<double> want;
  for (float z : graw) want.push_back(z > 20.0f ? -double{z} : -std::log1p(std::exp(double{z})));
  EXPECT_TRUE(testing::AllClose(g.Values(), want, 0.0, kGateTolerance));
  EXPECT_TRUE(g.GuardsIntact());
}

// The golden g was computed in float32 from g_raw, dt_bias and A_log.
TEST_P(KdaGateTest, SoftplusMatchesGolden) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::GoldenPath("kda"))) {
    if (entry.path().extension() != ".safetensors") continue;
    ++files;
    const std::string name = entry.path().stem().string();
    const std::optional<testing::GoldenFile> file = testing::ReadGoldenFile(entry.path().string());
    ASSERT_TRUE(file.has_value());
    auto load = [&](const char* tensor) { return file->Get(tensor).values; };
    const std::vector<int64_t> shape = file->Get("g_raw").shape;  // [B, T, HV, K]
    const int64_t tokens = shape[0] * shape[1], heads = shape[2], head_dim = shape[3];
    const std::vector<float> graw = testing::ToFloat(load("g_raw"));
    const std::vector<float> dt_bias = testing::ToFloat(load("dt_bias"));
    const std::vector<float> a_log = testing::ToFloat(load("A_log"));
    const std::vector<double> want = load("g");
    auto out = Output<float>(static_cast<int64_t>(want.size()));
    auto graw_dev = Input(graw), dt_dev = Input(dt_bias), a_dev = Input(a_log);
    kernels::KdaGateSoftplus(graw_dev.View(tokens, heads * head_dim),
                             dt_dev.View(1, heads * head_dim), a_dev.View(1, heads), heads,
                             head_dim, out.View(tokens, heads * head_dim));
    EXPECT_TRUE(out.GuardsIntact()) << name;
    const std::vector<float> g = out.Values();
    // Both sides round to float32 along the way (inputs, exp(A_log), the
    // softplus): a few ulp each, well inside 1e-5.
    EXPECT_TRUE(testing::AllClose(g, want, 0.0, 1e-5)) << name;
    std::printf("golden %-22s KdaGateSoftplus rel L2 %.3g\n", name.c_str(),
                testing::RelL2(g, want));
  }
  EXPECT_GE(files, 6);
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(KdaGateTest);

}  // namespace
}  // namespace deltaserve
