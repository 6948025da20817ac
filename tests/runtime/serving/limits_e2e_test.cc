// The request and peer limits against real `deltaserve serve` and
// `coordinator` processes: hostile sizes get INVALID_ARGUMENT naming the
// field and the flag while the server's memory (VmRSS) stays bounded; a
// config.json that is /dev/zero, a FIFO or a 1 TiB file is refused at once;
// a worker hello with a huge or deeply nested config_json is refused and a
// real worker attaches after it; a client that stops reading its stream is
// cancelled after --client-write-timeout, its sequence freed, while another
// client is served.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "deltaserve/v1/worker.grpc.pb.h"
#include "kernels/scratch.h"
#include "runtime/comm/world_layout.h"
#include "runtime/model/config.h"
#include "runtime/serving/worker_codec.h"
#include "tests/runtime/serving/serving_test_util.h"

namespace deltaserve {
namespace {

std::string K3Tiny() { return testing::GoldenPath("model/k3-tiny"); }

::testing::AssertionResult Refused(const grpc::Status& status, grpc::StatusCode code,
                                   const std::string& part) {
  if (status.error_code() != code) {
    return ::testing::AssertionFailure()
           << "code " << status.error_code() << ": " << status.error_message();
  }
  if (status.error_message().find(part) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "'" << status.error_message() << "' lacks '" << part << "'";
  }
  return ::testing::AssertionSuccess();
}

TEST(LimitsTest, HostileSizesAreRefusedAndMemoryStaysBounded) {
  auto server = testing::StartServer("serve --model " + K3Tiny() + " --threads 1");
  ASSERT_NE(server.stub, nullptr);
  // Warm up: one request that runs, so the RSS baseline holds the model's
  // working set.
  ASSERT_TRUE(testing::GenerateAll(*server.stub, testing::TokensRequest({1, 2, 3}, 4)).status.ok());
  const int64_t before = testing::RssBytes(server.process->pid());
  ASSERT_GT(before, 0);

  // The context of k3-tiny is 1048576 tokens: at 32 bytes a token, text over
  // 32 MiB is refused before tokenizing.
  v1::GenerateRequest text;
  text.set_text(std::string((32 << 20) + 1, 'a'));
  v1::GenerateRequest ids = testing::TokensRequest(std::vector<int32_t>((16 << 20) + 1, 7), 4);
  v1::GenerateRequest stops = testing::TokensRequest({1, 2, 3}, 4);
  for (int i = 0; i < 1000000; ++i) stops.add_stop_token_ids(i % 256);
  for (int round = 0; round < 4; ++round) {
    EXPECT_TRUE(Refused(testing::GenerateAll(*server.stub, text, 60).status,
                        grpc::StatusCode::INVALID_ARGUMENT,
                        "prompt: 33554433 bytes, over the limit of 33554432 "
                        "(--max-text-bytes-per-token 32 x the context of 1048576 tokens)"));
    EXPECT_TRUE(Refused(testing::GenerateAll(*server.stub, ids, 60).status,
                        grpc::StatusCode::INVALID_ARGUMENT,
                        "prompt: 16777217 ids, over the limit of 16777216 "
                        "(--max-request-bytes / 4)"));
    EXPECT_TRUE(Refused(testing::GenerateAll(*server.stub, stops, 60).status,
                        grpc::StatusCode::INVALID_ARGUMENT,
                        "stop_token_ids: 1000000 ids, over the limit of 256 "
                        "(--max-stop-token-ids)"));
  }
  // About 600 MB of hostile requests went in; a server that kept or
  // tokenized them would hold several times that.
  const int64_t after = testing::RssBytes(server.process->pid());
  EXPECT_LT(after - before, int64_t{256} << 20) << before << " -> " << after;
  // And it still serves.
  EXPECT_TRUE(testing::GenerateAll(*server.stub, testing::TokensRequest({1, 2, 3}, 4)).status.ok());
}

TEST(LimitsTest, AConfigJsonThatIsNoSmallRegularFileIsRefusedAtOnce) {
  const std::string root = testing::TempDir("limits_config");
  struct Case {
    std::string name, expected;
  };
  const Case cases[] = {
      {"zero", "is a character device, not a regular file"},
      {"fifo", "is a FIFO, not a regular file"},
      {"huge", "1099511627776 bytes, over the limit of 4194304"},
  };
  for (const Case& c : cases) {
    const std::string dir = root + "/" + c.name;
    std::filesystem::create_directories(dir);
    const std::string config = dir + "/config.json";
    if (c.name == "zero") std::filesystem::create_symlink("/dev/zero", config);
    if (c.name == "fifo") {
      ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
    }
    if (c.name == "huge") {
      std::filesystem::copy_file(K3Tiny() + "/config.json", config);
      std::filesystem::resize_file(config, int64_t{1} << 40);
    }
    const auto start = std::chrono::steady_clock::now();
    std::string output;
    // `timeout` so that a server that blocks fails the test instead of hanging it.
    const int rc = testing::RunCommand(
        "timeout 60 " + testing::BinPath("deltaserve") + " serve --model " + dir + " --port 0 2>&1",
        &output);
    EXPECT_NE(rc, 0) << c.name;
    EXPECT_NE(output.find(config + ": " + c.expected), std::string::npos) << output;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << c.name;
  }
}

// Attaches with `hello` and returns the status the coordinator ends it with.
grpc::Status AttachWith(const std::string& address, const v1::WorkerHello& hello) {
  auto link = v1::WorkerLink::NewStub(testing::WorkerChannel(address));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = link->Attach(&context);
  v1::WorkerMessage message;
  *message.mutable_hello() = hello;
  stream->Write(message);
  stream->WritesDone();
  v1::CoordinatorMessage reply;
  while (stream->Read(&reply)) {
  }
  return stream->Finish();
}

TEST(LimitsTest, AWorkerHelloOverTheLimitsIsRefused) {
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny());
  ASSERT_NE(coordinator.stub, nullptr);
  auto config = LoadModelConfig(K3Tiny());
  ASSERT_TRUE(config.ok()) << config.status();
  auto layout = WorldLayout::Make(1, 1, 1);
  ASSERT_TRUE(layout.ok());
  const v1::WorkerHello good = MakeWorkerHello(*config, *layout, "limits test");
  const int64_t before = testing::RssBytes(coordinator.process->pid());

  v1::WorkerHello huge = good;
  huge.set_config_json(std::string(kMaxConfigJsonBytes + 1, ' ') + good.config_json());
  EXPECT_TRUE(Refused(AttachWith(coordinator.worker_address, huge),
                      grpc::StatusCode::INVALID_ARGUMENT, "over the limit of"));
  v1::WorkerHello long_text = good;
  long_text.set_description(std::string(8 << 20, 'x'));
  EXPECT_TRUE(Refused(AttachWith(coordinator.worker_address, long_text),
                      grpc::StatusCode::INVALID_ARGUMENT, "a worker's hello is 8"));
  EXPECT_TRUE(Refused(AttachWith(coordinator.worker_address, long_text),
                      grpc::StatusCode::INVALID_ARGUMENT, "bytes, over the limit of 4259840"));
  v1::WorkerHello deep = good;
  deep.set_config_json(std::string(1 << 20, '[') + std::string(1 << 20, ']'));
  EXPECT_TRUE(Refused(AttachWith(coordinator.worker_address, deep),
                      grpc::StatusCode::INVALID_ARGUMENT,
                      "the worker's config.json: JSON nested deeper than the limit of 32"));
  EXPECT_LT(testing::RssBytes(coordinator.process->pid()) - before, int64_t{128} << 20);

  // A real worker attaches after them and serves.
  const std::string dir = testing::TempDir("limits_worker");
  auto worker = testing::ChildProcess::Start(
      testing::BinPath("deltaserve") + " worker --coordinator " + coordinator.worker_address +
          " --model " + K3Tiny() + " --threads 1",
      dir + "/worker.log");
  const testing::Streamed served =
      testing::GenerateAll(*coordinator.stub, testing::TokensRequest({1, 2, 3, 4}, 8), 120);
  EXPECT_TRUE(served.status.ok()) << served.status.error_message() << worker->Log();
  EXPECT_EQ(served.ids.size(), 8u);
}

// A 190 MiB hello from a worker with the token is refused by the worker
// port's message limit (RESOURCE_EXHAUSTED) before it is parsed: the
// coordinator holds it once, not also as a parsed message (+383 MiB before
// the limit). gRPC 1.51 still takes a message whole before its size limit
// applies (its flow control grants a stream the window for the message it
// announced).
TEST(LimitsTest, AHugeHelloIsRefusedBeforeItIsHeldWhole) {
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny());
  ASSERT_NE(coordinator.stub, nullptr);
  auto config = LoadModelConfig(K3Tiny());
  ASSERT_TRUE(config.ok()) << config.status();
  v1::WorkerHello huge = MakeWorkerHello(*config, *WorldLayout::Make(1, 1, 1), "limits test");
  huge.set_description(std::string(190 << 20, 'x'));
  const int64_t before = testing::PeakRssBytes(coordinator.process->pid());
  ASSERT_GT(before, 0);
  const grpc::Status status = AttachWith(coordinator.worker_address, huge);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  const int64_t grew = testing::PeakRssBytes(coordinator.process->pid()) - before;
  // Under AddressSanitizer each byte held also has an eighth of a byte of
  // shadow memory.
  const int64_t held =
      kernels::kAddressSanitizer ? (int64_t{190} << 20) * 9 / 8 : int64_t{190} << 20;
  EXPECT_LT(grew, held + (int64_t{40} << 20)) << grew / (1 << 20) << " MiB";
  EXPECT_TRUE(testing::Status(*coordinator.stub).workers() == 0);
}

TEST(LimitsTest, AClientThatStopsReadingIsCancelledAndOthersAreServed) {
  auto server =
      testing::StartServer("serve --model " + K3Tiny() + " --threads 1 --client-write-timeout 2");
  ASSERT_NE(server.stub, nullptr);
  // A client that takes little before it stops granting flow-control
  // credit: the server's Write blocks soon after it stops reading.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  auto stalled_stub = v1::Generation::NewStub(
      grpc::CreateCustomChannel(server.address, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext stalled;
  // Long enough that it cannot finish before the server gives up on it.
  auto reader = stalled_stub->Generate(&stalled, testing::TokensRequest({1, 2, 3}, 1000000 - 3));
  ASSERT_TRUE(testing::WaitForStatus(
      *server.stub, [](const v1::ServerStatus& s) { return s.running_sequences() == 1; },
      std::chrono::seconds(60)));
  // Within the timeout plus a margin the sequence is gone, though the
  // client is still connected and has read nothing.
  EXPECT_TRUE(testing::WaitForStatus(
      *server.stub, [](const v1::ServerStatus& s) { return s.running_sequences() == 0; },
      std::chrono::seconds(60)))
      << server.process->Log();
  const testing::Streamed other =
      testing::GenerateAll(*server.stub, testing::TokensRequest({4, 5, 6}, 8), 60);
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(other.ids.size(), 8u);
  // The stalled client, reading at last, finds its stream cancelled.
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  const std::string log = server.process->Log();
  EXPECT_NE(log.find("did not read its stream for 2 s (--client-write-timeout)"), std::string::npos)
      << log;
}

}  // namespace
}  // namespace deltaserve
