#include "runtime/model/weight_spec.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/model/config.h"
#include "runtime/model/presets.h"
#include "runtime/model/random_checkpoint.h"
#include "runtime/model/safetensors.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

ModelConfig Preset(const std::string& name) {
  auto config = PresetConfig(name);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StrAppend(&text, i ? ", " : "", shape[i]);
  }
  return text + "]";
}

// ExpectedTensors(golden config) is exactly the golden file: same names,
// shapes and dtypes, and the same order (by data offset).
TEST(WeightSpecTest, MatchesGoldenCheckpoints) {
  for (const char* model : {"k3-tiny", "kimi-linear-tiny"}) {
    SCOPED_TRACE(model);
    const std::string dir = testing::GoldenPath(std::string("model/") + model);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    auto file = SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    const auto& tensors = (*file)->tensors();
    const std::vector<TensorSpec> specs = ExpectedTensors(*config);
    std::map<std::string, const TensorSpec*> by_name;
    for (const TensorSpec& spec : specs) {
      EXPECT_TRUE(by_name.emplace(spec.name, &spec).second) << "duplicate " << spec.name;
    }
    for (const auto& [name, view] : tensors) {
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        ADD_FAILURE() << "golden tensor not in the spec: " << name;
        continue;
      }
      EXPECT_EQ(it->second->shape, view.shape) << name;
      EXPECT_EQ(it->second->dtype, view.dtype) << name << ": spec " << DTypeName(it->second->dtype)
                                               << ", golden " << DTypeName(view.dtype);
    }
    for (const TensorSpec& spec : specs) {
      EXPECT_TRUE(tensors.count(spec.name)) << "spec tensor not in golden: " << spec.name;
    }
    EXPECT_EQ(specs.size(), tensors.size());
    std::vector<std::pair<const uint8_t*, std::string>> stored;
    for (const auto& [name, view] : tensors) stored.emplace_back(view.data, name);
    std::sort(stored.begin(), stored.end());
    std::vector<std::string> golden_order, spec_order;
    for (const auto& entry : stored) golden_order.push_back(entry.second);
    for (const TensorSpec& spec : specs) spec_order.push_back(spec.name);
    EXPECT_EQ(spec_order, golden_order);
  }
}

TEST(WeightSpecTest, GoldenCheckpointsValidate) {
  for (const char* model : {"k3-tiny", "kimi-linear-tiny"}) {
    const std::string dir = testing::GoldenPath(std::string("model/") + model);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    auto checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    EXPECT_TRUE(ValidateCheckpoint(*config, **checkpoint).ok()) << model;
  }
}

TEST(WeightSpecTest, TiedEmbeddingsHaveNoHead) {
  ModelConfig config = Preset("kimi-linear-tiny");
  config.tie_word_embeddings = true;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    EXPECT_EQ(spec.name.find("lm_head"), std::string::npos) << spec.name;
  }
  EXPECT_EQ(config.LmHeadName(), "model.embed_tokens.weight");
  ModelConfig k3 = Preset("k3-tiny");
  k3.tie_word_embeddings = true;
  EXPECT_EQ(ExpectedTensors(k3).size() + 1, ExpectedTensors(Preset("k3-tiny")).size());
}

TEST(WeightSpecTest, VariantsChangeTheLayout) {
  auto names = [](const ModelConfig& c) {
    std::map<std::string, std::vector<int64_t>> out;
    for (const TensorSpec& spec : ExpectedTensors(c)) out[spec.name] = spec.shape;
    return out;
  };
  ModelConfig c = Preset("kimi-linear-tiny");
  c.num_shared_experts = 0;
  EXPECT_FALSE(names(c).count("model.layers.1.block_sparse_moe.shared_experts.up_proj.weight"));
  c.kda.full_rank_gate = true;
  c.mla_output_gate = true;
  c.q_lora_rank = 16;
  auto n = names(c);
  EXPECT_EQ(n["model.layers.0.self_attn.g_proj.weight"], (std::vector<int64_t>{32, 64}));
  EXPECT_FALSE(n.count("model.layers.0.self_attn.g_a_proj.weight"));
  EXPECT_EQ(n["model.layers.3.self_attn.g_proj.weight"], (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(n["model.layers.3.self_attn.q_b_proj.weight"], (std::vector<int64_t>{48, 16}));
  EXPECT_FALSE(n.count("model.layers.3.self_attn.q_proj.weight"));
  c.num_experts = 0;  // dense everywhere
  n = names(c);
  EXPECT_EQ(n["model.layers.5.mlp.down_proj.weight"], (std::vector<int64_t>{64, 96}));
  EXPECT_FALSE(n.count("model.layers.5.block_sparse_moe.gate.weight"));
  // K3's A_log pads to a multiple of 128.
  ModelConfig k3 = Preset("k3-tiny");
  k3.kda.num_heads = 130;
  EXPECT_EQ(names(k3)["language_model.model.layers.0.self_attn.A_log"],
            (std::vector<int64_t>{256}));
  k3.kda.num_heads = 96;
  EXPECT_EQ(names(k3)["language_model.model.layers.0.self_attn.A_log"],
            (std::vector<int64_t>{128}));
}

// A checkpoint of `config` with zero values, written through `edit`, which
// may drop (return false) or change entries.
template <typename Edit>
std::string WriteEditedCheckpoint(const ModelConfig& config, const std::string& tag, Edit edit) {
  std::vector<TensorData> tensors;
  for (TensorSpec spec : ExpectedTensors(config)) {
    if (!edit(spec)) continue;
    const std::vector<float> zeros(static_cast<size_t>(spec.NumElements()), 0.0f);
    if (spec.dtype == DType::kF32) {
      tensors.push_back(MakeF32Tensor(spec.name, spec.shape, zeros));
    } else if (spec.dtype == DType::kBF16) {
      tensors.push_back(MakeBF16Tensor(spec.name, spec.shape, zeros));
    } else {
      tensors.push_back(TensorData{spec.name, spec.dtype, spec.shape,
                                   std::vector<uint8_t>(zeros.size() * DTypeSize(spec.dtype))});
    }
  }
  const std::string dir = testing::TempDir(tag);
  const absl::Status status = WriteSafetensors(dir + "/model.safetensors", tensors);
  EXPECT_TRUE(status.ok()) << status;
  return dir;
}

absl::Status ValidateDir(const ModelConfig& config, const std::string& dir) {
  auto checkpoint = Checkpoint::Open(dir);
  if (!checkpoint.ok()) return checkpoint.status();
  return ValidateCheckpoint(config, **checkpoint);
}

void ExpectMentions(const absl::Status& status, const std::vector<std::string>& parts) {
  ASSERT_FALSE(status.ok());
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << status;
  }
}

TEST(ValidateCheckpointTest, AcceptsExactAndUnknownTensors) {
  for (const char* preset : {"k3-tiny", "kimi-linear-tiny"}) {
    const ModelConfig config = Preset(preset);
    const std::string dir =
        WriteEditedCheckpoint(config, "validate_ok", [](TensorSpec&) { return true; });
    EXPECT_TRUE(ValidateDir(config, dir).ok()) << ValidateDir(config, dir);
  }
}

TEST(ValidateCheckpointTest, MissingTensor) {
  const ModelConfig config = Preset("k3-tiny");
  const std::string missing = "language_model.model.layers.5.self_attn.dt_bias";
  const std::string dir = WriteEditedCheckpoint(config, "validate_missing",
                                                [&](TensorSpec& s) { return s.name != missing; });
  const absl::Status status = ValidateDir(config, dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  ExpectMentions(status, {missing, dir});
}

TEST(ValidateCheckpointTest, MisshapedTensor) {
  const ModelConfig config = Preset("kimi-linear-tiny");
  const std::string name = "model.layers.3.self_attn.kv_b_proj.weight";
  const std::string dir = WriteEditedCheckpoint(config, "validate_shape", [&](TensorSpec& s) {
    if (s.name == name) s.shape = {16, 64};  // transposed
    return true;
  });
  const absl::Status status = ValidateDir(config, dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ExpectMentions(status, {name, dir, "[16, 64]", "[64, 16]"});
}

TEST(ValidateCheckpointTest, IntegerDtype) {
  const ModelConfig config = Preset("k3-tiny");
  const std::string name = "language_model.model.layers.2.block_sparse_moe.experts.3.w2.weight";
  for (DType dtype : {DType::kI32, DType::kI64, DType::kU8}) {
    const std::string dir = WriteEditedCheckpoint(config, "validate_dtype", [&](TensorSpec& s) {
      if (s.name == name) s.dtype = dtype;
      return true;
    });
    ExpectMentions(ValidateDir(config, dir), {name, DTypeName(dtype), dir});
  }
  // Other float dtypes than the stored ones are fine: loading converts.
  const std::string dir = WriteEditedCheckpoint(config, "validate_f16", [&](TensorSpec& s) {
    if (s.name == name) s.dtype = DType::kF16;
    if (absl::EndsWith(s.name, "dt_bias")) s.dtype = DType::kBF16;
    return true;
  });
  EXPECT_TRUE(ValidateDir(config, dir).ok()) << ValidateDir(config, dir);
}

TEST(ValidateCheckpointTest, ALogAnyShapeWithEnoughValues) {
  const ModelConfig config = Preset("kimi-linear-tiny");  // 4 heads
  const std::string name = "model.layers.0.self_attn.A_log";
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{4}, {128}, {1, 4}, {2, 2}}) {
    const std::string dir = WriteEditedCheckpoint(config, "validate_alog", [&](TensorSpec& s) {
      if (s.name == name) s.shape = shape;
      return true;
    });
    EXPECT_TRUE(ValidateDir(config, dir).ok()) << ShapeText(shape);
  }
  const std::string dir = WriteEditedCheckpoint(config, "validate_alog_short", [&](TensorSpec& s) {
    if (s.name == name) s.shape = {1, 1, 3, 1};
    return true;
  });
  ExpectMentions(ValidateDir(config, dir), {name, "[1, 1, 3, 1]", "at least 4"});
}

TEST(ValidateCheckpointTest, ListsSeveralProblems) {
  const ModelConfig config = Preset("kimi-linear-tiny");
  const std::string dir = WriteEditedCheckpoint(config, "validate_many", [](TensorSpec& s) {
    return s.name.find("layers.7.") == std::string::npos;
  });
  const absl::Status status = ValidateDir(config, dir);
  ExpectMentions(status, {"model.layers.7.input_layernorm.weight", "more"});
}

TEST(ValidateCheckpointTest, WrongArchitectureForCheckpoint) {
  // A Kimi Linear checkpoint read with the K3 config: every name differs.
  const std::string dir = testing::GoldenPath("model/kimi-linear-tiny");
  ExpectMentions(ValidateDir(Preset("k3-tiny"), dir),
                 {"language_model.model.embed_tokens.weight", "kimi_k3"});
}

// Sample statistics of a stored tensor.
struct Stats {
  double mean = 0, std = 0, min = 0, max = 0;
};
Stats StatsOf(const Checkpoint& checkpoint, const std::string& name) {
  auto view = checkpoint.Get(name);
  EXPECT_TRUE(view.ok()) << view.status();
  auto values = ToFloat64(**view);
  EXPECT_TRUE(values.ok()) << values.status();
  Stats s;
  s.min = *std::min_element(values->begin(), values->end());
  s.max = *std::max_element(values->begin(), values->end());
  for (double v : *values) s.mean += v;
  s.mean /= static_cast<double>(values->size());
  for (double v : *values) s.std += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(s.std / static_cast<double>(values->size()));
  return s;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

TEST(RandomCheckpointTest, EveryPresetValidates) {
  for (const std::string& name : PresetNames()) {
    SCOPED_TRACE(name);
    const ModelConfig config = Preset(name);
    const std::string dir = testing::TempDir("random_" + name) + "/model";
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(WriteRandomCheckpoint(config, dir, 7).ok());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const ParameterCount count = CountParameters(config);
    std::printf("%s: %lld parameters, %lld active per token; written in %.2f s\n", name.c_str(),
                static_cast<long long>(count.total), static_cast<long long>(count.active_per_token),
                seconds);
    auto loaded = LoadModelConfig(dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(ModelConfigToJson(*loaded), ModelConfigToJson(config));
    auto checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    EXPECT_TRUE(ValidateCheckpoint(*loaded, **checkpoint).ok());
    // Stored dtypes are exactly the real ones, and nothing else is there.
    const std::vector<TensorSpec> specs = ExpectedTensors(config);
    EXPECT_EQ((*checkpoint)->tensors().size(), specs.size());
    int64_t stored = 0;
    for (const TensorSpec& spec : specs) {
      auto view = (*checkpoint)->Get(spec.name);
      ASSERT_TRUE(view.ok()) << view.status();
      EXPECT_EQ((*view)->dtype, spec.dtype) << spec.name;
      stored += (*view)->NumElements();
    }
    EXPECT_EQ(stored, count.total);
    std::filesystem::remove_all(dir);  // k3-small: 220 MB
  }
}

TEST(RandomCheckpointTest, ParameterCounts) {
  const ParameterCount small = CountParameters(Preset("k3-small"));
  // "About 100M" for benchmarks.
  EXPECT_GT(small.total, 90'000'000);
  EXPECT_LT(small.total, 130'000'000);
  EXPECT_LT(small.active_per_token, small.total);
  const ParameterCount tiny = CountParameters(Preset("k3-tiny"));
  // 8 MoE layers * (8 - 2) unused experts * 3 * 32 * 24.
  EXPECT_EQ(tiny.total - tiny.active_per_token, 8 * 6 * 3 * 32 * 24);
}

TEST(RandomCheckpointTest, ValuesAreSane) {
  for (const char* name : {"k3-tiny", "kimi-linear-tiny"}) {
    SCOPED_TRACE(name);
    const ModelConfig config = Preset(name);
    const std::string dir = testing::TempDir("random_values");
    ASSERT_TRUE(WriteRandomCheckpoint(config, dir, 11).ok());
    auto checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    const Checkpoint& ck = **checkpoint;
    const std::string p = config.ModelPrefix();
    const Stats embed = StatsOf(ck, p + "embed_tokens.weight");
    EXPECT_NEAR(embed.std, 1.0, 0.05);
    EXPECT_NEAR(embed.mean, 0.0, 0.05);
    // Linear weights: std 1/sqrt(fan_in).
    for (const auto& [tensor, fan_in] :
         std::vector<std::pair<std::string, double>>{{p + "layers.0.mlp.gate_proj.weight", 64},
                                                     {p + "layers.0.mlp.down_proj.weight", 96},
                                                     {p + "layers.0.self_attn.q_proj.weight", 64},
                                                     {p + "layers.0.self_attn.f_b_proj.weight", 8},
                                                     {config.LmHeadName(), 64}}) {
      const Stats s = StatsOf(ck, tensor);
      EXPECT_NEAR(s.std * std::sqrt(fan_in), 1.0, 0.1) << tensor;
      EXPECT_LE(std::abs(s.mean), 0.05 * s.std * std::sqrt(fan_in) + 0.02) << tensor;
    }
    for (const std::string& norm :
         {p + "norm.weight", p + "layers.3.input_layernorm.weight",
          p + "layers.3.self_attn.kv_a_layernorm.weight", p + "layers.0.self_attn.o_norm.weight"}) {
      const Stats s = StatsOf(ck, norm);
      EXPECT_NEAR(s.mean, 1.0, 0.1) << norm;
      EXPECT_GT(s.min, 0.7) << norm;
      EXPECT_LT(s.max, 1.3) << norm;
      EXPECT_GT(s.std, 0.01) << norm;
    }
    const Stats conv = StatsOf(ck, p + "layers.1.self_attn.k_conv1d.weight");
    EXPECT_NEAR(conv.std, 0.5, 0.1);
    const Stats bias = StatsOf(ck, p + "layers.1.block_sparse_moe.gate.e_score_correction_bias");
    EXPECT_LT(std::max(-bias.min, bias.max), 0.2);
    // A_log: log of a rate in [1, 16] per head; K3's padding is zero.
    auto a_log = ck.Get(p + "layers.0.self_attn.A_log");
    ASSERT_TRUE(a_log.ok());
    auto a = ToFloat64(**a_log);
    ASSERT_TRUE(a.ok());
    for (size_t h = 0; h < a->size(); ++h) {
      if (static_cast<int64_t>(h) < config.kda.num_heads) {
        EXPECT_GE((*a)[h], 0.0);
        EXPECT_LE((*a)[h], std::log(16.0) + 1e-6);
      } else {
        EXPECT_EQ((*a)[h], 0.0) << h;
      }
    }
    const Stats dt = StatsOf(ck, p + "layers.0.self_attn.dt_bias");
    if (config.IsK3()) {
      EXPECT_LT(std::max(-dt.min, dt.max), 1.0);
    } else {
      // softplus(dt_bias) in [1e-3, 1e-1].
      EXPECT_GE(dt.min, std::log(std::expm1(1e-3)) - 1e-3);
      EXPECT_LE(dt.max, std::log(std::expm1(1e-1)) + 1e-3);
    }
    if (config.IsK3()) {
      const Stats res = StatsOf(ck, p + "layers.2.mlp_res_proj.weight");
      EXPECT_NEAR(res.std, 1.0 / 8.0, 0.04);  // 1/sqrt(hidden)
    }
  }
}

TEST(RandomCheckpointTest, DeterministicFromTheSeed) {
  const ModelConfig config = Preset("k3-tiny");
  const std::string a = testing::TempDir("random_seed_a");
  const std::string b = testing::TempDir("random_seed_b");
  const std::string c = testing::TempDir("random_seed_c");
  ASSERT_TRUE(WriteRandomCheckpoint(config, a, 42).ok());
  ASSERT_TRUE(WriteRandomCheckpoint(config, b, 42).ok());
  ASSERT_TRUE(WriteRandomCheckpoint(config, c, 43).ok());
  const std::string bytes_a = ReadBytes(a + "/model.safetensors");
  EXPECT_EQ(bytes_a, ReadBytes(b + "/model.safetensors"));
  EXPECT_NE(bytes_a, ReadBytes(c + "/model.safetensors"));
  EXPECT_EQ(ReadBytes(a + "/config.json"), ReadBytes(c + "/config.json"));
  // Values of a tensor depend on its name, not on what else is in the model.
  ModelConfig fewer = config;
  fewer.num_experts_per_token = 1;
  fewer.num_experts = 4;
  const std::string d = testing::TempDir("random_seed_d");
  ASSERT_TRUE(WriteRandomCheckpoint(fewer, d, 42).ok());
  auto full = Checkpoint::Open(a);
  auto part = Checkpoint::Open(d);
  ASSERT_TRUE(full.ok() && part.ok());
  const std::string name = "language_model.model.layers.8.self_attn.kv_b_proj.weight";
  auto x = ToFloat32(**(*full)->Get(name));
  auto y = ToFloat32(**(*part)->Get(name));
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(*x, *y);
}

TEST(RandomCheckpointTest, InvalidConfigWritesNothing) {
  ModelConfig config = Preset("k3-tiny");
  config.num_experts_per_token = 99;
  const std::string dir = testing::TempDir("random_invalid") + "/model";
  const absl::Status status = WriteRandomCheckpoint(config, dir, 1);
  ExpectMentions(status, {"num_experts_per_token"});
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
}  // namespace deltaserve
