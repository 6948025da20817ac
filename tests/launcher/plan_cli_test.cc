// deltaserve plan as a user runs it: the per-stage figures it prints agree
// with ReportPlan, and bad input exits non-zero with a message naming the
// flag or the dimension.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/model/config.h"
#include "runtime/model/presets.h"
#include "runtime/model/safetensors.h"
#include "runtime/scheduler/gpu_plan.h"
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

// --- --gpu-memory ------------------------------------------------------------

// The exact byte counts "(N B)" of a row, in order.
std::vector<int64_t> RowBytes(const std::string& row) {
  std::vector<int64_t> out;
  for (size_t open = row.find('('); open != std::string::npos; open = row.find('(', open + 1)) {
    const size_t close = row.find(" B)", open);
    int64_t n = 0;
    if (close != std::string::npos &&
        absl::SimpleAtoi(row.substr(open + 1, close - open - 1), &n)) {
      out.push_back(n);
    }
  }
  return out;
}

TEST(PlanCliTest, GpuPlanOfATinyPresetIsOneGpu) {
  std::string output;
  ASSERT_EQ(Plan("--model k3-tiny --gpu-memory 8GiB --context 8192", &output), 0) << output;
  EXPECT_NE(output.find("preset k3-tiny"), std::string::npos) << output;
  EXPECT_NE(output.find("layout: 1 GPU on 1 node: PP 1 x TP 1"), std::string::npos) << output;
  // The context: what FitLayout leaves for the cache of one stage of k3-tiny.
  auto config = PresetConfig("k3-tiny");
  ASSERT_TRUE(config.ok());
  GpuBudget budget;
  budget.gpu_memory_bytes = int64_t{8} << 30;
  auto layout = EvaluateLayout(*config, 1, 1, 8192, budget);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const int64_t tokens = layout->max_context_tokens;
  const GpuStageMemory& m = layout->stages[0];
  EXPECT_EQ(tokens, ((int64_t{8} << 30) - m.FixedBytes()) / m.cache_bytes_per_page * 64);
  EXPECT_NE(output.find(absl::StrCat("largest context per replica: ", tokens, " tokens")),
            std::string::npos)
      << output;
  // The cache: 3 MLA layers x (16 + 4) values x 2 B (bf16) a token.
  EXPECT_EQ(m.cache_bytes_per_page, 3 * (16 + 4) * 2 * 64);
  const std::vector<int64_t> bytes = RowBytes(StageRow(output, 0));
  ASSERT_EQ(bytes.size(), 5u) << output;  // weights, state, cache, workspace, total
  EXPECT_EQ(bytes[4], m.TotalBytes(tokens));
  EXPECT_LE(bytes[4], int64_t{8} << 30);
}

TEST(PlanCliTest, GpuPlanOfRealK3NeedsMoreThanOneNode) {
  std::string output;
  ASSERT_EQ(Plan("--model k3 --gpu-memory 141GiB --gpus-per-node 8 --kv-dtype bf16", &output), 0)
      << output;
  std::printf("%s", output.c_str());
  EXPECT_NE(output.find("93 layers: 69 KDA + 24 MLA"), std::string::npos) << output;
  EXPECT_NE(output.find("MXFP4 routed experts"), std::string::npos) << output;
  const size_t at = output.find("layout: ");
  ASSERT_NE(at, std::string::npos) << output;
  const std::string layout = output.substr(at, output.find('\n', at) - at);
  EXPECT_NE(layout.find("x TP 8"), std::string::npos) << layout;
  EXPECT_EQ(layout.find(" on 1 node"), std::string::npos) << layout;
  int stages = 0;
  for (int s = 0; !StageRow(output, s).empty(); ++s) {
    const std::vector<int64_t> bytes = RowBytes(StageRow(output, s));
    ASSERT_EQ(bytes.size(), 5u) << StageRow(output, s);
    EXPECT_LT(bytes[4], int64_t{141} << 30) << StageRow(output, s);
    EXPECT_GT(bytes[0], int64_t{60} << 30) << "weights of stage " << s;
    ++stages;
  }
  EXPECT_GE(stages, 2) << output;
  EXPECT_NE(output.find(absl::StrCat("PP ", stages, " x TP 8")), std::string::npos) << layout;

  // One stage of one node cannot hold it: refused, saying by how much.
  EXPECT_NE(Plan("--model k3 --gpu-memory 141GiB --pp 1 --tp 8", &output), 0) << output;
  EXPECT_NE(output.find("PP 1 x TP 8 does not fit in 141.00 GiB per GPU: stage 0"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("more than there is"), std::string::npos) << output;
}

TEST(PlanCliTest, GpuPlanRefusesWhatCannotFit) {
  std::string output;
  EXPECT_NE(Plan("--model k3 --gpu-memory 6GiB", &output), 0) << output;
  for (const char* part : {"--gpu-memory 6GiB", "no layout of up to 744 GPUs", "PP 93 x TP 8",
                           "does not fit in 6.00 GiB per GPU", "more than there is"}) {
    EXPECT_NE(output.find(part), std::string::npos) << part << " in\n" << output;
  }
  // The tiny model fits, but not a context beyond its memory.
  EXPECT_NE(Plan("--model k3-tiny --gpu-memory 16MiB --workspace 0 --context 1048576", &output), 0)
      << output;
  EXPECT_NE(output.find("MLA cache for 1048576 tokens"), std::string::npos) << output;
}

TEST(PlanCliTest, GpuPlanBadInputFailsNamingTheFlag) {
  const std::string model = "--model k3-tiny";
  const std::vector<BadInput> cases = {
      {model + " --gpu-memory 141GB", {"--gpu-memory", "'141GB' is not a memory size", "GiB"}},
      {model + " --gpu-memory lots", {"--gpu-memory", "'lots' is not a memory size"}},
      {model + " --gpu-memory -4GiB", {"--gpu-memory", "not a memory size"}},
      {model + " --gpu-memory 0GiB", {"--gpu-memory must be positive"}},
      {model + " --gpu-memory 1.2.3GiB", {"--gpu-memory", "not a memory size"}},
      {model + " --gpu-memory 99999999TiB", {"--gpu-memory", "too large"}},
      {model + " --gpu-memory=", {"--gpu-memory"}},
      {model + " --gpu-memory 1GiB --workspace 4Gi", {"--workspace", "not a memory size"}},
      {model + " --gpu-memory 1GiB --kv-dtype fp8", {"--kv-dtype", "bf16 or f32"}},
      {model + " --gpu-memory 1GiB --gpus-per-node 0", {"--gpus-per-node"}},
      {model + " --gpu-memory 1GiB --tp 3", {"--tp 3"}},
      {model + " --gpu-memory 1GiB --gpus-per-node 6 --tp 4", {"--tp 4", "--gpus-per-node 6"}},
      {model + " --gpu-memory 1GiB --pp 10", {"--pp"}},
      {model + " --gpu-memory 1GiB --sequences 0", {"--sequences"}},
      {model + " --gpu-memory 1GiB --kv-dtype f32 --cache-bytes 4",
       {"--kv-dtype", "--cache-bytes"}},
      {model + " --pp 1 --tp 1 --gpus-per-node 8", {"--gpus-per-node needs --gpu-memory"}},
      {"--model k4 --gpu-memory 1GiB", {"k4/config.json"}},
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
  // Sizes in each unit parse as powers of 1024.
  std::string output;
  ASSERT_EQ(Plan(model + " --gpu-memory 0.5GiB --workspace 65536", &output), 0) << output;
  EXPECT_NE(output.find("GPUs: 512.00 MiB each"), std::string::npos) << output;
  EXPECT_NE(output.find("workspace 64.00 KiB"), std::string::npos) << output;
}

}  // namespace
}  // namespace deltaserve
