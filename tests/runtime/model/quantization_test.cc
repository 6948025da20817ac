#include "runtime/model/quantization.h"

#include <chrono>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace deltaserve {
namespace {

using Verdict = QuantizationMatcher::Verdict;

QuantizationMatcher Matcher(const QuantizationConfig& config) {
  auto matcher = QuantizationMatcher::Create(config);
  EXPECT_TRUE(matcher.ok()) << matcher.status();
  return *matcher;
}

QuantizationConfig With(std::vector<std::string> targets, std::vector<std::string> ignore = {}) {
  QuantizationConfig q;
  q.mxfp4 = true;
  q.targets = std::move(targets);
  q.ignore = std::move(ignore);
  return q;
}

// The real K3 block selects exactly the routed expert matrices of either
// layout, and nothing next to them.
TEST(QuantizationMatcherTest, RoutedExpertsOfTheRealBlock) {
  const QuantizationMatcher m = Matcher(RoutedExpertsMxfp4());
  for (const char* module : {"language_model.model.layers.1.block_sparse_moe.experts.0.w1",
                             "language_model.model.layers.92.block_sparse_moe.experts.895.w2",
                             "model.layers.3.block_sparse_moe.experts.7.w3"}) {
    EXPECT_EQ(m.Of(module).verdict, Verdict::kMxfp4) << module;
  }
  for (const char* module :
       {"language_model.model.layers.1.block_sparse_moe.experts.0.w4",
        "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight",
        "language_model.model.layers.1.block_sparse_moe.experts.x.w1",
        "language_model.model.layers.1.block_sparse_moe.gate",
        "language_model.model.layers.1.block_sparse_moe.shared_experts.gate_proj",
        "language_model.model.layers.1.block_sparse_moe.routed_expert_down_proj",
        "language_model.model.layers.0.mlp.gate_proj",
        "language_model.model.layers.0.self_attn.q_proj", "language_model.lm_head"}) {
    EXPECT_EQ(m.Of(module).verdict, Verdict::kUntargeted) << module;
  }
}

// Python's re.match: anchored at the start of the name only.
TEST(QuantizationMatcherTest, RegexAnchoredAtTheStartOnly) {
  const std::string module = "model.layers.3.block_sparse_moe.experts.7.w3";
  EXPECT_EQ(Matcher(With({"re:block_sparse_moe"})).Of(module).verdict, Verdict::kUntargeted);
  EXPECT_EQ(Matcher(With({"re:model\\.layers"})).Of(module).verdict, Verdict::kMxfp4);
  EXPECT_EQ(Matcher(With({"re:.*experts"})).Of(module).verdict, Verdict::kMxfp4);
  EXPECT_EQ(Matcher(With({"re:.*experts$"})).Of(module).verdict, Verdict::kUntargeted);
}

// A plain entry is an exact module name, or the class every matrix has.
TEST(QuantizationMatcherTest, NamesAndTheLinearClass) {
  const std::string module = "model.layers.3.block_sparse_moe.experts.7.w3";
  EXPECT_EQ(Matcher(With({module})).Of(module).verdict, Verdict::kMxfp4);
  EXPECT_EQ(Matcher(With({module + ".weight"})).Of(module).verdict, Verdict::kUntargeted);
  EXPECT_EQ(Matcher(With({"experts.7.w3"})).Of(module).verdict, Verdict::kUntargeted);
  EXPECT_EQ(Matcher(With({"Linear"})).Of(module).verdict, Verdict::kMxfp4);
  EXPECT_EQ(Matcher(With({"Linear"}, {module})).Of(module).verdict, Verdict::kIgnored);
}

TEST(QuantizationMatcherTest, IgnoreWinsAndIsNamed) {
  const std::string module = "model.layers.3.block_sparse_moe.experts.7.w3";
  const auto match = Matcher(With({"re:.*experts.*"}, {"lm_head", "re:.*\\.w3$"})).Of(module);
  EXPECT_EQ(match.verdict, Verdict::kIgnored);
  EXPECT_EQ(match.ignored_by, "re:.*\\.w3$");
  // The ignore list alone selects nothing.
  EXPECT_EQ(Matcher(With({"re:.*\\.w1$"}, {"re:.*\\.w3$"})).Of(module).verdict,
            Verdict::kUntargeted);
}

TEST(QuantizationMatcherTest, PlainConfigSelectsNothing) {
  QuantizationConfig plain;
  plain.targets = {"Linear"};  // without mxfp4 the lists are not read
  EXPECT_EQ(Matcher(plain).Of("model.layers.3.block_sparse_moe.experts.7.w3").verdict,
            Verdict::kPlain);
}

TEST(QuantizationMatcherTest, PatternsThatDoNotCompileAreErrorsNamingThem) {
  for (const std::string bad : {"re:(", "re:[z-a]", "re:(?=lookahead)", "re:(a)\\1"}) {
    EXPECT_FALSE(CheckQuantizationEntry(bad).ok()) << bad;
    auto target = QuantizationMatcher::Create(With({bad}));
    ASSERT_FALSE(target.ok()) << bad;
    EXPECT_NE(target.status().message().find(bad), std::string::npos) << target.status();
    auto ignore = QuantizationMatcher::Create(With({"Linear"}, {"lm_head", bad}));
    ASSERT_FALSE(ignore.ok()) << bad;
    EXPECT_NE(ignore.status().message().find("ignore"), std::string::npos) << ignore.status();
  }
  // Plain names are never patterns, whatever they hold.
  EXPECT_TRUE(CheckQuantizationEntry("(").ok());
  // A hostile pattern is cut short in the message.
  const std::string long_bad = "re:(" + std::string(10000, 'a');
  auto status = CheckQuantizationEntry(long_bad);
  ASSERT_FALSE(status.ok());
  EXPECT_LT(status.message().size(), 400u) << status;
}

// Patterns that take a backtracking engine exponential time match in linear
// time here.
TEST(QuantizationMatcherTest, CatastrophicPatternsStayFast) {
  const QuantizationMatcher m = Matcher(With({"re:(a+)+$", "re:(a|aa)*b", "re:(.*a){20}$"}));
  const std::string module(5000, 'a');
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(m.Of(module + "!").verdict, Verdict::kUntargeted);
  EXPECT_EQ(m.Of(module).verdict, Verdict::kMxfp4);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
}

}  // namespace
}  // namespace deltaserve
