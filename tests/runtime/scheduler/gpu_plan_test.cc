// Fitting a deployment onto GPUs: the per-GPU figures of a two-layer model
// counted by hand from MODEL.md's shapes, the largest context from them, and
// the layout search on the tiny and the real K3 presets.
#include "runtime/scheduler/gpu_plan.h"

#include <string>

#include "gtest/gtest.h"
#include "runtime/model/config.h"
#include "runtime/model/presets.h"
#include "runtime/model/state_pool.h"
#include "runtime/model/weight_spec.h"

namespace deltaserve {
namespace {

// kimi-linear-tiny cut to one KDA layer and one MLA layer, both with a dense
// FFN: D 64, vocab 256, KDA 4 heads x 8 (low-rank gate), conv 4, MLA 4 heads
// (nope 8, rope 4, value 8, latent 16, plain q_proj), FFN width 96.
ModelConfig TwoLayers() {
  ModelConfig c = *PresetConfig("kimi-linear-tiny");
  c.num_layers = 2;
  c.layer_kinds = {LayerKind::kKda, LayerKind::kMla};
  c.first_k_dense_replace = 2;
  return c;
}

TEST(GpuPlanTest, PerGpuBytesByHand) {
  const ModelConfig c = TwoLayers();
  const int64_t D = 64, V = 256, H = 4, d = 8, HD = 32, K = 4, I = 96;
  const int64_t n = 4, P = 8, R = 4, Vd = 8, C = 16;
  const int64_t norms = 2 * D, dense = 3 * D * I;
  const int64_t kda = 3 * HD * D                                 // q, k, v
                      + 3 * HD * K                               // convolutions
                      + d * D                                    // f_a_proj
                      + HD * d                                   // f_b_proj
                      + H * D                                    // b_proj
                      + H                                        // A_log
                      + HD                                       // dt_bias
                      + d * D                                    // g_a_proj (low-rank output gate)
                      + HD * d                                   // g_b_proj
                      + d                                        // o_norm
                      + D * HD;                                  // o_proj
  const int64_t mla = n * (P + R) * D                            // q_proj
                      + (C + R) * D                              // kv_a_proj_with_mqa
                      + C                                        // kv_a_layernorm
                      + n * (P + Vd) * C                         // kv_b_proj
                      + D * n * Vd;                              // o_proj
  const int64_t stage0 = (V * D + kda + norms + dense) * 2;      // embedding + layer 0
  const int64_t stage1 = (mla + norms + dense + D + V * D) * 2;  // layer 1 + norm + LM head

  GpuBudget budget;
  budget.gpu_memory_bytes = int64_t{1} << 20;
  budget.workspace_bytes = 64 << 10;
  budget.sequences = 3;
  budget.bytes = PlanBytes{.weight = 2, .cache = 2};
  auto plan = StagesFromCounts(c, {1, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto layout = FitLayout(c, *plan, /*tp=*/1, budget);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->stages.size(), 2u);
  const GpuStageMemory& s0 = layout->stages[0];
  const GpuStageMemory& s1 = layout->stages[1];
  EXPECT_EQ(s0.weight_bytes, stage0);
  EXPECT_EQ(s1.weight_bytes, stage1);
  // KDA slot, float32: the state [H, d, d] and the conv tail [K - 1, 3 * HD].
  EXPECT_EQ(s0.kda_state_bytes, 3 * (H * d * d + (K - 1) * 3 * HD) * 4);
  EXPECT_EQ(s1.kda_state_bytes, 0);
  // A page: 64 tokens x (C + R) values x 2 B, on the stage with the MLA layer.
  EXPECT_EQ(s0.cache_bytes_per_page, 0);
  EXPECT_EQ(s1.cache_bytes_per_page, 64 * (C + R) * 2);
  EXPECT_EQ(s1.TotalBytes(100), stage1 + 2 * 64 * (C + R) * 2 + (64 << 10));
  EXPECT_EQ(s0.TotalBytes(100), stage0 + 3 * (H * d * d + (K - 1) * 3 * HD) * 4 + (64 << 10));
  // Whole pages in what stage 1 has left.
  const int64_t pages = ((int64_t{1} << 20) - stage1 - (64 << 10)) / (64 * (C + R) * 2);
  EXPECT_EQ(layout->max_context_tokens, pages * 64);
  EXPECT_EQ(layout->tightest_stage, 1u);

  // TP 2: KDA heads split, the latent whole on each rank.
  auto one = StagesFromCounts(c, {2});
  ASSERT_TRUE(one.ok());
  auto tp2 = FitLayout(c, *one, /*tp=*/2, budget);
  ASSERT_TRUE(tp2.ok()) << tp2.status();
  EXPECT_EQ(tp2->stages[0].kda_state_bytes, 3 * (H / 2 * d * d + (K - 1) * 3 * HD / 2) * 4);
  EXPECT_EQ(tp2->stages[0].cache_bytes_per_page, 64 * (C + R) * 2);
}

TEST(GpuPlanTest, ContextThatDoesNotFitSaysByHowMuch) {
  const ModelConfig c = TwoLayers();
  GpuBudget budget;
  budget.gpu_memory_bytes = int64_t{1} << 20;
  budget.workspace_bytes = 0;
  auto fits = EvaluateLayout(c, 1, 1, 64, budget);
  ASSERT_TRUE(fits.ok()) << fits.status();
  const int64_t most = fits->max_context_tokens;
  EXPECT_TRUE(EvaluateLayout(c, 1, 1, most, budget).ok());
  auto over = EvaluateLayout(c, 1, 1, most + 1, budget);
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(over.status()));
  const std::string message(over.status().message());
  EXPECT_NE(message.find("PP 1 x TP 1 does not fit in 1.00 MiB per GPU"), std::string::npos)
      << message;
  EXPECT_NE(message.find("more than there is"), std::string::npos) << message;
}

TEST(GpuPlanTest, SmallestLayoutOfTinyIsOneGpu) {
  auto c = PresetConfig("k3-tiny");
  ASSERT_TRUE(c.ok());
  GpuBudget budget;
  budget.gpu_memory_bytes = int64_t{1} << 30;
  budget.workspace_bytes = int64_t{256} << 20;
  auto layout = SmallestLayout(*c, 4096, budget);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->gpus(), 1);
  EXPECT_EQ(layout->Nodes(8), 1);
  EXPECT_GE(layout->max_context_tokens, 4096);
}

// Real K3 at 141 GiB: more than a node's 8 GPUs (its weights alone are
// ~1.45 TB), and each GPU of the layout found stays within the budget.
TEST(GpuPlanTest, K3NeedsMoreThanOneNode) {
  auto k3 = PresetConfig("k3");
  ASSERT_TRUE(k3.ok()) << k3.status();
  GpuBudget budget;
  budget.gpu_memory_bytes = int64_t{141} << 30;
  auto layout = SmallestLayout(*k3, 1 << 20, budget);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_GT(layout->gpus(), 8);
  EXPECT_GT(layout->Nodes(8), 1);
  EXPECT_EQ(layout->tp, 8);
  EXPECT_GE(layout->max_context_tokens, 1 << 20);
  for (const GpuStageMemory& m : layout->stages) {
    EXPECT_LE(m.TotalBytes(layout->max_context_tokens), budget.gpu_memory_bytes);
  }
  // One stage fewer does not fit.
  auto fewer = EvaluateLayout(*k3, layout->pp - 1, 8, 1 << 20, budget);
  EXPECT_TRUE(absl::IsResourceExhausted(fewer.status())) << fewer.status();
  // A fixed TP: stages of TP 2 across nodes, more of them.
  auto tp2 = SmallestLayout(*k3, 1 << 20, budget, /*pp=*/0, /*tp=*/2);
  ASSERT_TRUE(tp2.ok()) << tp2.status();
  EXPECT_EQ(tp2->tp, 2);
  EXPECT_GT(tp2->pp, layout->pp);
}

TEST(GpuPlanTest, NothingFitsIsRefused) {
  auto k3 = PresetConfig("k3");
  ASSERT_TRUE(k3.ok());
  GpuBudget budget;
  budget.gpu_memory_bytes = int64_t{1} << 30;  // 1 GiB: not even one layer's experts
  auto layout = SmallestLayout(*k3, 4096, budget);
  ASSERT_FALSE(layout.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(layout.status()));
  const std::string message(layout.status().message());
  EXPECT_NE(message.find("no layout of up to 744 GPUs"), std::string::npos) << message;
  EXPECT_NE(message.find("PP 93 x TP 8"), std::string::npos) << message;
}

TEST(GpuPlanTest, BadBudgetsAreErrors) {
  const ModelConfig c = TwoLayers();
  auto plan = StagesFromCounts(c, {2});
  ASSERT_TRUE(plan.ok());
  GpuBudget budget;
  EXPECT_FALSE(FitLayout(c, *plan, 1, budget).ok());  // no memory
  budget.gpu_memory_bytes = 1 << 30;
  EXPECT_TRUE(FitLayout(c, *plan, 1, budget).ok());
  EXPECT_FALSE(FitLayout(c, *plan, 3, budget).ok());  // 3 does not divide 8
  budget.sequences = 0;
  EXPECT_FALSE(FitLayout(c, *plan, 1, budget).ok());
}

TEST(ByteSizeTextTest, BinaryUnits) {
  EXPECT_EQ(ByteSizeText(512), "512 B");
  EXPECT_EQ(ByteSizeText(int64_t{141} << 30), "141.00 GiB");
  EXPECT_EQ(ByteSizeText(int64_t{3} << 39), "1.50 TiB");
}

}  // namespace
}  // namespace deltaserve
