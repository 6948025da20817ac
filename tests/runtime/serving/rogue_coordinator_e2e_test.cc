// A real `deltaserve worker` attached to a coordinator forged by this
// process, which refuses it with a reason full of terminal escapes and then
// neither ends the stream nor sends anything more: the worker exits, with
// the reason escaped (it once printed the raw bytes to its terminal).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "deltaserve/v1/worker.grpc.pb.h"
#include "tests/runtime/serving/serving_test_util.h"

namespace deltaserve {
namespace {

// Reads the hello, refuses it, then holds the stream until the worker
// cancels it (or the test ends).
class RogueCoordinator final : public v1::WorkerLink::Service {
 public:
  grpc::Status Attach(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    v1::WorkerMessage hello;
    if (!stream->Read(&hello) || !hello.has_hello()) return grpc::Status::OK;
    v1::CoordinatorMessage refusal;
    refusal.set_refused("go away\x1b[2J\x1b]0;owned\x07 now");
    stream->Write(refusal);
    attached_ = true;
    while (!context->IsCancelled() && !stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return grpc::Status::OK;
  }
  void Stop() { stop_ = true; }
  bool attached() const { return attached_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> attached_{false};
};

TEST(RogueCoordinatorTest, ARefusalEndsTheWorkerAtOnceWithItsReasonEscaped) {
  RogueCoordinator rogue;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&rogue);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  const std::string dir = testing::TempDir("rogue_coordinator");
  auto worker = testing::ChildProcess::Start(
      absl::StrCat(testing::BinPath("deltaserve"), " worker --coordinator 127.0.0.1:", port,
                   " --model ", testing::GoldenPath("model/k3-tiny"), " --threads 1"),
      dir + "/log");
  const std::optional<int> code = worker->Wait(std::chrono::seconds(60));
  rogue.Stop();
  ASSERT_TRUE(code.has_value()) << "the worker did not exit: " << worker->Log();
  EXPECT_TRUE(rogue.attached()) << worker->Log();
  EXPECT_NE(*code, 0) << worker->Log();
  const std::string log = worker->Log();
  EXPECT_NE(
      log.find(R"(the coordinator refused this worker: "go away\x1b[2J\x1b]0;owned\x07 now")"),
      std::string::npos)
      << log;
  EXPECT_EQ(log.find('\x1b'), std::string::npos) << "a raw escape byte in the log";
  EXPECT_EQ(log.find('\x07'), std::string::npos) << "a raw bell byte in the log";
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace
}  // namespace deltaserve
