// The whole model against the float64 golden logits of ../shared/golden/model.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "runtime/model/model.h"
#include "tests/model_runs.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

class ModelGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelGoldenTest, LogitsMatchFloat64Reference) {
  const testing::GoldenLogits golden = testing::LoadGoldenLogits(GetParam());
  ASSERT_FALSE(golden.tokens.empty());
  auto model = Model::Load(testing::GoldenPath("model/" + GetParam()));
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

INSTANTIATE_TEST_SUITE_P(Golden, ModelGoldenTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);
INSTANTIATE_TEST_SUITE_P(GoldenEps, ModelGoldenTest, ::testing::ValuesIn(testing::kEpsGoldenModels),
                         testing::GoldenTestName);

}  // namespace
}  // namespace deltaserve
