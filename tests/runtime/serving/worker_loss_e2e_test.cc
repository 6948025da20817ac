// Failure, drain and lost workers, with real processes: `deltaserve
// coordinator`, `deltaserve worker` children and raw link clients that
// attach and then close, or attach and never read. Attach/detach cycles
// leave the coordinator's threads, mappings and memory flat; SIGTERM drains
// running requests and exits 0; a stalled worker neither holds shutdown nor a
// request past --step-timeout; a request whose replica is killed or leaves
// completes on another with the tokens of an undisturbed seeded run.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <thread>

#include "deltaserve/v1/worker.grpc.pb.h"
#include "kernels/scratch.h"
#include "runtime/comm/world_layout.h"
#include "runtime/model/config.h"
#include "runtime/serving/worker_codec.h"
#include "tests/runtime/serving/serving_test_util.h"

namespace deltaserve {
namespace {

using testing::GenerateAll;
using testing::Streamed;
using testing::TokensRequest;

std::string K3Tiny() { return testing::GoldenPath("model/k3-tiny"); }

std::unique_ptr<testing::ChildProcess> StartWorker(const std::string& address,
                                                   const std::string& log) {
  return testing::ChildProcess::Start(testing::BinPath("deltaserve") + " worker --coordinator " +
                                          address + " --model " + K3Tiny() + " --threads 1",
                                      log);
}

int64_t Mappings(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) ++n;
  return n;
}

// A raw worker link: a valid hello for k3-tiny, then whatever the test does.
struct RawLink {
  explicit RawLink(const std::shared_ptr<grpc::Channel>& channel, int stages = 1)
      : stub(v1::WorkerLink::NewStub(channel)) {
    auto config = LoadModelConfig(K3Tiny());
    EXPECT_TRUE(config.ok()) << config.status();
    stream = stub->Attach(&context);
    v1::WorkerMessage hello;
    *hello.mutable_hello() =
        MakeWorkerHello(*config, *WorldLayout::Make(1, stages, 1), "raw test link");
    ok = stream->Write(hello);
  }
  std::unique_ptr<v1::WorkerLink::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream;
  bool ok = false;
};

// A client channel whose stream window stays small and does not grow, so a
// link that never reads makes the coordinator's writes to it block.
std::shared_ptr<grpc::Channel> StallingChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4096);
  args.SetMaxReceiveMessageSize(-1);
  return testing::WorkerChannel(address, args);
}

TEST(WorkerLossTest, AttachDetachCyclesLeaveThreadsMappingsAndMemoryFlat) {
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny());
  ASSERT_NE(coordinator.stub, nullptr);
  const pid_t pid = coordinator.process->pid();
  auto channel = testing::WorkerChannel(coordinator.worker_address);
  auto cycle = [&] {
    RawLink link(channel);
    ASSERT_TRUE(link.ok);
    link.stream->WritesDone();
    const grpc::Status status = link.stream->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
  };
  // Warm up: gRPC's thread pool and allocator arenas reach their size.
  for (int i = 0; i < 100; ++i) ASSERT_NO_FATAL_FAILURE(cycle());
  const int64_t threads = testing::ProcStatus(pid, "Threads");
  const int64_t maps = Mappings(pid);
  const int64_t rss_kb = testing::ProcStatus(pid, "VmRSS");
  for (int i = 0; i < 1000; ++i) ASSERT_NO_FATAL_FAILURE(cycle());
  EXPECT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 0; },
      std::chrono::seconds(10)));
  // A scheduler thread left behind per attach would add 1000 threads and
  // 2000 mappings (stack and guard page); gRPC's pool may move by a few.
  EXPECT_LE(testing::ProcStatus(pid, "Threads"), threads + 4);
  EXPECT_LE(Mappings(pid), maps + 16);
  EXPECT_LE(testing::ProcStatus(pid, "VmRSS"), rss_kb + 8 * 1024);
  // Each cycle attached and was joined: the coordinator still serves.
  const std::string log = coordinator.process->Log();
  EXPECT_NE(log.find("worker 1100 attached"), std::string::npos);
  auto worker = StartWorker(coordinator.worker_address, testing::TempDir("cycles") + "/worker.log");
  const Streamed served = GenerateAll(*coordinator.stub, TokensRequest({1, 2, 3}, 8), 60);
  EXPECT_TRUE(served.status.ok()) << served.status.error_message() << worker->Log();
  EXPECT_EQ(served.ids.size(), 8u);
}

TEST(WorkerLossTest, SigtermDrainsRunningRequestsAndExitsZero) {
  auto coordinator =
      testing::StartServer("coordinator --model " + K3Tiny() + " --drain-timeout 120");
  ASSERT_NE(coordinator.stub, nullptr);
  const std::string dir = testing::TempDir("drain");
  auto worker = StartWorker(coordinator.worker_address, dir + "/worker.log");
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 1; },
      std::chrono::seconds(30)));
  // Streams running when SIGTERM comes: each finishes whole.
  constexpr int kRequests = 6;
  constexpr int kTokens = 1500;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>> streams;
  v1::GenerateResponse response;
  std::vector<int> got(kRequests, 0);
  for (int i = 0; i < kRequests; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(
        coordinator.stub->Generate(contexts.back().get(), TokensRequest({i + 1, 2, 3}, kTokens)));
    ASSERT_TRUE(streams.back()->Read(&response));
    got[i] += response.tokens_size();
  }
  coordinator.process->Signal(SIGTERM);
  const auto signalled = std::chrono::steady_clock::now();
  // At once: not serving, and new requests are refused naming the drain.
  bool refused = false;
  for (int i = 0; i < 100 && !refused; ++i) {
    const Streamed late = GenerateAll(*coordinator.stub, TokensRequest({9, 9}, 4), 10);
    refused = late.status.error_code() == grpc::StatusCode::UNAVAILABLE &&
              late.status.error_message().find("draining") != std::string::npos;
    if (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(refused);
  EXPECT_EQ(testing::Probe("health " + coordinator.address), "NOT_SERVING\n");
  for (int i = 0; i < kRequests; ++i) {
    while (streams[i]->Read(&response)) got[i] += response.tokens_size();
    const grpc::Status status = streams[i]->Finish();
    EXPECT_TRUE(status.ok()) << "request " << i << ": " << status.error_message();
    EXPECT_EQ(got[i], kTokens) << "request " << i;
  }
  const std::optional<int> code = coordinator.process->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << coordinator.process->Log();
  EXPECT_EQ(*code, 0) << coordinator.process->Log();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count(),
            120.0);
  EXPECT_NE(coordinator.process->Log().find("draining"), std::string::npos);
  // The worker was told the coordinator is going, and ends cleanly.
  const std::optional<int> worker_code = worker->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(worker_code.has_value()) << worker->Log();
  EXPECT_EQ(*worker_code, 0) << worker->Log();
}

// `deltaserve serve` drains the same way; what does not finish within
// --drain-timeout ends with UNAVAILABLE naming it, and the exit is still 0.
TEST(WorkerLossTest, ServeDrainsThenEndsWhatIsLeftAndExitsZero) {
  // 5 s: the short request's 300 tokens took most of 1 s under ASan on a
  // slow 2-core VM (246 of them were out when a 1 s drain ended).
  auto server = testing::StartServer("serve --model " + K3Tiny() +
                                     " --threads 1 --drain-timeout 5 --max-running 1");
  ASSERT_NE(server.stub, nullptr);
  // One short request running, one long one queued behind it (--max-running
  // 1), which cannot finish in the drain's 5 seconds.
  grpc::ClientContext short_context, long_context;
  auto short_stream = server.stub->Generate(&short_context, TokensRequest({1, 2}, 300));
  v1::GenerateResponse response;
  ASSERT_TRUE(short_stream->Read(&response));
  int short_tokens = response.tokens_size();
  auto long_stream = server.stub->Generate(&long_context, TokensRequest({3, 4}, 1000000));
  ASSERT_TRUE(testing::WaitForStatus(
      *server.stub, [](const v1::ServerStatus& s) { return s.waiting_requests() == 1; },
      std::chrono::seconds(10)));
  server.process->Signal(SIGTERM);
  const auto signalled = std::chrono::steady_clock::now();
  while (short_stream->Read(&response)) short_tokens += response.tokens_size();
  const grpc::Status short_status = short_stream->Finish();
  EXPECT_TRUE(short_status.ok()) << short_status.error_message();
  EXPECT_EQ(short_tokens, 300);
  int long_tokens = 0;
  while (long_stream->Read(&response)) long_tokens += response.tokens_size();
  const grpc::Status long_status = long_stream->Finish();
  EXPECT_EQ(long_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(long_status.error_message().find("--drain-timeout"), std::string::npos)
      << long_status.error_message();
  EXPECT_LT(long_tokens, 1000000);
  const std::optional<int> code = server.process->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value()) << server.process->Log();
  EXPECT_EQ(*code, 0) << server.process->Log();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count(),
            30.0);
  EXPECT_NE(server.process->Log().find("1 requests did not finish in time"), std::string::npos)
      << server.process->Log();
}

// A second signal cuts the drain short: a request that waits for a worker
// that never comes would otherwise hold the coordinator for --drain-timeout.
TEST(WorkerLossTest, ASecondSigtermEndsTheDrainAtOnce) {
  auto coordinator =
      testing::StartServer("coordinator --model " + K3Tiny() + " --drain-timeout 600");
  ASSERT_NE(coordinator.stub, nullptr);
  auto waiting = std::async(std::launch::async, [&] {
    return GenerateAll(*coordinator.stub, TokensRequest({1, 2, 3}, 4), 120);
  });
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.waiting_requests() == 1; },
      std::chrono::seconds(10)));
  coordinator.process->Signal(SIGTERM);
  // Draining: still up after a second, the request still waiting.
  EXPECT_FALSE(coordinator.process->Wait(std::chrono::seconds(1)).has_value());
  EXPECT_EQ(waiting.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  coordinator.process->Signal(SIGTERM);
  const std::optional<int> code = coordinator.process->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(code.has_value()) << coordinator.process->Log();
  EXPECT_EQ(*code, 0) << coordinator.process->Log();
  const Streamed ended = waiting.get();
  EXPECT_EQ(ended.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(coordinator.process->Log().find("Terminated again, ending the drain"),
            std::string::npos)
      << coordinator.process->Log();
}

TEST(WorkerLossTest, SigtermWithAStalledWorkerStillExits) {
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny() +
                                          " --drain-timeout 2 --step-tokens 400000");
  ASSERT_NE(coordinator.stub, nullptr);
  // A link that attaches and then never reads nor answers; a prompt whose
  // one step is far larger than its window, so the write to it blocks.
  RawLink stalled(StallingChannel(coordinator.worker_address));
  ASSERT_TRUE(stalled.ok);
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 1; },
      std::chrono::seconds(10)));
  auto held = std::async(std::launch::async, [&] {
    return GenerateAll(*coordinator.stub, TokensRequest(testing::RandomTokens(300000, 5), 4), 120);
  });
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.running_sequences() == 1; },
      std::chrono::seconds(20)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  coordinator.process->Signal(SIGTERM);
  const auto signalled = std::chrono::steady_clock::now();
  const std::optional<int> code = coordinator.process->Wait(std::chrono::seconds(30));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  ASSERT_TRUE(code.has_value()) << coordinator.process->Log();
  EXPECT_EQ(*code, 0) << coordinator.process->Log();
  // The drain timeout, the 2 s allowed a blocked write, gRPC's 2 s.
  EXPECT_LT(seconds, 10.0) << coordinator.process->Log();
  const Streamed lost = held.get();
  EXPECT_EQ(lost.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(lost.status.error_message().find("drain"), std::string::npos)
      << lost.status.error_message();
  EXPECT_NE(coordinator.process->Log().find("blocked 2 s into shutdown"), std::string::npos)
      << coordinator.process->Log();
  stalled.context.TryCancel();
}

TEST(WorkerLossTest, AWorkerThatNeverAnswersIsDroppedAfterTheStepTimeout) {
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny() + " --step-timeout 2");
  ASSERT_NE(coordinator.stub, nullptr);
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  RawLink stalled(testing::WorkerChannel(coordinator.worker_address));
  ASSERT_TRUE(stalled.ok);
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 1; },
      std::chrono::seconds(10)));
  const auto submitted = std::chrono::steady_clock::now();
  auto held = std::async(std::launch::async, [&] {
    return GenerateAll(*coordinator.stub, testing::SeededRequest(prompt, 30), 120);
  });
  // The step went out and is never answered: after 2 s the link is dropped
  // (its stream ends) and the request waits for another worker.
  v1::CoordinatorMessage message;
  ASSERT_TRUE(stalled.stream->Read(&message));
  ASSERT_TRUE(message.has_step());
  while (stalled.stream->Read(&message)) {
  }
  const double dropped_after =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted).count();
  EXPECT_GE(dropped_after, 1.9);
  EXPECT_LT(dropped_after, 10.0);
  EXPECT_NE(coordinator.process->Log().find("no answer to a step within 2 s (--step-timeout)"),
            std::string::npos)
      << coordinator.process->Log();
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.waiting_requests() == 1; },
      std::chrono::seconds(10)));
  auto worker =
      StartWorker(coordinator.worker_address, testing::TempDir("step_timeout") + "/worker.log");
  const Streamed served = held.get();
  ASSERT_TRUE(served.status.ok()) << served.status.error_message() << worker->Log();
  const Streamed again = GenerateAll(*coordinator.stub, testing::SeededRequest(prompt, 30), 60);
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(served.ids, again.ids);
}

// A step longer than the worker's keepalive: the worker's link is read on
// a thread of its own, so the pings are answered while the leader computes,
// and the link outlives the step (it used to end with "keepalive watchdog
// timeout" once a step ran past the keepalive and a half).
TEST(WorkerLossTest, AStepLongerThanTheKeepaliveKeepsTheLink) {
  auto coordinator =
      testing::StartServer("coordinator --model " + K3Tiny() + " --step-tokens 65536");
  const std::string dir = testing::TempDir("keepalive");
  auto worker = testing::ChildProcess::Start(
      testing::BinPath("deltaserve") + " worker --coordinator " + coordinator.worker_address +
          " --model " + K3Tiny() + " --threads 1 --keepalive 1",
      dir + "/worker.log");
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 1; },
      std::chrono::seconds(30)))
      << worker->Log();
  // One chunk of 40,000 tokens: MLA's quadratic prefill makes it one step
  // of seconds (about 10 s on a 2-core Zen 4, 6 x the keepalive at least).
  // Under AddressSanitizer 12,000 tokens take as long (40,000 took 250 s).
  const int64_t prompt = kernels::kAddressSanitizer ? 12000 : 40000;
  const Streamed out =
      GenerateAll(*coordinator.stub, TokensRequest(testing::RandomTokens(prompt, 77), 2), 300);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message() << worker->Log();
  EXPECT_EQ(out.ids.size(), 2u);
  EXPECT_GE(out.completion.timings().time_to_first_token_s(), 2.0)
      << "the step must outlast the keepalive";
  EXPECT_EQ(testing::Status(*coordinator.stub).workers(), 1) << worker->Log();
  EXPECT_EQ(worker->Log().find("keepalive"), std::string::npos) << worker->Log();
}

// Two replicas; the request runs on the first (the only one when it starts).
// Mid-generation that replica goes (`stop` says how); the stream continues
// from the other without repeating a token, and the tokens are those of an
// undisturbed run of the same seeded request.
using StartFn = std::function<std::unique_ptr<testing::ChildProcess>(const std::string& address,
                                                                     const std::string& log)>;
// `tokens`: the request's length, enough to outlast the second replica's
// start at the first replica's rate (0: 8,000, or 3,000 under
// AddressSanitizer, a tenth of the rate).
void SurvivesTheLossOfItsReplica(const StartFn& start_first,
                                 const std::function<void(testing::ChildProcess&)>& stop,
                                 std::optional<int> expected_exit, const std::string& logged,
                                 int tokens = 0) {
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny());
  ASSERT_NE(coordinator.stub, nullptr);
  const std::string dir = testing::TempDir("replica_loss");
  auto first = start_first(coordinator.worker_address, dir + "/first.log");
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 1; },
      std::chrono::seconds(30)));
  const std::vector<int32_t> prompt = testing::RandomTokens(40, 77);
  const int length = tokens > 0 ? tokens : kernels::kAddressSanitizer ? 3000 : 8000;
  const Streamed undisturbed =
      GenerateAll(*coordinator.stub, testing::SeededRequest(prompt, length));
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();
  ASSERT_EQ(undisturbed.ids.size(), static_cast<size_t>(length));

  grpc::ClientContext context;
  auto reader = coordinator.stub->Generate(&context, testing::SeededRequest(prompt, length));
  std::vector<int32_t> ids;
  v1::GenerateResponse response;
  v1::Completion completion;
  while (ids.size() < 200 && reader->Read(&response)) {
    for (const auto& t : response.tokens()) ids.push_back(t.id());
  }
  ASSERT_GE(ids.size(), 200u);
  auto second = StartWorker(coordinator.worker_address, dir + "/second.log");
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 2; },
      std::chrono::seconds(30)));
  size_t at_loss = 0;
  {
    // Still mid-generation when the replica goes.
    ASSERT_TRUE(reader->Read(&response));
    for (const auto& t : response.tokens()) ids.push_back(t.id());
    at_loss = ids.size();
    ASSERT_LT(at_loss, static_cast<size_t>(length));
  }
  stop(*first);
  while (reader->Read(&response)) {
    for (const auto& t : response.tokens()) ids.push_back(t.id());
    if (response.has_completion()) completion = response.completion();
  }
  const grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message() << coordinator.process->Log();
  EXPECT_EQ(ids, undisturbed.ids) << "lost at token " << at_loss;
  EXPECT_EQ(completion.usage().completion_tokens(), length);
  const std::optional<int> code = first->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value());
  if (expected_exit) {
    EXPECT_EQ(*code, *expected_exit) << first->Log();
  }
  const std::string log = coordinator.process->Log();
  EXPECT_NE(log.find(logged), std::string::npos) << log;
  EXPECT_NE(log.find("queued to run again"), std::string::npos) << log;
  // The second replica carries on alone.
  EXPECT_EQ(testing::Status(*coordinator.stub).workers(), 1);
}

TEST(WorkerLossTest, ARequestSurvivesTheKillOfItsReplicaWithTheSameTokens) {
  SurvivesTheLossOfItsReplica(
      StartWorker, [](testing::ChildProcess& p) { p.Signal(SIGKILL); }, 128 + SIGKILL,
      "worker 1 lost");
}

TEST(WorkerLossTest, SigtermOnAWorkerDetachesItAndItsRequestCompletesElsewhere) {
  SurvivesTheLossOfItsReplica(
      StartWorker, [](testing::ChildProcess& p) { p.Signal(SIGTERM); }, 0,
      "it is leaving: \"the worker got Terminated\"");
}

// The same with a two-stage MPI job, SIGTERM sent to mpirun alone, which
// forwards it to both ranks: the leader answers the steps in flight in its
// pipeline, then leaves. (mpirun's own exit code after a forwarded signal is
// Open MPI's business, so it is not checked.)
TEST(WorkerLossTest, SigtermOnAnMpiWorkerJobDetachesItAndItsRequestCompletesElsewhere) {
  SurvivesTheLossOfItsReplica(
      [](const std::string& address, const std::string& log) {
        return testing::ChildProcess::Start(
            "mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 2 " +
                testing::BinPath("deltaserve") + " worker --coordinator " + address + " --model " +
                K3Tiny() + " --pp 2 --threads 1",
            log);
      },
      [](testing::ChildProcess& p) { ASSERT_EQ(kill(p.pid(), SIGTERM), 0); }, std::nullopt,
      "it is leaving: \"the worker got Terminated\"",
      // A PP2 job on shared cores generates at about a third of one
      // process's rate: 2,500 tokens last as long as 8,000 there.
      2500);
}

}  // namespace
}  // namespace deltaserve
