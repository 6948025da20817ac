// RequestValidator against the k3-tiny model with the tokenizer fixture:
// each limit refuses one past it, naming the field, the size and the flag,
// and accepts the limit itself; concurrent tokenizations over the limit get
// RESOURCE_EXHAUSTED while the others run.
#include "runtime/serving/request_validation.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>

#include "runtime/model/presets.h"
#include "runtime/serving/grpc_request.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

constexpr int64_t kFixtureVocab = 1024;  // tests/data/tokenizer: 676 ranks + 256 special, padded

::testing::AssertionResult Contains(const absl::Status& status, const std::string& part) {
  if (std::string(status.message()).find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "'" << status << "' does not contain '" << part << "'";
}

struct Fixture {
  Fixture() {
    auto preset = PresetConfig("k3-tiny");
    EXPECT_TRUE(preset.ok()) << preset.status();
    config = *preset;
    config.vocab_size = kFixtureVocab;
    config.max_position_embeddings = 1000;
    auto loaded =
        LoadTokenizer(std::string(DELTASERVE_SOURCE_DIR) + "/tests/data/tokenizer", kFixtureVocab);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    tokenizer = std::move(*loaded);
  }
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
};

v1::GenerateRequest TextRequest(const std::string& text) {
  v1::GenerateRequest req;
  req.set_text(text);
  req.set_max_tokens(4);
  return req;
}

TEST(RequestValidationTest, StopTokenIdsAreLimitedAndChecked) {
  Fixture f;
  RequestLimits limits;
  limits.max_stop_token_ids = 8;
  const RequestValidator validator(f.config, f.tokenizer.get(), limits);
  v1::GenerateRequest req = TextRequest("hello");
  for (int i = 0; i < 8; ++i) req.add_stop_token_ids(i);
  auto ok = validator.Generate(FromProto(req));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->params.stop_ids.size(), 8u);
  req.add_stop_token_ids(9);
  auto over = validator.Generate(FromProto(req));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(over.status(), "stop_token_ids: 9 ids, over the limit of 8"));
  EXPECT_TRUE(Contains(over.status(), "--max-stop-token-ids"));
  req.clear_stop_token_ids();
  req.add_stop_token_ids(static_cast<int32_t>(kFixtureVocab));
  EXPECT_TRUE(Contains(validator.Generate(FromProto(req)).status(), "stop_token_ids[0]"));
}

// --max-prompt-tokens bounds a prompt as it will run, after tokenizing (a
// conversation's after its template renders it, which the text limits do
// not see), before admission.
TEST(RequestValidationTest, PromptTokensAreBoundedAfterTokenizing) {
  Fixture f;
  RequestLimits limits;
  limits.max_prompt_tokens = 10;
  const RequestValidator validator(f.config, f.tokenizer.get(), limits);
  v1::GenerateRequest req;
  req.set_max_tokens(1);
  for (int i = 0; i < 10; ++i) req.mutable_tokens()->add_ids(i);
  ASSERT_TRUE(validator.Generate(FromProto(req)).ok());
  req.mutable_tokens()->add_ids(10);
  auto over = validator.Generate(FromProto(req));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      Contains(over.status(), "prompt: 11 tokens, over the limit of 10 (--max-prompt-tokens)"));
  req.set_text(std::string(400, 'a') + " b c d e f g h i j k l");
  EXPECT_TRUE(Contains(validator.Generate(FromProto(req)).status(), "(--max-prompt-tokens)"));
}

TEST(RequestValidationTest, TextIsBoundedByTheContextBeforeTokenizing) {
  Fixture f;
  f.config.max_position_embeddings = 5000;
  RequestLimits limits;
  limits.max_text_bytes_per_token = 2;  // 2 x the context of 5000 tokens
  const RequestValidator validator(f.config, f.tokenizer.get(), limits);
  EXPECT_EQ(validator.max_text_bytes(), 10000);
  v1::GenerateRequest req = TextRequest(std::string(4000, 'a'));
  req.set_max_tokens(1);
  auto within = validator.Generate(FromProto(req));
  ASSERT_TRUE(within.ok()) << within.status();
  // At the limit the bytes pass (the tokens may still exceed the context).
  req.set_text(std::string(10000, 'a'));
  EXPECT_FALSE(Contains(validator.Generate(FromProto(req)).status(), "bytes, over the limit"));
  req.set_text(std::string(10001, 'a'));
  auto over = validator.Generate(FromProto(req));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(over.status(), "prompt: 10001 bytes, over the limit of 10000"));
  EXPECT_TRUE(Contains(over.status(), "--max-text-bytes-per-token 2 x the context of 5000"));
  // --max-request-bytes is the other bound, whichever is smaller.
  limits.max_request_bytes = 100;
  const RequestValidator small(f.config, f.tokenizer.get(), limits);
  req.set_text(std::string(101, 'a'));
  EXPECT_TRUE(Contains(small.Generate(FromProto(req)).status(), "--max-request-bytes"));
  v1::ScoreRequest score;
  score.set_text(std::string(101, 'a'));
  EXPECT_TRUE(Contains(small.Score(FromProto(score)).status(), "input: 101 bytes"));
}

TEST(RequestValidationTest, ParametersAreRefusedBeforeTheTextIsTokenized) {
  Fixture f;
  RequestLimits limits;
  limits.max_stop_token_ids = 0;
  const RequestValidator validator(f.config, f.tokenizer.get(), limits);
  // Text that is not UTF-8 fails only when tokenized: the stop_token_ids
  // error comes first.
  v1::GenerateRequest req = TextRequest("\xff");
  req.add_stop_token_ids(1);
  EXPECT_TRUE(Contains(validator.Generate(FromProto(req)).status(), "stop_token_ids"));
  req.clear_stop_token_ids();
  EXPECT_TRUE(Contains(validator.Generate(FromProto(req)).status(), "prompt"));
}

// A tokenizer that holds each Encode until released, so that the test knows
// how many run at once. It stands in for nothing a user runs: the limit
// counts calls, whatever the tokenizer.
class HeldTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "held"; }
  int64_t vocab_size() const override { return 256; }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool) const override {
    std::unique_lock<std::mutex> lock(mu_);
    ++running_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
    --running_;
    return std::vector<int32_t>(text.size(), 1);
  }
  absl::StatusOr<std::string> TokenBytes(int32_t) const override { return std::string("a"); }
  const std::vector<int32_t>& end_ids() const override { return end_ids_; }

  void WaitForRunning(int n) const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return running_ == n; });
  }
  void Release() const {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable int running_ = 0;
  mutable bool released_ = false;
  std::vector<int32_t> end_ids_;
};

TEST(RequestValidationTest, ConcurrentTokenizationsOverTheLimitAreRefused) {
  Fixture f;
  f.config.vocab_size = 256;
  HeldTokenizer tokenizer;
  RequestLimits limits;
  limits.max_concurrent_tokenizations = 2;
  const RequestValidator validator(f.config, &tokenizer, limits);
  const v1::GenerateRequest req = TextRequest("abc");
  auto first = std::async(std::launch::async, [&] { return validator.Generate(FromProto(req)); });
  auto second = std::async(std::launch::async, [&] { return validator.Generate(FromProto(req)); });
  tokenizer.WaitForRunning(2);
  auto third = validator.Generate(FromProto(req));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(third.status(), "--max-concurrent-tokenizations"));
  // Token ids need no tokenizer: they pass while the slots are taken.
  v1::GenerateRequest ids;
  ids.mutable_tokens()->add_ids(1);
  ids.set_max_tokens(1);
  EXPECT_TRUE(validator.Generate(FromProto(ids)).ok());
  tokenizer.Release();
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(second.get().ok());
  // The slots were given back.
  EXPECT_TRUE(validator.Generate(FromProto(req)).ok());
}

TEST(RequestValidationTest, RequestIdsAreBoundedOrRandom) {
  Fixture f;
  const RequestValidator validator(f.config, f.tokenizer.get(), RequestLimits());
  EXPECT_EQ(*validator.RequestId("mine"), "mine");
  EXPECT_TRUE(Contains(validator.RequestId(std::string(kMaxRequestIdBytes + 1, 'x')).status(),
                       "request_id: 129 bytes"));
  auto a = validator.RequestId(""), b = validator.RequestId("");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 4u + 32u);
  EXPECT_NE(*a, *b);
}

}  // namespace
}  // namespace deltaserve
