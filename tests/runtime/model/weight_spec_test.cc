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
#include "kernels/mxfp4.h"
#include "nlohmann/json.hpp"
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

// A tensor as a checkpoint stores it.
struct Stored {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  bool operator==(const Stored&) const = default;
};

// What `specs` say a checkpoint holds, in order: a kMxfp4 matrix [out, in] as
// its packed codes U8 [out, in / 2] then its scales U8 [out, in / 32].
std::vector<Stored> StoredLayout(const std::vector<TensorSpec>& specs) {
  std::vector<Stored> out;
  for (const TensorSpec& spec : specs) {
    if (spec.stored == Storage::kMxfp4) {
      out.push_back({spec.PackedName(), DType::kU8, {spec.shape[0], spec.shape[1] / 2}});
      out.push_back({spec.ScaleName(), DType::kU8, {spec.shape[0], spec.shape[1] / 32}});
    } else {
      out.push_back({spec.name, spec.dtype, spec.shape});
    }
  }
  return out;
}

// What a file holds, in data order.
std::vector<Stored> FileLayout(const SafetensorsFile& file) {
  std::vector<std::pair<const uint8_t*, Stored>> stored;
  for (const auto& [name, view] : file.tensors()) {
    stored.push_back({view.data, {name, view.dtype, view.shape}});
  }
  std::sort(stored.begin(), stored.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Stored> out;
  for (auto& entry : stored) out.push_back(std::move(entry.second));
  return out;
}

void ExpectSameLayout(const std::vector<Stored>& expected, const std::vector<Stored>& found) {
  EXPECT_EQ(expected.size(), found.size());
  for (size_t i = 0; i < std::min(expected.size(), found.size()); ++i) {
    const Stored& e = expected[i];
    const Stored& f = found[i];
    EXPECT_EQ(e.name, f.name) << "at " << i;
    EXPECT_EQ(e.dtype, f.dtype) << e.name << ": " << DTypeName(e.dtype) << " vs "
                                << DTypeName(f.dtype);
    EXPECT_EQ(e.shape, f.shape) << e.name << ": " << ShapeText(e.shape) << " vs "
                                << ShapeText(f.shape);
    if (!(e == f)) return;  // one mismatch tells; the rest would repeat it
  }
}

// ExpectedTensors(golden config) is exactly the golden file: same names,
// shapes, dtypes and stored forms (the MXFP4 pairs of k3-tiny-mxfp4), and the
// same order (by data offset).
TEST(WeightSpecTest, MatchesGoldenCheckpoints) {
  for (const char* model : {"k3-tiny", "kimi-linear-tiny", "k3-tiny-mxfp4"}) {
    SCOPED_TRACE(model);
    const std::string dir = testing::GoldenPath(std::string("model/") + model);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    auto file = SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    const std::vector<TensorSpec> specs = ExpectedTensors(*config);
    std::map<std::string, const TensorSpec*> by_name;
    for (const TensorSpec& spec : specs) {
      EXPECT_TRUE(by_name.emplace(spec.name, &spec).second) << "duplicate " << spec.name;
    }
    ExpectSameLayout(StoredLayout(specs), FileLayout(**file));
  }
}

TEST(WeightSpecTest, GoldenCheckpointsValidate) {
  for (const char* model : {"k3-tiny", "kimi-linear-tiny", "k3-tiny-mxfp4"}) {
    SCOPED_TRACE(model);
    const std::string dir = testing::GoldenPath(std::string("model/") + model);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    auto checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    EXPECT_TRUE(ValidateCheckpoint(*config, **checkpoint).ok()) << model;
    auto specs = CheckpointTensors(*config, **checkpoint);
    ASSERT_TRUE(specs.ok()) << specs.status();
    // MXFP4 exactly where the file holds the pairs: every routed expert of
    // k3-tiny-mxfp4 (8 MoE layers x 8 experts x w1, w2, w3), nothing else.
    int64_t mxfp4 = 0;
    for (const TensorSpec& spec : *specs) {
      const bool pair = (*checkpoint)->tensors().count(spec.PackedName()) > 0;
      EXPECT_EQ(spec.stored == Storage::kMxfp4, pair) << spec.name;
      if (spec.stored != Storage::kMxfp4) continue;
      ++mxfp4;
      EXPECT_EQ(spec.split.cut, TpCut::kExpert) << spec.name;
      auto views = GetMxfp4(**checkpoint, spec);
      ASSERT_TRUE(views.ok()) << views.status();
      EXPECT_EQ(views->packed->name, spec.PackedName());
      EXPECT_EQ(views->packed->shape, (std::vector<int64_t>{32, 16}));
      EXPECT_EQ(views->scale->name, spec.ScaleName());
      EXPECT_EQ(views->scale->shape, (std::vector<int64_t>{32, 1}));
    }
    EXPECT_EQ(mxfp4, config->quantization.mxfp4 ? 8 * 8 * 3 : 0);
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

// --- MXFP4 routed experts ---------------------------------------------------

ModelConfig GoldenConfig(const std::string& model) {
  auto config = LoadModelConfig(testing::GoldenPath("model/" + model));
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// Every tensor of `config` in its declared stored form, zero codes, unit
// scales (127), zero floats.
std::vector<TensorData> StoredZeros(const ModelConfig& config) {
  std::vector<TensorData> out;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    if (spec.stored == Storage::kMxfp4) {
      const int64_t rows = spec.shape[0], in = spec.shape[1];
      out.push_back({spec.PackedName(),
                     DType::kU8,
                     {rows, in / 2},
                     std::vector<uint8_t>(static_cast<size_t>(rows * (in / 2)), 0)});
      out.push_back({spec.ScaleName(),
                     DType::kU8,
                     {rows, in / 32},
                     std::vector<uint8_t>(static_cast<size_t>(rows * (in / 32)), 127)});
      continue;
    }
    const std::vector<float> zeros(static_cast<size_t>(spec.NumElements()), 0.0f);
    out.push_back(spec.dtype == DType::kF32 ? MakeF32Tensor(spec.name, spec.shape, zeros)
                                            : MakeBF16Tensor(spec.name, spec.shape, zeros));
  }
  return out;
}

std::string WriteTensors(const std::string& tag, const std::vector<TensorData>& tensors) {
  const std::string dir = testing::TempDir(tag);
  const absl::Status status = WriteSafetensors(dir + "/model.safetensors", tensors);
  EXPECT_TRUE(status.ok()) << status;
  return dir;
}

TensorData* Find(std::vector<TensorData>& tensors, const std::string& name) {
  for (TensorData& t : tensors) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

void Erase(std::vector<TensorData>& tensors, const std::string& name) {
  const size_t before = tensors.size();
  std::erase_if(tensors, [&](const TensorData& t) { return t.name == name; });
  EXPECT_EQ(tensors.size() + 1, before) << name;
}

absl::StatusOr<std::vector<TensorSpec>> SpecsOf(const ModelConfig& config, const std::string& dir) {
  auto checkpoint = Checkpoint::Open(dir);
  if (!checkpoint.ok()) return checkpoint.status();
  return CheckpointTensors(config, **checkpoint);
}

constexpr char kExpert[] = "language_model.model.layers.2.block_sparse_moe.experts.3.w2";

TEST(Mxfp4CheckpointTest, ExpertsMayBeEitherFormUnderAQuantizationConfig) {
  const ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  // All float: the sibling layout, valid under the same quantization_config.
  ModelConfig plain = config;
  plain.quantization = QuantizationConfig{};
  const std::string all_float = WriteTensors("mxfp4_all_float", StoredZeros(plain));
  auto specs = SpecsOf(config, all_float);
  ASSERT_TRUE(specs.ok()) << specs.status();
  for (const TensorSpec& spec : *specs) EXPECT_EQ(spec.stored, Storage::kFloat) << spec.name;
  // Mixed: one expert float, the rest MXFP4; each spec says which.
  std::vector<TensorData> tensors = StoredZeros(config);
  Erase(tensors, std::string(kExpert) + ".weight_packed");
  Erase(tensors, std::string(kExpert) + ".weight_scale");
  tensors.push_back(MakeBF16Tensor(std::string(kExpert) + ".weight", {32, 32},
                                   std::vector<float>(32 * 32, 0.0f)));
  specs = SpecsOf(config, WriteTensors("mxfp4_mixed", tensors));
  ASSERT_TRUE(specs.ok()) << specs.status();
  int64_t mxfp4 = 0;
  for (const TensorSpec& spec : *specs) {
    if (spec.name == std::string(kExpert) + ".weight") {
      EXPECT_EQ(spec.stored, Storage::kFloat);
    } else {
      mxfp4 += spec.stored == Storage::kMxfp4;
    }
  }
  EXPECT_EQ(mxfp4, 8 * 8 * 3 - 1);
}

TEST(Mxfp4CheckpointTest, PackedWithoutQuantizationConfig) {
  const ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  ModelConfig plain = config;
  plain.quantization = QuantizationConfig{};
  const std::string dir = WriteTensors("mxfp4_no_config", StoredZeros(config));
  const absl::Status status = ValidateDir(plain, dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ExpectMentions(status,
                 {"language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed",
                  "is MXFP4, but the config has no quantization_config", dir, "more"});
  // The golden MXFP4 checkpoint read with its bf16 sibling's config: the
  // same refusal, whatever else differs.
  ModelConfig sibling = GoldenConfig("k3-tiny");
  sibling.moe_intermediate_size = 32;
  ExpectMentions(ValidateDir(sibling, testing::GoldenPath("model/k3-tiny-mxfp4")),
                 {"no quantization_config"});
}

TEST(Mxfp4CheckpointTest, PackedModuleNotTargeted) {
  ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  const std::string dir = WriteTensors("mxfp4_untargeted", StoredZeros(config));
  config.quantization.targets = {R"(re:.*block_sparse_moe\.experts\.\d+\.w[13]$)"};
  const absl::Status status = ValidateDir(config, dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ExpectMentions(status,
                 {"language_model.model.layers.1.block_sparse_moe.experts.0.w2.weight_packed",
                  "module 'language_model.model.layers.1.block_sparse_moe.experts.0.w2' matches "
                  "no target of text_config.quantization_config",
                  "w[13]$"});
  EXPECT_EQ(status.message().find("experts.0.w1.weight_packed"), std::string::npos) << status;
}

TEST(Mxfp4CheckpointTest, PackedModuleIgnored) {
  ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  const std::string dir = WriteTensors("mxfp4_ignored", StoredZeros(config));
  config.quantization.ignore.push_back(R"(re:.*layers\.2\.block_sparse_moe\.experts\.3\.)");
  const absl::Status status = ValidateDir(config, dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ExpectMentions(status, {std::string(kExpert) + ".weight_packed",
                          std::string("module '") + kExpert + "' is in " +
                              "text_config.quantization_config.ignore ('re:.*layers",
                          "experts.3.w1.weight_packed", "experts.3.w3.weight_packed"});
  EXPECT_EQ(status.message().find("more"), std::string::npos) << status;  // 3 problems
}

TEST(Mxfp4CheckpointTest, HalfOfThePairMissing) {
  const ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  for (const char* half : {".weight_scale", ".weight_packed"}) {
    SCOPED_TRACE(half);
    std::vector<TensorData> tensors = StoredZeros(config);
    Erase(tensors, kExpert + std::string(half));
    const std::string dir = WriteTensors("mxfp4_half", tensors);
    const absl::Status status = ValidateDir(config, dir);
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
    const bool scale = std::string(half) == ".weight_scale";
    ExpectMentions(status, {"missing tensor '" + std::string(kExpert) + half + "'",
                            scale ? "U8 [32, 1], the scales of MXFP4" : "U8 [32, 16], the codes",
                            std::string(kExpert) + ".weight' [32, 32]",
                            kExpert + std::string(scale ? ".weight_packed" : ".weight_scale")});
  }
}

TEST(Mxfp4CheckpointTest, WrongDtypeOrShape) {
  const ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  const std::string packed = std::string(kExpert) + ".weight_packed";
  const std::string scale = std::string(kExpert) + ".weight_scale";
  struct Case {
    std::string tensor;
    TensorData replacement;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      {packed,
       MakeBF16Tensor(packed, {32, 16}, std::vector<float>(32 * 16, 0.0f)),
       {packed, "has dtype BF16, expected U8 [32, 16]"}},
      {packed,
       TensorData{packed, DType::kI32, {32, 16}, std::vector<uint8_t>(32 * 16 * 4)},
       {packed, "has dtype I32"}},
      {scale,
       MakeF32Tensor(scale, {32, 1}, std::vector<float>(32, 1.0f)),
       {scale, "has dtype F32, expected U8 [32, 1]"}},
      {packed,
       TensorData{packed, DType::kU8, {32, 32}, std::vector<uint8_t>(32 * 32)},
       {packed, "has shape [32, 32], expected U8 [32, 16]"}},
      {packed,
       TensorData{packed, DType::kU8, {16, 32}, std::vector<uint8_t>(16 * 32)},
       {packed, "has shape [16, 32], expected U8 [32, 16]"}},
      {scale,
       TensorData{scale, DType::kU8, {1, 32}, std::vector<uint8_t>(32)},
       {scale, "has shape [1, 32], expected U8 [32, 1]"}},
      {scale,
       TensorData{scale, DType::kU8, {32, 2}, std::vector<uint8_t>(64)},
       {scale, "has shape [32, 2]"}},
      {scale,
       TensorData{scale, DType::kU8, {32}, std::vector<uint8_t>(32)},
       {scale, "has shape [32], expected U8 [32, 1]"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.replacement.name + " " + DTypeName(c.replacement.dtype) + " " +
                 ShapeText(c.replacement.shape));
    std::vector<TensorData> tensors = StoredZeros(config);
    *Find(tensors, c.tensor) = c.replacement;
    const std::string dir = WriteTensors("mxfp4_wrong", tensors);
    const absl::Status status = ValidateDir(config, dir);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    std::vector<std::string> mentions = c.mentions;
    mentions.push_back(dir);
    ExpectMentions(status, mentions);
  }
}

TEST(Mxfp4CheckpointTest, BothFormsOfOneTensor) {
  const ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  std::vector<TensorData> tensors = StoredZeros(config);
  tensors.push_back(MakeBF16Tensor(std::string(kExpert) + ".weight", {32, 32},
                                   std::vector<float>(32 * 32, 0.0f)));
  const absl::Status status = ValidateDir(config, WriteTensors("mxfp4_both", tensors));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ExpectMentions(status, {std::string("tensor '") + kExpert + ".weight' is stored twice: as BF16",
                          "and as MXFP4 '" + std::string(kExpert) + ".weight_packed'"});
}

TEST(Mxfp4CheckpointTest, RowsNotInGroupsOf32) {
  // k3-tiny's experts are 24 wide: w2 [32, 24] cannot be MXFP4.
  ModelConfig config = Preset("k3-tiny");
  std::vector<TensorData> tensors = StoredZeros(config);  // all float
  config.quantization = RoutedExpertsMxfp4();
  const std::string w2 = std::string(kExpert) + ".weight";
  Erase(tensors, w2);
  tensors.push_back({w2 + "_packed", DType::kU8, {32, 12}, std::vector<uint8_t>(32 * 12)});
  tensors.push_back({w2 + "_scale", DType::kU8, {32, 1}, std::vector<uint8_t>(32, 127)});
  const absl::Status status = ValidateDir(config, WriteTensors("mxfp4_rows", tensors));
  ExpectMentions(status, {w2 + "_packed", "rows of 24 values (shape [32, 24])",
                          "do not split into groups of 32"});
}

TEST(Mxfp4CheckpointTest, OnlyRoutedExpertsMayBePacked) {
  ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  config.quantization.targets.push_back("Linear");  // even when targeted
  const std::string name =
      "language_model.model.layers.4.block_sparse_moe.shared_experts.down_proj.weight";
  std::vector<TensorData> tensors = StoredZeros(config);
  Erase(tensors, name);
  tensors.push_back({name + "_packed", DType::kU8, {64, 32}, std::vector<uint8_t>(64 * 32)});
  tensors.push_back({name + "_scale", DType::kU8, {64, 2}, std::vector<uint8_t>(64 * 2, 127)});
  const absl::Status status = ValidateDir(config, WriteTensors("mxfp4_shared", tensors));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  ExpectMentions(status, {"missing tensor '" + name + "'", name + "_packed",
                          "only routed experts may be MXFP4"});
}

TEST(Mxfp4CheckpointTest, PatternThatDoesNotCompile) {
  // Only a hand-made config can hold one: ParseModelConfig refuses it.
  ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  config.quantization.ignore.push_back("re:(");
  const std::string dir = testing::GoldenPath("model/k3-tiny-mxfp4");
  ExpectMentions(ValidateDir(config, dir), {"'re:('", "ignore"});
}

TEST(Mxfp4CheckpointTest, GetMxfp4) {
  const ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  std::vector<TensorData> tensors = StoredZeros(config);
  // A NaN scale (255) in row 5 of one expert's scales.
  Find(tensors, std::string(kExpert) + ".weight_scale")->bytes[5] = 255;
  const std::string dir = WriteTensors("mxfp4_get", tensors);
  auto checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto specs = CheckpointTensors(config, **checkpoint);
  ASSERT_TRUE(specs.ok()) << specs.status();  // structure only: scales are not read
  for (const TensorSpec& spec : *specs) {
    auto views = GetMxfp4(**checkpoint, spec);
    if (spec.name == std::string(kExpert) + ".weight") {
      ASSERT_FALSE(views.ok());
      ExpectMentions(views.status(), {std::string(kExpert) + ".weight_scale", "NaN scale (255)",
                                      "row 5, group 0 (columns 0..31)"});
    } else if (spec.stored == Storage::kMxfp4) {
      ASSERT_TRUE(views.ok()) << views.status();
      EXPECT_EQ(views->packed->dtype, DType::kU8);
      EXPECT_EQ(views->packed->data[0], 0);
      EXPECT_EQ(views->scale->data[0], 127);
    } else {
      ASSERT_FALSE(views.ok()) << spec.name;
      ExpectMentions(views.status(), {spec.name, "is not MXFP4"});
    }
  }
  // A float expert's spec is not MXFP4 either, whatever the config declares.
  EXPECT_FALSE(GetMxfp4(**checkpoint, ExpectedTensors(GoldenConfig("k3-tiny"))[0]).ok());
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
  // K3's mixture: 8 MoE layers * (128 - 8) unused experts * 3 * 512 * 512,
  // and the 8 active experts about half of what a token multiplies, as in K3.
  const ParameterCount moe = CountParameters(Preset("k3-moe-small"));
  EXPECT_EQ(moe.total - moe.active_per_token, int64_t{8} * 120 * 3 * 512 * 512);
  const double routed_active = 8.0 * 8 * 3 * 512 * 512;
  EXPECT_GT(routed_active / static_cast<double>(moe.active_per_token), 0.45);
  EXPECT_LT(moe.total, 1'000'000'000);
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

std::vector<double> Dequantized(const Checkpoint& checkpoint, const TensorSpec& spec) {
  auto views = GetMxfp4(checkpoint, spec);
  EXPECT_TRUE(views.ok()) << views.status();
  if (!views.ok()) return {};
  std::vector<float> values(static_cast<size_t>(spec.NumElements()));
  kernels::DequantizeMxfp4(views->packed->data, views->scale->data, spec.shape[0], spec.shape[1],
                           values.data());
  return std::vector<double>(values.begin(), values.end());
}

// make-model --experts mxfp4 of the golden config writes exactly the golden
// file's layout (names, dtypes, shapes, order) and its config.json, whether
// the config brought its quantization_config or RoutedExpertsMxfp4 added it.
TEST(RandomCheckpointTest, Mxfp4ExpertsInTheGoldenLayout) {
  const std::string golden_dir = testing::GoldenPath("model/k3-tiny-mxfp4");
  auto golden_file = SafetensorsFile::Open(golden_dir + "/model.safetensors");
  ASSERT_TRUE(golden_file.ok()) << golden_file.status();
  const nlohmann::json golden_json = nlohmann::json::parse(ReadBytes(golden_dir + "/config.json"));
  ModelConfig plain = GoldenConfig("k3-tiny");  // bf16 sibling, 24 wide
  plain.moe_intermediate_size = 32;
  for (const ModelConfig& source : {GoldenConfig("k3-tiny-mxfp4"), plain}) {
    SCOPED_TRACE(source.quantization.mxfp4 ? "own quantization_config" : "added");
    const std::string dir = testing::TempDir("random_mxfp4");
    ASSERT_TRUE(WriteRandomCheckpoint(WithExpertFormat(source, ExpertFormat::kMxfp4), dir, 5).ok());
    auto file = SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    ExpectSameLayout(FileLayout(**golden_file), FileLayout(**file));
    EXPECT_EQ(nlohmann::json::parse(ReadBytes(dir + "/config.json")), golden_json);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    auto checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    auto specs = CheckpointTensors(*config, **checkpoint);
    ASSERT_TRUE(specs.ok()) << specs.status();
    int64_t mxfp4 = 0;
    for (const TensorSpec& spec : *specs) mxfp4 += spec.stored == Storage::kMxfp4;
    EXPECT_EQ(mxfp4, 8 * 8 * 3);
  }
}

// The MXFP4 experts are their bf16 twins (same seed, same name) quantised:
// each value within a third of its group's largest magnitude (a scale of at
// least amax / 6, E2M1 steps of at most 2 scales), so of the bf16
// initialisation's magnitude, std 1 / sqrt(fan_in); no scale is NaN.
TEST(RandomCheckpointTest, Mxfp4ExpertsAreTheBf16OnesQuantised) {
  const ModelConfig config = GoldenConfig("k3-tiny-mxfp4");
  const std::string bf16_dir = testing::TempDir("random_twin_bf16");
  const std::string mxfp4_dir = testing::TempDir("random_twin_mxfp4");
  ASSERT_TRUE(
      WriteRandomCheckpoint(WithExpertFormat(config, ExpertFormat::kBf16), bf16_dir, 9).ok());
  ASSERT_TRUE(
      WriteRandomCheckpoint(WithExpertFormat(config, ExpertFormat::kMxfp4), mxfp4_dir, 9).ok());
  auto bf16 = Checkpoint::Open(bf16_dir);
  auto mxfp4 = Checkpoint::Open(mxfp4_dir);
  ASSERT_TRUE(bf16.ok() && mxfp4.ok());
  auto specs = CheckpointTensors(config, **mxfp4);
  ASSERT_TRUE(specs.ok()) << specs.status();
  double sum_sq = 0, count = 0;
  int64_t experts = 0;
  for (const TensorSpec& spec : *specs) {
    if (spec.stored != Storage::kMxfp4) continue;
    ++experts;
    const std::vector<double> q = Dequantized(**mxfp4, spec);
    auto twin = ToFloat64(**(*bf16)->Get(spec.name));
    ASSERT_TRUE(twin.ok()) << twin.status();
    ASSERT_EQ(q.size(), twin->size());
    for (size_t g = 0; g < q.size(); g += 32) {
      double amax = 0;
      for (size_t i = g; i < g + 32; ++i) amax = std::max(amax, std::abs((*twin)[i]));
      for (size_t i = g; i < g + 32; ++i) {
        // bf16 rounding of the twin: 2^-8 relative.
        ASSERT_LE(std::abs(q[i] - (*twin)[i]), amax / 3 * (1 + 1e-2) + amax * 0x1p-8)
            << spec.name << " [" << i << "]";
      }
    }
    for (double v : q) sum_sq += v * v * static_cast<double>(spec.shape[1]);
    count += static_cast<double>(q.size());
  }
  EXPECT_EQ(experts, 8 * 8 * 3);
  // Every expert here has fan_in 32: std * sqrt(fan_in) about 1.
  EXPECT_NEAR(std::sqrt(sum_sq / count), 1.0, 0.15);
}

TEST(RandomCheckpointTest, Mxfp4NeedsRowsOfWholeGroups) {
  // k3-tiny's experts are 24 wide (w2 [32, 24]): refused before any write.
  const std::string dir = testing::TempDir("random_mxfp4_24") + "/model";
  const absl::Status status =
      WriteRandomCheckpoint(WithExpertFormat(Preset("k3-tiny"), ExpertFormat::kMxfp4), dir, 1);
  ExpectMentions(status, {"experts.0.w2.weight", "rows of 24 values", "moe_intermediate_size is 24",
                          "multiple of 32"});
  EXPECT_FALSE(std::filesystem::exists(dir));
  // Kimi Linear's w1 / w3 read the 64-wide hidden state, its w2 24.
  ModelConfig kimi = Preset("kimi-linear-tiny");
  kimi.hidden_size = 48;
  ExpectMentions(WriteRandomCheckpoint(WithExpertFormat(kimi, ExpertFormat::kMxfp4), dir, 1),
                 {"w1.weight", "hidden_size is 48"});
}

TEST(RandomCheckpointTest, ExpertFormats) {
  EXPECT_EQ(*ParseExpertFormat("bf16"), ExpertFormat::kBf16);
  EXPECT_EQ(*ParseExpertFormat("mxfp4"), ExpertFormat::kMxfp4);
  for (const char* bad : {"", "fp4", "MXFP4", "bf16 "}) {
    ExpectMentions(ParseExpertFormat(bad).status(), {std::string("'") + bad + "'", "mxfp4"});
  }
  // bf16 drops a quantization_config; mxfp4 keeps the config's own.
  ModelConfig own = GoldenConfig("k3-tiny-mxfp4");
  own.quantization.ignore = {"lm_head"};
  EXPECT_FALSE(WithExpertFormat(own, ExpertFormat::kBf16).quantization.mxfp4);
  EXPECT_EQ(WithExpertFormat(own, ExpertFormat::kMxfp4).quantization.ignore,
            std::vector<std::string>{"lm_head"});
  EXPECT_EQ(WithExpertFormat(Preset("k3-tiny"), ExpertFormat::kMxfp4).quantization.targets,
            RoutedExpertsMxfp4().targets);
}

// The benchmarks' MXFP4 model: k3-small (rows of 512 and 384 values).
TEST(RandomCheckpointTest, BenchCheckpointMxfp4) {
  const std::string dir = testing::TempDir("bench_mxfp4") + "/model";
  auto made = BenchCheckpoint("k3-small", dir, ExpertFormat::kMxfp4);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(*made, dir);
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->quantization.mxfp4);
  auto checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto specs = CheckpointTensors(*config, **checkpoint);
  ASSERT_TRUE(specs.ok()) << specs.status();
  int64_t mxfp4 = 0;
  for (const TensorSpec& spec : *specs) mxfp4 += spec.stored == Storage::kMxfp4;
  EXPECT_EQ(mxfp4, 8 * 8 * 3);  // 8 MoE layers of 8 experts
  std::filesystem::remove_all(dir);
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
