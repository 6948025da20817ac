// The whole model against the float64 golden logits of ../shared/golden/model,
// and the trained models of models/ against their PyTorch reference logits.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kernels/gemm.h"
#include "runtime/model/model.h"
#include "tests/model_runs.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

class ModelGoldenTest : public ::testing::TestWithParam<std::string> {};

// Logits of the golden prompt of model `name`, loaded with `options`.
std::vector<float> LogitsWith(const std::string& name, const testing::GoldenLogits& golden,
                              const ModelOptions& options) {
  auto model = Model::Load(testing::ModelPath(name), {}, nullptr, options);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  const std::vector<int32_t> tokens(golden.tokens.begin(), golden.tokens.end());
  return testing::OneShotLogits(**model, tokens);
}

// Measured 0.072 (k3-tiny), 0.041 (kimi-linear-tiny), 0.0056 and 0.0007 (the
// -eps models); rounded up.
constexpr double kBf16CacheBound = 0.1;
// Measured 0.44 (k3-tiny), 0.27 (kimi-linear-tiny), 0.37 and 0.26 (the -eps
// models), 0.50 (k3-tiny-mxfp4); rounded up.
constexpr double kBf16ComputeBound = 0.6;

TEST_P(ModelGoldenTest, LogitsMatchFloat64Reference) {
  const testing::GoldenLogits golden = testing::LoadGoldenLogits(GetParam());
  ASSERT_FALSE(golden.tokens.empty());
  auto model = Model::Load(testing::ModelPath(GetParam()));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> tokens(golden.tokens.begin(), golden.tokens.end());
  const std::vector<float> logits_vec = testing::OneShotLogits(**model, tokens);
  ASSERT_FALSE(logits_vec.empty());
  const std::vector<float>* logits = &logits_vec;
  // float32 compute against float64 from the same (bf16-stored) weights.
  const double err = testing::RelL2(*logits, golden.logits);
  EXPECT_LE(err, 1e-4);
  std::printf("%s: relative L2 error of all logits %.3g\n", GetParam().c_str(), err);

  const int64_t V = (*model)->config().vocab_size;
  const int64_t T = static_cast<int64_t>(golden.tokens.size());
  int64_t compared = 0;
  for (int64_t t = 0; t < T; ++t) {
    const double* want = golden.logits.data() + t * V;
    std::vector<int64_t> order(V);
    for (int64_t i = 0; i < V; ++i) order[i] = i;
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](int64_t a, int64_t b) { return want[a] > want[b]; });
    if (want[order[0]] - want[order[1]] <= 1e-3) continue;
    const float* got = logits->data() + t * V;
    EXPECT_EQ(std::max_element(got, got + V) - got, order[0]) << "position " << t;
    ++compared;
  }
  EXPECT_GT(compared, T / 2);
}

// The MLA cache in bf16 (--kv-cache-dtype bf16): keys and values rounded to
// 8 significant bits move the logits by far more than float32 rounding, and
// by much less than the gap between the top two tokens at most positions.
// docs/numerics.md has the measured figures; the bound is theirs, rounded up.
TEST_P(ModelGoldenTest, Bf16CacheStaysNearFloat64Reference) {
  const testing::GoldenLogits golden = testing::LoadGoldenLogits(GetParam());
  ModelOptions options;
  options.kv_cache_dtype = kernels::DType::kBF16;
  const std::vector<float> logits = LogitsWith(GetParam(), golden, options);
  ASSERT_EQ(logits.size(), golden.logits.size());
  const double err = testing::RelL2(logits, golden.logits);
  const int64_t T = static_cast<int64_t>(golden.tokens.size());
  const int64_t V = static_cast<int64_t>(golden.logits.size()) / T;
  int64_t same = 0;
  for (int64_t t = 0; t < T; ++t) {
    const double* want = golden.logits.data() + t * V;
    const float* got = logits.data() + t * V;
    same += (std::max_element(got, got + V) - got) == (std::max_element(want, want + V) - want);
  }
  std::printf(
      "%s, bf16 MLA cache: relative L2 error of all logits %.3g, top token equal at %lld "
      "of %lld positions\n",
      GetParam().c_str(), err, static_cast<long long>(same), static_cast<long long>(T));
  EXPECT_LE(err, kBf16CacheBound);
}

// The opt-in bf16 compute (--compute-dtype bf16): prefill GEMMs on bf16
// weights round their activations to bf16 (8 significant bits), as bf16
// units need. docs/numerics.md has the measured figures; the bound is theirs,
// rounded up. Where the CPU has no bf16 matmul the model computes in float32
// and the float32 bound holds.
TEST_P(ModelGoldenTest, Bf16ComputeStaysNearFloat64Reference) {
  const testing::GoldenLogits golden = testing::LoadGoldenLogits(GetParam());
  ModelOptions options;
  options.compute_dtype = kernels::DType::kBF16;
  const std::vector<float> logits = LogitsWith(GetParam(), golden, options);
  ASSERT_EQ(logits.size(), golden.logits.size());
  const double err = testing::RelL2(logits, golden.logits);
  std::printf("%s, bf16 compute (%s): relative L2 error of all logits %.3g\n", GetParam().c_str(),
              kernels::Bf16ComputeAvailable() ? "bf16 matmul" : "float32", err);
  EXPECT_LE(err, kernels::Bf16ComputeAvailable() ? kBf16ComputeBound : 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Golden, ModelGoldenTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);
INSTANTIATE_TEST_SUITE_P(GoldenMxfp4, ModelGoldenTest,
                         ::testing::ValuesIn(testing::kMxfp4GoldenModels), testing::GoldenTestName);
INSTANTIATE_TEST_SUITE_P(GoldenEps, ModelGoldenTest, ::testing::ValuesIn(testing::kEpsGoldenModels),
                         testing::GoldenTestName);
INSTANTIATE_TEST_SUITE_P(Trained, ModelGoldenTest, ::testing::ValuesIn(testing::kTrainedModels),
                         testing::GoldenTestName);

}  // namespace
}  // namespace deltaserve
