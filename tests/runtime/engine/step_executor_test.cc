// Continuous batching on the worker: sequences run through shared steps, in
// any mix of prefill chunks, decode tokens and scoring, get the same tokens
// and log-probs as each run alone by the plainest loop over the model.
#include "runtime/engine/step_executor.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/workspace.h"
#include "runtime/comm/host_data_communicator.h"
#include "runtime/comm/single_communicator.h"
#include "tests/model_runs.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

class StepExecutorTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto model = Model::Load(testing::GoldenPath("model/" + GetParam()));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    layout_ = *WorldLayout::Make(1, 1, 1);
    executor_ = std::make_unique<StepExecutor>(*model_, layout_, world_, stage_);
  }
  std::vector<int32_t> Alone(const std::vector<int32_t>& prompt, int64_t n,
                             const kernels::SamplingParams& sampling, uint64_t seed) {
    return testing::ReferenceGenerate(*model_, prompt, n, sampling, seed);
  }
  std::unique_ptr<Model> model_;
  SingleCommunicator world_;
  SingleDataCommunicator stage_;
  WorldLayout layout_;
  std::unique_ptr<StepExecutor> executor_;
};

TEST_P(StepExecutorTest, SharedStepsGiveEachSequenceItsOwnTokens) {
  struct Request {
    std::vector<int32_t> prompt;
    kernels::SamplingParams sampling;
    uint64_t seed;
    int64_t chunk;  // prefill piece size
    size_t fed = 0;
    std::vector<int32_t> out;
  };
  std::vector<Request> requests = {
      {testing::RandomTokens(150, 1), {}, 0, 64, 0, {}},
      {testing::RandomTokens(9, 2), {0.8f, 20, 0.9f}, 7, 4, 0, {}},
      {testing::RandomTokens(1, 3), {1.0f, 0, 1.0f}, 9, 1, 0, {}},
      {testing::RandomTokens(40, 4), {}, 0, 100, 0, {}},
  };
  const int64_t kTokens = 12;
  bool busy = true;
  for (uint64_t step_id = 0; busy; ++step_id) {
    Step step;
    step.id = step_id;
    busy = false;
    for (size_t i = 0; i < requests.size(); ++i) {
      Request& r = requests[i];
      if (static_cast<int64_t>(r.out.size()) == kTokens) continue;
      busy = true;
      SequenceWork w;
      w.sequence_id = 100 + i;
      w.start = r.fed == 0;
      w.sampling = r.sampling;
      w.seed = r.seed;
      if (r.fed < r.prompt.size()) {
        const size_t n = std::min<size_t>(r.chunk, r.prompt.size() - r.fed);
        w.tokens.assign(r.prompt.begin() + r.fed, r.prompt.begin() + r.fed + n);
        r.fed += n;
        w.output = r.fed == r.prompt.size() ? WorkOutput::kSample : WorkOutput::kNone;
      } else {
        w.tokens = {r.out.back()};
        w.output = WorkOutput::kSample;
      }
      step.work.push_back(std::move(w));
    }
    if (!busy) break;
    auto results = executor_->Run(step);
    ASSERT_TRUE(results.ok()) << results.status();
    for (const SequenceResult& res : *results) {
      requests[res.sequence_id - 100].out.push_back(res.token);
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    EXPECT_EQ(r.out, Alone(r.prompt, kTokens, r.sampling, r.seed)) << "request " << i;
  }
  EXPECT_EQ(executor_->Held().sequences, 4);
  Step release;
  release.release = {100, 101, 102, 103};
  ASSERT_TRUE(executor_->Run(release).ok());
  const HeldState held = executor_->Held();
  EXPECT_EQ(held.sequences, 0);
  EXPECT_EQ(held.kda_bytes + held.mla_bytes, 0);
}

TEST_P(StepExecutorTest, ScoreGivesLogSoftmaxOfTheNextToken) {
  const auto tokens = testing::RandomTokens(70, 5);
  const std::vector<float> all = testing::OneShotLogits(*model_, tokens);
  ASSERT_FALSE(all.empty());
  const std::vector<float>* logits = &all;
  const int64_t V = model_->config().vocab_size;

  // Scored in two pieces next to a decoding sequence.
  std::vector<float> scored;
  for (size_t begin : {0, 30}) {
    Step step;
    SequenceWork w;
    w.sequence_id = 1;
    w.start = begin == 0;
    const size_t end = begin == 0 ? 30 : tokens.size();
    w.tokens.assign(tokens.begin() + begin, tokens.begin() + end);
    w.output = WorkOutput::kScore;
    for (size_t i = begin; i < end; ++i) {
      w.targets.push_back(i + 1 < tokens.size() ? tokens[i + 1] : -1);
    }
    step.work.push_back(w);
    SequenceWork other;
    other.sequence_id = 2;
    other.start = begin == 0;
    other.tokens = {5, 6, 7};
    other.output = WorkOutput::kSample;
    other.logprobs = true;
    other.top_logprobs = 3;
    step.work.push_back(other);
    auto results = executor_->Run(step);
    ASSERT_TRUE(results.ok()) << results.status();
    ASSERT_EQ(results->size(), 2u);
    const auto& s = (*results)[0].target_logprobs;
    scored.insert(scored.end(), s.begin(), s.end());
    const SequenceResult& sampled = (*results)[1];
    ASSERT_EQ(sampled.top_ids.size(), 3u);
    EXPECT_EQ(sampled.top_ids[0], sampled.token);  // greedy
    EXPECT_FLOAT_EQ(sampled.top_logprobs[0], sampled.logprob);
    EXPECT_GE(sampled.top_logprobs[0], sampled.top_logprobs[1]);
    EXPECT_GE(sampled.top_logprobs[1], sampled.top_logprobs[2]);
  }
  ASSERT_EQ(scored.size(), tokens.size());
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    const double expected = testing::LogSoftmax(logits->data() + i * V, V)[tokens[i + 1]];
    EXPECT_NEAR(scored[i], expected, 1e-4 * (1 + std::abs(expected))) << "token " << i;
  }
  EXPECT_EQ(scored.back(), 0.0f);
}

// Scoring with top-k: a row of K alternatives per token, highest first (ties:
// lower id), each the log-softmax of that row; and the step's logits buffer,
// counted by the stage, is this step's rows x vocab, not the document's.
TEST_P(StepExecutorTest, ScoreTopKPerRowAndTheLogitsBufferIsOneStep) {
  const auto tokens = testing::RandomTokens(40, 9);
  const std::vector<float> all = testing::OneShotLogits(*model_, tokens);
  ASSERT_FALSE(all.empty());
  const int64_t V = model_->config().vocab_size, K = 4;
  std::vector<int32_t> top_ids;
  std::vector<float> top_lp;
  int64_t largest_step_rows = 0;
  for (const auto& [begin, end] : {std::pair<size_t, size_t>{0, 25}, {25, 40}}) {
    SequenceWork w;
    w.sequence_id = 1;
    w.start = begin == 0;
    w.tokens.assign(tokens.begin() + begin, tokens.begin() + end);
    w.output = WorkOutput::kScore;
    w.top_logprobs = K;
    for (size_t i = begin; i < end; ++i) {
      w.targets.push_back(i + 1 < tokens.size() ? tokens[i + 1] : -1);
    }
    Step step;
    step.work.push_back(w);
    auto results = executor_->Run(step);
    ASSERT_TRUE(results.ok()) << results.status();
    const SequenceResult& r = (*results)[0];
    ASSERT_EQ(r.top_ids.size(), (end - begin) * K);
    ASSERT_EQ(r.top_logprobs.size(), r.top_ids.size());
    top_ids.insert(top_ids.end(), r.top_ids.begin(), r.top_ids.end());
    top_lp.insert(top_lp.end(), r.top_logprobs.begin(), r.top_logprobs.end());
    largest_step_rows = std::max<int64_t>(largest_step_rows, end - begin);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<double> lp = testing::LogSoftmax(all.data() + i * V, V);
    std::vector<int32_t> order(V);
    for (int32_t v = 0; v < V; ++v) order[v] = v;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
    for (int64_t j = 0; j < K; ++j) {
      // Pieces round differently from one shot (5e-5 relative): ids where
      // no neighbour is that close.
      EXPECT_NEAR(top_lp[i * K + j], lp[order[j]], 1e-4 * (1 + std::abs(lp[order[j]])))
          << "token " << i;
      if (lp[order[j]] - lp[order[j + 1]] > 1e-3 &&
          (j == 0 || lp[order[j - 1]] - lp[order[j]] > 1e-3)) {
        EXPECT_EQ(top_ids[i * K + j], order[j]) << "token " << i << ", rank " << j;
      }
    }
  }
  const int64_t peak = executor_->stage().stats().peak_logits_bytes;
  EXPECT_GE(peak, largest_step_rows * V * 4);
  // A vector's capacity may round up a little, never to the document.
  EXPECT_LT(peak, 2 * largest_step_rows * V * 4);
  EXPECT_LT(peak, static_cast<int64_t>(tokens.size()) * V * 4);
}

SequenceWork Work(uint64_t id, bool start, std::vector<int32_t> tokens,
                  WorkOutput output = WorkOutput::kNone) {
  SequenceWork w;
  w.sequence_id = id;
  w.start = start;
  w.tokens = std::move(tokens);
  w.output = output;
  return w;
}

TEST_P(StepExecutorTest, BadWorkChangesNothing) {
  Step start;
  start.work.push_back(Work(1, true, {1, 2, 3}, WorkOutput::kSample));
  ASSERT_TRUE(executor_->Run(start).ok());
  const HeldState before = executor_->Held();

  Step again = start;  // starting a live sequence
  EXPECT_EQ(executor_->Run(again).status().code(), absl::StatusCode::kFailedPrecondition);
  Step unknown;
  unknown.work.push_back(Work(9, false, {1}, WorkOutput::kSample));
  EXPECT_EQ(executor_->Run(unknown).status().code(), absl::StatusCode::kFailedPrecondition);
  Step twice;
  twice.work.push_back(Work(1, false, {1}));
  twice.work.push_back(Work(1, false, {2}));
  EXPECT_EQ(executor_->Run(twice).status().code(), absl::StatusCode::kInvalidArgument);
  // A bad token in one sequence fails the step; the new sequence of that step
  // is not kept and the old one did not advance.
  Step bad;
  bad.work.push_back(Work(1, false, {4}, WorkOutput::kSample));
  bad.work.push_back(Work(2, true, {1, 100000}));
  EXPECT_FALSE(executor_->Run(bad).ok());
  const HeldState after = executor_->Held();
  EXPECT_EQ(after.sequences, before.sequences);
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.mla_bytes, before.mla_bytes);
}

// An error a kernel reports asynchronously (as a GPU kernel would) comes back
// at the step's sync point as the step's error, naming the op; the step's
// sequences are gone, the others keep their state, and the next step runs.
TEST_P(StepExecutorTest, ADeviceErrorFailsTheStepAndTheNextOneRuns) {
  Step first;
  first.work.push_back(Work(1, true, {1, 2, 3}));
  first.work.push_back(Work(2, true, {4, 5}));
  ASSERT_TRUE(executor_->Run(first).ok());
  Step failing;
  failing.id = 1;
  failing.work.push_back(Work(1, false, {6}, WorkOutput::kSample));
  kernels::Workspace::Of(kernels::Device::kCpu)
      .ReportError("MlaAbsorbedAttention", "an illegal memory access");
  const auto failed = executor_->Run(failing);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(failed.status().message(),
            "step 1: MlaAbsorbedAttention failed on the cpu: an illegal memory access");
  EXPECT_EQ(executor_->Held().sequences, 1);  // sequence 2 only
  Step next;
  next.id = 2;
  next.work.push_back(Work(2, false, {6}, WorkOutput::kSample));
  next.work.push_back(Work(3, true, {7, 8}, WorkOutput::kSample));
  auto results = executor_->Run(next);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(results->size(), 2u);
}

TEST_P(StepExecutorTest, AForkStartsAsACopyOfItsPrefix) {
  const auto prefix = testing::RandomTokens(60, 8);
  const auto next = testing::RandomTokens(5, 9);
  Step first;
  first.work.push_back(Work(1, true, prefix));
  ASSERT_TRUE(executor_->Run(first).ok());
  // Sequence 2 forks from 1 and both take the same tokens in one step: the
  // same logits, and 1's state was copied as it was before the step.
  Step step;
  step.work.push_back(Work(1, false, next, WorkOutput::kLogits));
  SequenceWork fork = Work(2, true, next, WorkOutput::kLogits);
  fork.fork_from = 1;
  step.work.push_back(fork);
  auto results = executor_->Run(step);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 2u);
  EXPECT_LE(testing::RelL2((*results)[1].logits, testing::ToDouble((*results)[0].logits)), 1e-6);
  std::vector<int32_t> whole = prefix;
  whole.insert(whole.end(), next.begin(), next.end());
  const std::vector<float> reference = testing::OneShotLogits(*model_, whole);
  const int64_t V = model_->config().vocab_size;
  const std::vector<float> tail(reference.end() - 5 * V, reference.end());
  EXPECT_LE(testing::RelL2((*results)[1].logits, testing::ToDouble(tail)), 5e-5);
  EXPECT_EQ(executor_->Held().tokens, 130);

  // A fork of a sequence with no state, or one that is not starting, is refused.
  Step bad;
  SequenceWork orphan = Work(3, true, {1});
  orphan.fork_from = 42;
  bad.work.push_back(orphan);
  EXPECT_EQ(executor_->Run(bad).status().code(), absl::StatusCode::kFailedPrecondition);
  Step not_starting;
  SequenceWork again = Work(2, false, {1});
  again.fork_from = 1;
  not_starting.work.push_back(again);
  EXPECT_EQ(executor_->Run(not_starting).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A step that starts more sequences than the rank has state slots for fails
// whole, naming the sequence, and holds nothing new; one that fits runs.
TEST(StepExecutorSlotsTest, AStartBeyondTheSlotsFailsTheStepAndChangesNothing) {
  ModelOptions options;
  options.state_slots = 2;
  auto model = Model::Load(testing::GoldenPath("model/k3-tiny"), {}, nullptr, options);
  ASSERT_TRUE(model.ok()) << model.status();
  const WorldLayout layout = *WorldLayout::Make(1, 1, 1);
  SingleCommunicator world;
  SingleDataCommunicator stage;
  StepExecutor executor(**model, layout, world, stage);
  Step three;
  for (uint64_t id = 1; id <= 3; ++id) three.work.push_back(Work(id, true, {1, 2}));
  const auto refused = executor.Run(three);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find(
                "step 0: sequence 3 cannot start: all 2 KDA state slots are held"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(executor.Held().sequences, 0);
  EXPECT_EQ((*model)->state_pool().used_slots(), 0);
  three.work.pop_back();
  ASSERT_TRUE(executor.Run(three).ok());
  EXPECT_EQ(executor.Held().sequences, 2);
}

INSTANTIATE_TEST_SUITE_P(Golden, StepExecutorTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);

}  // namespace
}  // namespace deltaserve
