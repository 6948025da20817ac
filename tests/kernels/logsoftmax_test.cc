// kernels/logsoftmax.h against the float64 reference, and bit for bit
// against the scalar scoring code it replaces (runtime/engine/
// step_executor.cc's LogSumExp and AppendTop, copied below).
#include "kernels/logsoftmax.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/logsoftmax_ref.h"
#include "kernels/scratch.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::AllClose;
using testing::DeviceTest;
using testing::RandomFloats;
using testing::RandomTokens;
using testing::ToDouble;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// log_z: a double sum of V terms, each exp within an ulp, so at most about
// V ulp of 2^-53 relative, which log turns into as much absolute (the
// reference sums in long double), plus the rounding of max + log(sum), an
// ulp of |log_z|. The float log-probs add one float rounding: float epsilon
// relative, and log_z's error absolute.
double LogZTol(int64_t vocab, double log_z) {
  return (static_cast<double>(vocab + 8) + std::abs(log_z)) * 0x1p-52;
}
constexpr double kLogprobRtol = std::numeric_limits<float>::epsilon();

// The scoring code this op replaces, verbatim in its arithmetic.
double ScalarLogSumExp(const float* logits, int64_t vocab) {
  const double max = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max);
  return max + std::log(sum);
}
void ScalarTop(const float* logits, int64_t vocab, double log_z, int64_t n,
               std::vector<int32_t>& ids, std::vector<float>& logprobs) {
  n = std::min(n, vocab);
  if (n <= 0) return;
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int64_t i = 0; i < n; ++i) {
    ids.push_back(order[i]);
    logprobs.push_back(static_cast<float>(logits[order[i]] - log_z));
  }
}

// The outputs of one call, guarded, and its inputs on the device.
struct Outputs {
  testing::GuardedBuffer<float> logits;
  testing::GuardedBuffer<int32_t> targets;
  testing::GuardedBuffer<double> log_z;
  testing::GuardedBuffer<float> target;
  testing::GuardedBuffer<int32_t> ids;
  testing::GuardedBuffer<float> logprobs;
  bool Intact() const {
    return log_z.GuardsIntact() && target.GuardsIntact() && ids.GuardsIntact() &&
           logprobs.GuardsIntact();
  }
};

class LogSoftmaxTest : public DeviceTest {
 protected:
  // logits [rows, vocab] at `stride`, targets [rows] (none when empty).
  Outputs Run(const std::vector<float>& logits, int64_t rows, int64_t vocab, int64_t stride,
              const std::vector<int32_t>& targets, int64_t top_k) {
    const int64_t k = std::min(top_k, vocab);
    Outputs o{Input(logits),
              Input(targets),
              Output<double>(rows),
              Output<float>(targets.empty() ? 0 : rows),
              Output<int32_t>(rows * k),
              Output<float>(rows * k)};
    LogSoftmaxTopKArgs args;
    args.logits = o.logits.View(rows, vocab, stride == vocab ? 0 : stride);
    if (!targets.empty()) {
      args.targets = o.targets.View(rows, 1);
      args.target_logprobs = o.target.View(rows, 1);
    }
    args.top_k = top_k;
    args.log_z = o.log_z.View(rows, 1);
    if (k > 0) {
      args.top_ids = o.ids.View(rows, k);
      args.top_logprobs = o.logprobs.View(rows, k);
    }
    LogSoftmaxTopK(args);
    return o;
  }
};

TEST_P(LogSoftmaxTest, MatchesReference) {
  uint64_t seed = 1;
  for (int64_t rows : {1, 3, 7}) {
    for (int64_t vocab : {1, 2, 7, 100, 1000}) {
      for (int64_t top_k : {int64_t{0}, int64_t{1}, int64_t{5}, vocab, vocab + 3}) {
        for (int64_t pad : {0, 4}) {
          SCOPED_TRACE(::testing::Message() << "rows " << rows << " vocab " << vocab << " top_k "
                                            << top_k << " pad " << pad);
          const int64_t stride = vocab + pad, k = std::min(top_k, vocab);
          // NaN in the gaps: a strided read must not see them.
          const auto logits = testing::WithStride(RandomFloats(rows * vocab, ++seed, -20.0f, 20.0f),
                                                  rows, vocab, stride, kNaN);
          // Targets in range and out of it on both sides.
          auto targets = RandomTokens(rows, ++seed, vocab + 3);
          targets[0] = rows > 1 ? -1 : targets[0];
          const Outputs o = Run(logits, rows, vocab, stride, targets, top_k);
          std::vector<double> want_z(rows), want_target(rows), want_top(rows * k);
          std::vector<int32_t> want_ids(rows * k);
          for (int64_t r = 0; r < rows; ++r) {
            std::vector<double> row(logits.begin() + r * stride,
                                    logits.begin() + r * stride + vocab);
            want_z[r] = ref::LogSumExp(row.data(), vocab);
            const int32_t t = targets[r];
            want_target[r] = t < 0 || t >= vocab ? 0.0 : row[t] - want_z[r];
            const auto ranked = ref::Ranked(row.data(), vocab);
            for (int64_t i = 0; i < k; ++i) {
              want_ids[r * k + i] = ranked[i];
              want_top[r * k + i] = row[ranked[i]] - want_z[r];
            }
          }
          double ztol = 0;
          const auto got_z = o.log_z.Values();
          for (int64_t r = 0; r < rows; ++r) {
            EXPECT_NEAR(got_z[r], want_z[r], LogZTol(vocab, want_z[r]));
            ztol = std::max(ztol, LogZTol(vocab, want_z[r]));
          }
          EXPECT_TRUE(AllClose(o.target.Values(), want_target, ztol, kLogprobRtol));
          EXPECT_EQ(o.ids.Values(), want_ids);
          EXPECT_TRUE(AllClose(o.logprobs.Values(), want_top, ztol, kLogprobRtol));
          EXPECT_TRUE(o.Intact());
        }
      }
    }
  }
}

// The bits of the scalar code, including a K3-sized vocabulary on several
// threads, -inf (masked) logits, and integer-valued logits with many ties.
TEST_P(LogSoftmaxTest, BitForBitTheScalarCode) {
  struct Case {
    int64_t rows, vocab, top_k;
    bool ties;
  };
  uint64_t seed = 50;
  for (const Case& c : {Case{3, 163840, 20, false}, Case{5, 4096, 8, true}, Case{1, 1, 3, false},
                        Case{2, 33, 40, true}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << c.vocab);
    auto logits = RandomFloats(c.rows * c.vocab, ++seed, -30.0f, 30.0f);
    if (c.ties) {
      for (float& x : logits) x = std::floor(x / 10.0f);
    }
    if (c.vocab > 8) {
      for (int64_t r = 0; r < c.rows; ++r) logits[r * c.vocab + 5] = -kInf;
    }
    std::vector<int32_t> targets = RandomTokens(c.rows, ++seed, c.vocab);
    targets.back() = static_cast<int32_t>(c.vocab);  // out of range
    const Outputs o = Run(logits, c.rows, c.vocab, c.vocab, targets, c.top_k);
    const auto z = o.log_z.Values();
    const auto target = o.target.Values();
    const auto ids = o.ids.Values();
    const auto logprobs = o.logprobs.Values();
    const int64_t k = std::min(c.top_k, c.vocab);
    for (int64_t r = 0; r < c.rows; ++r) {
      const float* row = logits.data() + r * c.vocab;
      const double want_z = ScalarLogSumExp(row, c.vocab);
      EXPECT_EQ(std::memcmp(&z[r], &want_z, sizeof(double)), 0) << z[r] << " vs " << want_z;
      const int32_t t = targets[r];
      const float want_t = t < 0 || t >= c.vocab ? 0.0f : static_cast<float>(row[t] - want_z);
      EXPECT_EQ(std::memcmp(&target[r], &want_t, sizeof(float)), 0)
          << target[r] << " vs " << want_t;
      std::vector<int32_t> want_ids;
      std::vector<float> want_logprobs;
      ScalarTop(row, c.vocab, want_z, c.top_k, want_ids, want_logprobs);
      EXPECT_EQ(std::vector<int32_t>(ids.begin() + r * k, ids.begin() + (r + 1) * k), want_ids);
      EXPECT_EQ(std::memcmp(logprobs.data() + r * k, want_logprobs.data(), sizeof(float) * k), 0);
    }
    EXPECT_TRUE(o.Intact());
  }
}

TEST_P(LogSoftmaxTest, VocabularyOfOne) {
  const std::vector<float> logits = {3.5f, -2.0f};
  const Outputs o = Run(logits, 2, 1, 1, {0, 1}, 4);
  EXPECT_EQ(o.log_z.Values(), (std::vector<double>{3.5, -2.0}));
  EXPECT_EQ(o.target.Values(), (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(o.ids.Values(), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(o.logprobs.Values(), (std::vector<float>{0.0f, 0.0f}));
  EXPECT_TRUE(o.Intact());
}

// Equal logits: the lower id first, across rows and thread chunks alike.
TEST_P(LogSoftmaxTest, TiesGoToTheLowerId) {
  std::vector<float> logits = {1, 2, 2, 0, 2, 1, 0, 0, 0, 0, 0, 0};
  const Outputs o = Run(logits, 2, 6, 6, {}, 4);
  EXPECT_EQ(o.ids.Values(), (std::vector<int32_t>{1, 2, 4, 0, 0, 1, 2, 3}));
  EXPECT_TRUE(o.Intact());
}

// No targets and no top-k: only log_z, the other outputs empty views.
TEST_P(LogSoftmaxTest, LogZOnly) {
  const auto logits = RandomFloats(4 * 50, 3);
  const Outputs o = Run(logits, 4, 50, 50, {}, 0);
  const auto z = o.log_z.Values();
  for (int64_t r = 0; r < 4; ++r) {
    const double want = ScalarLogSumExp(logits.data() + r * 50, 50);
    EXPECT_EQ(std::memcmp(&z[r], &want, sizeof(double)), 0);
  }
  EXPECT_TRUE(o.Intact());
  LogSoftmaxTopKArgs empty;
  empty.logits = Tensor::F32(nullptr, 0, 50);
  empty.log_z = MutableTensor::F64(nullptr, 0, 1);
  empty.logits.device = empty.log_z.device = device();
  LogSoftmaxTopK(empty);
}

// One row's top-k takes one vocabulary of ids from scratch, returned after.
TEST_P(LogSoftmaxTest, ScratchIsOneVocabulary) {
  const int64_t vocab = 163840;
  const auto logits = RandomFloats(vocab, 4);
  const ScratchStats before = ThisThreadScratchStats();
  Run(logits, 1, vocab, vocab, {}, 10);
  const ScratchStats after = ThisThreadScratchStats();
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_LE(after.peak_in_use_bytes,
            std::max(before.peak_in_use_bytes,
                     before.in_use_bytes + vocab * sizeof(int32_t) + 64 + kScratchRedzoneBytes));
}

TEST_P(LogSoftmaxTest, FindNonFinite) {
  const int64_t rows = 4, cols = 700;
  auto x = RandomFloats(rows * cols, 5, -100.0f, 100.0f);
  // x (any stride) on the device under test.
  const auto find = [&](const std::vector<float>& x, int64_t stride = 0) {
    auto xd = Input(x);
    return FindNonFinite(xd.View(rows, cols, stride));
  };
  EXPECT_EQ(find(x), -1);
  Tensor none = Input(std::vector<float>{}).View(0, cols);
  EXPECT_EQ(FindNonFinite(none), -1);
  // Each kind of value, at block edges and the ends; the first one counts.
  for (float bad : {kNaN, kInf, -kInf, -kNaN}) {
    for (int64_t at : {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{257}, cols - 1,
                       2 * cols + 511, rows * cols - 1}) {
      auto y = x;
      y[at] = bad;
      if (at + 3 < rows * cols) y[at + 3] = kNaN;
      EXPECT_EQ(find(y), at) << bad << " at " << at;
    }
  }
  // The largest finite float is finite; a strided view ignores its gaps and
  // counts r * cols + c.
  x[10] = std::numeric_limits<float>::max();
  x[11] = -std::numeric_limits<float>::max();
  const int64_t stride = cols + 5;
  auto s = testing::WithStride(x, rows, cols, stride, kNaN);
  EXPECT_EQ(find(s, stride), -1);
  s[2 * stride + 9] = -kInf;
  EXPECT_EQ(find(s, stride), 2 * cols + 9);
  // And the reference agrees on the whole array.
  const auto d = ToDouble(testing::WithoutStride(s, rows, cols, stride));
  EXPECT_EQ(ref::FindNonFinite(d.data(), rows * cols), 2 * cols + 9);
}

TEST_P(LogSoftmaxTest, RefusesBadArguments) {
  std::vector<float> logits(8);
  std::vector<double> z(2);
  std::vector<int32_t> ids(8);
  LogSoftmaxTopKArgs args;
  args.logits = Tensor::F32(logits.data(), 2, 4);
  args.log_z = MutableTensor::F64(z.data(), 2, 1);
  args.top_k = 6;  // top_k' = 4, but a [2, 6] view
  args.top_ids = MutableTensor::I32(ids.data(), 2, 6);
  EXPECT_DEATH(LogSoftmaxTopK(args), "top_ids: shape \\[2, 6\\], expected \\[2, 4\\]");
  args.top_k = 0;
  args.top_ids = {};
  args.targets = Tensor::I32(ids.data(), 2, 1);  // but no target_logprobs
  EXPECT_DEATH(LogSoftmaxTopK(args), "target_logprobs: dtype f64, expected f32|shape");
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(LogSoftmaxTest);

}  // namespace
}  // namespace deltaserve::kernels
