// kernels/sampling.h: the generator against the published algorithms, the
// distribution against the float64 reference, and the draws.
#include "kernels/sampling.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/sampling_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::DeviceTest;
using testing::GuardedBuffer;
using testing::RandomFloats;
using testing::ToDouble;

// The probabilities are computed in double on both sides; only the order of
// the sums differs.
constexpr double kProbTol = 1e-12;

SamplingParams Params(float temperature, int64_t top_k = 0, float top_p = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

// On `device`, into a guarded output whose guards it checks.
std::vector<double> Dist(Device device, const std::vector<float>& logits, const SamplingParams& p) {
  const auto vocab = static_cast<int64_t>(logits.size());
  GuardedBuffer<double> probs(device, vocab);
  GuardedBuffer<float> on_device(device, vocab);
  on_device.Fill(logits);
  SamplingDistribution(on_device.View(1, vocab), p, probs.View(1, vocab));
  EXPECT_TRUE(probs.GuardsIntact());
  return probs.Values();
}

// RngTest is the host generator alone; the op tests run once per device.
class SamplingTest : public DeviceTest {};
class SamplingDistributionTest : public DeviceTest {};
class SampleTest : public DeviceTest {};

std::vector<double> RefDist(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<double> probs(logits.size(), NAN);
  ref::SamplingDistribution(ToDouble(logits).data(), static_cast<int64_t>(logits.size()), p,
                            probs.data());
  return probs;
}

std::vector<double> OneHot(size_t n, size_t at) {
  std::vector<double> v(n, 0.0);
  v[at] = 1.0;
  return v;
}

// Same support, and probabilities within kProbTol.
::testing::AssertionResult SameDistribution(const std::vector<double>& got,
                                            const std::vector<double>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size";
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= kProbTol) || (got[i] > 0) != (want[i] > 0)) {
      return ::testing::AssertionFailure()
             << "token " << i << ": got " << got[i] << " want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------- Rng

// Values from an independent implementation of splitmix64 seeding and
// xoshiro256** (Blackman & Vigna's reference code, transcribed to Python).
TEST(RngTest, MatchesPublishedAlgorithm) {
  Rng a(0);
  EXPECT_EQ(a.Next(), 0x99ec5f36cb75f2b4ULL);
  EXPECT_EQ(a.Next(), 0xbf6e1f784956452aULL);
  EXPECT_EQ(a.Next(), 0x1a5f849d4933e6e0ULL);
  EXPECT_EQ(a.Next(), 0x6aa594f1262d2d2cULL);
  Rng b(42);
  EXPECT_EQ(b.Next(), 0x15780b2e0c2ec716ULL);
  EXPECT_EQ(b.Next(), 0x6104d9866d113a7eULL);
  EXPECT_EQ(b.Next(), 0xae17533239e499a1ULL);
  EXPECT_EQ(b.Next(), 0xecb8ad4703b360a1ULL);
  Rng c(7);
  EXPECT_EQ(c.Uniform(), 0.7005764821796896);
  EXPECT_EQ(c.Uniform(), 0.2787512294737843);
}

TEST(RngTest, UniformIsTopBitsOfNext) {
  Rng a(99), b(99);
  double sum = 0.0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = a.Uniform();
    ASSERT_EQ(u, static_cast<double>(b.Next() >> 11) * 0x1.0p-53);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  // Mean of U(0,1): standard error 0.29 / sqrt(n).
  EXPECT_NEAR(sum / n, 0.5, 5 * 0.2887 / std::sqrt(n));
}

TEST(RngTest, SameSeedSameSequence) {
  Rng a(123), b(123), c(124);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.Next();
    ASSERT_EQ(x, b.Next());
    differs |= x != c.Next();
  }
  EXPECT_TRUE(differs);
}

// ------------------------------------------------------------- greedy

TEST_P(SamplingTest, GreedyIsArgmaxLowestIdAndLeavesRngAlone) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  Rng rng(5), twin(5);
  auto on_device = Input(logits);
  const Tensor lv = on_device.View(1, 5);
  EXPECT_EQ(Sample(lv, Params(0.0f), rng), 1);
  EXPECT_EQ(Sample(lv, Params(0.0f, 3, 0.5f), rng), 1);
  EXPECT_EQ(rng.Next(), twin.Next());
  EXPECT_EQ(Dist(device(), logits, Params(0.0f)), OneHot(5, 1));
  EXPECT_EQ(ref::Sample(ToDouble(logits).data(), 5, Params(0.0f), rng), 1);
  EXPECT_EQ(rng.Next(), twin.Next());
}

TEST_P(SamplingTest, SingleToken) {
  const std::vector<float> logits = {-7.0f};
  Rng rng(1);
  EXPECT_EQ(Dist(device(), logits, Params(1.0f, 0, 0.5f)), OneHot(1, 0));
  auto on_device = Input(logits);
  EXPECT_EQ(Sample(on_device.View(1, 1), Params(1.0f), rng), 0);
}

// --------------------------------------------------------- distribution

TEST_P(SamplingDistributionTest, MatchesReference) {
  uint64_t seed = 1;
  for (int64_t vocab : {2, 5, 1000, 50000}) {
    for (float temperature : {0.3f, 1.0f, 2.5f}) {
      for (int64_t top_k : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{50}, vocab + 5}) {
        for (float top_p : {1.0f, 0.9f, 0.5f, 1e-3f}) {
          SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " temperature " << temperature
                                            << " top_k " << top_k << " top_p " << top_p);
          const auto logits = RandomFloats(vocab, ++seed, -5.0f, 5.0f);
          const SamplingParams p = Params(temperature, top_k, top_p);
          const auto got = Dist(device(), logits, p);
          EXPECT_TRUE(SameDistribution(got, RefDist(logits, p)));
          double sum = 0.0;
          for (double v : got) sum += v;
          EXPECT_NEAR(sum, 1.0, 1e-12);
        }
      }
    }
  }
}

// A real vocabulary: also a rough guard on the cost (no full sorts).
TEST_P(SamplingDistributionTest, LargeVocabulary) {
  const int64_t vocab = 163840;
  const auto logits = RandomFloats(vocab, 2024, -12.0f, 12.0f);
  for (const SamplingParams& p :
       {Params(1.0f), Params(0.7f, 0, 0.9f), Params(1.0f, 40, 0.95f), Params(1.3f, 1000, 1.0f)}) {
    SCOPED_TRACE(::testing::Message() << "top_k " << p.top_k << " top_p " << p.top_p);
    const auto start = std::chrono::steady_clock::now();
    const auto got = Dist(device(), logits, p);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(SameDistribution(got, RefDist(logits, p)));
    EXPECT_LT(ms, 500.0);  // ~a few ms; far above it only with an O(V²) bug
  }
}

TEST_P(SamplingDistributionTest, TopKOneAndTinyTopPAreGreedy) {
  uint64_t seed = 300;
  for (int64_t vocab : {1, 7, 1000}) {
    auto logits = RandomFloats(vocab, ++seed);
    if (vocab > 4) logits[4] = logits[vocab - 1] = 2.0f;  // tied maxima
    int64_t argmax = 0;
    for (int64_t i = 1; i < vocab; ++i) {
      if (logits[i] > logits[argmax]) argmax = i;
    }
    const auto greedy = OneHot(vocab, argmax);
    EXPECT_EQ(Dist(device(), logits, Params(0.0f)), greedy);
    EXPECT_EQ(Dist(device(), logits, Params(0.8f, 1)), greedy) << vocab;
    EXPECT_EQ(Dist(device(), logits, Params(0.8f, 0, 1e-6f)), greedy) << vocab;
    Rng rng(seed);
    auto on_device = Input(logits);
    const Tensor lv = on_device.View(1, vocab);
    for (int draw = 0; draw < 20; ++draw) {
      EXPECT_EQ(Sample(lv, Params(1.0f, 1), rng), argmax);
      EXPECT_EQ(Sample(lv, Params(1.0f, 0, 1e-6f), rng), argmax);
    }
  }
}

// Ties at the top_k boundary keep the lower ids; exact probabilities.
TEST_P(SamplingDistributionTest, TopKTiesKeepLowerIds) {
  const std::vector<float> logits = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  EXPECT_EQ(Dist(device(), logits, Params(1.0f, 2)),
            (std::vector<double>{0.0, 0.5, 0.5, 0.0, 0.0}));
  EXPECT_EQ(RefDist(logits, Params(1.0f, 2)), (std::vector<double>{0.0, 0.5, 0.5, 0.0, 0.0}));
  // top_p over equal probabilities: 0.3 of {1/3, 1/3, 1/3} keeps the lowest id.
  EXPECT_EQ(Dist(device(), logits, Params(1.0f, 3, 0.3f)), OneHot(5, 1));
}

// Probabilities 0.5, 0.3, 0.2: top_p picks the smallest prefix reaching it.
TEST_P(SamplingDistributionTest, TopPPrefix) {
  const std::vector<float> logits = {std::log(0.3f), std::log(0.5f), std::log(0.2f)};
  auto near = [](const std::vector<double>& got, const std::vector<double>& want) {
    return SameDistribution(got, want);
  };
  // The prefix rounds differently only within ~1e-7 of 0.5 / 0.8: stay away.
  EXPECT_TRUE(near(Dist(device(), logits, Params(1.0f, 0, 0.45f)), {0.0, 1.0, 0.0}));
  const double p3 = std::exp(static_cast<double>(std::log(0.3f)));
  const double p5 = std::exp(static_cast<double>(std::log(0.5f)));
  EXPECT_TRUE(
      near(Dist(device(), logits, Params(1.0f, 0, 0.7f)), {p3 / (p3 + p5), p5 / (p3 + p5), 0.0}));
  EXPECT_TRUE(
      near(Dist(device(), logits, Params(1.0f, 0, 0.9f)), Dist(device(), logits, Params(1.0f))));
  // top_p applies to the top_k-renormalised distribution: with top_k = 2 the
  // kept probabilities are 0.375 / 0.625, so 0.6 keeps one token.
  EXPECT_TRUE(near(Dist(device(), logits, Params(1.0f, 2, 0.6f)), {0.0, 1.0, 0.0}));
}

// ------------------------------------------------------------- draws

TEST_P(SampleTest, MatchesReferenceDrawForDraw) {
  const auto logits = RandomFloats(1000, 77, -3.0f, 3.0f);
  const auto logits_d = ToDouble(logits);
  auto on_device = Input(logits);
  for (const SamplingParams& p :
       {Params(1.0f), Params(0.5f, 20), Params(1.5f, 0, 0.8f), Params(1.0f, 100, 0.95f)}) {
    Rng a(2024), b(2024);
    for (int draw = 0; draw < 300; ++draw) {
      ASSERT_EQ(Sample(on_device.View(1, 1000), p, a), ref::Sample(logits_d.data(), 1000, p, b))
          << "draw " << draw << " top_k " << p.top_k << " top_p " << p.top_p;
    }
    EXPECT_EQ(a.Next(), b.Next());  // one Uniform per draw on both sides
  }
}

TEST_P(SampleTest, SameSeedSameTokens) {
  const auto logits = RandomFloats(5000, 5, -4.0f, 4.0f);
  const SamplingParams p = Params(0.9f, 64, 0.9f);
  Rng a(31337), b(31337);
  auto on_device = Input(logits);
  const Tensor lv = on_device.View(1, 5000);
  for (int draw = 0; draw < 200; ++draw) {
    ASSERT_EQ(Sample(lv, p, a), Sample(lv, p, b));
  }
}

// 20000 draws over five tokens: every count within 4.5 standard errors of
// N·p (deterministic for this seed; a wrong CDF walk is off by hundreds).
TEST_P(SampleTest, EmpiricalFrequencies) {
  const std::vector<float> logits = {0.0f, 1.0f, -1.0f, 0.5f, 2.0f};
  for (const SamplingParams& p : {Params(1.0f), Params(0.7f, 3), Params(1.0f, 0, 0.8f)}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << p.temperature << " top_k " << p.top_k
                                      << " top_p " << p.top_p);
    const auto probs = Dist(device(), logits, p);
    const int n = 20000;
    std::vector<int> count(5, 0);
    Rng rng(8675309);
    auto on_device = Input(logits);
    const Tensor lv = on_device.View(1, 5);
    for (int draw = 0; draw < n; ++draw) ++count[Sample(lv, p, rng)];
    for (int i = 0; i < 5; ++i) {
      const double expected = n * probs[i];
      const double se = std::sqrt(n * probs[i] * (1.0 - probs[i]));
      if (probs[i] == 0.0) {
        EXPECT_EQ(count[i], 0) << "token " << i;
      } else {
        EXPECT_NEAR(count[i], expected, 4.5 * se) << "token " << i;
      }
    }
  }
}

// Non-finite logits (the engine refuses them before sampling, but a kernel
// must stay in range for any input) give the reference's distribution, with
// NaN as -inf and an infinite maximum sharing the mass, and the same draws.
// Sizes span the top-p histogram's one-bucket and many-bucket cases, and the
// rows mix every kind of value, so a comparison that is not a strict order
// (NaN) would reach std::sort and nth_element. Run at every CPU level.
TEST_P(SamplingTest, NonFiniteLogitsFollowTheReference) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> rows;
  for (int64_t vocab : {1, 2, 7, 64, 1000, 5000}) {
    for (float bad : {kNaN, kInf, -kInf}) {
      rows.push_back(std::vector<float>(vocab, bad));  // all bad
      std::vector<float> mixed = RandomFloats(vocab, 11 * vocab, -4.0f, 4.0f);
      for (int64_t i = 0; i < vocab; i += 3) mixed[i] = bad;  // a third bad
      rows.push_back(mixed);
      std::vector<float> one = RandomFloats(vocab, 13 * vocab, -4.0f, 4.0f);
      one[vocab / 2] = bad;
      rows.push_back(one);
    }
    std::vector<float> all_kinds = RandomFloats(vocab, 17 * vocab, -4.0f, 4.0f);
    for (int64_t i = 0; i < vocab; ++i) {
      if (i % 4 == 1) all_kinds[i] = kNaN;
      if (i % 4 == 2) all_kinds[i] = i % 8 == 2 ? kInf : -kInf;
    }
    rows.push_back(all_kinds);
  }
  // Rows of equal values make uniform distributions; a top_p that is not a
  // multiple of 1 / (tokens kept) for any size here keeps the cut off an
  // exact tie of rounded sums, where the two summation orders may differ.
  const std::vector<SamplingParams> settings = {Params(0.0f),
                                                Params(1.0f),
                                                Params(0.7f, 5),
                                                Params(1.3f, 0, 0.9013f),
                                                Params(0.7f, 50, 0.3771f),
                                                Params(2.0f, 3, 0.0537f),
                                                Params(kInf, 0, 0.8131f),
                                                Params(kNaN, 4, 0.5f),
                                                Params(1.0f, -1, kNaN)};
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<float>& logits = rows[r];
    const int64_t vocab = static_cast<int64_t>(logits.size());
    auto on_device = Input(logits);
    for (size_t s = 0; s < settings.size(); ++s) {
      SCOPED_TRACE(::testing::Message()
                   << "row " << r << " (vocab " << vocab << "), setting " << s);
      const std::vector<double> got = Dist(device(), logits, settings[s]);
      EXPECT_TRUE(SameDistribution(got, RefDist(logits, settings[s])));
      double sum = 0.0;
      for (double p : got) sum += p;
      EXPECT_NEAR(sum, 1.0, 1e-12);
      for (uint64_t seed = 1; seed <= 5; ++seed) {
        Rng rng(seed), twin(seed);
        const int32_t id = Sample(on_device.View(1, vocab), settings[s], rng);
        ASSERT_GE(id, 0);
        ASSERT_LT(id, vocab);
        EXPECT_GT(got[id], 0.0) << "drew a token outside the distribution";
        EXPECT_EQ(id, ref::Sample(ToDouble(logits).data(), vocab, settings[s], twin));
      }
    }
  }
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(SamplingTest);
DELTASERVE_INSTANTIATE_DEVICE_TEST(SamplingDistributionTest);
DELTASERVE_INSTANTIATE_DEVICE_TEST(SampleTest);

}  // namespace
}  // namespace deltaserve::kernels
