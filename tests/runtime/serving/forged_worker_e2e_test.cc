// Workers forged by this process, attached to a real `deltaserve
// coordinator` over its worker port.
//
// One answers its first step with a malformed result (two top ids, one top
// log-prob): the coordinator drops it, the request it held goes back to the
// queue, and the coordinator keeps serving: a real worker attaches, runs that
// request (with the tokens it gets undisturbed) and new ones. The forger's
// own text reaches the log escaped.
//
// Two others answer every step correctly, each with step times of its own
// choosing (one 20 times slower per token, with another layout): each
// replica's chunk cost model, in GetServerStatus, fits its own steps.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "deltaserve/v1/worker.grpc.pb.h"
#include "runtime/comm/world_layout.h"
#include "runtime/model/config.h"
#include "runtime/serving/worker_codec.h"
#include "tests/runtime/serving/serving_test_util.h"

namespace deltaserve {
namespace {

std::string K3Tiny() { return testing::GoldenPath("model/k3-tiny"); }

TEST(ForgedWorkerTest, AMalformedResultDropsTheWorkerAndTheCoordinatorServesOn) {
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny());
  ASSERT_NE(coordinator.stub, nullptr);
  auto config = LoadModelConfig(K3Tiny());
  ASSERT_TRUE(config.ok()) << config.status();
  auto layout = WorldLayout::Make(1, 1, 1);
  ASSERT_TRUE(layout.ok());

  // The forger: a valid hello, then a result that does not add up.
  auto channel = testing::WorkerChannel(coordinator.worker_address);
  auto link = v1::WorkerLink::NewStub(channel);
  grpc::ClientContext link_context;
  auto stream = link->Attach(&link_context);
  v1::WorkerMessage hello;
  // A description that would forge a log line and clear the screen.
  *hello.mutable_hello() = MakeWorkerHello(*config, *layout, "forger\ncoordinator: ok\x1b[2J");
  ASSERT_TRUE(stream->Write(hello));
  ASSERT_TRUE(testing::WaitForHealth(coordinator.address, "SERVING")) << coordinator.process->Log();

  auto held = std::async(std::launch::async, [&] {
    return testing::GenerateAll(*coordinator.stub, testing::TokensRequest({1, 2, 3, 4}, 8), 60);
  });
  v1::CoordinatorMessage plan;
  ASSERT_TRUE(stream->Read(&plan));
  ASSERT_TRUE(plan.has_step());
  v1::WorkerMessage forged;
  v1::StepResult* result = forged.mutable_result();
  result->set_step_id(plan.step().step_id());
  for (const auto& work : plan.step().work()) {
    v1::SequenceOutput* out = result->add_outputs();
    out->set_sequence_id(work.sequence_id());
    out->set_token(5);
    out->add_top_ids(5);
    out->add_top_ids(6);
    out->add_top_logprobs(-0.1f);
  }
  ASSERT_TRUE(stream->Write(forged));
  // The coordinator ends the forger's stream.
  v1::CoordinatorMessage more;
  while (stream->Read(&more)) {
  }
  stream->Finish();

  // The request waits for another worker rather than failing.
  EXPECT_TRUE(testing::WaitForHealth(coordinator.address, "NOT_SERVING"));
  EXPECT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.waiting_requests() == 1; },
      std::chrono::seconds(10)));
  EXPECT_EQ(held.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  const std::string log = coordinator.process->Log();
  EXPECT_NE(log.find("malformed result"), std::string::npos) << log;
  EXPECT_NE(log.find("2 top ids but 1 top log-probs"), std::string::npos) << log;
  EXPECT_NE(log.find("1 requests of worker 1 queued to run again"), std::string::npos) << log;
  // Its text is quoted in the log, escaped.
  EXPECT_NE(log.find("attached: \"forger\\ncoordinator: ok\\x1b[2J\""), std::string::npos) << log;
  EXPECT_EQ(log.find("\x1b"), std::string::npos) << log;

  // A real worker attaches and serves.
  const std::string dir = testing::TempDir("forged_worker");
  auto worker = testing::ChildProcess::Start(
      testing::BinPath("deltaserve") + " worker --coordinator " + coordinator.worker_address +
          " --model " + K3Tiny() + " --threads 1",
      dir + "/worker.log");
  ASSERT_TRUE(testing::WaitForHealth(coordinator.address, "SERVING")) << worker->Log();
  const testing::Streamed rerun = held.get();
  EXPECT_TRUE(rerun.status.ok()) << rerun.status.error_message();
  const testing::Streamed served =
      testing::GenerateAll(*coordinator.stub, testing::TokensRequest({1, 2, 3, 4}, 8), 120);
  EXPECT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(served.ids.size(), 8u);
  // None of the forged token reached the client: the re-run's tokens are
  // the real worker's.
  EXPECT_EQ(rerun.ids, served.ids);
  worker->Signal(SIGTERM);
  worker->Wait(std::chrono::seconds(30));
}

// A replica that answers every step at once and well (a sampled token 5,
// -1 log-probs for scored tokens) and reports the step took
// `seconds_per_token` per token carried, on its slowest stage.
class TimedForger {
 public:
  TimedForger(const std::string& worker_address, const ModelConfig& config, int pp,
              double seconds_per_token)
      : link_(v1::WorkerLink::NewStub(testing::WorkerChannel(worker_address))),
        stream_(link_->Attach(&context_)) {
    auto layout = WorldLayout::Make(1, pp, 1);
    EXPECT_TRUE(layout.ok()) << layout.status();
    v1::WorkerMessage hello;
    *hello.mutable_hello() = MakeWorkerHello(config, *layout, absl::StrCat("timed forger pp ", pp));
    EXPECT_TRUE(stream_->Write(hello));
    thread_ = std::thread([this, pp, seconds_per_token] { Answer(pp, seconds_per_token); });
  }
  ~TimedForger() {
    context_.TryCancel();
    thread_.join();
  }

 private:
  void Answer(int pp, double seconds_per_token) {
    v1::CoordinatorMessage message;
    while (stream_->Read(&message) && message.has_step() && !message.step().shutdown()) {
      v1::WorkerMessage answer;
      v1::StepResult* result = answer.mutable_result();
      result->set_step_id(message.step().step_id());
      int64_t tokens = 0;
      for (const auto& work : message.step().work()) {
        tokens += work.tokens_size();
        if (work.output() == v1::SequenceWork::OUTPUT_NONE) continue;
        v1::SequenceOutput* out = result->add_outputs();
        out->set_sequence_id(work.sequence_id());
        if (work.output() == v1::SequenceWork::OUTPUT_SAMPLE) out->set_token(5);
        for (int i = 0; i < work.targets_size(); ++i) out->add_target_logprobs(-1.0f);
      }
      const double seconds = seconds_per_token * static_cast<double>(tokens);
      result->set_wall_s(seconds);
      // The last stage the slowest, the others half as slow: the fit takes
      // the slowest.
      for (int stage = 0; stage < pp; ++stage) {
        result->add_stage_compute_s(stage == pp - 1 ? seconds : seconds / 2);
      }
      if (!stream_->Write(answer)) break;
    }
  }

  std::unique_ptr<v1::WorkerLink::Stub> link_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  std::thread thread_;
};

TEST(ForgedWorkerTest, EachReplicasCostModelFitsItsOwnSteps) {
  // Full 512-token chunks, so that a few dozen steps outweigh the prior.
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny() + " --step-tokens 512");
  ASSERT_NE(coordinator.stub, nullptr);
  auto config = LoadModelConfig(K3Tiny());
  ASSERT_TRUE(config.ok()) << config.status();
  constexpr double kFast = 1e-3, kSlow = 2e-2;  // seconds per token
  TimedForger fast(coordinator.worker_address, *config, 1, kFast);
  TimedForger slow(coordinator.worker_address, *config, 2, kSlow);
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 2; },
      std::chrono::seconds(30)))
      << coordinator.process->Log();

  // Two long prompts at once go one to each replica (the least loaded);
  // rounds until each replica has run enough steps.
  std::vector<int32_t> prompt(8192);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i % 256);
  v1::ServerStatus status;
  auto steps_of = [](const v1::ServerStatus& s, int pp) {
    for (const auto& w : s.worker_status()) {
      if (w.pipeline_stages() == pp) return w.steps();
    }
    return int64_t{-1};
  };
  for (int round = 0; round < 10; ++round) {
    auto a = std::async(std::launch::async, [&] {
      return testing::GenerateAll(*coordinator.stub, testing::TokensRequest(prompt, 2), 60);
    });
    auto b = std::async(std::launch::async, [&] {
      return testing::GenerateAll(*coordinator.stub, testing::TokensRequest(prompt, 2), 60);
    });
    ASSERT_TRUE(a.get().status.ok());
    ASSERT_TRUE(b.get().status.ok());
    status = testing::Status(*coordinator.stub);
    if (steps_of(status, 1) >= 60 && steps_of(status, 2) >= 60) break;
  }
  ASSERT_EQ(status.worker_status_size(), 2) << status.DebugString();
  ASSERT_GE(steps_of(status, 1), 60) << status.DebugString();
  ASSERT_GE(steps_of(status, 2), 60) << status.DebugString();
  // What each fit predicts for a full step of 512 fresh tokens, and of 512
  // after 4096: its own replica's time, within what the forgetting prior
  // still holds after 60 steps (the fit leans a little on the per-pair cost
  // near a prefix of 0: 14% low there after 44 steps), and 20 times apart,
  // which the prior, a small cost on both, does not blur.
  std::map<int, double> at_0, at_4096;
  for (const auto& w : status.worker_status()) {
    const auto cost = [&](double n, double p) {
      return w.cost_per_token_s() * n + w.cost_per_pair_s() * n * (p + (n + 1) / 2);
    };
    at_0[w.pipeline_stages()] = cost(512, 0);
    at_4096[w.pipeline_stages()] = cost(512, 4096);
  }
  for (auto* at : {&at_0, &at_4096}) {
    EXPECT_NEAR((*at)[1], 512 * kFast, 0.2 * 512 * kFast) << status.DebugString();
    EXPECT_NEAR((*at)[2], 512 * kSlow, 0.2 * 512 * kSlow) << status.DebugString();
    EXPECT_NEAR((*at)[2] / (*at)[1], kSlow / kFast, 0.05 * kSlow / kFast) << status.DebugString();
  }
}

// A replica whose answers `answer` writes: given each step and how many came
// before it, the result to send, or nullopt to send nothing (it stays
// attached and reads on). Counts the steps it got and sees its stream end.
class ScriptedForger {
 public:
  using Answer = std::function<std::optional<v1::WorkerMessage>(const v1::StepPlan&, int index)>;
  ScriptedForger(const std::string& worker_address, const ModelConfig& config, Answer answer)
      : link_(v1::WorkerLink::NewStub(testing::WorkerChannel(worker_address))),
        stream_(link_->Attach(&context_)) {
    v1::WorkerMessage hello;
    *hello.mutable_hello() = MakeWorkerHello(config, *WorldLayout::Make(1, 1, 1), "scripted");
    EXPECT_TRUE(stream_->Write(hello));
    thread_ = std::thread([this, answer = std::move(answer)] {
      v1::CoordinatorMessage message;
      while (stream_->Read(&message) && message.has_step() && !message.step().shutdown()) {
        std::optional<v1::WorkerMessage> reply = answer(message.step(), steps_++);
        if (reply && !stream_->Write(*reply)) break;
      }
      ended_ = true;
    });
  }
  ~ScriptedForger() {
    context_.TryCancel();
    thread_.join();
  }
  int steps() const { return steps_; }
  bool ended() const { return ended_; }
  bool WaitForEnd(std::chrono::seconds within) const {
    const auto end = std::chrono::steady_clock::now() + within;
    while (!ended_ && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return ended_;
  }

 private:
  std::unique_ptr<v1::WorkerLink::Stub> link_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  std::atomic<int> steps_{0};
  std::atomic<bool> ended_{false};
  std::thread thread_;
};

// A well-formed answer to `step`: token 5 for each sample, -1 for each
// scored target, `seconds` of compute; every output failed with `error`
// when it is not empty.
v1::WorkerMessage Answer(const v1::StepPlan& step, double seconds, const std::string& error = "") {
  v1::WorkerMessage answer;
  v1::StepResult* result = answer.mutable_result();
  result->set_step_id(step.step_id());
  for (const auto& work : step.work()) {
    if (work.output() == v1::SequenceWork::OUTPUT_NONE) continue;
    v1::SequenceOutput* out = result->add_outputs();
    out->set_sequence_id(work.sequence_id());
    if (!error.empty()) {
      out->set_error(error);
      continue;
    }
    if (work.output() == v1::SequenceWork::OUTPUT_SAMPLE) out->set_token(5);
    for (int i = 0; i < work.targets_size(); ++i) out->add_target_logprobs(-1.0f);
  }
  result->set_wall_s(seconds);
  result->add_stage_compute_s(seconds);
  return answer;
}

// A worker that refuses every step, then one that fails every sequence it
// is given: each is dropped, and the request they held runs on a real
// worker and succeeds, instead of failing with their errors.
TEST(ForgedWorkerTest, AWorkerWhoseStepsAllFailIsDroppedAndItsRequestRunsElsewhere) {
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny());
  ASSERT_NE(coordinator.stub, nullptr);
  auto config = LoadModelConfig(K3Tiny());
  ASSERT_TRUE(config.ok()) << config.status();
  auto refuser = std::make_unique<ScriptedForger>(
      coordinator.worker_address, *config, [](const v1::StepPlan& step, int) {
        v1::WorkerMessage answer;
        answer.mutable_result()->set_step_id(step.step_id());
        answer.mutable_result()->set_error("out of\nluck");
        return std::optional<v1::WorkerMessage>(answer);
      });
  ASSERT_TRUE(testing::WaitForHealth(coordinator.address, "SERVING")) << coordinator.process->Log();
  auto held = std::async(std::launch::async, [&] {
    return testing::GenerateAll(*coordinator.stub, testing::TokensRequest({1, 2, 3, 4}, 8), 60);
  });
  ASSERT_TRUE(refuser->WaitForEnd(std::chrono::seconds(10))) << coordinator.process->Log();
  refuser.reset();
  ScriptedForger failer(coordinator.worker_address, *config, [](const v1::StepPlan& step, int) {
    return std::optional<v1::WorkerMessage>(Answer(step, 1e-3, "every sequence fails"));
  });
  ASSERT_TRUE(failer.WaitForEnd(std::chrono::seconds(10))) << coordinator.process->Log();
  EXPECT_EQ(held.wait_for(std::chrono::seconds(0)), std::future_status::timeout);

  auto worker = testing::ChildProcess::Start(
      testing::BinPath("deltaserve") + " worker --coordinator " + coordinator.worker_address +
          " --model " + K3Tiny() + " --threads 1",
      testing::TempDir("failing_worker") + "/worker.log");
  const testing::Streamed rerun = held.get();
  EXPECT_TRUE(rerun.status.ok()) << rerun.status.error_message() << coordinator.process->Log();
  EXPECT_EQ(rerun.ids.size(), 8u);
  const std::string log = coordinator.process->Log();
  EXPECT_NE(log.find("worker 1 lost: it refused a step: out of\\nluck"), std::string::npos) << log;
  EXPECT_NE(log.find("worker 2 lost: it failed every sequence of a step"), std::string::npos)
      << log;
  worker->Signal(SIGTERM);
  worker->Wait(std::chrono::seconds(30));
}

// A worker that answers its first steps at once, so that its cost model
// expects milliseconds, then answers none while its link stays up: dropped
// after --step-timeout-floor, not --step-timeout, and sent no more steps
// meanwhile than its one stage keeps in flight.
TEST(ForgedWorkerTest, AWorkerThatFallsSilentIsDroppedByItsCostModelsDeadline) {
  auto coordinator =
      testing::StartServer("coordinator --model " + K3Tiny() +
                           " --step-timeout 300 --step-timeout-floor 1 --drain-timeout 0");
  ASSERT_NE(coordinator.stub, nullptr);
  auto config = LoadModelConfig(K3Tiny());
  ASSERT_TRUE(config.ok()) << config.status();
  constexpr int kAnswered = 20;
  std::atomic<int64_t> silent_since_ms{0};
  ScriptedForger forger(
      coordinator.worker_address, *config, [&](const v1::StepPlan& step, int index) {
        if (index < kAnswered) return std::optional<v1::WorkerMessage>(Answer(step, 1e-3));
        if (index == kAnswered) {
          silent_since_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count();
        }
        return std::optional<v1::WorkerMessage>();
      });
  ASSERT_TRUE(testing::WaitForHealth(coordinator.address, "SERVING")) << coordinator.process->Log();
  auto held = std::async(std::launch::async, [&] {
    v1::GenerateRequest request = testing::TokensRequest({1, 2, 3, 4}, 200);
    request.set_ignore_eos(true);
    return testing::GenerateAll(*coordinator.stub, request, 60);
  });
  ASSERT_TRUE(forger.WaitForEnd(std::chrono::seconds(20))) << coordinator.process->Log();
  const double silent_s = (std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count() -
                           silent_since_ms) /
                          1e3;
  EXPECT_GT(silent_s, 0.9);
  EXPECT_LT(silent_s, 5.0);
  // One stage: a step and a decode step ahead of it in flight at most.
  EXPECT_LE(forger.steps(), kAnswered + 2);
  const std::string log = coordinator.process->Log();
  EXPECT_NE(log.find("no answer to a step within 1 s (10 times what its cost model expects"),
            std::string::npos)
      << log;
  EXPECT_EQ(held.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  coordinator.process->Signal(SIGTERM);
}

}  // namespace
}  // namespace deltaserve
