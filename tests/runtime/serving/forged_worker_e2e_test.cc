// A process that attaches to `deltaserve coordinator` as a worker and answers
// its first step with a malformed result (two top ids, one top log-prob):
// the coordinator drops it, the request it held goes back to the queue, and
// the coordinator keeps serving: a real worker attaches, runs that request
// (with the tokens it gets undisturbed) and new ones. The forger's own text
// reaches the log escaped.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <thread>

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
  auto channel =
      grpc::CreateChannel(coordinator.worker_address, grpc::InsecureChannelCredentials());
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

}  // namespace
}  // namespace deltaserve
