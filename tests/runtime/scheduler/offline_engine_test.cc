// The engine `deltaserve generate` and `score` run on: several sequences at
// once, cut into pieces and batched with each other, give each the tokens
// and logits it gets alone by the plainest loop over the model.
#include "runtime/scheduler/offline_engine.h"

#include "tests/engine_runs.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

class OfflineEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto model = Model::Load(testing::GoldenPath("model/" + GetParam()));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
  }
  std::unique_ptr<Model> model_;
};

TEST_P(OfflineEngineTest, BatchedSequencesGetTheirTokensAlone) {
  std::vector<SequenceRequest> requests;
  const std::vector<std::pair<int64_t, uint64_t>> shapes = {{150, 1}, {9, 2}, {1, 3}, {40, 4}};
  for (const auto& [length, seed] : shapes) {
    SequenceRequest r;
    r.id = seed;
    r.prompt = testing::RandomTokens(length, seed);
    r.max_tokens = 8;
    r.sampling = {seed % 2 ? 0.8f : 0.0f, 20, 0.9f};
    r.seed = seed * 7;
    requests.push_back(r);
  }
  const auto events = testing::RunEngine(*model_, requests, /*chunk=*/16);
  for (const SequenceRequest& r : requests) {
    std::vector<int32_t> got;
    for (const auto& e : events) {
      if (e.id == r.id && e.kind == SchedulerEvent::Kind::kToken) got.push_back(e.output.token);
    }
    EXPECT_EQ(got, testing::ReferenceGenerate(*model_, r.prompt, 8, r.sampling, r.seed))
        << "sequence " << r.id;
  }
}

TEST_P(OfflineEngineTest, BadTokensFailTheSequenceWithTheIdNamed) {
  SequenceRequest r;
  r.id = 1;
  r.prompt = {1, 2, 1 << 20};
  testing::LocalReplica local(*model_);
  OfflineEngine engine(local.replica(), model_->config(), SchedulerOptions{});
  engine.Add(r);
  std::vector<SchedulerEvent> events;
  ASSERT_TRUE(engine.Run([&](const SchedulerEvent& e) { events.push_back(e); }).ok());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, SchedulerEvent::Kind::kFailed);
  EXPECT_NE(events.back().status.message().find("token id 1048576"), std::string::npos)
      << events.back().status;
}

// A document prefilled once and forked for each question gives every answer
// what document + question gives run fresh: the same greedy tokens, and the
// same logits to rounding.
TEST_P(OfflineEngineTest, ForkedQuestionsEqualFreshRuns) {
  const auto document = testing::RandomTokens(300, 21);
  const std::vector<std::vector<int32_t>> questions = {
      testing::RandomTokens(5, 22), testing::RandomTokens(9, 23), testing::RandomTokens(1, 24)};
  for (SequenceKind kind : {SequenceKind::kGenerate, SequenceKind::kLogits}) {
    std::vector<SequenceRequest> requests;
    SequenceRequest prefix;
    prefix.id = 1;
    prefix.kind = SequenceKind::kPrefix;
    prefix.prompt = document;
    prefix.forks = static_cast<int64_t>(questions.size());
    requests.push_back(prefix);
    for (size_t q = 0; q < questions.size(); ++q) {
      SequenceRequest r;
      r.id = 10 + q;
      r.kind = kind;
      r.prompt = questions[q];
      r.max_tokens = 6;
      r.fork_from = 1;
      requests.push_back(r);
    }
    const auto events = testing::RunEngine(*model_, requests, /*chunk=*/64);
    const int64_t V = model_->config().vocab_size;
    for (size_t q = 0; q < questions.size(); ++q) {
      std::vector<int32_t> whole = document;
      whole.insert(whole.end(), questions[q].begin(), questions[q].end());
      std::vector<int32_t> tokens;
      std::vector<float> logits;
      for (const auto& e : events) {
        if (e.id != 10 + q) continue;
        if (e.kind == SchedulerEvent::Kind::kToken) tokens.push_back(e.output.token);
        logits.insert(logits.end(), e.output.logits.begin(), e.output.logits.end());
      }
      if (kind == SequenceKind::kGenerate) {
        EXPECT_EQ(tokens, testing::ReferenceGenerate(*model_, whole, 6)) << "question " << q;
      } else {
        const std::vector<float> fresh = testing::OneShotLogits(*model_, whole);
        const std::vector<float> tail(fresh.end() - questions[q].size() * V, fresh.end());
        EXPECT_LE(testing::RelL2(logits, testing::ToDouble(tail)), 5e-5) << "question " << q;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, OfflineEngineTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);

}  // namespace
}  // namespace deltaserve
