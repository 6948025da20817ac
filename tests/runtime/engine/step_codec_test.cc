// Steps and results survive the bytes between ranks, and hostile bytes are
// refused with an error, never a crash or a huge allocation.
#include "runtime/engine/step_codec.h"

#include <cstring>

#include "gtest/gtest.h"

namespace deltaserve {
namespace {

Step SampleStep() {
  Step step;
  step.id = 42;
  step.more_coming = true;
  step.release = {7, 9};
  SequenceWork a;
  a.sequence_id = 3;
  a.start = true;
  a.tokens = {1, 2, 3};
  a.output = WorkOutput::kSample;
  a.sampling = {0.7f, 20, 0.9f};
  a.seed = 1234567890123ull;
  a.logprobs = true;
  a.top_logprobs = 5;
  SequenceWork b;
  b.sequence_id = 4;
  b.tokens = {5, 6};
  b.output = WorkOutput::kScore;
  b.targets = {6, -1};
  b.start = true;
  b.fork_from = 3;
  SequenceWork c;  // sent ahead: the replica feeds the token
  c.sequence_id = 8;
  c.output = WorkOutput::kSample;
  c.feed_sampled = true;
  step.work = {a, b, c};
  return step;
}

TEST(StepCodecTest, StepRoundTrips) {
  const Step step = SampleStep();
  auto decoded = DecodeStep(EncodeStep(step));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->id, 42u);
  EXPECT_TRUE(decoded->more_coming);
  EXPECT_EQ(decoded->release, step.release);
  ASSERT_EQ(decoded->work.size(), 3u);
  EXPECT_FALSE(decoded->work[0].feed_sampled);
  EXPECT_TRUE(decoded->work[2].feed_sampled);
  EXPECT_TRUE(decoded->work[2].tokens.empty());
  const SequenceWork& a = decoded->work[0];
  EXPECT_EQ(a.sequence_id, 3u);
  EXPECT_TRUE(a.start);
  EXPECT_EQ(a.tokens, step.work[0].tokens);
  EXPECT_EQ(a.output, WorkOutput::kSample);
  EXPECT_EQ(a.sampling.temperature, 0.7f);
  EXPECT_EQ(a.sampling.top_k, 20);
  EXPECT_EQ(a.sampling.top_p, 0.9f);
  EXPECT_EQ(a.seed, 1234567890123ull);
  EXPECT_TRUE(a.logprobs);
  EXPECT_EQ(a.top_logprobs, 5);
  EXPECT_EQ(decoded->work[1].targets, step.work[1].targets);
  EXPECT_FALSE(a.fork_from.has_value());
  EXPECT_EQ(decoded->work[1].fork_from, std::optional<uint64_t>(3));
  EXPECT_EQ(decoded->work[1].output, WorkOutput::kScore);
}

TEST(StepCodecTest, ResultsRoundTrip) {
  SequenceResult r;
  r.sequence_id = 5;
  r.token = 17;
  r.logprob = -0.25f;
  r.top_ids = {17, 3};
  r.top_logprobs = {-0.25f, -2.0f};
  r.target_logprobs = {-1.5f};
  r.logits = {0.5f, -1.0f, 3.0f};
  auto decoded = DecodeResults(EncodeResults({r, SequenceResult{}}));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 2u);
  const SequenceResult& d = (*decoded)[0];
  EXPECT_EQ(d.sequence_id, 5u);
  EXPECT_EQ(d.token, 17);
  EXPECT_EQ(d.logprob, -0.25f);
  EXPECT_EQ(d.top_ids, r.top_ids);
  EXPECT_EQ(d.top_logprobs, r.top_logprobs);
  EXPECT_EQ(d.target_logprobs, r.target_logprobs);
  EXPECT_EQ(d.logits, r.logits);
}

TEST(StepCodecTest, EveryTruncationAndTrailingByteIsRefused) {
  const std::string bytes = EncodeStep(SampleStep());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto decoded = DecodeStep(std::string_view(bytes).substr(0, n));
    ASSERT_FALSE(decoded.ok()) << "length " << n;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  }
  EXPECT_FALSE(DecodeStep(bytes + "x").ok());
}

TEST(StepCodecTest, HostileCountsAndKindsAreRefused) {
  // A release count of 2^60 in a short message: refused before allocating.
  std::string bytes = EncodeStep(Step{});
  const uint64_t huge = uint64_t{1} << 60;
  std::memcpy(bytes.data() + 9, &huge, sizeof(huge));
  auto decoded = DecodeStep(bytes);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("truncated"), std::string::npos);
  // An output kind that does not exist.
  Step step = SampleStep();
  std::string good = EncodeStep(step);
  // id 8, more 1, release 8 + 16, work count 8, then work[0]: id 8, start 1,
  // tokens 8 + 12: the output kind follows.
  const size_t at = 8 + 1 + 8 + 16 + 8 + 8 + 1 + 8 + 12;
  const int32_t bad = 77;
  std::memcpy(good.data() + at, &bad, sizeof(bad));
  decoded = DecodeStep(good);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("output kind 77"), std::string::npos);
}

}  // namespace
}  // namespace deltaserve
