// `deltaserve coordinator` with a worker job started by mpirun (two pipeline
// stages), as on a cluster: health follows the worker, tokens equal the
// single-process generate, a worker job killed mid-stream hands its streams
// back to the queue while the coordinator stays up, a new worker job
// continues them with the tokens they would have had, and a second worker is
// a second replica that takes over the streams of one that is lost.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/step_executor.h"
#include "runtime/model/model.h"
#include "tests/model_runs.h"
#include "tests/runtime/serving/serving_test_util.h"

namespace deltaserve {
namespace {

using testing::GenerateAll;
using testing::Streamed;
using testing::TokensRequest;

std::string K3Tiny() { return testing::GoldenPath("model/k3-tiny"); }

// Two ranks on two cores: one compute thread each; Open MPI ranks yield
// while they wait so the waiting stage does not starve the working one.
std::unique_ptr<testing::ChildProcess> StartWorker(const std::string& address,
                                                   const std::string& log) {
  return testing::ChildProcess::Start(
      "mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 2 " +
          testing::BinPath("deltaserve") + " worker --coordinator " + address + " --model " +
          K3Tiny() + " --pp 2 --threads 1",
      log);
}

TEST(WorkerJobTest, ServesThroughAnMpiWorkerAndSurvivesItsDeath) {
  // Small steps: the 3000-token prompt runs as a dozen or more chunks, which
  // the coordinator sends ahead through the two stages (more_coming).
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny() + " --step-tokens 256");
  ASSERT_NE(coordinator.stub, nullptr);
  // No worker yet: not serving, though the API answers.
  EXPECT_EQ(testing::Probe("health " + coordinator.address), "NOT_SERVING\n");
  EXPECT_FALSE(testing::Status(*coordinator.stub).worker_attached());

  const std::string dir = testing::TempDir("worker");
  auto worker = StartWorker(coordinator.worker_address, dir + "/worker1.log");
  ASSERT_TRUE(testing::WaitForHealth(coordinator.address, "SERVING")) << worker->Log();

  const std::vector<int32_t> prompt = testing::RandomTokens(3000, 21);
  std::string expected;
  ASSERT_EQ(testing::RunCommand(testing::BinPath("deltaserve") + " generate --model " + K3Tiny() +
                                    " --tokens " + absl::StrJoin(prompt, ",") +
                                    " --max-tokens 20 --ids 2>/dev/null",
                                &expected),
            0);
  const Streamed first = GenerateAll(*coordinator.stub, TokensRequest(prompt, 20));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  const std::string ids = absl::StrJoin(first.ids, " ");
  EXPECT_EQ(ids + "\n", expected);

  // Short requests next to the long prefill: the steps that carry their
  // decodes are sent ahead too (a sequence being sampled sits out the next
  // step), and each still gets the tokens it gets alone.
  {
    std::vector<std::vector<int32_t>> shorts;
    std::vector<Streamed> alone(4), together(4);
    for (int i = 0; i < 4; ++i) {
      shorts.push_back(testing::RandomTokens(3 + i, 40 + i));
      alone[i] = GenerateAll(*coordinator.stub, TokensRequest(shorts[i], 12));
      ASSERT_TRUE(alone[i].status.ok());
    }
    Streamed long_again;
    std::thread long_thread(
        [&] { long_again = GenerateAll(*coordinator.stub, TokensRequest(prompt, 20)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back(
          [&, i] { together[i] = GenerateAll(*coordinator.stub, TokensRequest(shorts[i], 12)); });
    }
    for (auto& t : threads) t.join();
    long_thread.join();
    ASSERT_TRUE(long_again.status.ok());
    EXPECT_EQ(long_again.ids, first.ids);
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(together[i].status.ok());
      EXPECT_EQ(together[i].ids, alone[i].ids) << "short request " << i;
    }
  }

  // Scoring a document runs through the stages in pipelined chunks too.
  {
    const std::vector<int32_t> document = testing::RandomTokens(900, 31);
    v1::ScoreRequest req;
    req.mutable_tokens()->mutable_ids()->Add(document.begin(), document.end());
    grpc::ClientContext context;
    v1::ScoreResponse scored;
    ASSERT_TRUE(coordinator.stub->Score(&context, req, &scored).ok());
    ASSERT_EQ(scored.logprobs_size(), 899);
    auto model = Model::Load(K3Tiny());
    ASSERT_TRUE(model.ok());
    const std::vector<float> all = testing::OneShotLogits(**model, document);
    ASSERT_FALSE(all.empty());
    const std::vector<float>* logits = &all;
    const int64_t V = (*model)->config().vocab_size;
    std::vector<double> expected;
    std::vector<float> got(scored.logprobs().begin(), scored.logprobs().end());
    for (int i = 0; i < 899; ++i) {
      expected.push_back(testing::LogSoftmax(logits->data() + i * V, V)[document[i + 1]]);
    }
    // Pieces and stages reorder float32 sums; k3-tiny amplifies that most
    // (docs/numerics.md): the bound of the invariance tests.
    EXPECT_LE(testing::RelL2(got, expected), 5e-5);
  }

  // Kill the whole worker job while a seeded stream is running: the stream
  // waits in the queue, with a new request behind it.
  const Streamed whole = GenerateAll(*coordinator.stub, testing::SeededRequest({1, 2, 3}, 2000));
  ASSERT_TRUE(whole.status.ok());
  grpc::ClientContext context;
  auto reader = coordinator.stub->Generate(&context, testing::SeededRequest({1, 2, 3}, 2000));
  v1::GenerateResponse response;
  std::vector<int32_t> streamed;
  ASSERT_TRUE(reader->Read(&response));
  for (const auto& t : response.tokens()) streamed.push_back(t.id());
  worker->Signal(SIGKILL);
  worker->Wait(std::chrono::seconds(10));

  // The coordinator is up, not serving, and keeps both requests queued.
  EXPECT_TRUE(testing::WaitForHealth(coordinator.address, "NOT_SERVING"));
  Streamed queued;
  std::thread waiting([&] { queued = GenerateAll(*coordinator.stub, TokensRequest(prompt, 20)); });
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& st) { return st.waiting_requests() == 2; },
      std::chrono::seconds(5)))
      << coordinator.process->Log();
  v1::ServerStatus s = testing::Status(*coordinator.stub);
  EXPECT_FALSE(s.worker_attached());
  EXPECT_EQ(s.running_sequences(), 0);

  // A new worker job attaches: the stream continues where it was, without a
  // repeated token, and the queued request runs, and new ones too.
  auto second = StartWorker(coordinator.worker_address, dir + "/worker2.log");
  while (reader->Read(&response)) {
    for (const auto& t : response.tokens()) streamed.push_back(t.id());
  }
  const grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message() << second->Log();
  EXPECT_EQ(streamed, whole.ids);
  waiting.join();
  ASSERT_TRUE(queued.status.ok()) << queued.status.error_message() << second->Log();
  EXPECT_EQ(queued.ids, first.ids);
  EXPECT_EQ(testing::Probe("health " + coordinator.address), "SERVING\n");
  const Streamed again = GenerateAll(*coordinator.stub, TokensRequest(prompt, 20));
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.ids, first.ids);

  // A second worker job (one process) is a second replica: requests spread
  // over both, and the streams of one that is lost move to the other.
  auto replica = testing::ChildProcess::Start(
      testing::BinPath("deltaserve") + " worker --threads 1 --coordinator " +
          coordinator.worker_address + " --model " + K3Tiny(),
      dir + "/replica.log");
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& st) { return st.workers() == 2; },
      std::chrono::seconds(30)))
      << replica->Log();
  constexpr int kStreams = 8;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>> streams;
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    v1::GenerateRequest req = TokensRequest({i + 1, 2, 3}, 1000000);
    req.set_request_id("stream-" + std::to_string(i));
    streams.push_back(coordinator.stub->Generate(contexts.back().get(), req));
    ASSERT_TRUE(streams.back()->Read(&response));
  }
  replica->Signal(SIGKILL);
  replica->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& st) { return st.workers() == 1; },
      std::chrono::seconds(10)));
  // Every stream is still running, on the surviving replica, to abort.
  int running = 0;
  for (int i = 0; i < kStreams; ++i) {
    grpc::ClientContext context;
    v1::AbortRequest abort;
    abort.set_request_id("stream-" + std::to_string(i));
    v1::AbortResponse reply;
    ASSERT_TRUE(coordinator.stub->Abort(&context, abort, &reply).ok());
    running += reply.found();
  }
  int aborted = 0;
  for (int i = 0; i < kStreams; ++i) {
    while (streams[i]->Read(&response)) {
    }
    aborted += streams[i]->Finish().error_code() == grpc::StatusCode::CANCELLED;
  }
  EXPECT_EQ(running, kStreams) << coordinator.process->Log();
  EXPECT_EQ(aborted, kStreams);
  // New requests went to the least loaded replica: half were on the lost one.
  EXPECT_NE(coordinator.process->Log().find(absl::StrCat(kStreams / 2, " requests of worker")),
            std::string::npos)
      << coordinator.process->Log();
  const Streamed after = GenerateAll(*coordinator.stub, TokensRequest(prompt, 20));
  ASSERT_TRUE(after.status.ok());
  EXPECT_EQ(after.ids, first.ids);

  // A worker with another model is refused, naming the mismatch.
  std::string output;
  EXPECT_NE(testing::RunCommand(testing::BinPath("deltaserve") + " worker --coordinator " +
                                    coordinator.worker_address + " --model " +
                                    testing::GoldenPath("model/kimi-linear-tiny"),
                                &output),
            0);
  EXPECT_NE(output.find("not the coordinator's"), std::string::npos) << output;
}

// Decoding on a worker behind a link goes ahead of its results (the worker
// feeds each sampled token into the step sent before it came back): eight
// clients at once on two stages, greedy and sampled, ending by length and by
// stop tokens (one step sent ahead samples a token that is dropped), each get
// the tokens `serve`, whose worker answers every step at once, gives them alone.
TEST(WorkerJobTest, ConcurrentClientsDecodingAheadOnTwoStagesGetTheirOwnTokens) {
  struct Job {
    v1::GenerateRequest request;
    Streamed alone, together;
  };
  std::vector<Job> jobs(8);
  for (size_t i = 0; i < jobs.size(); ++i) {
    v1::GenerateRequest& r = jobs[i].request;
    r = TokensRequest(testing::RandomTokens(5 + 40 * i, 300 + i), 6 + 3 * static_cast<int>(i));
    if (i % 2 == 1) {
      r.mutable_sampling()->set_temperature(0.9f);
      r.mutable_sampling()->set_seed(17 + i);
    }
  }
  {
    auto serve = testing::StartServer("serve --model " + K3Tiny() + " --threads 1");
    for (Job& job : jobs) {
      job.alone = GenerateAll(*serve.stub, job.request);
      ASSERT_TRUE(job.alone.status.ok()) << job.alone.status.error_message();
    }
  }
  // Stop tokens: the 4th token of three of them (ending there), from the
  // run alone.
  for (size_t i : {0, 3, 6}) {
    Job& job = jobs[i];
    ASSERT_GT(job.alone.ids.size(), 4u);
    const int32_t stop = job.alone.ids[3];
    job.request.add_stop_token_ids(stop);
    const auto end = std::find(job.alone.ids.begin(), job.alone.ids.end(), stop);
    job.alone.ids.erase(end + 1, job.alone.ids.end());
  }
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny());
  const std::string dir = testing::TempDir("decode_ahead");
  auto worker = StartWorker(coordinator.worker_address, dir + "/worker.log");
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 1; },
      std::chrono::seconds(60)))
      << worker->Log();
  std::vector<std::thread> threads;
  for (Job& job : jobs) {
    threads.emplace_back([&] { job.together = GenerateAll(*coordinator.stub, job.request); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE(jobs[i].together.status.ok())
        << i << ": " << jobs[i].together.status.error_message();
    EXPECT_EQ(jobs[i].together.ids, jobs[i].alone.ids) << "request " << i;
  }
  // Every sequence's state is released, the dropped tokens' too: the
  // replica holds only the prefix cache's entries.
  EXPECT_TRUE(testing::WaitForStatus(
      *coordinator.stub,
      [](const v1::ServerStatus& s) {
        return s.running_sequences() == 0 && s.worker_status_size() == 1 &&
               s.worker_status(0).held_slots() == s.prefix_cache().entries() &&
               (s.kda_state_bytes() > 0) == (s.prefix_cache().entries() > 0);
      },
      std::chrono::seconds(10)))
      << testing::Status(*coordinator.stub).DebugString();
  worker->Signal(SIGTERM);
  worker->Wait(std::chrono::seconds(20));
}

}  // namespace
}  // namespace deltaserve

namespace deltaserve {
namespace {

// Tensor parallelism behind the coordinator: a 2-rank TP worker and a
// 2-stage x 2-rank TP worker give the single process's greedy tokens
// (kimi-linear-tiny, whose TP logits are within 1.6e-6 of one process:
// docs/numerics.md), prefill pipelined in chunks included.
TEST(WorkerJobTest, TensorAndPipelineParallelWorkersGiveGenerateTokens) {
  const std::string model = testing::GoldenPath("model/kimi-linear-tiny");
  auto coordinator =
      testing::StartServer("coordinator --model " + model + " --step-tokens 128 --http-port 0");
  const std::vector<int32_t> prompt = testing::RandomTokens(1000, 61);
  std::string expected;
  ASSERT_EQ(testing::RunCommand(testing::BinPath("deltaserve") + " generate --model " + model +
                                    " --tokens " + absl::StrJoin(prompt, ",") +
                                    " --max-tokens 16 --ids 2>/dev/null",
                                &expected),
            0);
  const std::string dir = testing::TempDir("tp_worker");
  for (const auto& [ranks, pp, tp] : {std::tuple{2, 1, 2}, std::tuple{4, 2, 2}}) {
    SCOPED_TRACE(::testing::Message() << "pp " << pp << " tp " << tp);
    auto worker = testing::ChildProcess::Start(
        "mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np " +
            std::to_string(ranks) + " " + testing::BinPath("deltaserve") +
            " worker --coordinator " + coordinator.worker_address + " --model " + model + " --pp " +
            std::to_string(pp) + " --tp " + std::to_string(tp) + " --threads 1",
        dir + "/worker" + std::to_string(ranks) + ".log");
    ASSERT_TRUE(testing::WaitForStatus(
        *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 1; },
        std::chrono::seconds(60)))
        << worker->Log();
    const Streamed streamed = GenerateAll(*coordinator.stub, TokensRequest(prompt, 16));
    ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
    const std::string ids = absl::StrJoin(streamed.ids, " ");
    EXPECT_EQ(ids + "\n", expected);
    if (pp == 2) {
      // The OpenAI client through the coordinator's HTTP API, streamed and
      // not, gets the same tokens.
      std::string output;
      ASSERT_EQ(testing::RunCommand(
                    absl::StrCat("PYTHONPATH=", DELTASERVE_PYTHON_DEPS, " ", testing::kSystemPython,
                                 " ", DELTASERVE_SOURCE_DIR,
                                 "/tests/runtime/serving/openai_client_check.py http://127.0.0.1:",
                                 coordinator.http_port, "/v1 none kimi-linear-tiny ",
                                 absl::StrJoin(prompt, ","), " 16 2>&1"),
                    &output),
                0)
          << output;
      const nlohmann::json r = nlohmann::json::parse(output, nullptr, false);
      ASSERT_FALSE(r.is_discarded()) << output;
      for (const char* name : {"greedy", "greedy_stream"}) {
        EXPECT_EQ(absl::StrJoin(r[name]["ids"].get<std::vector<int32_t>>(), " ") + "\n", expected)
            << name;
      }
    }
    worker->Signal(SIGTERM);
    worker->Wait(std::chrono::seconds(20));
    ASSERT_TRUE(testing::WaitForStatus(
        *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 0; },
        std::chrono::seconds(20)));
  }
}

}  // namespace
}  // namespace deltaserve
