// The bounds on config.json as input: its file (a regular file of at most
// kMaxConfigJsonBytes, refused quickly otherwise), its text (size and
// nesting, before parsing) and the products of its sizes, each refusal
// naming what is over which limit. Real configs (the presets) pass.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/model/config.h"
#include "runtime/model/presets.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

::testing::AssertionResult Refused(const absl::StatusOr<ModelConfig>& got,
                                   const std::string& part) {
  if (got.ok()) return ::testing::AssertionFailure() << "accepted";
  if (std::string(got.status().message()).find(part) == std::string::npos) {
    return ::testing::AssertionFailure() << "'" << got.status() << "' lacks '" << part << "'";
  }
  return ::testing::AssertionSuccess();
}

ModelConfig Tiny() {
  auto preset = PresetConfig("k3-tiny");
  EXPECT_TRUE(preset.ok()) << preset.status();
  return *preset;
}

TEST(ConfigLimitsTest, PresetsPass) {
  for (const std::string& name : PresetNames()) {
    auto preset = PresetConfig(name);
    ASSERT_TRUE(preset.ok()) << name;
    auto parsed = ParseModelConfig(ModelConfigToJson(*preset), name);
    EXPECT_TRUE(parsed.ok()) << name << ": " << parsed.status();
  }
}

TEST(ConfigLimitsTest, AbsurdProductsAreRefusedNamingTheProduct) {
  // 4096 layers x 65536 experts: each within its own limit, the two together
  // millions of tensors.
  ModelConfig c = Tiny();
  c.num_layers = 4096;
  c.layer_kinds.assign(4096, LayerKind::kKda);
  c.layer_kinds[3] = LayerKind::kMla;
  c.num_experts = 65536;
  EXPECT_TRUE(Refused(ParseModelConfig(ModelConfigToJson(c), "big.json"),
                      "big.json: a product of sizes: num_hidden_layers x num_experts + "
                      "num_shared_experts + 1 = 4096 x 65539 = 268447744, over the limit of "
                      "262144"));
  // Widths that multiply past what a tensor dimension may be.
  c = Tiny();
  c.kda.num_heads = 1 << 13;
  c.kda.head_dim = 1 << 12;
  EXPECT_TRUE(Refused(ParseModelConfig(ModelConfigToJson(c), "wide.json"),
                      "linear_attn_config.num_heads x linear_attn_config.head_dim = 8192 x 4096 "
                      "= 33554432, over the limit of 16777216"));
  // Parameters: each size allowed, the routed experts' product not.
  c = Tiny();
  c.num_experts = 4096;
  c.moe_intermediate_size = 1 << 16;
  c.routed_expert_hidden_size = 1 << 16;
  EXPECT_TRUE(Refused(ParseModelConfig(ModelConfigToJson(c), "moe.json"),
                      "moe_intermediate_size x routed_expert_hidden_size (or hidden_size)"));
  // A sequence's KDA state.
  c = Tiny();
  c.kda.num_heads = 1;
  c.kda.head_dim = 1 << 16;
  EXPECT_TRUE(Refused(ParseModelConfig(ModelConfigToJson(c), "kda.json"),
                      "linear_attn_config.num_heads x head_dim x head_dim"));
}

TEST(ConfigLimitsTest, TextOverTheLimitsIsRefusedBeforeParsing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_TRUE(Refused(ParseModelConfig(deep, "deep.json"),
                      "deep.json: JSON nested deeper than the limit of 32"));
  std::string big = ModelConfigToJson(Tiny());
  big.insert(1, "\"padding\": \"" + std::string(kMaxConfigJsonBytes, 'x') + "\",");
  EXPECT_TRUE(Refused(ParseModelConfig(big, "big.json"), "bytes of JSON, over the limit of"));
}

TEST(ConfigLimitsTest, ConfigJsonMustBeASmallRegularFile) {
  const std::string root = testing::TempDir("config_limits");
  auto dir = [&](const std::string& name) {
    const std::string d = root + "/" + name;
    std::filesystem::create_directories(d);
    return d;
  };
  const std::string zero = dir("zero"), fifo = dir("fifo"), huge = dir("huge");
  std::filesystem::create_symlink("/dev/zero", zero + "/config.json");
  ASSERT_EQ(::mkfifo((fifo + "/config.json").c_str(), 0600), 0);
  {
    std::ofstream(huge + "/config.json") << ModelConfigToJson(Tiny());
    std::filesystem::resize_file(huge + "/config.json", int64_t{1} << 40);
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(Refused(LoadModelConfig(zero), "is a character device, not a regular file"));
  EXPECT_TRUE(Refused(LoadModelConfig(fifo), "is a FIFO, not a regular file"));
  EXPECT_TRUE(Refused(LoadModelConfig(huge), "1099511627776 bytes, over the limit of 4194304"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  const std::string good = dir("good");
  std::ofstream(good + "/config.json") << ModelConfigToJson(Tiny());
  EXPECT_TRUE(LoadModelConfig(good).ok());
}

}  // namespace
}  // namespace deltaserve
