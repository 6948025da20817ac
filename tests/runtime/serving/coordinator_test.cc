// The coordinator's schedule, step by step, end to end: a worker that
// records every step and runs it on a real replica (the golden k3-tiny model);
// every request gets the tokens it gets alone. The policy itself is tested
// without a model in tests/runtime/scheduler/scheduler_test.cc.
#include "runtime/serving/coordinator.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "tests/engine_runs.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

// Reports each step as taking what the coordinator's own starting cost model
// says, so the schedule does not depend on this machine's timing.
class RecordingWorker final : public WorkerConnection {
 public:
  RecordingWorker(const Model& model, Coordinator& coordinator)
      : local_(model), coordinator_(coordinator), cost_(model.config()) {}

  // Attaches saying it has `stages` pipeline stages (the steps still run here,
  // in one stage).
  void Attach(const ModelConfig& config, int stages) {
    std::shared_ptr<WorkerConnection> self(this, [](WorkerConnection*) {});
    auto id = coordinator_.AttachWorker(
        MakeWorkerInfo(config, *WorldLayout::Make(1, stages, 1), "recording"), self);
    ASSERT_TRUE(id.ok()) << id.status();
  }
  absl::StatusOr<std::optional<StepResult>> Send(const Step& step) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      plans_.push_back(step);
    }
    std::vector<StepPiece> pieces;
    for (uint64_t id : step.release) lengths_.erase(id);
    for (const auto& w : step.work) {
      pieces.push_back({static_cast<int64_t>(w.tokens.size()), lengths_[w.sequence_id]});
      lengths_[w.sequence_id] += static_cast<int64_t>(w.tokens.size());
    }
    auto result = local_.replica().Run(step);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return result.status();
    result->wall_s = cost_.Cost(pieces);
    result->stage_compute_s = {cost_.Cost(pieces)};
    return std::optional<StepResult>(std::move(*result));
  }
  std::vector<Step> plans() {
    std::lock_guard<std::mutex> lock(mu_);
    return plans_;
  }

 private:
  testing::LocalReplica local_;
  Coordinator& coordinator_;
  const ChunkCostModel cost_;
  std::map<uint64_t, int64_t> lengths_;
  std::mutex mu_;
  std::vector<Step> plans_;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = Model::Load(testing::GoldenPath("model/k3-tiny"));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
  }
  void Start(int64_t step_tokens, int stages = 1) {
    CoordinatorOptions options;
    options.step_tokens = step_tokens;
    coordinator_ = std::make_unique<Coordinator>(model_->config(), nullptr, options, metrics_);
    worker_ = std::make_unique<RecordingWorker>(*model_, *coordinator_);
    worker_->Attach(model_->config(), stages);
  }
  void TearDown() override {
    if (coordinator_) coordinator_->Shutdown();
  }
  // Every token of a request, and how it ended.
  std::vector<int32_t> Finish(const RequestHandle& handle) {
    std::vector<int32_t> ids;
    while (true) {
      std::vector<TokenEvent> events;
      auto outcome = coordinator_->Poll(handle, &events, std::chrono::milliseconds(100));
      for (const auto& e : events) ids.push_back(e.id);
      if (outcome) {
        EXPECT_TRUE(outcome->status.ok()) << outcome->status;
        return ids;
      }
    }
  }
  std::vector<int32_t> Alone(const std::vector<int32_t>& prompt, int64_t n) {
    return testing::ReferenceGenerate(*model_, prompt, n);
  }
  RequestHandle Submit(const std::vector<int32_t>& prompt, int64_t max_tokens) {
    GenerateParams params;
    params.max_tokens = max_tokens;
    auto handle = coordinator_->SubmitGenerate("r" + std::to_string(next_++), "", prompt, params,
                                               std::nullopt);
    EXPECT_TRUE(handle.ok()) << handle.status();
    return *handle;
  }
  // Tokens of sequence `id` in each plan (0 where it has no work).
  static std::vector<int> WorkOf(const std::vector<Step>& plans, uint64_t id) {
    std::vector<int> sizes;
    for (const auto& plan : plans) {
      int n = 0;
      for (const auto& w : plan.work) {
        if (w.sequence_id == id) n = static_cast<int>(w.tokens.size());
      }
      sizes.push_back(n);
    }
    return sizes;
  }

  std::unique_ptr<Model> model_;
  MetricsRegistry metrics_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<RecordingWorker> worker_;
  int next_ = 0;
};

TEST_F(CoordinatorTest, PrefillChunksShrinkAsTheMlaPrefixGrows) {
  Start(256);
  const auto prompt = testing::RandomTokens(6000, 1);
  EXPECT_EQ(Finish(Submit(prompt, 4)), Alone(prompt, 4));
  std::vector<int> chunks;
  for (int n : WorkOf(worker_->plans(), 1)) {
    if (n > 0) chunks.push_back(n);
  }
  chunks.resize(chunks.size() - 3);  // the decode steps
  int64_t total = 0;
  for (int n : chunks) total += n;
  EXPECT_EQ(total, 6000);
  EXPECT_EQ(chunks.front(), 256);
  // Non-increasing but for the prompt's last piece, and much smaller by the
  // end: attention over a 6000-token prefix costs many times the rest.
  for (size_t i = 1; i + 1 < chunks.size(); ++i) {
    EXPECT_LE(chunks[i], chunks[i - 1]) << "chunk " << i;
  }
  EXPECT_LT(chunks[chunks.size() - 2], 256 / 3);
}

TEST_F(CoordinatorTest, ShortRequestsDecodeWhileALongPromptPrefills) {
  Start(256);
  const auto long_prompt = testing::RandomTokens(4000, 2);
  const auto short_prompt = testing::RandomTokens(5, 3);
  // Submitted together: the short one is prefilled first (shortest prompt
  // first, the oldest keeping a share) and decodes in the steps that carry
  // the long prompt's chunks.
  RequestHandle long_request = Submit(long_prompt, 2);
  RequestHandle short_request = Submit(short_prompt, 10);
  EXPECT_EQ(Finish(short_request), Alone(short_prompt, 10));
  EXPECT_EQ(Finish(long_request), Alone(long_prompt, 2));
  const auto plans = worker_->plans();
  const auto long_work = WorkOf(plans, 1), short_work = WorkOf(plans, 2);
  int shared = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (long_work[i] > 1 && short_work[i] == 1) ++shared;  // a chunk and a decode
    int tokens = 0;
    for (const auto& w : plans[i].work) tokens += static_cast<int>(w.tokens.size());
    EXPECT_LE(tokens, 256) << "step " << i << " is over the token budget";
  }
  EXPECT_EQ(shared, 9);  // every decode of the short request
}

TEST_F(CoordinatorTest, StepsPromiseASuccessorWhilePromptIsLeft) {
  Start(256, /*stages=*/2);
  const auto long_prompt = testing::RandomTokens(3000, 6);
  const auto short_prompt = testing::RandomTokens(4, 7);
  RequestHandle long_request = Submit(long_prompt, 2);
  RequestHandle short_request = Submit(short_prompt, 6);
  EXPECT_EQ(Finish(short_request), Alone(short_prompt, 6));
  EXPECT_EQ(Finish(long_request), Alone(long_prompt, 2));
  // Steps that carry the short request's decode next to the long prompt's
  // chunks still promise a successor; once the prompt is in, none do.
  const auto plans = worker_->plans();
  const auto long_work = WorkOf(plans, 1), short_work = WorkOf(plans, 2);
  int mixed = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (long_work[i] > 1 && short_work[i] == 1) {
      ++mixed;
      EXPECT_TRUE(plans[i].more_coming) << "step " << i;
    }
    if (long_work[i] <= 1 && short_work[i] <= 1) {
      EXPECT_FALSE(plans[i].more_coming) << "step " << i;
    }
  }
  EXPECT_EQ(mixed, 5);
}

TEST_F(CoordinatorTest, DecodesSplitIntoOneGroupPerPipelineStage) {
  Start(256, /*stages=*/2);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(testing::RandomTokens(3, 50 + i));
    handles.push_back(Submit(prompts.back(), 10));
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Finish(handles[i]), Alone(prompts[i], 10)) << i;
  // Four sequences decoding on two stages: two per step, alternating, each
  // step promising the next while the other group waits.
  int decode_steps = 0;
  for (const auto& plan : worker_->plans()) {
    int decodes = 0;
    for (const auto& w : plan.work) decodes += w.tokens.size() == 1;
    if (decodes == 0) continue;
    ++decode_steps;
    EXPECT_LE(decodes, 2) << "step " << plan.id;
  }
  EXPECT_GE(decode_steps, 2 * 9);  // 9 decodes each, at most two per step
}

TEST_F(CoordinatorTest, PurePrefillStepsPromiseASuccessorToAPipeline) {
  Start(256, /*stages=*/2);
  const auto prompt = testing::RandomTokens(2000, 4);
  EXPECT_EQ(Finish(Submit(prompt, 3)), Alone(prompt, 3));
  const auto plans = worker_->plans();
  ASSERT_GE(plans.size(), 4u);
  // Chunks that sample nothing say more_coming; the prompt's last chunk
  // samples the first token, which the next step needs, and does not. This
  // worker is behind a link, so a decode step may be followed by one sent
  // ahead of its result (Scheduler's decode_ahead): the step sampling token
  // 2 may promise, the one sampling the last token does not.
  size_t i = 0;
  for (; i < plans.size() && plans[i].work.size() == 1 &&
         plans[i].work[0].output == WorkOutput::kNone;
       ++i) {
    EXPECT_TRUE(plans[i].more_coming) << "step " << i;
  }
  EXPECT_GE(i, 3u);
  ASSERT_LT(i, plans.size());
  EXPECT_FALSE(plans[i].more_coming) << "the prompt's last chunk";
  EXPECT_FALSE(plans.back().more_coming) << "the last decode step";
}

TEST_F(CoordinatorTest, CancellingFreesTheStateWithTheNextStep) {
  Start(256);
  RequestHandle handle = Submit({1, 2, 3}, 1000000);
  std::vector<TokenEvent> events;
  while (events.size() < 3) coordinator_->Poll(handle, &events, std::chrono::milliseconds(100));
  coordinator_->Cancel(handle, absl::CancelledError("test"));
  std::optional<RequestOutcome> outcome;
  while (!outcome) outcome = coordinator_->Poll(handle, &events, std::chrono::milliseconds(100));
  EXPECT_EQ(outcome->status.code(), absl::StatusCode::kCancelled);
  for (int i = 0; i < 100 && coordinator_->Status().kda_state_bytes > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const ServerStatusData status = coordinator_->Status();
  EXPECT_EQ(status.kda_state_bytes, 0);
  EXPECT_EQ(status.mla_cache_bytes, 0);
  EXPECT_EQ(status.running_sequences, 0);
  const auto plans = worker_->plans();
  ASSERT_FALSE(plans.empty());
  ASSERT_EQ(plans.back().release.size(), 1u);
  EXPECT_EQ(plans.back().release[0], 1u);
}

// A link that breaks on the first step sent down it.
class BrokenLink final : public WorkerConnection {
 public:
  absl::StatusOr<std::optional<StepResult>> Send(const Step&) override {
    return absl::UnavailableError("the test breaks every link");
  }
};

// Attaches a worker whose link breaks on its first step, and waits until
// the coordinator has dropped it.
void LoseABrokenWorker(Coordinator& coordinator) {
  const WorkerInfo info =
      MakeWorkerInfo(coordinator.config(), *WorldLayout::Make(1, 1, 1), "broken");
  ASSERT_TRUE(coordinator.AttachWorker(info, std::make_shared<BrokenLink>()).ok());
  for (int i = 0; i < 500 && coordinator.Status().workers > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(coordinator.Status().workers, 0);
}

// A step's allowance once the cost model has learned: 10 times the more of
// what the model expects and what the worker's recent steps took, within the
// floor and --step-timeout.
TEST(StepAllowanceTest, TenTimesTheExpectedOrRecentStepWithinTheFloorAndTimeout) {
  EXPECT_DOUBLE_EQ(StepAllowance(0.01, 0.02, 5, 300), 5);  // decode: the floor
  EXPECT_DOUBLE_EQ(StepAllowance(2, 0.5, 5, 300), 20);     // the model's expectation
  EXPECT_DOUBLE_EQ(StepAllowance(0.1, 3, 5, 300), 30);     // a model that guesses low
  EXPECT_DOUBLE_EQ(StepAllowance(100, 0, 5, 300), 300);    // never past --step-timeout
  EXPECT_DOUBLE_EQ(StepAllowance(0.01, 0, 60, 30), 30);    // a floor past the timeout
}

// A hello is untrusted: a layout the model cannot have, or a state pool
// that makes no sense, is refused by name and nothing is attached.
TEST_F(CoordinatorTest, AHelloTheModelCannotHaveIsRefused) {
  Coordinator coordinator(model_->config(), nullptr, CoordinatorOptions{}, metrics_);
  const WorkerInfo good = MakeWorkerInfo(coordinator.config(), *WorldLayout::Make(1, 1, 1), "h");
  auto refused = [&](auto change, const std::string& text) {
    WorkerInfo info = good;
    change(info);
    const auto id = coordinator.AttachWorker(info, std::make_shared<BrokenLink>());
    ASSERT_FALSE(id.ok()) << text;
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(id.status().message().find(text), std::string::npos) << id.status();
  };
  // k3-tiny: 9 layers, 4 KDA and 4 MLA heads.
  refused([](WorkerInfo& i) { i.pipeline_stages = INT32_MAX; },
          "the model's 9 layers make 1 to that many stages");
  refused([](WorkerInfo& i) { i.pipeline_stages = 0; }, "1 to that many stages");
  refused([](WorkerInfo& i) { i.tensor_parallel = 3; }, "3 tensor-parallel ranks) is not valid");
  refused([](WorkerInfo& i) { i.tensor_parallel = INT32_MAX; }, "tensor-parallel ranks");
  refused([](WorkerInfo& i) { i.replicas = 2; }, "a worker is one replica");
  refused([](WorkerInfo& i) { i.cache_pages = -1; }, "MLA cache of -1 pages is not valid");
  refused([](WorkerInfo& i) { i.state_slots = 1; }, "1 state slots are not valid");
  refused([](WorkerInfo& i) { i.unit_bytes.page = INT64_MAX; },
          "the worker's state of 9223372036854775807 bytes a page and 0 bytes a slot is not valid");
  refused([](WorkerInfo& i) { i.unit_bytes.slot = -1; }, "-1 bytes a slot is not valid");
  EXPECT_EQ(coordinator.Status().workers, 0);
}

// A remote link: steps wait in a queue for the test, which answers them
// through Coordinator::OnStepResult as a worker's link reader would.
class QueuedLink final : public WorkerConnection {
 public:
  absl::StatusOr<std::optional<StepResult>> Send(const Step& step) override {
    std::lock_guard<std::mutex> lock(mu_);
    steps_.push_back(step);
    cv_.notify_all();
    return std::optional<StepResult>();
  }
  Step Take() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !steps_.empty(); });
    Step step = std::move(steps_.front());
    steps_.pop_front();
    return step;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Step> steps_;
};

// A worker's error text reaches the client as one bounded line: control
// characters escaped, the rest cut, whatever the worker sent.
TEST_F(CoordinatorTest, AWorkersErrorReachesTheClientEscapedAndBounded) {
  coordinator_ =
      std::make_unique<Coordinator>(model_->config(), nullptr, CoordinatorOptions{}, metrics_);
  RequestHandle handle = Submit({1, 2, 3}, 4);
  // Each worker refuses the step: it is dropped and the request runs on the
  // next, until it has lost three and ends with the last one's error.
  for (int i = 0; i < 3; ++i) {
    auto link = std::make_shared<QueuedLink>();
    const auto id = coordinator_->AttachWorker(
        MakeWorkerInfo(model_->config(), *WorldLayout::Make(1, 1, 1), "erring"), link);
    ASSERT_TRUE(id.ok()) << id.status();
    StepResult result;
    result.step_id = link->Take().id;
    result.error = "refused\n\x1b[2Jcoordinator: ok" + std::string(20000, 'x');
    ASSERT_TRUE(coordinator_->OnStepResult(*id, result).ok());
    EXPECT_EQ(coordinator_->Status().workers, 0);
    coordinator_->DetachWorker(*id, "the test ends its link");
  }
  std::vector<TokenEvent> events;
  std::optional<RequestOutcome> outcome;
  while (!outcome) outcome = coordinator_->Poll(handle, &events, std::chrono::milliseconds(100));
  EXPECT_EQ(outcome->status.code(), absl::StatusCode::kUnavailable);
  const std::string message(outcome->status.message());
  EXPECT_NE(message.find("lost 3 workers in turn, the last because it refused a step: "
                         "refused\\n\\x1b[2Jcoordinator: ok"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("... (19003 more bytes)"), std::string::npos) << message.substr(0, 200);
  EXPECT_LT(message.size(), 1300u);
  EXPECT_TRUE(std::all_of(message.begin(), message.end(), [](char c) { return c >= 0x20; }));
}

// A request whose worker breaks under it runs again on the next, and after
// two such losses still completes with its own tokens.
TEST_F(CoordinatorTest, ARequestRunsAgainOnTheNextWorkerAfterLosingTwo) {
  coordinator_ =
      std::make_unique<Coordinator>(model_->config(), nullptr, CoordinatorOptions{}, metrics_);
  const std::vector<int32_t> prompt = {4, 5, 6};
  RequestHandle survivor = Submit(prompt, 6);
  ASSERT_NO_FATAL_FAILURE(LoseABrokenWorker(*coordinator_));
  ASSERT_NO_FATAL_FAILURE(LoseABrokenWorker(*coordinator_));
  EXPECT_EQ(coordinator_->Status().waiting_requests, 1);
  worker_ = std::make_unique<RecordingWorker>(*model_, *coordinator_);
  worker_->Attach(model_->config(), 1);
  EXPECT_EQ(Finish(survivor), Alone(prompt, 6));
}

// A link that runs each step on a real replica once the test allows it, and
// breaks instead of running the step after its first `steps` (never when
// `steps` is negative). The test allows a step only when the link waits for
// one and only after a Poll, so the client has taken each step's progress
// before the next step runs.
class PacedLink final : public WorkerConnection {
 public:
  PacedLink(const Model& model, int steps) : local_(model), steps_(steps) {}
  absl::StatusOr<std::optional<StepResult>> Send(const Step& step) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++arrived_;
      cv_.wait(lock, [&] { return open_ || allowed_ >= arrived_; });
    }
    if (steps_ == 0) return absl::UnavailableError("the test breaks the link mid-prefill");
    if (steps_ > 0) --steps_;
    auto result = local_.replica().Run(step);
    if (!result.ok()) return result.status();
    return std::optional<StepResult>(std::move(*result));
  }
  // The coordinator cutting the link opens it: a Send waiting returns.
  void Cancel() override { Open(); }
  // Whether a step waits for the test to allow it (the step before it has
  // run and the coordinator has taken its result).
  bool Waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return !open_ && arrived_ > allowed_;
  }
  // Lets the waiting step run.
  void Allow() {
    std::lock_guard<std::mutex> lock(mu_);
    ++allowed_;
    cv_.notify_all();
  }
  // Lets every step run, now and from now on.
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  testing::LocalReplica local_;
  int steps_;  // left before it breaks; only the scheduler's thread uses it
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t arrived_ = 0;  // steps sent to it
  int64_t allowed_ = 0;  // steps the test has let run
  bool open_ = false;
};

// Progress is told as it comes (an interval of 1 ns), each further than the
// last: when the worker breaks mid-prefill and the request starts over on
// another, its client hears nothing until the new prefill passes the old.
// Each worker's steps run one at a time, each after the client has polled
// for the one before.
TEST_F(CoordinatorTest, PrefillProgressNeverGoesBackWhenARequestRunsAgain) {
  CoordinatorOptions options;
  options.step_tokens = 16;
  options.progress_interval_s = 1e-9;
  coordinator_ = std::make_unique<Coordinator>(model_->config(), nullptr, options, metrics_);
  std::vector<int32_t> prompt(200);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 5 + 1) % 256);
  RequestHandle handle = Submit(prompt, 2);
  const auto breaking = std::make_shared<PacedLink>(*model_, 6);
  const auto second = std::make_shared<PacedLink>(*model_, -1);
  // However the test ends, both links open, so that no step waits on one
  // through the coordinator's shutdown.
  struct OpenAtEnd {
    std::vector<std::shared_ptr<PacedLink>> links;
    ~OpenAtEnd() {
      for (const auto& link : links) link->Open();
    }
  } open_at_end{{breaking, second}};
  ASSERT_TRUE(
      coordinator_
          ->AttachWorker(MakeWorkerInfo(model_->config(), *WorldLayout::Make(1, 1, 1), "breaking"),
                         breaking)
          .ok());
  std::vector<int64_t> told;
  std::vector<TokenEvent> tokens;
  auto take = [&]() {
    std::optional<PrefillProgress> progress;
    auto outcome = coordinator_->Poll(handle, &tokens, std::chrono::milliseconds(10), &progress);
    if (progress) {
      EXPECT_EQ(progress->tokens_total, 200);
      EXPECT_TRUE(tokens.empty()) << "progress with or after the first token";
      told.push_back(progress->tokens_done);
    }
    return outcome;
  };
  // Polls, then lets the link run its next step if it was already waiting
  // for it before the Poll: the Poll took whatever the step before told.
  auto take_then_allow = [&](PacedLink& link) {
    const bool waiting = link.Waiting();
    auto outcome = take();
    if (waiting) link.Allow();
    return outcome;
  };
  while (coordinator_->Status().workers > 0) {
    ASSERT_FALSE(take_then_allow(*breaking).has_value())
        << "the request ended on the breaking worker";
  }
  ASSERT_FALSE(told.empty());
  const int64_t before = told.back();
  EXPECT_GE(before, 16 * 5 / 2) << "the broken worker ran 6 steps of up to 16 tokens";
  // Queued again, from the start of its prompt.
  const ServerStatusData queued = coordinator_->Status();
  ASSERT_EQ(queued.requests.size(), 1u);
  EXPECT_EQ(queued.requests[0].worker, 0u);
  EXPECT_EQ(queued.requests[0].prefill.tokens_done, 0);
  ASSERT_TRUE(
      coordinator_
          ->AttachWorker(MakeWorkerInfo(model_->config(), *WorldLayout::Make(1, 1, 1), "paced"),
                         second)
          .ok());
  std::optional<RequestOutcome> outcome;
  while (!outcome) outcome = take_then_allow(*second);
  ASSERT_TRUE(outcome->status.ok()) << outcome->status;
  ASSERT_GT(told.size(), 1u);
  EXPECT_GT(told.back(), before) << "nothing told of the second prefill";
  for (size_t i = 1; i < told.size(); ++i) EXPECT_GT(told[i], told[i - 1]) << i;
  EXPECT_LT(told.back(), 200);
  std::vector<int32_t> ids;
  for (const TokenEvent& e : tokens) ids.push_back(e.id);
  EXPECT_EQ(ids, Alone(prompt, 2));
}

// The third worker lost under a request ends it, so a request that kills
// every worker it runs on cannot take the fleet down in turn.
TEST_F(CoordinatorTest, ARequestThatLosesThreeWorkersInTurnEnds) {
  coordinator_ =
      std::make_unique<Coordinator>(model_->config(), nullptr, CoordinatorOptions{}, metrics_);
  RequestHandle poison = Submit({4, 5, 6}, 6);
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(LoseABrokenWorker(*coordinator_));
  std::vector<TokenEvent> tokens;
  const std::optional<RequestOutcome> outcome =
      coordinator_->Poll(poison, &tokens, std::chrono::seconds(10));
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(absl::IsUnavailable(outcome->status)) << outcome->status;
  EXPECT_NE(outcome->status.message().find("lost 3 workers in turn"), std::string::npos)
      << outcome->status;
  EXPECT_NE(outcome->status.message().find("the test breaks every link"), std::string::npos)
      << outcome->status;
  EXPECT_EQ(coordinator_->Status().waiting_requests, 0);
}

// The process's mapped address space now, in bytes (/proc/self/status).
int64_t MappedBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7)) * 1024;
  }
  return -1;
}

// A worker whose scheduler thread cannot be started is refused and leaves
// nothing registered; the coordinator serves on with the workers it has. The
// thread is made to fail by an address-space limit just above what the
// process maps (a thread's stack no longer fits). Runs in a child process;
// the exit code says which check failed (0: none).
int ThreadFailureChild(const Model& model) {
  MetricsRegistry metrics;
  Coordinator coordinator(model.config(), nullptr, CoordinatorOptions{}, metrics);
  RecordingWorker first(model, coordinator);
  RecordingWorker second(model, coordinator);
  RecordingWorker third(model, coordinator);
  const WorkerInfo info = MakeWorkerInfo(model.config(), *WorldLayout::Make(1, 1, 1), "test");
  auto borrowed = [](WorkerConnection& c) {
    return std::shared_ptr<WorkerConnection>(&c, [](WorkerConnection*) {});
  };
  if (!coordinator.AttachWorker(info, borrowed(first)).ok()) return 10;
  rlimit old{};
  getrlimit(RLIMIT_AS, &old);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(MappedBytes() + (2 << 20));
  if (setrlimit(RLIMIT_AS, &tight) != 0) return 11;
  auto refused = coordinator.AttachWorker(info, borrowed(second));
  setrlimit(RLIMIT_AS, &old);
  if (refused.ok()) return 12;
  if (!absl::IsResourceExhausted(refused.status()) ||
      refused.status().message().find("cannot start a thread") == std::string::npos) {
    return 13;
  }
  if (coordinator.Status().workers != 1) return 14;
  if (!coordinator.AttachWorker(info, borrowed(third)).ok()) return 15;
  if (coordinator.Status().workers != 2) return 16;
  // Requests run (on either worker) and none hangs.
  GenerateParams params;
  params.max_tokens = 4;
  for (int i = 0; i < 4; ++i) {
    auto handle =
        coordinator.SubmitGenerate("r" + std::to_string(i), "", {1, 2, 3}, params, std::nullopt);
    if (!handle.ok()) return 17;
    std::optional<RequestOutcome> outcome;
    std::vector<TokenEvent> tokens;
    for (int polls = 0; polls < 600 && !outcome; ++polls) {
      outcome = coordinator.Poll(*handle, &tokens, std::chrono::milliseconds(100));
    }
    if (!outcome || !outcome->status.ok() || tokens.size() != 4) return 18;
  }
  coordinator.Shutdown();
  return 0;
}

TEST_F(CoordinatorTest, AWorkerWhoseThreadCannotStartIsRefusedLeavingNoTrace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // _Exit: the child skips the exit handlers of the test process it copies.
  EXPECT_EXIT(std::_Exit(ThreadFailureChild(*model_)), ::testing::ExitedWithCode(0),
              "worker \"test\" refused: cannot start its thread");
}

}  // namespace
}  // namespace deltaserve

namespace deltaserve {
namespace {

// What a worker process sends is checked before any request sees it.
TEST(CheckPeerResultTest, RefusesEachMalformedField) {
  StepResult good;
  good.wall_s = 0.5;
  good.stage_compute_s = {0.2, 0.3};
  SequenceResult sampled;
  sampled.sequence_id = 7;
  sampled.token = 255;
  sampled.logprob = -1.5f;
  sampled.top_ids = {255, 3};
  sampled.top_logprobs = {-1.5f, -2.0f};
  SequenceResult scored;
  scored.sequence_id = 8;
  scored.target_logprobs = {-0.5f, -INFINITY};  // a zero probability is a log-prob
  good.outputs = {sampled, scored};
  EXPECT_TRUE(CheckPeerResult(good, 256).ok());

  struct Bad {
    std::function<void(StepResult&)> change;
    std::string message;
  };
  const Bad bad[] = {
      {[](StepResult& r) { r.outputs[0].token = 256; }, "token 256 outside a vocabulary of 256"},
      {[](StepResult& r) { r.outputs[0].token = -2; }, "token -2"},
      {[](StepResult& r) { r.outputs[0].top_ids.push_back(1); }, "3 top ids but 2 top log-probs"},
      {[](StepResult& r) { r.outputs[0].top_ids[1] = -1; }, "top id -1"},
      {[](StepResult& r) { r.outputs[0].logprob = NAN; }, "logprob is nan"},
      {[](StepResult& r) { r.outputs[1].target_logprobs[0] = INFINITY; }, "a log-prob is inf"},
      {[](StepResult& r) { r.outputs[0].logprob = 1e30f; }, "logprob is 1e+30"},
      {[](StepResult& r) { r.outputs[0].top_logprobs[1] = 0.5f; }, "a log-prob is 0.5"},
      {[](StepResult& r) { r.wall_s = -1; }, "wall_s is -1"},
      {[](StepResult& r) { r.stage_compute_s[1] = NAN; }, "stage_compute_s[1] is nan"},
  };
  for (const Bad& b : bad) {
    StepResult r = good;
    b.change(r);
    const absl::Status status = CheckPeerResult(r, 256);
    EXPECT_FALSE(status.ok()) << b.message;
    EXPECT_NE(status.message().find(b.message), std::string::npos) << status;
  }
}

}  // namespace
}  // namespace deltaserve
