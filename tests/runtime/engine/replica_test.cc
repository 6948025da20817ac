// A step sent ahead of its predecessor's result (SequenceWork::feed_sampled):
// the replica's leader feeds the token that predecessor sampled, the same
// token a step carrying it would have had; until that step is collected, or
// for a sequence nothing sampled, Start refuses it, naming the sequence.
#include "runtime/engine/replica.h"

#include "gtest/gtest.h"
#include "runtime/comm/host_data_communicator.h"
#include "runtime/comm/single_communicator.h"
#include "runtime/model/model.h"
#include "tests/model_runs.h"

namespace deltaserve {
namespace {

SequenceWork Sample(uint64_t id, std::vector<int32_t> tokens, bool start) {
  SequenceWork w;
  w.sequence_id = id;
  w.start = start;
  w.tokens = std::move(tokens);
  w.output = WorkOutput::kSample;
  w.sampling = {0.9f, 0, 1.0f};
  w.seed = 5;
  return w;
}

int32_t TokenOf(const StepResult& result, uint64_t id) {
  for (const SequenceResult& out : result.outputs) {
    if (out.sequence_id == id) return out.token;
  }
  ADD_FAILURE() << "no output for sequence " << id;
  return -1;
}

TEST(ReplicaTest, AStepSentAheadIsFedTheTokenItsPredecessorSampled) {
  auto model = Model::Load(testing::GoldenPath("model/k3-tiny"));
  ASSERT_TRUE(model.ok()) << model.status();
  SingleCommunicator world;
  SingleDataCommunicator stage;
  const WorldLayout layout = *WorldLayout::Make(1, 1, 1);
  StepExecutor executor(**model, layout, world, stage);
  Replica replica(executor);
  const std::vector<int32_t> prompt = testing::RandomTokens(40, 9);

  // Sequence 1: its prompt, then a step sent ahead, then another.
  Step first{1, {}, {Sample(1, prompt, true)}, true};
  Step ahead{2, {}, {Sample(1, {}, false)}, true};
  ahead.work[0].feed_sampled = true;
  ASSERT_TRUE(replica.Start(first).ok());
  EXPECT_FALSE(replica.FeedsReady(ahead));
  const absl::Status early = replica.Start(ahead);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("sequence 1"), std::string::npos) << early;
  auto one = replica.Collect();
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(replica.FeedsReady(ahead));
  ASSERT_TRUE(replica.Start(ahead).ok());
  Step third{3, {}, {Sample(1, {}, false)}, false};
  third.work[0].feed_sampled = true;
  auto two = replica.Collect();
  ASSERT_TRUE(two.ok()) << two.status();
  auto three = replica.Run(third);
  ASSERT_TRUE(three.ok()) << three.status();

  // Sequence 2: the same prompt and seed with each token given.
  auto a = replica.Run({4, {1}, {Sample(2, prompt, true)}, false});
  ASSERT_TRUE(a.ok());
  auto b = replica.Run({5, {}, {Sample(2, {TokenOf(*a, 2)}, false)}, false});
  ASSERT_TRUE(b.ok());
  auto c = replica.Run({6, {}, {Sample(2, {TokenOf(*b, 2)}, false)}, false});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(TokenOf(*one, 1), TokenOf(*a, 2));
  EXPECT_EQ(TokenOf(*two, 1), TokenOf(*b, 2));
  EXPECT_EQ(TokenOf(*three, 1), TokenOf(*c, 2));

  // Sequence 1 was released with step 4: nothing to feed it any more.
  Step after{7, {}, {Sample(1, {}, false)}, false};
  after.work[0].feed_sampled = true;
  const absl::Status released = replica.Start(after);
  EXPECT_EQ(released.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(released.message().find("sequence 1's sampled token"), std::string::npos) << released;
}

}  // namespace
}  // namespace deltaserve
