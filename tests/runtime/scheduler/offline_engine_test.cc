// The engine `deltaserve generate` and `score` run on: several sequences at
// once, cut into pieces and batched with each other, give each the tokens
// and logits it gets alone by the plainest loop over the model.
#include "runtime/scheduler/offline_engine.h"

#include <map>

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

INSTANTIATE_TEST_SUITE_P(Golden, OfflineEngineTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);

}  // namespace
}  // namespace deltaserve
