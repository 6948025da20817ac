// A rank's shard as the loader builds it against the planner's figures for
// the same stage: both read the tensor-parallel split written on each
// TensorSpec (the loader's slices, the planner's element counts), and this
// holds what the loader really keeps to what the planner reports, as well as
// the per-sequence state sizes.
#include "runtime/model/shard.h"

#include "absl/strings/str_cat.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/state_pool.h"
#include "runtime/model/weights.h"
#include "runtime/scheduler/stage_plan.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

// Bytes the loader holds (matrices as stored, vectors float32), without what
// it derives (the transposed MLA key up-projection is a copy of kv_b_proj
// rows).
int64_t HeldBytes(const ModelWeights& w) {
  int64_t bytes = 0;
  for (const auto& [dtype, n] : CountWeightBytes(w).by_dtype) bytes += n;
  for (const LayerWeights& l : w.layers) bytes -= l.mla.w_uk_t.bytes();
  return bytes;
}

class ShardTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardTest, LoadedShardsMatchThePlan) {
  const std::string dir = testing::GoldenPath("model/" + GetParam());
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  auto opened = Checkpoint::Open(dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const std::shared_ptr<const Checkpoint> checkpoint = std::move(*opened);
  int64_t checkpoint_bytes = 0;
  int64_t a_log_padding_bytes = 0;
  for (const auto& [name, view] : checkpoint->tensors()) {
    checkpoint_bytes += view->nbytes;
    if (name.ends_with("A_log")) {
      a_log_padding_bytes += (view->NumElements() - config->kda.num_heads) * 4;
    }
  }
  const int64_t context = 300;
  for (int pp : {1, 2, 3}) {
    for (int tp : {1, 2, 4}) {
      SCOPED_TRACE(absl::StrCat("pp ", pp, " tp ", tp));
      auto plan = PlanStages(*config, pp, context);
      ASSERT_TRUE(plan.ok()) << plan.status();
      // The loader holds every weight in float32.
      auto report = ReportPlan(*config, *plan, tp, context, PlanBytes{});
      ASSERT_TRUE(report.ok()) << report.status();
      int64_t read_by_all = 0;
      for (int stage = 0; stage < pp; ++stage) {
        for (int rank = 0; rank < tp; ++rank) {
          ModelShard requested;
          requested.layer_begin = plan->stages[stage].begin;
          requested.layer_end = plan->stages[stage].end;
          requested.tp_rank = rank;
          requested.tp_size = tp;
          auto shard = ResolveShard(*config, requested);
          ASSERT_TRUE(shard.ok()) << shard.status();
          int64_t bytes_read = 0;
          auto weights = LoadWeights(*config, checkpoint, *shard, &bytes_read);
          ASSERT_TRUE(weights.ok()) << weights.status();
          read_by_all += bytes_read;
          // The golden models have as many experts as any tp here divides,
          // so every rank holds what the report says rank 0 does.
          EXPECT_EQ(HeldBytes(*weights), (*report)[stage].weight_bytes_per_rank)
              << "stage " << stage << " rank " << rank;
          EXPECT_EQ(KdaSlotBytes(LocalConfig(*config, *shard), *shard),
                    (*report)[stage].kda_state_bytes_per_sequence);
        }
      }
      // With one TP rank every tensor is read exactly once, except the A_log
      // padding (K3 pads to 128 entries) beyond the heads.
      if (tp == 1) {
        EXPECT_EQ(read_by_all, checkpoint_bytes - a_log_padding_bytes);
      } else {
        EXPECT_GT(read_by_all, checkpoint_bytes - a_log_padding_bytes);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, ShardTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);
INSTANTIATE_TEST_SUITE_P(GoldenMxfp4, ShardTest, ::testing::ValuesIn(testing::kMxfp4GoldenModels),
                         testing::GoldenTestName);

TEST(ShardTest, RefusesWhatCannotBeSplit) {
  auto config = LoadModelConfig(testing::GoldenPath("model/k3-tiny"));
  ASSERT_TRUE(config.ok());
  ModelShard shard;
  shard.tp_size = 3;
  auto resolved = ResolveShard(*config, shard);
  ASSERT_FALSE(resolved.ok());
  EXPECT_NE(resolved.status().message().find("KDA heads"), std::string::npos) << resolved.status();
  shard.tp_size = 1;
  shard.layer_begin = 5;
  shard.layer_end = 12;
  EXPECT_FALSE(ResolveShard(*config, shard).ok());
}

}  // namespace
}  // namespace deltaserve
