#include "runtime/model/config.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/model/presets.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

constexpr LayerKind K = LayerKind::kKda;
constexpr LayerKind M = LayerKind::kMla;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

json GoldenJson(const std::string& model) {
  return json::parse(ReadFile(testing::GoldenPath("model/" + model + "/config.json")));
}

// `a.b.c` -> the JSON pointer /a/b/c.
json::json_pointer Pointer(const std::string& dotted) {
  std::string pointer = "/" + dotted;
  for (char& ch : pointer) {
    if (ch == '.') ch = '/';
  }
  return json::json_pointer(pointer);
}

absl::StatusOr<ModelConfig> Parse(const json& j) {
  return ParseModelConfig(j.dump(), "test/config.json");
}

// Every field, so a preset or a round trip that drops one shows up.
void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.layer_kinds, b.layer_kinds);
  EXPECT_EQ(a.kda.num_heads, b.kda.num_heads);
  EXPECT_EQ(a.kda.head_dim, b.kda.head_dim);
  EXPECT_EQ(a.kda.conv_kernel_size, b.kda.conv_kernel_size);
  EXPECT_EQ(a.kda.full_rank_gate, b.kda.full_rank_gate);
  EXPECT_EQ(a.kda.has_lower_bound, b.kda.has_lower_bound);
  EXPECT_EQ(a.kda.gate_lower_bound, b.kda.gate_lower_bound);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
  EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
  EXPECT_EQ(a.mla_output_gate, b.mla_output_gate);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.situ_beta, b.situ_beta);
  EXPECT_EQ(a.situ_linear_beta, b.situ_linear_beta);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.first_k_dense_replace, b.first_k_dense_replace);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.num_experts_per_token, b.num_experts_per_token);
  EXPECT_EQ(a.num_shared_experts, b.num_shared_experts);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.moe_renormalize, b.moe_renormalize);
  EXPECT_EQ(a.routed_scaling_factor, b.routed_scaling_factor);
  EXPECT_EQ(a.routed_expert_hidden_size, b.routed_expert_hidden_size);
  EXPECT_EQ(a.latent_moe_use_norm, b.latent_moe_use_norm);
  EXPECT_EQ(a.attn_res_block_size, b.attn_res_block_size);
  EXPECT_EQ(a.quantization.mxfp4, b.quantization.mxfp4);
  EXPECT_EQ(a.quantization.targets, b.quantization.targets);
  EXPECT_EQ(a.quantization.ignore, b.quantization.ignore);
}

TEST(ConfigTest, ParsesGoldenK3) {
  auto config = LoadModelConfig(testing::GoldenPath("model/k3-tiny"));
  ASSERT_TRUE(config.ok()) << config.status();
  const ModelConfig& c = *config;
  // text_config says kimi_linear; the top level decides.
  EXPECT_EQ(c.arch, Architecture::kKimiK3);
  EXPECT_TRUE(c.IsK3());
  EXPECT_EQ(c.model_type, "kimi_k3");
  EXPECT_EQ(c.layer_kinds, (std::vector<LayerKind>{K, K, K, M, K, K, K, M, M}));
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 9);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.kda.num_heads, 4);
  EXPECT_EQ(c.kda.head_dim, 8);
  EXPECT_EQ(c.kda.conv_kernel_size, 4);
  EXPECT_TRUE(c.kda.full_rank_gate);
  EXPECT_TRUE(c.kda.has_lower_bound);
  EXPECT_EQ(c.kda.gate_lower_bound, -5.0f);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.q_lora_rank, 32);
  EXPECT_EQ(c.kv_lora_rank, 16);
  EXPECT_EQ(c.qk_nope_head_dim, 8);
  EXPECT_EQ(c.qk_rope_head_dim, 4);
  EXPECT_EQ(c.v_head_dim, 8);
  EXPECT_EQ(c.MlaCacheWidth(), 20);
  EXPECT_TRUE(c.mla_output_gate);
  EXPECT_EQ(c.hidden_act, "situ");
  EXPECT_EQ(c.situ_beta, 4.0f);
  EXPECT_EQ(c.situ_linear_beta, 25.0f);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_token, 2);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_EQ(c.moe_intermediate_size, 24);
  EXPECT_TRUE(c.moe_renormalize);
  EXPECT_EQ(c.routed_scaling_factor, 1.0f);
  EXPECT_EQ(c.routed_expert_hidden_size, 32);
  EXPECT_TRUE(c.latent_moe_use_norm);
  EXPECT_EQ(c.attn_res_block_size, 4);
  EXPECT_FALSE(c.IsMoeLayer(0));
  EXPECT_TRUE(c.IsMoeLayer(1));
  EXPECT_TRUE(c.IsMoeLayer(8));
  EXPECT_EQ(c.ModelPrefix(), "language_model.model.");
  EXPECT_EQ(c.LmHeadName(), "language_model.lm_head.weight");
}

TEST(ConfigTest, ParsesGoldenKimiLinear) {
  auto config = LoadModelConfig(testing::GoldenPath("model/kimi-linear-tiny"));
  ASSERT_TRUE(config.ok()) << config.status();
  const ModelConfig& c = *config;
  EXPECT_EQ(c.arch, Architecture::kKimiLinear);
  EXPECT_FALSE(c.IsK3());
  EXPECT_EQ(c.model_type, "kimi_linear");
  EXPECT_EQ(c.layer_kinds, (std::vector<LayerKind>{K, K, K, M, K, K, K, M, M}));
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 9);
  EXPECT_EQ(c.kda.num_heads, 4);
  EXPECT_EQ(c.kda.head_dim, 8);
  EXPECT_EQ(c.kda.conv_kernel_size, 4);
  EXPECT_FALSE(c.kda.full_rank_gate);
  EXPECT_FALSE(c.kda.has_lower_bound);
  EXPECT_EQ(c.q_lora_rank, 0);  // null: plain q_proj
  EXPECT_FALSE(c.mla_output_gate);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.num_shared_experts, 1);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.446f);
  EXPECT_EQ(c.routed_expert_hidden_size, 0);
  EXPECT_FALSE(c.latent_moe_use_norm);
  EXPECT_EQ(c.attn_res_block_size, 0);
  EXPECT_EQ(c.ModelPrefix(), "model.");
  EXPECT_EQ(c.LmHeadName(), "lm_head.weight");
}

// K3's required keys are under text_config; Kimi Linear's at the top.
std::vector<std::string> RequiredKeys(bool k3) {
  std::vector<std::string> keys = {"hidden_size",
                                   "num_hidden_layers",
                                   "vocab_size",
                                   "num_attention_heads",
                                   "q_lora_rank",
                                   "kv_lora_rank",
                                   "qk_nope_head_dim",
                                   "qk_rope_head_dim",
                                   "v_head_dim",
                                   "intermediate_size",
                                   "rms_norm_eps",
                                   "hidden_act",
                                   "linear_attn_config",
                                   "linear_attn_config.num_heads",
                                   "linear_attn_config.head_dim",
                                   "linear_attn_config.kda_layers",
                                   "linear_attn_config.full_attn_layers",
                                   "num_experts",
                                   "num_experts_per_token",
                                   "moe_intermediate_size",
                                   "num_shared_experts",
                                   "first_k_dense_replace",
                                   "moe_renormalize",
                                   "routed_scaling_factor"};
  if (k3) {
    for (const char* key :
         {"attn_res_block_size", "activation_situ_beta", "activation_situ_linear_beta",
          "routed_expert_hidden_size", "latent_moe_use_norm", "mla_use_output_gate",
          "linear_attn_config.use_full_rank_gate", "linear_attn_config.gate_lower_bound",
          "linear_attn_config.short_conv_kernel_size"}) {
      keys.push_back(key);
    }
  }
  return keys;
}

TEST(ConfigTest, EachRequiredKeyMissingIsAnErrorNamingIt) {
  for (bool k3 : {true, false}) {
    const json golden = GoldenJson(k3 ? "k3-tiny" : "kimi-linear-tiny");
    const std::string prefix = k3 ? "text_config." : "";
    for (const std::string& key : RequiredKeys(k3)) {
      SCOPED_TRACE(prefix + key);
      json j = golden;
      const json::json_pointer pointer = Pointer(prefix + key);
      j[pointer.parent_pointer()].erase(pointer.back());
      auto config = Parse(j);
      ASSERT_FALSE(config.ok());
      EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(config.status().message().find("missing required key '" + prefix + key + "'"),
                std::string::npos)
          << config.status();
      EXPECT_NE(config.status().message().find("test/config.json"), std::string::npos)
          << config.status();
    }
  }
  // The top-level keys that choose the layout.
  for (const char* key : {"model_type", "text_config"}) {
    json j = GoldenJson("k3-tiny");
    j.erase(key);
    auto config = Parse(j);
    ASSERT_FALSE(config.ok()) << key;
    EXPECT_NE(config.status().message().find(std::string("'") + key + "'"), std::string::npos)
        << config.status();
  }
}

TEST(ConfigTest, NullRequiredKeyIsMissing) {
  json j = GoldenJson("k3-tiny");
  j["text_config"]["attn_res_block_size"] = nullptr;
  auto config = Parse(j);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("text_config.attn_res_block_size"), std::string::npos)
      << config.status();
}

TEST(ConfigTest, KimiLinearOptionalKeysHaveDefaults) {
  json j = GoldenJson("kimi-linear-tiny");
  j["linear_attn_config"].erase("short_conv_kernel_size");
  j.erase("tie_word_embeddings");
  j.erase("max_position_embeddings");
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->kda.conv_kernel_size, 4);
  EXPECT_FALSE(config->tie_word_embeddings);
}

TEST(ConfigTest, DenseModelNeedsNoMoeKeys) {
  json j = GoldenJson("kimi-linear-tiny");
  for (const char* key : {"num_experts_per_token", "moe_intermediate_size", "num_shared_experts",
                          "moe_renormalize", "routed_scaling_factor"}) {
    j.erase(key);
  }
  j["num_experts"] = 0;
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->IsMoeLayer(5));
}

struct BadValue {
  std::string key;  // dotted path below text_config for K3
  json value;
};

TEST(ConfigTest, WrongValuesAreErrorsNamingTheKey) {
  const std::vector<BadValue> cases = {
      {"hidden_size", "64"},
      {"hidden_size", -64},
      {"hidden_size", 0},
      {"hidden_size", 64.5},
      {"hidden_size", int64_t{1} << 40},
      {"hidden_size", json::array({64})},
      {"num_hidden_layers", true},
      {"num_hidden_layers", 0},
      {"num_hidden_layers", 100000},
      {"vocab_size", nullptr},
      {"num_attention_heads", 0},
      {"q_lora_rank", "32"},
      {"q_lora_rank", 0},
      {"kv_lora_rank", -1},
      {"qk_nope_head_dim", 0},
      {"qk_rope_head_dim", -4},
      {"v_head_dim", 0},
      {"intermediate_size", "96"},
      {"rms_norm_eps", "1e-5"},
      {"rms_norm_eps", 0},
      {"rms_norm_eps", -1e-5},
      {"rms_norm_eps", 1e-50},                          // 0 as a float32
      {"rms_norm_eps", 1e39},                           // infinite as a float32
      {"linear_attn_config.gate_lower_bound", -1e-50},  // -0 as a float32: not negative
      {"routed_scaling_factor", 1e-300},
      {"activation_situ_beta", 1e300},
      {"hidden_act", "gelu"},
      {"hidden_act", 1},
      {"linear_attn_config", json::array()},
      {"linear_attn_config.num_heads", 0},
      {"linear_attn_config.num_heads", "4"},
      {"linear_attn_config.head_dim", -8},
      {"linear_attn_config.short_conv_kernel_size", 0},
      {"linear_attn_config.kda_layers", "1,2,3,5,6,7"},
      {"linear_attn_config.kda_layers", json::array({1, 2, "3", 5, 6, 7})},
      {"linear_attn_config.full_attn_layers", 4},
      {"linear_attn_config.use_full_rank_gate", 1},
      {"linear_attn_config.gate_lower_bound", "-5"},
      {"linear_attn_config.gate_lower_bound", 5.0},
      {"num_experts", -8},
      {"num_experts", 1 << 20},
      {"num_experts_per_token", 9},  // more than num_experts
      {"num_experts_per_token", 0},
      {"moe_intermediate_size", 0},
      {"num_shared_experts", -1},
      {"first_k_dense_replace", 10},  // more than num_hidden_layers
      {"moe_renormalize", "true"},
      {"routed_scaling_factor", "2.5"},
      {"routed_scaling_factor", 0},
      {"moe_router_activation_func", "softmax"},
      {"moe_layer_freq", 2},
      {"num_expert_group", 4},  // group-limited routing
      {"attn_res_block_size", 0},
      {"attn_res_block_size", "4"},
      {"activation_situ_beta", "4"},
      {"activation_situ_beta", 0},
      {"activation_situ_linear_beta", -25},
      {"routed_expert_hidden_size", 0},
      {"latent_moe_use_norm", "yes"},
      {"mla_use_output_gate", 0},
      {"tie_word_embeddings", "false"},
      {"max_position_embeddings", 0},
  };
  const json golden = GoldenJson("k3-tiny");
  for (const BadValue& bad : cases) {
    const std::string path = "text_config." + bad.key;
    SCOPED_TRACE(path + " = " + bad.value.dump());
    json j = golden;
    j[Pointer(path)] = bad.value;
    if (bad.key == "num_expert_group") j["text_config"]["topk_group"] = 1;
    auto config = Parse(j);
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string named = bad.key == "num_expert_group" ? "text_config.topk_group" : path;
    EXPECT_NE(config.status().message().find("'" + named + "'"), std::string::npos)
        << config.status();
  }
}

TEST(ConfigTest, KimiLinearRejectsAttentionResidualKey) {
  json j = GoldenJson("kimi-linear-tiny");
  j["attn_res_block_size"] = 4;
  auto config = Parse(j);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("attn_res_block_size"), std::string::npos);
}

TEST(ConfigTest, UnknownModelTypeIsAnError) {
  for (const char* type : {"deepseek_v3", "kimi_linear_v2", ""}) {
    json j = GoldenJson("kimi-linear-tiny");
    j["model_type"] = type;
    auto config = Parse(j);
    ASSERT_FALSE(config.ok()) << type;
    EXPECT_NE(config.status().message().find(std::string("'") + type + "'"), std::string::npos)
        << config.status();
  }
  json j = GoldenJson("kimi-linear-tiny");
  j["model_type"] = 3;
  auto config = Parse(j);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("'model_type'"), std::string::npos);
}

TEST(ConfigTest, NotJsonIsAnErrorNamingTheFile) {
  for (const char* text : {"", "{", "[1, 2]", "{\"model_type\": \"kimi_k3\"", "nul"}) {
    auto config = ParseModelConfig(text, "some/dir/config.json");
    ASSERT_FALSE(config.ok()) << text;
    EXPECT_NE(config.status().message().find("some/dir/config.json"), std::string::npos)
        << config.status();
  }
}

absl::StatusOr<ModelConfig> WithLayerLists(bool k3, const json& kda, const json& full) {
  json j = GoldenJson(k3 ? "k3-tiny" : "kimi-linear-tiny");
  json& lin = k3 ? j["text_config"]["linear_attn_config"] : j["linear_attn_config"];
  lin["kda_layers"] = kda;
  lin["full_attn_layers"] = full;
  return Parse(j);
}

TEST(ConfigTest, LayerListErrors) {
  for (bool k3 : {true, false}) {
    SCOPED_TRACE(k3 ? "k3" : "kimi_linear");
    // Layer 4 in both lists.
    auto both = WithLayerLists(k3, {1, 2, 3, 4, 5, 6, 7}, {4, 8, 9});
    ASSERT_FALSE(both.ok());
    EXPECT_NE(both.status().message().find("layer 4 is in both"), std::string::npos)
        << both.status();
    // Layer 7 in neither.
    auto neither = WithLayerLists(k3, {1, 2, 3, 5, 6}, {4, 8, 9});
    ASSERT_FALSE(neither.ok());
    EXPECT_NE(neither.status().message().find("layer 7 (1-indexed) is in neither"),
              std::string::npos)
        << neither.status();
    // The 0-indexing trap: the same pattern written 0-indexed.
    auto zero = WithLayerLists(k3, {0, 1, 2, 4, 5, 6}, {3, 7, 8});
    ASSERT_FALSE(zero.ok());
    EXPECT_NE(zero.status().message().find("layer 0"), std::string::npos) << zero.status();
    EXPECT_NE(zero.status().message().find("1-indexed"), std::string::npos) << zero.status();
    EXPECT_NE(zero.status().message().find("kda_layers"), std::string::npos) << zero.status();
    // Past the end.
    auto past = WithLayerLists(k3, {1, 2, 3, 5, 6, 7}, {4, 8, 9, 10});
    ASSERT_FALSE(past.ok());
    EXPECT_NE(past.status().message().find("layer 10"), std::string::npos) << past.status();
    EXPECT_NE(past.status().message().find("full_attn_layers"), std::string::npos) << past.status();
    auto negative = WithLayerLists(k3, {-1, 1, 2, 3, 5, 6, 7}, {4, 8, 9});
    ASSERT_FALSE(negative.ok());
    EXPECT_NE(negative.status().message().find("layer -1"), std::string::npos);
    // Twice in one list.
    auto twice = WithLayerLists(k3, {1, 2, 3, 5, 6, 7, 7}, {4, 8, 9});
    ASSERT_FALSE(twice.ok());
    EXPECT_NE(twice.status().message().find("layer 7 twice"), std::string::npos) << twice.status();
    // All KDA is fine, and so is the list order.
    auto all_kda = WithLayerLists(k3, {9, 8, 7, 6, 5, 4, 3, 2, 1}, json::array());
    ASSERT_TRUE(all_kda.ok()) << all_kda.status();
    EXPECT_EQ(all_kda->layer_kinds, std::vector<LayerKind>(9, K));
  }
}

TEST(ConfigTest, OptionalVariants) {
  // Tied embeddings: the head is the embedding.
  json j = GoldenJson("kimi-linear-tiny");
  j["tie_word_embeddings"] = true;
  auto tied = Parse(j);
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_TRUE(tied->tie_word_embeddings);
  EXPECT_EQ(tied->LmHeadName(), "model.embed_tokens.weight");
  // Zero shared experts.
  j = GoldenJson("k3-tiny");
  j["text_config"]["num_shared_experts"] = 0;
  auto no_shared = Parse(j);
  ASSERT_TRUE(no_shared.ok()) << no_shared.status();
  EXPECT_EQ(no_shared->num_shared_experts, 0);
  // The K3 gate keys one level up are accepted too.
  j = GoldenJson("k3-tiny");
  j["text_config"]["use_full_rank_gate"] = false;
  j["text_config"]["gate_lower_bound"] = -3.0;
  j["text_config"]["linear_attn_config"].erase("use_full_rank_gate");
  j["text_config"]["linear_attn_config"].erase("gate_lower_bound");
  auto moved = Parse(j);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_FALSE(moved->kda.full_rank_gate);
  EXPECT_EQ(moved->kda.gate_lower_bound, -3.0f);
}

TEST(ConfigTest, GarbledConfigsNeverCrash) {
  for (const char* model : {"k3-tiny", "kimi-linear-tiny", "k3-tiny-mxfp4"}) {
    const std::string text =
        ReadFile(testing::GoldenPath(std::string("model/") + model + "/config.json"));
    uint64_t state = 12345;
    auto next = [&state] {  // splitmix64
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return z ^ (z >> 31);
    };
    int accepted = 0;
    for (int iteration = 0; iteration < 400; ++iteration) {
      std::string mutated = text;
      for (int e = 0; e < 2; ++e) {
        const size_t pos = next() % mutated.size();
        mutated[pos] =
            (next() & 1) ? static_cast<char>('0' + next() % 10) : static_cast<char>(next());
      }
      auto config = ParseModelConfig(mutated, "garbled/config.json");
      if (config.ok()) {
        ++accepted;
        // Whatever passed must be self-consistent enough to serialise.
        EXPECT_TRUE(ParseModelConfig(ModelConfigToJson(*config), "again").ok());
      } else {
        EXPECT_NE(config.status().message().find("garbled/config.json"), std::string::npos)
            << config.status();
      }
    }
    std::printf("%s: %d of 400 garbled configs still parsed\n", model, accepted);
  }
}

TEST(ConfigTest, LoadModelConfigErrorsNameTheFile) {
  const std::string dir = testing::TempDir("config_test_missing");
  auto missing = LoadModelConfig(dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/config.json"), std::string::npos)
      << missing.status();
  std::ofstream(dir + "/config.json") << "{\"model_type\": \"kimi_k3\"}";
  auto bad = LoadModelConfig(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(dir + "/config.json"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("'text_config'"), std::string::npos) << bad.status();
}

TEST(ConfigTest, JsonRoundTrip) {
  for (const char* model : {"k3-tiny", "kimi-linear-tiny", "k3-tiny-mxfp4"}) {
    SCOPED_TRACE(model);
    auto golden = LoadModelConfig(testing::GoldenPath(std::string("model/") + model));
    ASSERT_TRUE(golden.ok()) << golden.status();
    const std::string text = ModelConfigToJson(*golden);
    auto again = ParseModelConfig(text, "round trip");
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << text;
    ExpectSameConfig(*again, *golden);
    EXPECT_EQ(ModelConfigToJson(*again), text);
    // Same keys and values as the golden file, where the golden file has them.
    const json written = json::parse(text);
    const json expected = GoldenJson(model);
    const json& w = golden->IsK3() ? written["text_config"] : written;
    const json& e = golden->IsK3() ? expected["text_config"] : expected;
    for (auto it = w.begin(); it != w.end(); ++it) {
      ASSERT_TRUE(e.contains(it.key())) << it.key();
      EXPECT_EQ(it.value(), e[it.key()]) << it.key();
    }
    EXPECT_EQ(written["model_type"], expected["model_type"]);
    // The quantization block, whole: every key and value of the golden one.
    EXPECT_EQ(w.contains("quantization_config"), e.contains("quantization_config"));
  }
  // Presets, including variants the golden files lack.
  for (const std::string& name : PresetNames()) {
    SCOPED_TRACE(name);
    auto preset = PresetConfig(name);
    ASSERT_TRUE(preset.ok()) << preset.status();
    auto again = ParseModelConfig(ModelConfigToJson(*preset), name);
    ASSERT_TRUE(again.ok()) << again.status();
    ExpectSameConfig(*again, *preset);
  }
  ModelConfig variant = *PresetConfig("kimi-linear-tiny");
  variant.tie_word_embeddings = true;
  variant.num_shared_experts = 0;
  variant.hidden_act = "situ";
  variant.situ_beta = 3.0f;
  variant.kda.full_rank_gate = true;
  variant.kda.conv_kernel_size = 3;
  variant.max_position_embeddings = 0;
  variant.quantization = RoutedExpertsMxfp4();
  variant.quantization.targets.push_back("Linear");
  variant.quantization.ignore.clear();
  auto again = ParseModelConfig(ModelConfigToJson(variant), "variant");
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameConfig(*again, variant);
  // Kimi Linear keeps it at the top level.
  EXPECT_TRUE(json::parse(ModelConfigToJson(variant)).contains("quantization_config"));
}

// --- quantization_config ---------------------------------------------------

TEST(QuantizationConfigTest, ParsesGoldenMxfp4) {
  auto config = LoadModelConfig(testing::GoldenPath("model/k3-tiny-mxfp4"));
  ASSERT_TRUE(config.ok()) << config.status();
  const QuantizationConfig& q = config->quantization;
  EXPECT_TRUE(q.mxfp4);
  EXPECT_EQ(q.key, "text_config.quantization_config");
  EXPECT_EQ(q.targets, std::vector<std::string>{R"(re:.*block_sparse_moe\.experts\.\d+\.w[123]$)"});
  EXPECT_EQ(q.ignore,
            (std::vector<std::string>{"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                      R"(re:.*mlp\..*)", "re:.*routed_expert.*", "re:.*gate$"}));
  // RoutedExpertsMxfp4 is that block.
  const QuantizationConfig k3 = RoutedExpertsMxfp4();
  EXPECT_EQ(k3.targets, q.targets);
  EXPECT_EQ(k3.ignore, q.ignore);
  EXPECT_EQ(config->moe_intermediate_size, 32);
  // The bf16 sibling and Kimi Linear are plain.
  for (const char* model : {"k3-tiny", "kimi-linear-tiny"}) {
    auto plain = LoadModelConfig(testing::GoldenPath(std::string("model/") + model));
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_FALSE(plain->quantization.mxfp4) << model;
    EXPECT_TRUE(plain->quantization.targets.empty()) << model;
  }
}

TEST(QuantizationConfigTest, TopLevelOrTextConfig) {
  const json golden = GoldenJson("k3-tiny-mxfp4");
  const json block = golden["text_config"]["quantization_config"];
  // At the top level of a K3 config, as transformers' wrappers write it.
  json top = golden;
  top["text_config"].erase("quantization_config");
  top["quantization_config"] = block;
  auto moved = Parse(top);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_TRUE(moved->quantization.mxfp4);
  EXPECT_EQ(moved->quantization.key, "quantization_config");
  EXPECT_EQ(moved->quantization.targets.size(), 1u);
  // In both places: fine when they agree, an error naming both when not.
  json both = golden;
  both["quantization_config"] = block;
  auto same = Parse(both);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(same->quantization.mxfp4);
  both["quantization_config"]["ignore"] = json::array();
  auto differ = Parse(both);
  ASSERT_FALSE(differ.ok());
  EXPECT_NE(differ.status().message().find("'quantization_config'"), std::string::npos)
      << differ.status();
  EXPECT_NE(differ.status().message().find("'text_config.quantization_config'"), std::string::npos)
      << differ.status();
  // Kimi Linear: at the top level.
  json kimi = GoldenJson("kimi-linear-tiny");
  kimi["quantization_config"] = block;
  auto linear = Parse(kimi);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_TRUE(linear->quantization.mxfp4);
  // null is no quantization_config.
  json null_block = golden;
  null_block["text_config"]["quantization_config"] = nullptr;
  auto plain = Parse(null_block);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->quantization.mxfp4);
}

TEST(QuantizationConfigTest, GroupFormatOrTopLevelFormat) {
  json j = GoldenJson("k3-tiny-mxfp4");
  json& q = j["text_config"]["quantization_config"];
  // A group without its own format takes the block's.
  q["config_groups"]["group_0"].erase("format");
  auto inherited = Parse(j);
  ASSERT_TRUE(inherited.ok()) << inherited.status();
  // A group's own format decides (compressed-tensors writes "mixed-precision"
  // at the top when groups differ).
  q["config_groups"]["group_0"]["format"] = "mxfp4-pack-quantized";
  q["format"] = "mixed-precision";
  auto own = Parse(j);
  ASSERT_TRUE(own.ok()) << own.status();
  // Several MXFP4 groups: their targets together.
  q["config_groups"]["group_1"] = q["config_groups"]["group_0"];
  q["config_groups"]["group_1"]["targets"] = {"re:.*shared_experts.*"};
  auto two = Parse(j);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->quantization.targets.size(), 2u);
}

struct BadQuantization {
  std::string key;  // dotted path below text_config.quantization_config ("" for the block)
  json value;       // set there; a JSON null with erase = true removes the key instead
  bool erase;
  std::string named;  // the key the message names, below text_config.quantization_config
  std::string says;   // and a part of the message
};

TEST(QuantizationConfigTest, EachRefusalNamesTheKeyAndValue) {
  const std::string kRoot = "text_config.quantization_config";
  const std::string g = "config_groups.group_0.";
  const std::vector<BadQuantization> cases = {
      {"", "mxfp4", false, "", "must be an object"},
      {"", json::array({1}), false, "", "must be an object"},
      {"quant_method", "fp8", false, "quant_method", "is 'fp8'; only 'compressed-tensors'"},
      {"quant_method", "gptq", false, "quant_method", "is 'gptq'"},
      {"quant_method", 3, false, "quant_method", "must be a string"},
      {"quant_method", nullptr, true, "quant_method", "missing required key"},
      {"format", 32, false, "format", "must be a string"},
      {"kv_cache_scheme", {{"num_bits", 8}}, false, "kv_cache_scheme", "quantized KV cache"},
      {"config_groups", json::object(), false, "config_groups", "is empty"},
      {"config_groups", json::array(), false, "config_groups", "must be an object"},
      {"config_groups", nullptr, true, "config_groups", "missing required key"},
      {g.substr(0, g.size() - 1), 5, false, g.substr(0, g.size() - 1), "must be an object"},
      {g + "format", "nvfp4-pack-quantized", false, g + "format",
       "is 'nvfp4-pack-quantized'; only 'mxfp4-pack-quantized'"},
      {g + "format", "pack-quantized", false, g + "format", "is 'pack-quantized'"},
      {g + "format", 4, false, g + "format", "must be a string"},
      {g + "weights", nullptr, true, g + "weights", "missing required key"},
      {g + "weights", "mxfp4", false, g + "weights", "must be an object"},
      {g + "weights.num_bits", 8, false, g + "weights.num_bits", "is 8; only MXFP4"},
      {g + "weights.num_bits", "4", false, g + "weights.num_bits", "must be an integer"},
      {g + "weights.num_bits", 4.0, false, g + "weights.num_bits", "must be an integer"},
      {g + "weights.num_bits", nullptr, true, g + "weights.num_bits", "missing required key"},
      {g + "weights.type", "int", false, g + "weights.type", "is 'int'; only MXFP4"},
      {g + "weights.type", true, false, g + "weights.type", "must be a string"},
      {g + "weights.group_size", 64, false, g + "weights.group_size",
       "is 64; only MXFP4 with groups of 32 is supported"},
      {g + "weights.group_size", 16, false, g + "weights.group_size", "is 16"},
      {g + "weights.group_size", -32, false, g + "weights.group_size", "must be at least 0"},
      {g + "weights.group_size", int64_t{1} << 40, false, g + "weights.group_size", "too large"},
      {g + "weights.group_size", json::array({32}), false, g + "weights.group_size",
       "must be an integer"},
      {g + "weights.group_size", nullptr, true, g + "weights.group_size", "missing required key"},
      {g + "weights.strategy", "channel", false, g + "weights.strategy", "is 'channel'"},
      {g + "weights.strategy", 1, false, g + "weights.strategy", "must be a string"},
      {g + "weights.symmetric", false, false, g + "weights.symmetric", "no zero point"},
      {g + "weights.symmetric", "yes", false, g + "weights.symmetric", "must be true or false"},
      {g + "weights.dynamic", true, false, g + "weights.dynamic", "stored scales"},
      {g + "weights.dynamic", "local", false, g + "weights.dynamic", "must be true or false"},
      {g + "input_activations",
       {{"num_bits", 8}},
       false,
       g + "input_activations",
       "only weights may be quantized"},
      {g + "output_activations",
       {{"num_bits", 8}},
       false,
       g + "output_activations",
       "only weights may be quantized"},
      {g + "targets", json::array(), false, g + "targets", "is empty"},
      {g + "targets", "re:.*experts.*", false, g + "targets", "must be a list of strings"},
      {g + "targets", json::array({1}), false, g + "targets", "must be a list of strings"},
      {g + "targets", nullptr, true, g + "targets", "missing required key"},
      {g + "targets", json::array({"re:(unclosed"}), false, g + "targets",
       "'re:(unclosed' is not a regular expression"},
      {g + "targets", json::array({"Linear", "re:(?=x)"}), false, g + "targets", "entry 1"},
      {"ignore", "lm_head", false, "ignore", "must be a list of strings"},
      {"ignore", json::array({nullptr}), false, "ignore", "must be a list of strings"},
      {"ignore", json::array({"lm_head", "re:[z-a]"}), false, "ignore", "entry 1: 're:[z-a]'"},
  };
  const json golden = GoldenJson("k3-tiny-mxfp4");
  for (const BadQuantization& bad : cases) {
    const std::string path = bad.key.empty() ? kRoot : kRoot + "." + bad.key;
    SCOPED_TRACE(path + (bad.erase ? " erased" : " = " + bad.value.dump()));
    json j = golden;
    const json::json_pointer pointer = Pointer(path);
    if (bad.erase) {
      j[pointer.parent_pointer()].erase(pointer.back());
    } else {
      j[pointer] = bad.value;
    }
    auto config = Parse(j);
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string named = bad.named.empty() ? kRoot : kRoot + "." + bad.named;
    EXPECT_NE(config.status().message().find("'" + named + "'"), std::string::npos)
        << config.status();
    EXPECT_NE(config.status().message().find(bad.says), std::string::npos) << config.status();
    EXPECT_NE(config.status().message().find("test/config.json"), std::string::npos)
        << config.status();
  }
  // Neither the group nor the block says a format.
  json j = golden;
  j["text_config"]["quantization_config"].erase("format");
  j["text_config"]["quantization_config"]["config_groups"]["group_0"].erase("format");
  auto none = Parse(j);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("'" + kRoot + "." + g + "format' is missing"),
            std::string::npos)
      << none.status();
  // A group without a format of its own under a block format that is not MXFP4.
  j["text_config"]["quantization_config"]["format"] = "float-quantized";
  auto other = Parse(j);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("'" + kRoot + ".format' is 'float-quantized'"),
            std::string::npos)
      << other.status();
}

// Every key of the block set to values of every JSON type: an error naming
// the file, or a config that serialises and parses again; never a crash.
TEST(QuantizationConfigTest, HostileValuesNeverCrash) {
  const json golden = GoldenJson("k3-tiny-mxfp4");
  const std::vector<json> hostile = {nullptr,
                                     true,
                                     0,
                                     -1,
                                     4,
                                     32,
                                     1e308,
                                     -0.0,
                                     "",
                                     "re:",
                                     "re:(",
                                     std::string(100000, 'x'),
                                     "re:" + std::string(5000, '(') + std::string(5000, ')'),
                                     json::array(),
                                     json::array({nullptr}),
                                     json::array({"re:.*", 7}),
                                     json::object(),
                                     json::object({{"a", 1}}),
                                     json::parse(std::string(200, '[') + std::string(200, ']'))};
  std::vector<std::string> paths;
  std::function<void(const json&, const std::string&)> walk = [&](const json& j,
                                                                  const std::string& path) {
    paths.push_back(path);
    if (j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) walk(it.value(), path + "/" + it.key());
    } else if (j.is_array()) {
      for (size_t i = 0; i < j.size(); ++i) walk(j[i], path + "/" + std::to_string(i));
    }
  };
  walk(golden["text_config"]["quantization_config"], "/text_config/quantization_config");
  int accepted = 0, tried = 0;
  for (const std::string& path : paths) {
    for (const json& value : hostile) {
      json j = golden;
      j[json::json_pointer(path)] = value;
      auto config = ParseModelConfig(j.dump(), "hostile/config.json");
      ++tried;
      if (config.ok()) {
        ++accepted;
        EXPECT_TRUE(ParseModelConfig(ModelConfigToJson(*config), "again").ok()) << path;
      } else {
        EXPECT_NE(config.status().message().find("hostile/config.json"), std::string::npos)
            << config.status();
      }
    }
  }
  std::printf("%d of %d hostile quantization_config values still parsed\n", accepted, tried);
}

TEST(PresetsTest, TinyPresetsAreTheGoldenConfigs) {
  for (const char* model : {"k3-tiny", "kimi-linear-tiny"}) {
    SCOPED_TRACE(model);
    auto preset = PresetConfig(model);
    ASSERT_TRUE(preset.ok()) << preset.status();
    auto golden = LoadModelConfig(testing::GoldenPath(std::string("model/") + model));
    ASSERT_TRUE(golden.ok()) << golden.status();
    ExpectSameConfig(*preset, *golden);
  }
}

TEST(PresetsTest, K3Small) {
  auto config = PresetConfig("k3-small");
  ASSERT_TRUE(config.ok()) << config.status();
  const ModelConfig& c = *config;
  EXPECT_TRUE(c.IsK3());
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.layer_kinds, (std::vector<LayerKind>{K, K, K, M, K, K, K, M, M}));
  EXPECT_EQ(c.kda.num_heads * c.kda.head_dim, 1024);
  EXPECT_EQ(c.MlaCacheWidth(), 320);
  EXPECT_EQ(c.routed_expert_hidden_size, 512);
  EXPECT_EQ(c.attn_res_block_size, 4);
}

TEST(PresetsTest, UnknownPresetNamesIt) {
  auto config = PresetConfig("k3-huge");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("k3-huge"), std::string::npos);
  EXPECT_NE(config.status().message().find("k3-small"), std::string::npos);
}

}  // namespace
}  // namespace deltaserve
