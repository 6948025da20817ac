// The engine `deltaserve generate` and `score` run on: several sequences at
// once, cut into pieces and batched with each other, give each the tokens
// and logits it gets alone by the plainest loop over the model.
#include "runtime/scheduler/offline_engine.h"

#include <map>

#include "absl/strings/str_cat.h"
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
    const auto events = testing::RunEngine(
        *model_, testing::PrefixAndForks(document, questions, kind, 6), /*chunk=*/64);
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

TEST_P(OfflineEngineTest, NonFiniteLogitsEndTheSequenceNamingThePosition) {
  auto model = Model::Load(testing::NanModel(GetParam()));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<kernels::SamplingParams> settings = {
      {}, {0.8f, 0, 1.0f}, {1.0f, 5, 1.0f}, {0.7f, 0, 0.9f}, {1.0f, 20, 0.5f}};
  testing::LocalReplica local(**model);
  OfflineEngine engine(local.replica(), (*model)->config(), SchedulerOptions{});
  for (size_t i = 0; i < settings.size(); ++i) {
    SequenceRequest r;
    r.id = 1 + i;
    r.prompt = testing::RandomTokens(10, 40 + i);
    r.sampling = settings[i];
    r.logprobs = true;
    r.top_logprobs = 3;
    engine.Add(r);
  }
  SequenceRequest score;
  score.id = 100;
  score.kind = SequenceKind::kScore;
  score.prompt = testing::RandomTokens(12, 50);
  engine.Add(score);
  std::map<uint64_t, absl::Status> failed;
  ASSERT_TRUE(engine
                  .Run([&](const SchedulerEvent& e) {
                    EXPECT_NE(e.kind, SchedulerEvent::Kind::kToken) << "sequence " << e.id;
                    if (e.kind == SchedulerEvent::Kind::kFailed) failed[e.id] = e.status;
                  })
                  .ok());
  ASSERT_EQ(failed.size(), settings.size() + 1);
  for (const auto& [id, status] : failed) {
    EXPECT_NE(status.message().find(absl::StrCat("sequence ", id, ": ")), std::string::npos)
        << status;
    EXPECT_NE(status.message().find(id == 100 ? "not finite at token position 0"
                                              : "not finite at token position 9"),
              std::string::npos)
        << status;
  }
}

TEST_P(OfflineEngineTest, CallbacksAddAndFinishSequencesAndSeeTheSteps) {
  // Sequence 1 is ended by its caller after two tokens (as a stop string
  // would) and sequence 2 added in its place; 2 gets its tokens alone.
  SequenceRequest first;
  first.id = 1;
  first.prompt = testing::RandomTokens(12, 1);
  first.max_tokens = 8;
  SequenceRequest second;
  second.id = 2;
  second.prompt = testing::RandomTokens(30, 2);
  second.max_tokens = 5;
  testing::LocalReplica local(*model_);
  SchedulerOptions options;
  options.max_running = 1;
  OfflineEngine engine(local.replica(), model_->config(), options);
  engine.Add(first);
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, int64_t> fed;
  const absl::Status status = engine.Run(
      [&](const SchedulerEvent& e) {
        if (e.kind != SchedulerEvent::Kind::kToken) return;
        tokens[e.id].push_back(e.output.token);
        if (e.id == 1 && tokens[1].size() == 2) {
          EXPECT_TRUE(engine.Finish(1));
          engine.Add(second);
        }
      },
      [&](const Step& step) {
        for (const SequenceWork& w : step.work) fed[w.sequence_id] += w.tokens.size();
      });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(tokens[1].size(), 2u);
  EXPECT_EQ(tokens[2], testing::ReferenceGenerate(*model_, second.prompt, 5, second.sampling, 0));
  // Every prompt token went out, and one token per decode step after.
  EXPECT_EQ(fed[2], 30 + 4);
  EXPECT_GE(fed[1], 12 + 1);
  EXPECT_FALSE(engine.Finish(1));
}

// Requests served from the prefix cache give what they give cold: turns of a
// chat, each extending the last, and questions sharing a document up to a
// page boundary and past one, under several prefill chunkings, and with a
// budget of one entry (evictions between them). The same greedy tokens, and
// the log-probs of their top alternatives to the rounding that cutting a
// prompt differently gives (docs/numerics.md, "Invariance"). A checkpoint a
// token off would give another model state: the test shows that such a fork
// is far outside that bound.
TEST_P(OfflineEngineTest, RequestsServedFromThePrefixCacheEqualColdRuns) {
  const testing::PrefixCacheCase c = testing::MakePrefixCacheCase();
  std::map<uint64_t, testing::Answer> cold;
  for (const SequenceRequest& r : c.requests) {
    cold[r.id] = testing::Answers(testing::RunEngine(*model_, {r}, /*chunk=*/0))[r.id];
  }
  const StatePool& pool = model_->state_pool();
  for (const int64_t chunk : {0, 16, 64, 100}) {
    for (const int64_t entries : {100, 1}) {
      SCOPED_TRACE(absl::StrCat("chunk ", chunk, ", room for ", entries, " entries"));
      testing::LocalReplica local(*model_);
      SchedulerOptions options;
      options.fixed_chunk = chunk;
      const std::vector<SchedulerEvent> events = testing::RunOneAfterAnother(
          local.replica(), model_->config(),
          testing::WithPrefixCache(options, {pool.page_bytes(), pool.slot_bytes()}, entries),
          c.requests);
      // With room for one entry, each new one evicts the last, and the hits
      // are the same.
      EXPECT_EQ(testing::CachedTokens(events), c.cached);
      testing::ExpectAnswersEqual(testing::Answers(events), cold);
    }
  }
  // A fork from the state a token short of the page, or a token past it,
  // fed the rest from the page boundary on: far from the cold run.
  const std::vector<int32_t>& turn1 = c.requests[0].prompt;
  for (const int64_t off : {-1, 1}) {
    std::vector<SequenceRequest> forked = testing::PrefixAndForks(
        std::vector<int32_t>(turn1.begin(), turn1.begin() + 192 + off),
        {std::vector<int32_t>(turn1.begin() + 192, turn1.end())}, SequenceKind::kGenerate, 6);
    forked[1].top_logprobs = 5;
    const testing::Answer wrong = testing::Answers(testing::RunEngine(*model_, forked, 0))[10];
    EXPECT_GT(
        testing::RelL2(std::vector<float>(wrong.top_logprobs.begin(), wrong.top_logprobs.end()),
                       cold[1].top_logprobs),
        100 * 5e-5)
        << "a checkpoint " << off << " token off";
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, OfflineEngineTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);

}  // namespace
}  // namespace deltaserve
