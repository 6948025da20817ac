// deltaserve plan as a user runs it: the per-stage figures it prints agree
// with ReportPlan, and bad input exits non-zero with a message naming the
// flag or the dimension.
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "runtime/scheduler/stage_plan.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

// moonshotai/Kimi-Linear-48B-A3B-Instruct config.json, the keys the runtime
// reads (the public release's values).
constexpr char kKimiLinearJson[] = R"({
  "model_type": "kimi_linear",
  "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216,
  "num_hidden_layers": 27, "num_attention_heads": 32, "hidden_act": "silu",
  "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
  "q_lora_rank": null, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "v_head_dim": 128,
  "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_experts": 256,
  "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024,
  "moe_renormalize": true, "moe_router_activation_func": "sigmoid",
  "routed_scaling_factor": 2.446, "use_grouped_topk": true, "num_expert_group": 1,
  "topk_group": 1,
  "linear_attn_config": {
    "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
    "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
    "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4
  }
})";

// Runs `deltaserve plan FLAGS`; the exit status.
int Plan(const std::string& flags, std::string* output) {
  return testing::RunCommand(absl::StrCat(testing::BinPath("deltaserve"), " plan ", flags), output);
}

// The table row of stage `s`: the line whose first column is its number.
std::string StageRow(const std::string& output, int s) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    const std::vector<absl::string_view> columns = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!columns.empty() && columns[0] == std::to_string(s)) return std::string(line);
  }
  return "";
}

// The row shows every figure of the report exactly.
void ExpectRowMatches(const std::string& row, const StageReport& r, bool last) {
  ASSERT_FALSE(row.empty());
  const std::string layers = r.layers.size() == 1
                                 ? absl::StrCat(r.layers.begin)
                                 : absl::StrCat(r.layers.begin, "-", r.layers.end - 1);
  EXPECT_NE(row.find(absl::StrCat(" ", layers, " ")), std::string::npos) << row;
  EXPECT_NE(row.find(absl::StrCat(r.weight_bytes_per_rank, " B")), std::string::npos) << row;
  EXPECT_NE(row.find(absl::StrCat(r.kda_state_bytes_per_sequence, " B")), std::string::npos) << row;
  EXPECT_NE(row.find(absl::StrCat(r.mla_cache_bytes, " B")), std::string::npos) << row;
  if (!last) {
    EXPECT_NE(row.find(absl::StrCat(r.boundary_bytes_per_token, " B")), std::string::npos) << row;
  }
}

TEST(PlanCliTest, ConfigFilePlanMatchesReportPlan) {
  const std::string dir = testing::TempDir("plan_cli");
  const std::string path = dir + "/config.json";
  std::ofstream(path) << kKimiLinearJson;
  std::string output;
  ASSERT_EQ(Plan(absl::StrCat("--config ", path,
                              " --pp 4 --tp 2 --context 8192 --weight-bytes 2 "
                              "--cache-bytes 2"),
                 &output),
            0)
      << output;

  auto config = ParseModelConfig(kKimiLinearJson, path);
  ASSERT_TRUE(config.ok()) << config.status();
  auto plan = PlanStages(*config, 4, 8192);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto reports = ReportPlan(*config, *plan, 2, 8192, PlanBytes{.weight = 2, .cache = 2});
  ASSERT_TRUE(reports.ok()) << reports.status();
  for (int s : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(s));
    ExpectRowMatches(StageRow(output, s), (*reports)[s], s == 3);
  }
  EXPECT_NE(output.find("kimi_linear"), std::string::npos) << output;
  EXPECT_NE(output.find("27 layers: 20 KDA + 7 MLA"), std::string::npos) << output;
  // The MLA total: 7 layers x 576 values x 8192 tokens x 2 B.
  EXPECT_NE(output.find(absl::StrCat(int64_t{7} * 576 * 8192 * 2, " B")), std::string::npos)
      << output;
}

TEST(PlanCliTest, GoldenK3ModelWithExplicitStages) {
  const std::string model = testing::GoldenPath("model/k3-tiny");
  std::string output;
  ASSERT_EQ(Plan(absl::StrCat("--model ", model, " --pp 3 --tp 2 --stage-layers 2,3,4"), &output),
            0)
      << output;
  auto config = LoadModelConfig(model);
  ASSERT_TRUE(config.ok()) << config.status();
  auto plan = StagesFromCounts(*config, {2, 3, 4});
  ASSERT_TRUE(plan.ok());
  auto reports = ReportPlan(*config, *plan, 2, 4096, PlanBytes{});
  ASSERT_TRUE(reports.ok()) << reports.status();
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    ExpectRowMatches(StageRow(output, s), (*reports)[s], s == 2);
  }
  // The boundary after layer 4 carries the prefix and bank entries 0 and 4.
  EXPECT_EQ((*reports)[1].boundary_bytes_per_token, (1 + 2) * 64 * 4);
  EXPECT_NE(output.find("--stage-layers"), std::string::npos) << output;

  // Planned by the cost model: the same figures as PlanStages + ReportPlan.
  ASSERT_EQ(Plan(absl::StrCat("--model ", model, " --pp 2 --tp 4 --context 300"), &output), 0)
      << output;
  auto balanced = PlanStages(*config, 2, 300);
  ASSERT_TRUE(balanced.ok());
  auto balanced_reports = ReportPlan(*config, *balanced, 4, 300, PlanBytes{});
  ASSERT_TRUE(balanced_reports.ok());
  ExpectRowMatches(StageRow(output, 0), (*balanced_reports)[0], false);
  EXPECT_NE(output.find("attention-residual block starts"), std::string::npos) << output;
}

// MXFP4 routed experts (the golden k3-tiny-mxfp4): weights as stored, so one
// rank of a single stage holds the checkpoint's bytes (less K3's A_log
// padding), experts at 17/32 B a value; --weight-bytes 4 counts them as
// float32 instead.
TEST(PlanCliTest, Mxfp4ModelCountsStoredBytes) {
  const std::string model = testing::GoldenPath("model/k3-tiny-mxfp4");
  std::string output;
  ASSERT_EQ(Plan(absl::StrCat("--model ", model, " --pp 1 --tp 1"), &output), 0) << output;
  auto config = LoadModelConfig(model);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->quantization.mxfp4);
  // The bytes of every tensor the checkpoint stores, vectors widened to
  // float32 (as the loader holds them), less the A_log padding.
  auto checkpoint = Checkpoint::Open(model);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  int64_t stored = 0;
  for (const auto& [name, view] : (*checkpoint)->tensors()) {
    const bool matrix = view->shape.size() == 2 && view->shape[0] > 1;
    stored += matrix ? static_cast<int64_t>(view->nbytes) : view->NumElements() * 4;
    if (name.ends_with("A_log")) stored -= (view->NumElements() - 4) * 4;
  }
  const int64_t experts = 8 * 8 * 3 * 32 * 32;  // MoE layers x experts x w1-3 x [32, 32]
  EXPECT_NE(StageRow(output, 0).find(absl::StrCat(" (", stored, " B)")), std::string::npos)
      << output;
  EXPECT_NE(output.find("weights as held (matrices as stored: bf16 2, f32 4, MXFP4 routed experts "
                        "0.5 + 1 per 32; vectors f32 4)"),
            std::string::npos)
      << output;
  // Every weight in float32: the experts at 4 B, the rest twice their bf16.
  ASSERT_EQ(Plan(absl::StrCat("--model ", model, " --pp 1 --tp 1 --weight-bytes 4"), &output), 0)
      << output;
  auto plan = StagesFromCounts(*config, {9});
  ASSERT_TRUE(plan.ok());
  auto f32 = ReportPlan(*config, *plan, 1, 4096, PlanBytes{.weight = 4});
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_NE(StageRow(output, 0).find(absl::StrCat(" (", (*f32)[0].weight_bytes_per_rank, " B)")),
            std::string::npos)
      << output;
  auto stored_report = ReportPlan(*config, *plan, 1, 4096, PlanBytes{});
  ASSERT_TRUE(stored_report.ok());
  EXPECT_EQ((*stored_report)[0].weight_bytes_per_rank, stored);
  EXPECT_GT((*f32)[0].weight_bytes_per_rank - stored, experts * (4 - 1));
}

struct BadInput {
  std::string flags;
  std::vector<std::string> message;  // each must appear in the output
};

TEST(PlanCliTest, BadInputFailsNamingTheProblem) {
  const std::string model = "--model " + testing::GoldenPath("model/k3-tiny");
  const std::vector<BadInput> cases = {
      {model + " --pp 2 --tp 3", {"--tp", "num_heads"}},
      {model + " --pp 10 --tp 1", {"--pp", "9 layers"}},
      {model + " --pp 0 --tp 1", {"--pp"}},
      {model + " --pp two --tp 1", {"--pp", "integer"}},
      {model + " --tp 1", {"--pp"}},
      {model + " --pp 2", {"--tp"}},
      {model + " --pp 2 --tp 1 --bogus 1", {"unknown flag --bogus"}},
      {model + " --pp 3 --tp 1 --stage-layers 2,3", {"--stage-layers", "2 stages"}},
      {model + " --pp 3 --tp 1 --stage-layers 2,3,3", {"--stage-layers", "sum to 8"}},
      {model + " --pp 3 --tp 1 --stage-layers 2,0,7", {"--stage-layers", "stage 1 has 0"}},
      {model + " --pp 3 --tp 1 --stage-layers 2,x,4", {"--stage-layers", "'x'"}},
      {model + " --pp 2 --tp 1 --weight-bytes 0", {"--weight-bytes"}},
      {model + " --pp 2 --tp 1 --context 0", {"--context"}},
      {"--pp 2 --tp 1", {"--model", "--config"}},
      {model + " --config x.json --pp 2 --tp 1", {"exactly one"}},
      {"--model /nonexistent/model --pp 2 --tp 1", {"/nonexistent/model", "cannot open"}},
  };
  for (const BadInput& bad : cases) {
    std::string output;
    EXPECT_NE(Plan(bad.flags, &output), 0) << bad.flags << "\n" << output;
    for (const std::string& part : bad.message) {
      EXPECT_NE(output.find(part), std::string::npos)
          << bad.flags << ": expected '" << part << "' in\n"
          << output;
    }
  }
}

}  // namespace
}  // namespace deltaserve
