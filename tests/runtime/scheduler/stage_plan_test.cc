// The pipeline stage planner and its per-stage figures, on the real model
// sizes: the public Kimi-Linear-48B-A3B config and a K3 config with the
// sizes MODEL.md states. Expected figures are computed here from MODEL.md's
// rules and memory facts, not from the planner's code.
#include "runtime/scheduler/stage_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/config.h"
#include "runtime/model/presets.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_spec.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

// moonshotai/Kimi-Linear-48B-A3B-Instruct config.json (the public release;
// values as in the published file, keys the runtime does not read dropped).
constexpr char kKimiLinearJson[] = R"({
  "architectures": ["KimiLinearForCausalLM"],
  "model_type": "kimi_linear",
  "vocab_size": 163840,
  "hidden_size": 2304,
  "intermediate_size": 9216,
  "num_hidden_layers": 27,
  "num_attention_heads": 32,
  "num_key_value_heads": 32,
  "head_dim": 72,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-05,
  "tie_word_embeddings": false,
  "q_lora_rank": null,
  "kv_lora_rank": 512,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "v_head_dim": 128,
  "mla_use_nope": true,
  "first_k_dense_replace": 1,
  "moe_layer_freq": 1,
  "num_experts": 256,
  "num_experts_per_token": 8,
  "num_shared_experts": 1,
  "moe_intermediate_size": 1024,
  "moe_renormalize": true,
  "moe_router_activation_func": "sigmoid",
  "routed_scaling_factor": 2.446,
  "use_grouped_topk": true,
  "num_expert_group": 1,
  "topk_group": 1,
  "num_nextn_predict_layers": 0,
  "model_max_length": 1048576,
  "linear_attn_config": {
    "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
    "head_dim": 128,
    "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
    "num_heads": 32,
    "short_conv_kernel_size": 4
  },
  "torch_dtype": "bfloat16"
})";

// Kimi K3 in its real layout: MODEL.md's sizes (93 layers, hidden 7168,
// KDA,KDA,KDA,MLA with the last two MLA, 96 KDA heads of 128, latent
// 512 + 64, blocks of 12) and, for the rest, the values public K3 configs
// carry (96 MLA heads, q-LoRA 1536, 896 experts of width 3072 in a latent of
// 3584, 16 active + 2 shared, dense width 33792). CountParameters gives
// 2.78T total / 104B active for it, as MODEL.md states (checked below).
constexpr char kK3Json[] = R"({
  "architectures": ["KimiK3ForConditionalGeneration"],
  "model_type": "kimi_k3",
  "text_config": {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "vocab_size": 163840,
    "hidden_size": 7168,
    "intermediate_size": 33792,
    "num_hidden_layers": 93,
    "num_attention_heads": 96,
    "num_key_value_heads": 96,
    "hidden_act": "situ",
    "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 1048576,
    "tie_word_embeddings": false,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": true,
    "mla_use_output_gate": true,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_experts": 896,
    "num_experts_per_token": 16,
    "num_shared_experts": 2,
    "moe_intermediate_size": 3072,
    "routed_expert_hidden_size": 3584,
    "latent_moe_use_norm": true,
    "moe_renormalize": true,
    "moe_router_activation_func": "sigmoid",
    "routed_scaling_factor": 1.0,
    "use_grouped_topk": true,
    "num_expert_group": 1,
    "topk_group": 1,
    "attn_res_block_size": 12,
    "linear_attn_config": {
      "num_heads": 96,
      "head_dim": 128,
      "short_conv_kernel_size": 4,
      "use_full_rank_gate": true,
      "gate_lower_bound": -5.0,
      "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25,
                     26, 27, 29, 30, 31, 33, 34, 35, 37, 38, 39, 41, 42, 43, 45, 46, 47, 49,
                     50, 51, 53, 54, 55, 57, 58, 59, 61, 62, 63, 65, 66, 67, 69, 70, 71, 73,
                     74, 75, 77, 78, 79, 81, 82, 83, 85, 86, 87, 89, 90, 91],
      "full_attn_layers": [4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68,
                           72, 76, 80, 84, 88, 92, 93]
    }
  },
  "torch_dtype": "bfloat16"
})";

const ModelConfig& KimiLinear() {
  static const ModelConfig* config = [] {
    auto parsed = ParseModelConfig(kKimiLinearJson, "Kimi-Linear-48B-A3B config.json");
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return new ModelConfig(*parsed);
  }();
  return *config;
}

const ModelConfig& K3() {
  static const ModelConfig* config = [] {
    auto parsed = ParseModelConfig(kK3Json, "K3 config.json");
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return new ModelConfig(*parsed);
  }();
  return *config;
}

constexpr int64_t kContext = 4096;

std::vector<StageReport> Report(const ModelConfig& c, const StagePlan& plan, int tp,
                                int64_t context, const PlanBytes& bytes) {
  auto reports = ReportPlan(c, plan, tp, context, bytes);
  EXPECT_TRUE(reports.ok()) << reports.status();
  return reports.ok() ? *reports : std::vector<StageReport>{};
}

StagePlan Plan(const ModelConfig& c, int pp, int64_t context = kContext,
               const PlanOptions& options = {}) {
  auto plan = PlanStages(c, pp, context, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : StagePlan{};
}

StagePlan Counts(const ModelConfig& c, const std::vector<int64_t>& counts) {
  auto plan = StagesFromCounts(c, counts);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : StagePlan{};
}

int64_t Sum(const std::vector<StageReport>& reports, int64_t StageReport::*field) {
  int64_t sum = 0;
  for (const StageReport& r : reports) sum += r.*field;
  return sum;
}

double MaxCost(const ModelConfig& c, const StagePlan& plan, int64_t tokens) {
  double max_cost = 0;
  for (const StageRange& r : plan.stages) max_cost = std::max(max_cost, StageCost(c, r, tokens));
  return max_cost;
}

double TotalCost(const ModelConfig& c, int64_t tokens) {
  return StageCost(c, StageRange{0, c.num_layers}, tokens);
}

int64_t AlignedBoundaries(const ModelConfig& c, const StagePlan& plan) {
  int64_t aligned = 0;
  for (size_t s = 1; s < plan.stages.size(); ++s) {
    aligned += plan.stages[s].begin % c.attn_res_block_size == 0;
  }
  return aligned;
}

TEST(RealConfigsTest, MatchModelMd) {
  const ModelConfig& k3 = K3();
  ASSERT_EQ(k3.num_layers, 93);
  EXPECT_EQ(std::count(k3.layer_kinds.begin(), k3.layer_kinds.end(), LayerKind::kKda), 69);
  EXPECT_EQ(k3.layer_kinds[91], LayerKind::kMla);
  EXPECT_EQ(k3.layer_kinds[92], LayerKind::kMla);
  EXPECT_EQ(k3.MlaCacheWidth(), 576);
  // MODEL.md: 2.78T parameters, 104B active.
  const ParameterCount k3_params = CountParameters(k3);
  EXPECT_NEAR(k3_params.total / 1e12, 2.78, 0.01);
  EXPECT_NEAR(k3_params.active_per_token / 1e9, 104, 1.5);

  const ModelConfig& kl = KimiLinear();
  ASSERT_EQ(kl.num_layers, 27);
  EXPECT_EQ(std::count(kl.layer_kinds.begin(), kl.layer_kinds.end(), LayerKind::kKda), 20);
  // "48B (3B active)".
  const ParameterCount kl_params = CountParameters(kl);
  EXPECT_NEAR(kl_params.total / 1e9, 48, 2);
  EXPECT_NEAR(kl_params.active_per_token / 1e9, 3, 0.5);
}

// --- memory figures --------------------------------------------------------

// The k3 preset (what `plan --model k3` reads) is this config with its
// routed experts in MXFP4, as MODEL.md says real K3 stores them.
TEST(RealConfigsTest, K3PresetIsTheRealConfigWithMxfp4Experts) {
  auto preset = PresetConfig("k3");
  ASSERT_TRUE(preset.ok()) << preset.status();
  ModelConfig expected = K3();
  expected.quantization = RoutedExpertsMxfp4();
  EXPECT_EQ(ModelConfigToJson(*preset), ModelConfigToJson(expected));
  const ParameterCount count = CountParameters(*preset);
  EXPECT_NEAR(static_cast<double>(count.total), 2.78e12, 0.01e12);
  EXPECT_NEAR(static_cast<double>(count.active_per_token), 104e9, 1.5e9);  // as above
  auto again = ParseModelConfig(ModelConfigToJson(*preset), "k3");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ModelConfigToJson(*again), ModelConfigToJson(*preset));
  // Too large to write: make-model's list leaves it out.
  for (const std::string& name : PresetNames()) EXPECT_NE(name, "k3");
}

TEST(ReportPlanTest, K3MlaCacheMatchesModelMd) {
  const PlanBytes bf16{.weight = 2, .cache = 2};
  const int64_t million = 1 << 20;
  for (int pp = 1; pp <= 8; ++pp) {
    const auto reports = Report(K3(), Plan(K3(), pp), 1, million, bf16);
    // 24 MLA layers x (512 + 64) x 2 B = 27,648 B per token, about 29 GB at 1M.
    EXPECT_EQ(Sum(reports, &StageReport::mla_cache_bytes), int64_t{27648} * million) << "pp " << pp;
    EXPECT_EQ(Sum(reports, &StageReport::mla_layers), 24);
  }
  const auto one = Report(K3(), Plan(K3(), 1), 1, million, bf16);
  EXPECT_NEAR(one[0].mla_cache_bytes / 1e9, 29, 0.1);
  // The whole latent cache sits on every rank of a TP group.
  const auto tp4 = Report(K3(), Plan(K3(), 1), 4, million, bf16);
  EXPECT_EQ(tp4[0].mla_cache_bytes, one[0].mla_cache_bytes);
}

TEST(ReportPlanTest, K3KdaStateMatchesModelMd) {
  const PlanBytes bytes;  // float32 state
  const int64_t recurrent = int64_t{69} * 96 * 128 * 128 * 4;
  ASSERT_EQ(recurrent, 434110464);
  const int64_t conv = int64_t{69} * (4 - 1) * 3 * 96 * 128 * 4;  // about 30 MB
  EXPECT_NEAR(conv / 1e6, 30, 1);
  for (int pp = 1; pp <= 8; ++pp) {
    const StagePlan plan = Plan(K3(), pp);
    const auto tp1 = Report(K3(), plan, 1, kContext, bytes);
    EXPECT_EQ(Sum(tp1, &StageReport::kda_state_bytes_per_sequence), recurrent + conv)
        << "pp " << pp;
    EXPECT_EQ(Sum(tp1, &StageReport::kda_layers), 69);
    // Heads split four ways: each rank holds a quarter of every stage's state.
    const auto tp4 = Report(K3(), plan, 4, kContext, bytes);
    for (size_t s = 0; s < tp1.size(); ++s) {
      EXPECT_EQ(tp4[s].kda_state_bytes_per_sequence * 4, tp1[s].kda_state_bytes_per_sequence);
    }
  }
}

// Bank entries after layers [0, end): the embedding plus one finished block
// sum per block start passed, counted the slow way.
int64_t BankEntries(int64_t end, int64_t block) {
  int64_t n = 0;
  for (int64_t i = 0; i < end; ++i) n += i % block == 0 ? 1 : 0;
  return n;
}

TEST(ReportPlanTest, K3BoundaryCarriesTheBank) {
  const PlanBytes bytes;
  // After 48 layers the bank holds the embedding and the sums of blocks
  // 0-11, 12-23, 24-35: 4 entries, plus the running prefix.
  const auto at48 = Report(K3(), Counts(K3(), {48, 45}), 1, kContext, bytes);
  EXPECT_EQ(at48[0].boundary_bytes_per_token, (1 + 4) * 7168 * 4);
  EXPECT_EQ(at48[1].boundary_bytes_per_token, 0);
  // The bank grows with depth, by one entry at each block start.
  for (int64_t end : {1, 11, 12, 13, 24, 47, 49, 60, 61, 84, 85, 92}) {
    const auto r = Report(K3(), Counts(K3(), {end, 93 - end}), 1, kContext, bytes);
    EXPECT_EQ(r[0].boundary_bytes_per_token, (1 + BankEntries(end, 12)) * 7168 * 4)
        << "boundary after " << end << " layers";
  }
  // Several stages: each boundary counts from layer 0, not from its stage.
  const auto four =
      Report(K3(), Counts(K3(), {20, 30, 25, 18}), 1, kContext, PlanBytes{.activation = 2});
  EXPECT_EQ(four[0].boundary_bytes_per_token, (1 + 2) * 7168 * 2);  // 0, 12
  EXPECT_EQ(four[1].boundary_bytes_per_token, (1 + 5) * 7168 * 2);  // ..., 48
  EXPECT_EQ(four[2].boundary_bytes_per_token, (1 + 7) * 7168 * 2);  // ..., 72
  EXPECT_EQ(four[3].boundary_bytes_per_token, 0);
}

TEST(ReportPlanTest, KimiLinearBoundaryIsTheResidualStream) {
  const auto r = Report(KimiLinear(), Plan(KimiLinear(), 4), 2, kContext, PlanBytes{});
  ASSERT_EQ(r.size(), 4u);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(r[s].boundary_bytes_per_token, 2304 * 4);
  EXPECT_EQ(r[3].boundary_bytes_per_token, 0);
}

int64_t AllElements(const ModelConfig& c) {
  int64_t n = 0;
  for (const TensorSpec& spec : ExpectedTensors(c)) n += spec.NumElements();
  return n;
}

TEST(ReportPlanTest, WeightsAtTp1AreTheWholeCheckpoint) {
  const PlanBytes bf16{.weight = 2, .cache = 2};
  const int64_t kimi_linear = AllElements(KimiLinear()) * 2;
  // K3 stores A_log padded to 128 entries per layer; only the 96 heads'
  // values are held.
  const int64_t k3 = (AllElements(K3()) - 69 * (128 - 96)) * 2;
  for (int pp = 1; pp <= 8; ++pp) {
    EXPECT_EQ(Sum(Report(KimiLinear(), Plan(KimiLinear(), pp), 1, kContext, bf16),
                  &StageReport::weight_bytes_per_rank),
              kimi_linear)
        << "pp " << pp;
    EXPECT_EQ(
        Sum(Report(K3(), Plan(K3(), pp), 1, kContext, bf16), &StageReport::weight_bytes_per_rank),
        k3)
        << "pp " << pp;
  }
  // Every weight converted to float32: twice the bf16 figure.
  EXPECT_EQ(Report(KimiLinear(), Plan(KimiLinear(), 1), 1, kContext, PlanBytes{.weight = 4})[0]
                .weight_bytes_per_rank,
            kimi_linear * 2);
}

// As stored (the default), one TP rank of every stage holds the checkpoint's
// bytes, counted from the golden files themselves: bf16, f32 and, in
// k3-tiny-mxfp4, the routed experts' packed codes and scales; except that
// vectors (1-D, one-row or 3-D tensors) are held as float32 (HeldAsMatrix),
// and K3's A_log padding beyond the heads is not held.
TEST(ReportPlanTest, AsStoredWeightsAreTheCheckpointBytes) {
  for (const char* model : {"k3-tiny", "kimi-linear-tiny", "k3-tiny-mxfp4"}) {
    SCOPED_TRACE(model);
    const std::string dir = testing::GoldenPath(std::string("model/") + model);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    auto checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    int64_t held = 0, packed = 0;
    for (const auto& [name, view] : (*checkpoint)->tensors()) {
      const bool matrix = view->shape.size() == 2 && view->shape[0] > 1;
      held += matrix ? static_cast<int64_t>(view->nbytes) : view->NumElements() * 4;
      if (name.ends_with("A_log")) held -= (view->NumElements() - config->kda.num_heads) * 4;
      if (name.ends_with(".weight_packed")) ++packed;
    }
    EXPECT_EQ(packed, config->quantization.mxfp4 ? 8 * 8 * 3 : 0);
    for (int pp : {1, 2, 3}) {
      EXPECT_EQ(Sum(Report(*config, Plan(*config, pp), 1, kContext, PlanBytes{}),
                    &StageReport::weight_bytes_per_rank),
                held)
          << "pp " << pp;
    }
  }
}

// Real K3 with its routed experts in MXFP4: each expert value costs 4 bits
// plus an 8-bit scale per 32 (17/32 B) instead of bf16's 2 B; nothing else
// changes.
TEST(ReportPlanTest, K3Mxfp4ExpertsAreSeventeenThirtySecondsOfAByte) {
  ModelConfig mxfp4 = K3();
  mxfp4.quantization = RoutedExpertsMxfp4();
  const int64_t moe_layers = 92, E = 896, Z = 3584, I = 3072;
  const int64_t expert_values = moe_layers * E * 3 * Z * I;
  const int64_t bf16 = Sum(Report(K3(), Plan(K3(), 1), 1, kContext, PlanBytes{}),
                           &StageReport::weight_bytes_per_rank);
  const int64_t packed = Sum(Report(mxfp4, Plan(mxfp4, 1), 1, kContext, PlanBytes{}),
                             &StageReport::weight_bytes_per_rank);
  EXPECT_EQ(bf16 - packed, expert_values * 2 - expert_values / 32 * 17);
  std::printf("K3 weights as stored: %.3f TB with bf16 experts, %.3f TB with MXFP4 experts\n",
              bf16 * 1e-12, packed * 1e-12);
  // Under TP 8 each rank holds its 896 / 8 experts of a layer whole (e % 8):
  // 1/8 of the stage's saving.
  const StagePlan plan = Counts(mxfp4, {31, 31, 31});
  const auto bf16_tp8 = Report(K3(), plan, 8, kContext, PlanBytes{});
  const auto mxfp4_tp8 = Report(mxfp4, plan, 8, kContext, PlanBytes{});
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const int64_t stage_moe_layers = plan.stages[s].size() - (s == 0 ? 1 : 0);
    const int64_t rank_values = stage_moe_layers * (E / 8) * 3 * Z * I;
    EXPECT_EQ(bf16_tp8[s].weight_bytes_per_rank - mxfp4_tp8[s].weight_bytes_per_rank,
              rank_values * 2 - rank_values / 32 * 17)
        << "stage " << s;
  }
}

TEST(ReportPlanTest, WeightsPerRankShrinkWithTp) {
  for (const ModelConfig* c : {&KimiLinear(), &K3()}) {
    for (int pp : {1, 3, 8}) {
      const StagePlan plan = Plan(*c, pp);
      const auto tp1 = Report(*c, plan, 1, kContext, PlanBytes{});
      const auto tp2 = Report(*c, plan, 2, kContext, PlanBytes{});
      const auto tp4 = Report(*c, plan, 4, kContext, PlanBytes{});
      for (size_t s = 0; s < tp1.size(); ++s) {
        const int64_t whole = tp1[s].weight_bytes_per_rank;
        EXPECT_GT(tp2[s].weight_bytes_per_rank, whole / 2) << c->model_type << " stage " << s;
        EXPECT_LT(tp2[s].weight_bytes_per_rank, whole) << c->model_type << " stage " << s;
        EXPECT_LT(tp4[s].weight_bytes_per_rank, tp2[s].weight_bytes_per_rank);
      }
    }
  }
}

TEST(ReportPlanTest, TinyK3FirstStageWeightsByHand) {
  // k3-tiny: D 64, vocab 256, KDA 4 heads x 8 (full-rank gate), conv 4,
  // dense width 96. Stage 0 = embedding + layer 0 (KDA, dense FFN), tp 2.
  auto config = PresetConfig("k3-tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t D = 64, H = 4, d = 8, HD = 32, K = 4, I = 96, V = 256, tp = 2;
  const int64_t split = 3 * HD * D     // q, k, v
                        + 3 * HD * K   // convolutions
                        + HD * d       // f_b_proj
                        + H * D        // b_proj
                        + H            // A_log (H entries)
                        + HD           // dt_bias
                        + HD * D       // g_proj
                        + D * HD       // o_proj
                        + 3 * D * I;   // dense gate/up/down
  const int64_t replicated = d * D     // f_a_proj
                             + d       // o_norm
                             + 2 * D   // input / post-attention norms
                             + 4 * D   // self_attention_res_*, mlp_res_*
                             + V * D;  // embedding
  const auto r = Report(*config, Counts(*config, {1, 8}), tp, 16, PlanBytes{.weight = 4});
  EXPECT_EQ(r[0].weight_bytes_per_rank, (split / tp + replicated) * 4);
  // As held: matrices bf16 as stored; vectors float32: the convolutions,
  // A_log, dt_bias and o_norm (stored so), the norms and residual mixes
  // (stored bf16, widened at load).
  const int64_t f32_split = 3 * HD * K + H + HD, f32_replicated = d + 2 * D + 4 * D;
  const auto stored = Report(*config, Counts(*config, {1, 8}), tp, 16, PlanBytes{});
  EXPECT_EQ(stored[0].weight_bytes_per_rank,
            (split / tp + replicated) * 2 + (f32_split / tp + f32_replicated) * 2);
  EXPECT_EQ(r[0].kda_layers, 1);
  EXPECT_EQ(r[0].kda_state_bytes_per_sequence, (H / tp) * d * d * 4 + 3 * 3 * (H / tp) * d * 4);
  EXPECT_EQ(r[0].boundary_bytes_per_token, (1 + 1) * D * 4);
}

TEST(ReportPlanTest, RoutedExpertsAreWholeOnRankEModTp) {
  // tp 4: with 4 experts rank 0 holds expert 0; with 5 it also holds expert
  // 4 (the largest rank); with 8 it holds 0 and 4 again.
  auto base = PresetConfig("k3-tiny");
  ASSERT_TRUE(base.ok());
  auto weights = [&](int64_t experts, const PlanBytes& bytes, int64_t width = 24) {
    ModelConfig c = *base;
    c.num_experts = experts;
    c.moe_intermediate_size = width;
    if (bytes.weight == PlanBytes::kAsStored) c.quantization = RoutedExpertsMxfp4();
    return Report(c, Counts(c, {9}), 4, 16, bytes)[0].weight_bytes_per_rank;
  };
  const int64_t moe_layers = 8, D = 64, Z = 32, I = 24;
  const int64_t expert = 3 * Z * I;
  const int64_t router = D + 1;  // gate.weight row + correction bias, replicated
  const PlanBytes f32{.weight = 4};
  EXPECT_EQ(weights(5, f32) - weights(4, f32), moe_layers * (expert + router) * 4);
  EXPECT_EQ(weights(8, f32) - weights(5, f32), moe_layers * 3 * router * 4);
  // MXFP4 as stored (width 32, so rows of whole groups): an expert of
  // 3 * 32 * 32 values is 3 * 32 * (16 code bytes + 1 scale byte); the router
  // row bf16, its bias f32.
  const int64_t mxfp4_expert = 3 * 32 * (16 + 1), stored_router = D * 2 + 4;
  EXPECT_EQ(weights(5, PlanBytes{}, 32) - weights(4, PlanBytes{}, 32),
            moe_layers * (mxfp4_expert + stored_router));
  EXPECT_EQ(weights(8, PlanBytes{}, 32) - weights(5, PlanBytes{}, 32),
            moe_layers * 3 * stored_router);
}

// --- cost model ------------------------------------------------------------

TEST(LayerCostTest, KdaLinearMlaQuadraticMoeByActiveExperts) {
  const ModelConfig& c = K3();
  const int64_t kda = 1, mla = 3;
  ASSERT_EQ(c.layer_kinds[kda], LayerKind::kKda);
  ASSERT_EQ(c.layer_kinds[mla], LayerKind::kMla);
  // Second differences: 0 for KDA; the causal attention term for MLA,
  // n (P + R + Vd) multiply-adds per query-key pair, 2 FLOPs each.
  auto second = [&](int64_t layer) {
    return LayerCost(c, layer, 3) - 2 * LayerCost(c, layer, 2) + LayerCost(c, layer, 1);
  };
  EXPECT_NEAR(second(kda), 0, 1e-6 * LayerCost(c, kda, 1));
  EXPECT_NEAR(second(mla), 96.0 * (128 + 64 + 128) * 2, 1e-6 * LayerCost(c, mla, 1));
  EXPECT_NEAR(LayerCost(c, kda, 8192), 2 * LayerCost(c, kda, 4096), 1e-9 * LayerCost(c, kda, 8192));
  EXPECT_GT(LayerCost(c, mla, 1 << 20), 10 * LayerCost(c, kda, 1 << 20));
  // More routed experts at the same top-k add only router work.
  ModelConfig wide = c;
  wide.num_experts *= 2;
  const int64_t T = 1000;
  EXPECT_NEAR(LayerCost(wide, kda, T) - LayerCost(c, kda, T), 2.0 * T * 896 * 7168,
              1e-6 * LayerCost(c, kda, T));
  // Ends: stage 0 pays the embedding, the last stage the head.
  EXPECT_NEAR(StageCost(c, {0, 1}, T), LayerCost(c, 0, T) + EmbeddingCost(c, T),
              1e-9 * StageCost(c, {0, 1}, T));
  EXPECT_NEAR(StageCost(c, {92, 93}, T), LayerCost(c, 92, T) + HeadCost(c, T),
              1e-9 * StageCost(c, {92, 93}, T));
  EXPECT_NEAR(HeadCost(c, T), 2.0 * T * 163840 * 7168, 1);
}

// --- planner ---------------------------------------------------------------

void ExpectValidPlan(const ModelConfig& c, const StagePlan& plan, int pp) {
  ASSERT_EQ(plan.stages.size(), static_cast<size_t>(pp));
  EXPECT_EQ(plan.stages.front().begin, 0);
  EXPECT_EQ(plan.stages.back().end, c.num_layers);
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    EXPECT_LT(plan.stages[s].begin, plan.stages[s].end) << "stage " << s;
    if (s > 0) {
      EXPECT_EQ(plan.stages[s].begin, plan.stages[s - 1].end) << "stage " << s;
    }
  }
  EXPECT_TRUE(ValidatePlan(c, plan).ok());
}

TEST(PlanStagesTest, ContiguousCoveringAndBalancedOnRealConfigs) {
  for (const ModelConfig* c : {&KimiLinear(), &K3()}) {
    const double total = TotalCost(*c, kContext);
    for (int pp = 1; pp <= 8; ++pp) {
      SCOPED_TRACE(c->model_type + " pp " + std::to_string(pp));
      const StagePlan plan = Plan(*c, pp);
      ExpectValidPlan(*c, plan, pp);
      EXPECT_LE(MaxCost(*c, plan, kContext), 1.3 * total / pp);
    }
  }
  // Long context: MLA layers dominate and the split follows them.
  for (int pp = 2; pp <= 8; pp += 3) {
    const StagePlan plan = Plan(K3(), pp, 1 << 20);
    ExpectValidPlan(K3(), plan, pp);
    EXPECT_LE(MaxCost(K3(), plan, 1 << 20), 1.3 * TotalCost(K3(), 1 << 20) / pp);
  }
}

// Every split of L layers into pp stages (starts of stages 1..pp-1).
void ForEachPartition(int64_t L, int pp, const std::function<void(const StagePlan&)>& fn) {
  std::vector<int64_t> starts(static_cast<size_t>(pp), 0);
  std::function<void(int, int64_t)> rec = [&](int k, int64_t from) {
    if (k == pp) {
      StagePlan plan;
      for (int s = 0; s < pp; ++s) {
        plan.stages.push_back({starts[s], s + 1 < pp ? starts[s + 1] : L});
      }
      fn(plan);
      return;
    }
    for (int64_t b = from; b <= L - (pp - k); ++b) {
      starts[k] = b;
      rec(k + 1, b + 1);
    }
  };
  rec(1, 1);
}

TEST(PlanStagesTest, MinimisesTheMaximumStageCost) {
  // Exhaustive search on Kimi Linear (no blocks): the planner is optimal.
  const ModelConfig& c = KimiLinear();
  for (int pp = 2; pp <= 4; ++pp) {
    double best = std::numeric_limits<double>::infinity();
    ForEachPartition(c.num_layers, pp,
                     [&](const StagePlan& p) { best = std::min(best, MaxCost(c, p, kContext)); });
    EXPECT_NEAR(MaxCost(c, Plan(c, pp), kContext), best, 1e-9 * best) << "pp " << pp;
  }
}

TEST(PlanStagesTest, K3PrefersBlockBoundariesWithinTolerance) {
  const ModelConfig& c = K3();
  for (int pp = 2; pp <= 4; ++pp) {
    SCOPED_TRACE("pp " + std::to_string(pp));
    // The optimum, then the most block-aligned boundaries any partition
    // within 5% of it achieves, found exhaustively.
    double best = std::numeric_limits<double>::infinity();
    ForEachPartition(c.num_layers, pp,
                     [&](const StagePlan& p) { best = std::min(best, MaxCost(c, p, kContext)); });
    int64_t most_aligned = 0;
    ForEachPartition(c.num_layers, pp, [&](const StagePlan& p) {
      if (MaxCost(c, p, kContext) <= 1.05 * best * (1 + 1e-9)) {
        most_aligned = std::max(most_aligned, AlignedBoundaries(c, p));
      }
    });
    const StagePlan plan = Plan(c, pp);
    EXPECT_LE(MaxCost(c, plan, kContext), 1.05 * best * (1 + 1e-9));
    EXPECT_EQ(AlignedBoundaries(c, plan), most_aligned);
    // Without the tolerance: the plain optimum.
    const StagePlan strict = Plan(c, pp, kContext, PlanOptions{.block_alignment_tolerance = 0});
    EXPECT_NEAR(MaxCost(c, strict, kContext), best, 1e-9 * best);
  }
  // Eight stages: blocks of 12 layers are close to the ideal 93 / 8, so every
  // boundary lands on a block start.
  const StagePlan eight = Plan(c, 8);
  EXPECT_EQ(AlignedBoundaries(c, eight), 7);
  for (size_t s = 1; s < eight.stages.size(); ++s) {
    EXPECT_EQ(eight.stages[s].begin, 12 * static_cast<int64_t>(s));
  }
}

TEST(PlanStagesTest, Deterministic) {
  // Every rank of a job plans for itself: the plans must agree exactly.
  for (int pp = 1; pp <= 8; ++pp) {
    const StagePlan a = Plan(K3(), pp), b = Plan(K3(), pp);
    EXPECT_EQ(a.stages, b.stages);
  }
}

TEST(PlanStagesTest, Errors) {
  auto too_many = PlanStages(KimiLinear(), 28, kContext);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("27 layers"), std::string::npos) << too_many.status();
  EXPECT_FALSE(PlanStages(KimiLinear(), 0, kContext).ok());
  EXPECT_FALSE(PlanStages(KimiLinear(), -1, kContext).ok());
  EXPECT_FALSE(PlanStages(KimiLinear(), 2, 0).ok());
  EXPECT_TRUE(PlanStages(KimiLinear(), 27, kContext).ok());  // one layer each
}

TEST(ReportPlanTest, TpMustDivideTheSplitDimensions) {
  const StagePlan plan = Counts(KimiLinear(), {27});
  auto three = ReportPlan(KimiLinear(), plan, 3, kContext, PlanBytes{});
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("num_heads"), std::string::npos) << three.status();
  EXPECT_FALSE(ReportPlan(KimiLinear(), plan, 64, kContext, PlanBytes{}).ok());
  EXPECT_FALSE(ReportPlan(KimiLinear(), plan, 0, kContext, PlanBytes{}).ok());
  // Each dimension is named when it is the one that does not divide.
  ModelConfig c = KimiLinear();
  c.num_attention_heads = 30;
  auto mla = CheckTensorParallel(c, 4);
  EXPECT_NE(mla.message().find("num_attention_heads"), std::string::npos) << mla;
  c = KimiLinear();
  c.intermediate_size = 9218;
  auto dense = CheckTensorParallel(c, 4);
  EXPECT_NE(dense.message().find("intermediate_size"), std::string::npos) << dense;
  c = KimiLinear();
  c.moe_intermediate_size = 1026;
  auto shared = CheckTensorParallel(c, 4);
  EXPECT_NE(shared.message().find("shared expert"), std::string::npos) << shared;
  // An invalid plan is refused.
  StagePlan gap{{StageRange{0, 10}, StageRange{11, 27}}};
  EXPECT_FALSE(ReportPlan(KimiLinear(), gap, 1, kContext, PlanBytes{}).ok());
  EXPECT_FALSE(ReportPlan(KimiLinear(), plan, 1, kContext, PlanBytes{.weight = -1}).ok());
  EXPECT_FALSE(ReportPlan(KimiLinear(), plan, 1, kContext, PlanBytes{.weight = 9}).ok());
  EXPECT_FALSE(ReportPlan(KimiLinear(), plan, 1, kContext, PlanBytes{.cache = 0}).ok());
}

TEST(StagesFromCountsTest, ExplicitSplits) {
  auto tiny = PresetConfig("k3-tiny");  // 9 layers
  ASSERT_TRUE(tiny.ok());
  const StagePlan plan = Counts(*tiny, {2, 3, 4});
  EXPECT_EQ(plan.stages, (std::vector<StageRange>{{0, 2}, {2, 5}, {5, 9}}));

  auto short_sum = StagesFromCounts(*tiny, {2, 3, 3});
  ASSERT_FALSE(short_sum.ok());
  EXPECT_NE(short_sum.status().message().find("sum to 8"), std::string::npos) << short_sum.status();
  EXPECT_NE(short_sum.status().message().find("9 layers"), std::string::npos);
  auto long_sum = StagesFromCounts(*tiny, {5, 5});
  ASSERT_FALSE(long_sum.ok());
  EXPECT_NE(long_sum.status().message().find("sum to 10"), std::string::npos) << long_sum.status();
  auto zero = StagesFromCounts(*tiny, {2, 0, 7});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("stage 1 has 0 layers"), std::string::npos)
      << zero.status();
  EXPECT_FALSE(StagesFromCounts(*tiny, {-1, 10}).ok());
  EXPECT_FALSE(StagesFromCounts(*tiny, {}).ok());
}

}  // namespace
}  // namespace deltaserve
