#include "kernels/attn_res.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/attn_res_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using ::deltaserve::testing::AllClose;
using ::deltaserve::testing::DeviceTest;
using ::deltaserve::testing::GuardedBuffer;
using ::deltaserve::testing::RandomFloats;
using ::deltaserve::testing::ReductionTolerance;
using ::deltaserve::testing::ToDouble;

struct MixResult {
  std::vector<float> got;
  std::vector<double> want;
  double max_abs = 0.0;                                               // largest |candidate value|
  ::testing::AssertionResult guards = ::testing::AssertionSuccess();  // of got's buffer
};

// Candidate i is scaled by scales[i]; proj_w by 1/sqrt(D) so that the scores
// stay O(1) and the softmax is not one-hot.
MixResult RunMix(Device device, int64_t n, int64_t t, int64_t d, const std::vector<float>& scales,
                 uint64_t seed) {
  std::vector<std::vector<float>> cands(n);
  std::vector<std::vector<double>> cands_d(n);
  std::vector<const double*> ptrs_d(n);
  MixResult r;
  for (int64_t i = 0; i < n; ++i) {
    cands[i] = RandomFloats(t * d, seed + i);
    for (float& x : cands[i]) x *= scales[i];
    for (float x : cands[i]) r.max_abs = std::max(r.max_abs, std::abs(double{x}));
    cands_d[i] = ToDouble(cands[i]);
    ptrs_d[i] = cands_d[i].data();
  }
  const std::vector<float> norm_w = RandomFloats(d, seed + 100, 0.5f, 1.5f);
  std::vector<float> proj_w = RandomFloats(d, seed + 101, -4.0f, 4.0f);
  for (float& x : proj_w) x /= std::sqrt(static_cast<float>(d));
  const float eps = 1e-6f;

  GuardedBuffer<float> out(device, t * d);
  std::vector<GuardedBuffer<float>> on_device;  // the candidates on `device`
  std::vector<Tensor> views;
  for (int64_t i = 0; i < n; ++i) {
    on_device.emplace_back(device, t * d);
    on_device.back().Fill(cands[i]);
    views.push_back(on_device.back().View(t, d));
  }
  GuardedBuffer<float> norm_on(device, d), proj_on(device, d);
  norm_on.Fill(norm_w);
  proj_on.Fill(proj_w);
  AttnResMix(views.data(), n, norm_on.View(1, d), proj_on.View(1, d), eps, out.View(t, d));
  r.got = out.Values();
  r.guards = out.GuardsIntact();
  r.want.assign(t * d, 0.0);
  const std::vector<double> nw = ToDouble(norm_w), pw = ToDouble(proj_w);
  ref::AttnResMix(ptrs_d.data(), n, t, d, nw.data(), pw.data(), eps, r.want.data());
  return r;
}

// The scores are float64 reductions over D; the errors left are the float32
// rounding of q = norm_w * proj_w (which perturbs each score by ~u |score|) and
// of the output, so a tolerance for a reduction over D is generous. Absolute
// errors scale with the largest candidate.
double MixTolerance(int64_t d) { return ReductionTolerance(d); }

class AttnResMixTest : public DeviceTest {};

TEST_P(AttnResMixTest, MatchesReferenceOverShapes) {
  uint64_t seed = 1;
  double worst = 0.0;
  for (int64_t n : {1, 2, 3, 5, 9, 10}) {
    for (int64_t t : {0, 1, 2, 7, 33}) {
      for (int64_t d : {1, 3, 5, 12, 64, 130, 7168}) {
        const std::vector<float> scales(n, 1.0f);
        const MixResult r = RunMix(device(), n, t, d, scales, seed += 20);
        const double tol = MixTolerance(d);
        ASSERT_TRUE(AllClose(r.got, r.want, tol * r.max_abs, tol))
            << "n=" << n << " T=" << t << " D=" << d;
        ASSERT_TRUE(r.guards) << "n=" << n << " T=" << t << " D=" << d;
        for (size_t i = 0; i < r.got.size(); ++i)
          worst = std::max(worst, std::abs(r.got[i] - r.want[i]) / r.max_abs);
      }
    }
  }
  std::printf("max abs error / max |v| over the sweep: %.3g\n", worst);
}

// Candidates spanning eight orders of magnitude: the RMS normalisation makes
// their scores comparable, the mixed values are raw.
TEST_P(AttnResMixTest, CandidatesOfVeryDifferentScales) {
  const std::vector<float> scales = {1e-4f, 1.0f, 3e3f, 0.02f, 50.0f, 1e4f, 7e-3f};
  for (int64_t d : {5, 129, 2048}) {
    const MixResult r = RunMix(device(), static_cast<int64_t>(scales.size()), 17, d, scales, 4242);
    const double tol = MixTolerance(d);
    EXPECT_TRUE(AllClose(r.got, r.want, tol * r.max_abs, tol)) << "D=" << d;
    EXPECT_TRUE(r.guards) << "D=" << d;
    double worst = 0.0;
    for (size_t i = 0; i < r.got.size(); ++i)
      worst = std::max(worst, std::abs(r.got[i] - r.want[i]) / r.max_abs);
    std::printf("D=%ld: max abs error / max |v| %.3g\n", static_cast<long>(d), worst);
  }
}

// One candidate (layer 0: the embedding) comes back bit for bit.
TEST_P(AttnResMixTest, SingleCandidateIsExact) {
  for (int64_t d : {1, 7, 64, 7168}) {
    const int64_t t = 5;
    std::vector<float> v = RandomFloats(t * d, 9, -30.0f, 30.0f);
    v[0] = 0.0f;
    auto v_on = Input(v), nw = Input(RandomFloats(d, 10)), pw = Input(RandomFloats(d, 11));
    const Tensor cand = v_on.View(t, d);
    auto buffer = Output<float>(t * d);
    AttnResMix(&cand, 1, nw.View(1, d), pw.View(1, d), 1e-6f, buffer.View(t, d));
    const std::vector<float> out = buffer.Values();
    EXPECT_EQ(0, std::memcmp(out.data(), v.data(), v.size() * sizeof(float))) << "D=" << d;
    EXPECT_TRUE(buffer.GuardsIntact()) << "D=" << d;
  }
  // An all-zero candidate has score 0 and mixes to zeros.
  auto zeros = Input(std::vector<float>(3 * 16, 0.0f)), w = Input(RandomFloats(16, 12));
  const Tensor cand = zeros.View(3, 16);
  auto buffer = Output<float>(3 * 16);
  AttnResMix(&cand, 1, w.View(1, 16), w.View(1, 16), 1e-6f, buffer.View(3, 16));
  for (float x : buffer.Values()) EXPECT_EQ(x, 0.0f);
  EXPECT_TRUE(buffer.GuardsIntact());
}

// Exact integer-valued inputs with identical scores: equal weights, so the
// output is the plain mean of the candidates.
TEST_P(AttnResMixTest, EqualScoresAverage) {
  const int64_t d = 12;
  // Candidate 1 is candidate 0 times 3: same RMS-normalised direction, same
  // score. Candidate 2 is the negation of 0 with q chosen orthogonal: all
  // scores are 0.
  std::vector<float> a(d), b(d), c(d), nw(d, 1.0f), pw(d);
  for (int64_t i = 0; i < d; ++i) {
    a[i] = static_cast<float>(i % 2 == 0 ? 1 : -1);
    b[i] = 3.0f * a[i];
    c[i] = -a[i];
    pw[i] = 1.0f;  // Σ a = 0 for even d: every score is exactly 0
  }
  auto a_on = Input(a), b_on = Input(b), c_on = Input(c), nw_on = Input(nw), pw_on = Input(pw);
  const Tensor cands[] = {a_on.View(1, d), b_on.View(1, d), c_on.View(1, d)};
  auto buffer = Output<float>(d);
  AttnResMix(cands, 3, nw_on.View(1, d), pw_on.View(1, d), 1e-6f, buffer.View(1, d));
  const std::vector<float> out = buffer.Values();
  for (int64_t i = 0; i < d; ++i) EXPECT_FLOAT_EQ(out[i], (a[i] + b[i] + c[i]) / 3.0f);
  EXPECT_TRUE(buffer.GuardsIntact());
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(AttnResMixTest);

}  // namespace
}  // namespace deltaserve::kernels
