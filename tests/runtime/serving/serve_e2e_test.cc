// `deltaserve serve` end to end: a real server process on loopback, real
// clients (the C++ stub, `deltaserve client`, the Python example).
#include <signal.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "kernels/scratch.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/step_executor.h"
#include "runtime/model/model.h"
#include "runtime/model/presets.h"
#include "runtime/model/random_checkpoint.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/model_runs.h"
#include "tests/runtime/serving/serving_test_util.h"

namespace deltaserve {
namespace {

using testing::GenerateAll;
using testing::Streamed;
using testing::TokensRequest;

std::string Deltaserve(const std::string& args, int* code = nullptr) {
  std::string output;
  const int rc = testing::RunCommand(testing::BinPath("deltaserve") + " " + args, &output);
  if (code != nullptr) *code = rc;
  return output;
}

// The first line of a command's output.
std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

class ServeTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string ModelDir() const { return testing::GoldenPath("model/" + GetParam()); }
};

TEST_P(ServeTest, GreedyGenerateEqualsTheGenerateCommandFromEveryClient) {
  auto server = testing::StartServer("serve --model " + ModelDir());
  ASSERT_NE(server.stub, nullptr);
  const std::vector<int32_t> prompt = testing::RandomTokens(37, 3);
  for (const auto& [sampling, seed] :
       {std::pair<std::string, int>{"", 0}, {" --temperature 0.8 --top-k 40 --top-p 0.9", 11}}) {
    const std::string rest =
        " --max-tokens 24 --ids" + sampling + (seed ? " --seed " + std::to_string(seed) : "");
    const std::string flags = " --tokens " + absl::StrJoin(prompt, ",") + rest;
    int code = 0;
    const std::string expected =
        FirstLine(Deltaserve("generate --model " + ModelDir() + flags + " 2>/dev/null", &code));
    ASSERT_EQ(code, 0);
    ASSERT_FALSE(expected.empty());

    // The C++ stub.
    v1::GenerateRequest req = TokensRequest(prompt, 24);
    if (seed) {
      req.mutable_sampling()->set_temperature(0.8f);
      req.mutable_sampling()->set_top_k(40);
      req.mutable_sampling()->set_top_p(0.9f);
      req.mutable_sampling()->set_seed(seed);
    }
    const Streamed streamed = GenerateAll(*server.stub, req);
    ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
    const std::string ids = absl::StrJoin(streamed.ids, " ");
    EXPECT_EQ(ids, expected) << sampling;
    EXPECT_EQ(streamed.completion.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(streamed.completion.usage().prompt_tokens(), 37);
    EXPECT_EQ(streamed.completion.usage().completion_tokens(), 24);
    EXPECT_GT(streamed.completion.timings().total_s(), 0);

    // deltaserve client.
    EXPECT_EQ(FirstLine(Deltaserve("client generate --server " + server.address + flags +
                                   " 2>/dev/null")),
              expected);
    // The same prompt from a file (spaces and newlines between the ids).
    const std::string file = testing::TempDir("client_tokens") + "/prompt.txt";
    std::ofstream(file) << absl::StrJoin(prompt, " ") << "\n";
    EXPECT_EQ(FirstLine(Deltaserve("client generate --server " + server.address +
                                   " --tokens-file " + file + rest + " 2>/dev/null")),
              expected);
    // The Python example, with Debian's python3-grpcio.
    std::string output;
    testing::RunCommand(std::string(testing::kSystemPython) + " " + DELTASERVE_SOURCE_DIR +
                            "/examples/python/deltaserve_client.py --stubs " +
                            DELTASERVE_PYTHON_DIR + " generate --server " + server.address + flags +
                            " 2>/dev/null",
                        &output);
    EXPECT_EQ(FirstLine(output), expected) << sampling;
    testing::RunCommand(std::string(testing::kSystemPython) + " " + DELTASERVE_SOURCE_DIR +
                            "/examples/python/deltaserve_client.py --stubs " +
                            DELTASERVE_PYTHON_DIR + " generate --server " + server.address +
                            " --tokens-file " + file + rest + " 2>/dev/null",
                        &output);
    EXPECT_EQ(FirstLine(output), expected) << sampling;
  }
}

TEST_P(ServeTest, ScoreGivesTheModelsLogProbs) {
  auto server = testing::StartServer("serve --model " + ModelDir());
  const std::vector<int32_t> tokens = testing::RandomTokens(300, 8);
  v1::ScoreRequest req;
  req.mutable_tokens()->mutable_ids()->Add(tokens.begin(), tokens.end());
  grpc::ClientContext context;
  v1::ScoreResponse response;
  ASSERT_TRUE(server.stub->Score(&context, req, &response).ok());
  ASSERT_EQ(response.logprobs_size(), 299);

  auto model = Model::Load(ModelDir());
  ASSERT_TRUE(model.ok());
  const std::vector<float> all = testing::OneShotLogits(**model, tokens);
  ASSERT_FALSE(all.empty());
  const std::vector<float>* logits = &all;
  const int64_t V = (*model)->config().vocab_size;
  double total = 0;
  for (int i = 0; i < 299; ++i) {
    const double expected = testing::LogSoftmax(logits->data() + i * V, V)[tokens[i + 1]];
    EXPECT_NEAR(response.logprobs(i), expected, 1e-4 * (1 + std::abs(expected))) << i;
    total += expected;
  }
  EXPECT_NEAR(response.total_logprob(), total, 1e-3 * std::abs(total));

  // A request without an id gets one the server made: 128 random bits, a
  // fresh one each time (a client must not guess another's, which Abort takes).
  const std::regex made("req-[0-9a-f]{32}");
  EXPECT_TRUE(std::regex_match(response.request_id(), made)) << response.request_id();
  grpc::ClientContext again_context;
  v1::ScoreResponse again;
  ASSERT_TRUE(server.stub->Score(&again_context, req, &again).ok());
  EXPECT_TRUE(std::regex_match(again.request_id(), made)) << again.request_id();
  EXPECT_NE(again.request_id(), response.request_id());
}

INSTANTIATE_TEST_SUITE_P(Golden, ServeTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);

std::string K3Tiny() { return testing::GoldenPath("model/k3-tiny"); }

// 32 streams at once, one with a 20,000-token prompt: every one gets the
// tokens it gets alone, and short requests keep decoding while the long
// prompt is still being prefilled. Under AddressSanitizer the long prompt is
// 8,000 tokens (20,000 took 239 s there, 16 s here); the 31 short ones
// 4,883 prompt tokens and their decoding still take most of its prefill.
TEST(ServeLoadTest, ConcurrentMixedRequestsEachGetTheirOwnTokens) {
  // One compute thread: the 32 client threads share the two cores with it.
  // No prefix cache: each prompt runs twice, and the second run must prefill
  // the long prompt again as the first did.
  auto server = testing::StartServer("serve --model " + K3Tiny() +
                                     " --step-tokens 256 --threads 1 --prefix-cache-bytes 0");
  struct Job {
    std::vector<int32_t> prompt;
    int max_tokens;
    Streamed alone, together;
  };
  std::vector<Job> jobs;
  const int64_t long_prompt = kernels::kAddressSanitizer ? 8000 : 20000;
  jobs.push_back({testing::RandomTokens(long_prompt, 100), 8, {}, {}});
  for (int i = 1; i < 32; ++i) {
    jobs.push_back({testing::RandomTokens(1 + (i * 37) % 300, 100 + i), 8 + i % 9, {}, {}});
  }
  for (Job& job : jobs) {
    job.alone = GenerateAll(*server.stub, TokensRequest(job.prompt, job.max_tokens));
    ASSERT_TRUE(job.alone.status.ok()) << job.alone.status.error_message();
  }
  // The long one first, then the rest while it prefills.
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < jobs.size(); ++i) {
    threads.emplace_back([&, i] {
      jobs[i].together =
          GenerateAll(*server.stub, TokensRequest(jobs[i].prompt, jobs[i].max_tokens));
    });
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& t : threads) t.join();
  int finished_during_prefill = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    ASSERT_TRUE(job.together.status.ok()) << i << ": " << job.together.status.error_message();
    EXPECT_EQ(job.together.ids, job.alone.ids) << "request " << i;
    if (i > 0 && job.together.end < jobs[0].together.first_token) ++finished_during_prefill;
  }
  const double long_ttft =
      std::chrono::duration<double>(jobs[0].together.first_token - start).count();
  EXPECT_GE(finished_during_prefill, 25)
      << "of 31 short requests only " << finished_during_prefill
      << " finished before the long prompt's first token (" << long_ttft << " s)";
}

TEST(ServeStepLogTest, EachStepIsALineWithItsChunksDecodeRowsAndTimes) {
  const std::string log = testing::TempDir("step_log") + "/steps.jsonl";
  auto server = testing::StartServer("serve --model " + K3Tiny() +
                                     " --step-tokens 128 --threads 1 --step-log " + log);
  const std::vector<int32_t> prompt = testing::RandomTokens(1000, 100);
  const Streamed out = GenerateAll(*server.stub, TokensRequest(prompt, 5));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.ids.size(), 5u);
  // Every step is in the file once its result is in, before the last token.
  std::ifstream in(log);
  std::string line;
  const std::regex piece("\\{\"tokens\":(\\d+),\"prefix\":(\\d+)\\}");
  const std::regex rest(
      "\"decode_rows\":(\\d+),\"wall_s\":([0-9.e-]+),\"stage_compute_s\":\\[([0-9.e-]+)\\]\\}$");
  int64_t fed = 0, decode_rows = 0, steps = 0;
  while (std::getline(in, line)) {
    SCOPED_TRACE(line);
    ++steps;
    for (auto it = std::sregex_iterator(line.begin(), line.end(), piece);
         it != std::sregex_iterator(); ++it) {
      EXPECT_EQ(std::stoll((*it)[2]), fed);  // chunks in prompt order, each after the last
      const int64_t tokens = std::stoll((*it)[1]);
      EXPECT_GT(tokens, 0);
      EXPECT_LE(tokens, 128);
      fed += tokens;
    }
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, rest));
    decode_rows += std::stoll(m[1]);
    EXPECT_GT(std::stod(m[2]), 0.0);
    EXPECT_GE(std::stod(m[3]), 0.0);
  }
  EXPECT_EQ(fed, 1000);
  EXPECT_EQ(decode_rows, 4);  // the first token comes from the prompt's last chunk
  EXPECT_GE(steps, 1000 / 128 + 1 + 4);
}

// --log-format json: every line of the server's log is a JSON object with
// its time, level and part, and each request ends with a line of its own
// that says who sent it, its tokens, times, finish and worker. The default
// text form leads each line with the same time and level.
TEST(ServeLogTest, JsonLinesWithTimeLevelAndOneLinePerRequest) {
  auto server = testing::StartServer("serve --model " + K3Tiny() + " --log-format json");
  v1::GenerateRequest req = TokensRequest(testing::RandomTokens(20, 7), 6);
  req.set_request_id("log\n\"me\"");
  const Streamed out = GenerateAll(*server.stub, req);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  // A million tokens and a deadline of half a second: it fails mid-way (a
  // few thousand take under a second on a fast machine).
  v1::GenerateRequest late_request = TokensRequest({1, 2, 3}, 1000000);
  late_request.set_request_id("too-late");
  late_request.set_ignore_eos(true);
  EXPECT_FALSE(GenerateAll(*server.stub, late_request, 0.5).status.ok());
  server.process->Signal(SIGTERM);
  ASSERT_EQ(server.process->Wait(std::chrono::seconds(60)), 0) << server.process->Log();

  std::istringstream log(server.process->Log());
  std::string line;
  const std::regex time("^\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z$");
  int lines = 0;
  std::vector<nlohmann::json> ended;
  while (std::getline(log, line)) {
    SCOPED_TRACE(line);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object());
    ++lines;
    EXPECT_TRUE(std::regex_match(j.value("time", ""), time));
    EXPECT_TRUE(j["level"] == "info" || j["level"] == "warning" || j["level"] == "error");
    EXPECT_TRUE(j["component"].is_string());
    EXPECT_TRUE(j["message"].is_string());
    if (j["message"] == "request finished" || j["message"] == "request failed") ended.push_back(j);
  }
  EXPECT_GE(lines, 3);  // listening, shutting down, stopped, the requests
  ASSERT_EQ(ended.size(), 2u) << server.process->Log();
  const nlohmann::json& done = ended[0];
  EXPECT_EQ(done["request"], "log\n\"me\"");
  EXPECT_EQ(done["principal"], "");
  EXPECT_EQ(done["kind"], "generate");
  EXPECT_EQ(done["prompt_tokens"], 20);
  EXPECT_EQ(done["generated_tokens"], 6);
  EXPECT_EQ(done["finish_reason"], "length");
  EXPECT_EQ(done["status"], "OK");
  EXPECT_GE(done["worker"].get<int64_t>(), 1);
  EXPECT_GT(done["time_to_first_token_s"].get<double>(), 0.0);
  EXPECT_GE(done["total_s"].get<double>(), done["time_to_first_token_s"].get<double>());
  const nlohmann::json& late = ended[1];
  EXPECT_EQ(late["level"], "warning");
  EXPECT_EQ(late["request"], "too-late");
  EXPECT_EQ(late["finish_reason"], "error");
  EXPECT_TRUE(late["status"] == "DEADLINE_EXCEEDED" || late["status"] == "CANCELLED");
  EXPECT_LT(late["generated_tokens"].get<int64_t>(), 1000000);

  auto text = testing::StartServer("serve --model " + K3Tiny());
  const std::regex any_line(
      "\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z (info|warning|error) [a-z]+: .*");
  const std::regex listening(
      "\\S+ info serve: listening on port \\d+ port=\\d+ worker_port=-1 metrics_port=-1 "
      "http_port=-1");
  std::istringstream text_log(text.process->Log());
  int listened = 0;
  while (std::getline(text_log, line)) {
    EXPECT_TRUE(std::regex_match(line, any_line)) << line;
    listened += std::regex_match(line, listening);
  }
  EXPECT_EQ(listened, 1) << text.process->Log();
  int code = 0;
  const std::string bad =
      Deltaserve("serve --model " + K3Tiny() + " --log-format yaml 2>&1", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(bad.find("--log-format: log format \"yaml\": use text or json"), std::string::npos)
      << bad;
}

TEST(ServeErrorsTest, BadRequestsAreRefusedNamingTheFieldAndServingGoesOn) {
  auto server = testing::StartServer("serve --model " + K3Tiny() + " --max-request-bytes 100000");
  auto expect_invalid = [&](const v1::GenerateRequest& req, const std::string& field) {
    const Streamed s = GenerateAll(*server.stub, req);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_NE(s.status.error_message().find(field), std::string::npos)
        << "'" << s.status.error_message() << "' does not name " << field;
    // And the server still serves.
    const Streamed ok = GenerateAll(*server.stub, TokensRequest({1, 2, 3}, 2));
    EXPECT_TRUE(ok.status.ok()) << "after " << field << ": " << ok.status.error_message();
  };
  expect_invalid(TokensRequest({1, 256, 3}, 4), "prompt[1]");
  expect_invalid(TokensRequest({-5}, 4), "prompt[0]");
  expect_invalid(TokensRequest({}, 4), "prompt");
  v1::GenerateRequest empty_text;
  empty_text.set_text("");
  expect_invalid(empty_text, "prompt");
  v1::GenerateRequest big_text;
  big_text.set_text(std::string(200000, 'a'));
  expect_invalid(big_text, "prompt");
  // Longer than the context (k3-tiny: 1,048,576 positions); the limit on
  // request bytes is the default here, so the context is what refuses it.
  {
    auto wide = testing::StartServer("serve --model " + K3Tiny());
    std::vector<int32_t> huge(1048577, 7);
    const Streamed s = GenerateAll(*wide.stub, TokensRequest(huge, 1));
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.status.error_message().find("context"), std::string::npos)
        << s.status.error_message();
  }
  v1::GenerateRequest req = TokensRequest({1, 2}, 4);
  req.mutable_sampling()->set_temperature(-1);
  expect_invalid(req, "temperature");
  req = TokensRequest({1, 2}, 4);
  req.mutable_sampling()->set_temperature(NAN);
  expect_invalid(req, "temperature");
  req = TokensRequest({1, 2}, 4);
  req.mutable_sampling()->set_top_p(1.5f);
  expect_invalid(req, "top_p");
  req = TokensRequest({1, 2}, 4);
  req.mutable_sampling()->set_top_k(-1);
  expect_invalid(req, "top_k");
  expect_invalid(TokensRequest({1, 2}, -3), "max_tokens");
  req = TokensRequest({1, 2}, 4);
  req.set_top_logprobs(21);
  expect_invalid(req, "top_logprobs");
  req = TokensRequest({1, 2}, 4);
  req.add_stop_token_ids(9999);
  expect_invalid(req, "stop_token_ids[0]");
  req = TokensRequest({1, 2}, 4);
  req.add_stop("");
  expect_invalid(req, "stop[0]");
  req = TokensRequest({1, 2}, 4);
  req.set_request_id(std::string(200, 'r'));
  expect_invalid(req, "request_id");
}

TEST(ServeLimitsTest, OverloadAnswersResourceExhaustedAndCancellationFreesState) {
  auto server = testing::StartServer("serve --model " + K3Tiny() +
                                     " --max-running 1 --max-waiting 1 --metrics-port 0");
  // One long generation runs, one waits; a third does not fit.
  auto start_long = [&](const std::string& id, grpc::ClientContext* context) {
    v1::GenerateRequest req = TokensRequest({1, 2, 3, 4}, 1000000);
    req.set_request_id(id);
    return server.stub->Generate(context, req);
  };
  grpc::ClientContext running_ctx, waiting_ctx;
  auto running = start_long("running", &running_ctx);
  v1::GenerateResponse response;
  ASSERT_TRUE(running->Read(&response));  // it has started
  auto waiting = start_long("waiting", &waiting_ctx);
  ASSERT_TRUE(testing::WaitForStatus(
      *server.stub, [](const v1::ServerStatus& s) { return s.waiting_requests() == 1; },
      std::chrono::seconds(5)));
  const Streamed refused = GenerateAll(*server.stub, TokensRequest({1}, 1));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.status.error_message();

  v1::ServerStatus status = testing::Status(*server.stub);
  EXPECT_EQ(status.running_sequences(), 1);
  EXPECT_GT(status.kda_state_bytes(), 0);
  EXPECT_GT(status.mla_cache_bytes(), 0);
  // The running one reserved its whole length's MLA cache pages up front:
  // 4 + 1,000,000 tokens in pages of 64.
  ASSERT_EQ(status.worker_status_size(), 1);
  EXPECT_GT(status.worker_status(0).cache_pages(), 15626);
  EXPECT_EQ(status.worker_status(0).reserved_pages(), 15626);
  // Its KDA state takes one of the worker's slots (the default 256).
  EXPECT_EQ(status.worker_status(0).state_slots(), 256);
  EXPECT_EQ(status.worker_status(0).held_slots(), 1);

  // Abort by id ends the waiting one; cancelling the stream ends the other.
  {
    grpc::ClientContext context;
    v1::AbortRequest abort;
    abort.set_request_id("waiting");
    v1::AbortResponse reply;
    ASSERT_TRUE(server.stub->Abort(&context, abort, &reply).ok());
    EXPECT_TRUE(reply.found());
  }
  while (waiting->Read(&response)) {
  }
  EXPECT_EQ(waiting->Finish().error_code(), grpc::StatusCode::CANCELLED);
  running_ctx.TryCancel();
  while (running->Read(&response)) {
  }
  EXPECT_EQ(running->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(testing::WaitForStatus(
      *server.stub,
      [](const v1::ServerStatus& s) {
        return s.running_sequences() == 0 && s.waiting_requests() == 0 &&
               s.kda_state_bytes() == 0 && s.mla_cache_bytes() == 0 &&
               s.worker_status_size() == 1 && s.worker_status(0).reserved_pages() == 0 &&
               s.worker_status(0).held_slots() == 0;
      },
      std::chrono::seconds(3)))
      << testing::Status(*server.stub).DebugString();
  const std::string metrics = testing::HttpGet(server.metrics_port, "/metrics");
  EXPECT_NE(metrics.find("deltaserve_kda_state_bytes 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("deltaserve_mla_cache_bytes 0\n"), std::string::npos);
  EXPECT_NE(metrics.find("deltaserve_requests_failed_total 2\n"), std::string::npos);
  EXPECT_NE(metrics.find("deltaserve_requests_rejected_total 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("deltaserve_time_to_first_token_seconds_bucket{le=\"3600\"}"),
            std::string::npos);

  // A deadline ends a request the same way.
  const Streamed late = GenerateAll(*server.stub, TokensRequest({5, 6}, 1000000), 0.3);
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(testing::WaitForStatus(
      *server.stub,
      [](const v1::ServerStatus& s) {
        return s.running_sequences() == 0 && s.kda_state_bytes() == 0;
      },
      std::chrono::seconds(3)));
  // Aborting what does not exist says so; the server goes on.
  grpc::ClientContext context;
  v1::AbortRequest abort;
  abort.set_request_id("nobody");
  v1::AbortResponse reply;
  ASSERT_TRUE(server.stub->Abort(&context, abort, &reply).ok());
  EXPECT_FALSE(reply.found());
  EXPECT_TRUE(GenerateAll(*server.stub, TokensRequest({1, 2}, 3)).status.ok());
}

// Reflection streams need no credentials, so they must cost the server no
// thread while they last, be bounded in number, and end when idle: 400
// streams that send nothing, on two connections, leave the thread count
// flat and authenticated calls served; the 144 past the cap of 256 are
// refused at once, and the rest are cancelled after their 10 s of idleness,
// after which reflection answers again.
TEST(ServeApiTest, IdleReflectionStreamsHoldNoThreadsAndEnd) {
  namespace refl = grpc::reflection::v1;
  auto server = testing::StartServer("serve --model " + K3Tiny());
  ASSERT_TRUE(testing::WaitForStatus(
      *server.stub, [](const v1::ServerStatus& s) { return s.worker_attached(); },
      std::chrono::seconds(10)));
  const pid_t pid = server.process->pid();
  const int64_t threads_before = testing::ProcStatus(pid, "Threads");
  constexpr int kChannels = 2, kPerChannel = 200, kCap = 256;
  grpc::CompletionQueue cq;
  struct Held {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientAsyncReaderWriter<refl::ServerReflectionRequest,
                                                  refl::ServerReflectionResponse>>
        stream;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<refl::ServerReflection::Stub>> stubs;
  std::vector<std::unique_ptr<Held>> held;
  for (int c = 0; c < kChannels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("deltaserve.test.channel", c);  // a connection of its own
    stubs.push_back(refl::ServerReflection::NewStub(
        grpc::CreateCustomChannel(server.address, grpc::InsecureChannelCredentials(), args)));
    for (int i = 0; i < kPerChannel; ++i) {
      auto h = std::make_unique<Held>();
      // Tags: 2i the start, 2i + 1 the finish.
      const intptr_t index = static_cast<intptr_t>(held.size());
      h->stream = stubs.back()->AsyncServerReflectionInfo(&h->context, &cq,
                                                          reinterpret_cast<void*>(2 * index));
      h->stream->Finish(&h->status, reinterpret_cast<void*>(2 * index + 1));
      held.push_back(std::move(h));
    }
  }
  // Counts the streams that finished, by their code, until `until` or all
  // have.
  std::map<grpc::StatusCode, int> finished;
  int total_finished = 0;
  auto collect = [&](std::chrono::steady_clock::time_point until, int want) {
    void* tag = nullptr;
    bool ok = false;
    while (total_finished < want &&
           cq.AsyncNext(&tag, &ok,
                        std::chrono::system_clock::now() +
                            std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                until - std::chrono::steady_clock::now())) ==
               grpc::CompletionQueue::GOT_EVENT) {
      const intptr_t t = reinterpret_cast<intptr_t>(tag);
      if (t % 2 == 1) {
        ++finished[held[t / 2]->status.error_code()];
        ++total_finished;
      }
    }
  };
  const auto opened = std::chrono::steady_clock::now();
  collect(opened + std::chrono::seconds(5), kChannels * kPerChannel - kCap);
  EXPECT_EQ(finished[grpc::StatusCode::RESOURCE_EXHAUSTED], kChannels * kPerChannel - kCap);
  EXPECT_EQ(total_finished, kChannels * kPerChannel - kCap);
  // The held streams cost no thread each (a thread per stream was 256 more).
  EXPECT_LT(testing::ProcStatus(pid, "Threads"), threads_before + 32);
  // Authenticated calls go on.
  const Streamed generated = GenerateAll(*server.stub, TokensRequest({1, 2, 3}, 4), 30);
  EXPECT_TRUE(generated.status.ok()) << generated.status.error_message();
  EXPECT_EQ(generated.ids.size(), 4u);
  // Idle for 10 s, the held streams are cancelled.
  collect(opened + std::chrono::seconds(25), kChannels * kPerChannel);
  EXPECT_EQ(total_finished, kChannels * kPerChannel);
  EXPECT_EQ(finished[grpc::StatusCode::CANCELLED], kCap);
  EXPECT_GE(std::chrono::steady_clock::now() - opened, std::chrono::seconds(9));
  EXPECT_NE(testing::Probe("services " + server.address + " v1").find("deltaserve.v1.Generation"),
            std::string::npos);
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

TEST(ServeApiTest, HealthReflectionModelInfoAndStopStrings) {
  auto server = testing::StartServer("serve --model " + K3Tiny());
  EXPECT_TRUE(testing::WaitForStatus(
      *server.stub, [](const v1::ServerStatus& s) { return s.worker_attached(); },
      std::chrono::seconds(10)));
  EXPECT_EQ(testing::Probe("health " + server.address), "SERVING\n");
  EXPECT_EQ(testing::Probe("health " + server.address + " deltaserve.v1.Generation"), "SERVING\n");
  // Reflection in both versions: the same services; a file by name or by a
  // symbol it defines, then the files it imports, each sent once a stream;
  // or why there is none.
  const std::string services = testing::Probe("services " + server.address);
  EXPECT_EQ(services,
            "deltaserve.v1.Generation\ngrpc.reflection.v1alpha.ServerReflection\n"
            "grpc.reflection.v1.ServerReflection\ngrpc.health.v1.Health\n");
  EXPECT_EQ(testing::Probe("services " + server.address + " v1"), services);
  EXPECT_EQ(testing::Probe("files " + server.address +
                           " v1 deltaserve.v1.Generation.Generate deltaserve.v1.GenerateRequest "
                           "no.such.Thing google/protobuf/type.proto google/protobuf/any.proto "
                           "no/such.proto"),
            "file deltaserve/v1/generation.proto package deltaserve.v1\n--\n--\n"
            "error 5 no symbol no.such.Thing\n--\n"
            "file google/protobuf/type.proto package google.protobuf\n"
            "file google/protobuf/any.proto package google.protobuf\n"
            "file google/protobuf/source_context.proto package google.protobuf\n--\n--\n"
            "error 5 no file no/such.proto\n--\n");
  EXPECT_EQ(testing::Probe("files " + server.address + " v1alpha deltaserve.v1.GenerateRequest"),
            "file deltaserve/v1/generation.proto package deltaserve.v1\n--\n");

  grpc::ClientContext context;
  v1::ModelInfo info;
  ASSERT_TRUE(server.stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model_type(), "kimi_k3");
  EXPECT_EQ(info.num_layers(), 9);
  EXPECT_EQ(info.kda_layers(), 6);
  EXPECT_EQ(info.mla_layers(), 3);
  EXPECT_EQ(info.vocab_size(), 256);
  EXPECT_EQ(info.context_length(), 1048576);
  EXPECT_EQ(info.tokenizer(), "byte");
  EXPECT_EQ(info.layout().pipeline_stages(), 1);

  // Byte tokens: stop at the text of a printable token the greedy run makes;
  // the output ends there, without the stop string.
  v1::GenerateRequest req;
  req.set_text("Hello, world");
  req.set_max_tokens(40);
  const Streamed full = GenerateAll(*server.stub, req);
  ASSERT_TRUE(full.status.ok());
  ASSERT_EQ(full.ids.size(), 40u);
  // The same prompt from a file, through both clients.
  const std::string prompt_file = testing::TempDir("prompt_file") + "/prompt.txt";
  std::ofstream(prompt_file) << "Hello, world";
  const std::string from_file = " generate --server " + server.address + " --prompt-file " +
                                prompt_file + " --max-tokens 40 --ids 2>/dev/null";
  EXPECT_EQ(FirstLine(Deltaserve("client" + from_file)), absl::StrJoin(full.ids, " "));
  std::string python;
  testing::RunCommand(std::string(testing::kSystemPython) + " " + DELTASERVE_SOURCE_DIR +
                          "/examples/python/deltaserve_client.py --stubs " + DELTASERVE_PYTHON_DIR +
                          from_file,
                      &python);
  EXPECT_EQ(FirstLine(python), absl::StrJoin(full.ids, " "));
  auto printable = std::find_if(full.ids.begin() + 5, full.ids.end(),
                                [](int32_t id) { return id >= 0x20 && id < 0x7f; });
  ASSERT_NE(printable, full.ids.end());
  const std::string stop(1, static_cast<char>(*printable));
  req.add_stop(stop);
  const Streamed stopped = GenerateAll(*server.stub, req);
  ASSERT_TRUE(stopped.status.ok());
  EXPECT_EQ(stopped.completion.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(stopped.completion.stop(), stop);
  const size_t at = full.text.find(stop);
  EXPECT_EQ(stopped.text, full.text.substr(0, at));
  const size_t n = std::find(full.ids.begin(), full.ids.end(), *printable) - full.ids.begin();
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(full.ids.begin(), full.ids.begin() + n + 1));
}

// A K3-shaped model with a Kimi tiktoken tokenizer (the fixture of
// tests/runtime/tokenizer: 676 BPE ranks and 256 special tokens) and a
// 1024-token vocabulary: text prompts are encoded with the BPE, and the
// streamed text is the same as deltaserve generate prints.
TEST(ServeTokenizerTest, TextPromptsGoThroughTheCheckpointsTiktokenBpe) {
  namespace fs = std::filesystem;
  const std::string dir = testing::TempDir("tiktoken_model");
  auto config = PresetConfig("k3-tiny");
  ASSERT_TRUE(config.ok());
  config->vocab_size = 1024;
  ASSERT_TRUE(WriteRandomCheckpoint(*config, dir, 5).ok());
  for (const char* file : {"tiktoken.model", "tokenizer_config.json"}) {
    fs::copy_file(std::string(DELTASERVE_SOURCE_DIR) + "/tests/data/tokenizer/" + file,
                  dir + "/" + file);
  }
  auto tokenizer = LoadTokenizer(dir, 1024);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = "Hello, world! Don't stop: 12345 你好世界";
  auto prompt = (*tokenizer)->Encode(text);
  ASSERT_TRUE(prompt.ok());

  auto server = testing::StartServer("serve --model " + dir);
  grpc::ClientContext context;
  v1::ModelInfo info;
  ASSERT_TRUE(server.stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.tokenizer(), "tiktoken");

  v1::GenerateRequest req;
  req.set_text(text);
  req.set_max_tokens(30);
  req.set_ignore_eos(true);  // a random model may well sample [EOS] early
  const Streamed streamed = GenerateAll(*server.stub, req);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
  EXPECT_EQ(streamed.completion.usage().prompt_tokens(), static_cast<int64_t>(prompt->size()));
  // Same prompt ids, same tokens, same text as the generate command.
  v1::GenerateRequest by_ids_req = TokensRequest(*prompt, 30);
  by_ids_req.set_ignore_eos(true);
  const Streamed by_ids = GenerateAll(*server.stub, by_ids_req);
  EXPECT_EQ(by_ids.ids, streamed.ids);
  const std::string ids = absl::StrJoin(streamed.ids, " ");
  const std::string base = "generate --model " + dir + " --prompt \"" + text + "\" --max-tokens 30";
  EXPECT_EQ(FirstLine(Deltaserve(base + " --ignore-eos --ids 2>/dev/null")), ids);
  EXPECT_EQ(Deltaserve(base + " --ignore-eos 2>/dev/null"), streamed.text + "\n");
  // Without ignore_eos both stop at the tokenizer's end tokens alike.
  req.set_ignore_eos(false);
  const Streamed stopping = GenerateAll(*server.stub, req);
  ASSERT_TRUE(stopping.status.ok());
  const std::string stopping_ids = absl::StrJoin(stopping.ids, " ");
  EXPECT_EQ(FirstLine(Deltaserve(base + " --ids 2>/dev/null")), stopping_ids);
}

}  // namespace
}  // namespace deltaserve

namespace deltaserve {
namespace {

double MetricValue(const std::string& page, const std::string& name) {
  const size_t at = page.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(page.substr(at + name.size() + 2));
}

// `deltaserve client` as a script uses it: replies as JSON, labelled
// log-probs, a command-line mistake reported as such before any call (and
// nothing on stdout), a server's refusal with its gRPC code and nothing on
// stdout either; and the status's counts of ended requests are the metrics'.
TEST(ServeClientTest, JsonRepliesLabelledLogprobsUsageErrorsAndOneCountOfEndedRequests) {
  auto server = testing::StartServer("serve --model " + K3Tiny() + " --metrics-port 0");
  ASSERT_NE(server.stub, nullptr);
  const std::string client = "client generate --server " + server.address;
  int code = 0;

  // Usage errors: an unknown flag (against a port where nothing listens, so
  // a call would fail otherwise) and --max-tokens 0, in both clients and
  // in `generate`.
  std::string out = Deltaserve("client info --server 127.0.0.1:1 --bogus 2>&1", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("client info: unknown flag --bogus"), std::string::npos) << out;
  EXPECT_EQ(out.find("INVALID_ARGUMENT"), std::string::npos) << out;
  EXPECT_EQ(out.find("UNAVAILABLE"), std::string::npos) << out;
  EXPECT_EQ(Deltaserve(client + " --tokens 1,2,3 --max-tokens 0 2>/dev/null", &code), "");
  EXPECT_NE(code, 0);
  out = Deltaserve(client + " --tokens 1,2,3 --max-tokens 0 2>&1");
  EXPECT_NE(out.find("--max-tokens must be >= 1 (got 0)"), std::string::npos) << out;
  out = Deltaserve("generate --model " + K3Tiny() + " --tokens 1,2,3 --max-tokens 0 2>&1", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--max-tokens must be >= 1 (got 0)"), std::string::npos) << out;
  const std::string python = std::string(testing::kSystemPython) + " " + DELTASERVE_SOURCE_DIR +
                             "/examples/python/deltaserve_client.py --stubs " +
                             DELTASERVE_PYTHON_DIR + " generate --server " + server.address;
  code = testing::RunCommand(python + " --tokens 1,2,3 --max-tokens 0 2>&1", &out);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("must be >= 1 (got 0)"), std::string::npos) << out;
  // The Python client takes the token lists the C++ one takes.
  const std::string expected =
      FirstLine(Deltaserve(client + " --tokens 1,2,3 --max-tokens 4 --ids 2>/dev/null"));
  ASSERT_FALSE(expected.empty());
  for (const std::string tokens : {"'1 2 3'", "1,2,3", "'1, 2,3'"}) {
    testing::RunCommand(python + " --tokens " + tokens + " --max-tokens 4 --ids 2>/dev/null", &out);
    EXPECT_EQ(FirstLine(out), expected) << tokens;
  }

  // The server refuses a token outside the vocabulary: its code, and no
  // empty line on stdout first.
  EXPECT_EQ(Deltaserve(client + " --tokens 1,2,300 2>/dev/null", &code), "");
  EXPECT_NE(code, 0);
  out = Deltaserve(client + " --tokens 1,2,300 2>&1");
  EXPECT_NE(out.find("INVALID_ARGUMENT: prompt[2]"), std::string::npos) << out;

  // --top-logprobs: each token's log-prob and its alternatives, labelled.
  out =
      Deltaserve(client + " --tokens 1,2,3 --max-tokens 2 --top-logprobs 2 --ids 2>&1 >/dev/null");
  EXPECT_TRUE(std::regex_search(out, std::regex("(^|\n)token [0-9]+ logprob -?[0-9.]+\n"
                                                "  top 1: token [0-9]+ logprob -?[0-9.]+\n"
                                                "  top 2: token [0-9]+ logprob -?[0-9.]+\n")))
      << out;

  // One request cancelled while it runs: it ended with an error.
  {
    grpc::ClientContext context;
    auto stream = server.stub->Generate(&context, TokensRequest({1, 2, 3, 4}, 1000000));
    v1::GenerateResponse response;
    ASSERT_TRUE(stream->Read(&response));
    context.TryCancel();
    while (stream->Read(&response)) {
    }
  }
  // Ended: the greedy 4-token run, the --top-logprobs run and the Python
  // client's three (normally), and the cancelled one (an error). The
  // refusals above were never admitted.
  ASSERT_TRUE(testing::WaitForStatus(
      *server.stub,
      [](const v1::ServerStatus& s) { return s.requests_finished() + s.requests_failed() == 6; },
      std::chrono::seconds(10)));
  out = Deltaserve("client status --server " + server.address + " --json 2>&1", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.front(), '{') << out;
  EXPECT_EQ(out.substr(out.size() - 2), "}\n") << out;
  EXPECT_NE(out.find("\"requests_finished\":\"5\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"requests_failed\":\"1\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"worker_attached\":true"), std::string::npos) << out;
  const std::string metrics = testing::HttpGet(server.metrics_port, "/metrics");
  EXPECT_EQ(MetricValue(metrics, "deltaserve_requests_finished_total"), 5) << metrics;
  EXPECT_EQ(MetricValue(metrics, "deltaserve_requests_failed_total"), 1) << metrics;

  out = Deltaserve("client info --server " + server.address + " --json 2>&1", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"model_type\":\"kimi_k3\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"vocab_size\":\"256\""), std::string::npos) << out;  // int64: a string
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  // Without --json: protobuf text format, as before.
  out = Deltaserve("client info --server " + server.address + " 2>&1");
  EXPECT_NE(out.find("model_type: \"kimi_k3\""), std::string::npos) << out;
  // The start line gives the metrics' address whole, to paste into a scraper.
  EXPECT_NE(server.process->Log().find(
                "metrics on http://127.0.0.1:" + std::to_string(server.metrics_port) + "/metrics"),
            std::string::npos)
      << server.process->Log();
}

// A conversation's turns through `deltaserve serve`: each turn's prompt is
// the last one, its reply and new tokens, and starts from the prefix the
// server's cache kept at the end of the last prompt's last full page (64
// tokens a page) with the tokens `deltaserve generate` gives it cold. The
// usage, `client generate`, the server status and /metrics count the same
// hits; --prefix-cache-bytes 0 turns the cache off.
TEST(ServePrefixCacheTest, TurnsOfAConversationStartFromTheCacheWithTheColdTokens) {
  auto server = testing::StartServer("serve --model " + K3Tiny() + " --metrics-port 0");
  auto uncached = testing::StartServer("serve --model " + K3Tiny() + " --prefix-cache-bytes 0");
  ASSERT_NE(server.stub, nullptr);
  ASSERT_NE(uncached.stub, nullptr);
  std::vector<int32_t> prompt = testing::RandomTokens(150, 7);
  // Prompts of 150, 198 and 256 tokens: entries at 128, 192, 192.
  const std::vector<int64_t> more = {40, 50};
  const std::vector<int64_t> expected_cached = {0, 128, 192};
  for (size_t turn = 0; turn < expected_cached.size(); ++turn) {
    SCOPED_TRACE(absl::StrCat("turn ", turn));
    const std::string tokens = absl::StrJoin(prompt, ",");
    const std::string cold = FirstLine(Deltaserve("generate --model " + K3Tiny() + " --tokens " +
                                                  tokens + " --max-tokens 8 --ids 2>/dev/null"));
    ASSERT_FALSE(cold.empty());
    const Streamed got = GenerateAll(*server.stub, TokensRequest(prompt, 8));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(absl::StrJoin(got.ids, " "), cold);
    EXPECT_EQ(got.completion.usage().prompt_tokens(), static_cast<int64_t>(prompt.size()));
    EXPECT_EQ(got.completion.usage().cached_tokens(), expected_cached[turn]);
    const Streamed off = GenerateAll(*uncached.stub, TokensRequest(prompt, 8));
    ASSERT_TRUE(off.status.ok()) << off.status.error_message();
    EXPECT_EQ(off.ids, got.ids);
    EXPECT_EQ(off.completion.usage().cached_tokens(), 0);
    if (turn + 1 == expected_cached.size()) break;
    prompt.insert(prompt.end(), got.ids.begin(), got.ids.end());
    const std::vector<int32_t> next = testing::RandomTokens(more[turn], 8 + turn);
    prompt.insert(prompt.end(), next.begin(), next.end());
  }
  // The last prompt again, from `deltaserve client`: 192 cached.
  int code = 0;
  const std::string out =
      Deltaserve("client generate --server " + server.address + " --tokens " +
                     absl::StrJoin(prompt, ",") + " --max-tokens 2 --ids 2>&1 >/dev/null",
                 &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("prompt tokens: 256 (192 cached)"), std::string::npos) << out;

  // Four lookups, three hits, 128 + 192 + 192 tokens; entries at 128 and 192.
  const v1::ServerStatus status = testing::Status(*server.stub);
  const v1::PrefixCacheStatus& cache = status.prefix_cache();
  EXPECT_EQ(cache.lookups(), 4);
  EXPECT_EQ(cache.hits(), 3);
  EXPECT_EQ(cache.cached_tokens(), 512);
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_GT(cache.bytes(), 0);
  EXPECT_EQ(cache.evictions(), 0);
  ASSERT_EQ(status.worker_status_size(), 1);
  EXPECT_EQ(status.worker_status(0).prefix_cache().DebugString(), cache.DebugString());
  const std::string metrics = testing::HttpGet(server.metrics_port, "/metrics");
  EXPECT_EQ(MetricValue(metrics, "deltaserve_prefix_cache_lookups_total"), 4) << metrics;
  EXPECT_EQ(MetricValue(metrics, "deltaserve_prefix_cache_hits_total"), 3) << metrics;
  EXPECT_EQ(MetricValue(metrics, "deltaserve_prefix_cache_tokens_total"), 512) << metrics;
  EXPECT_EQ(MetricValue(metrics, "deltaserve_prefix_cache_entries"), 2) << metrics;
  EXPECT_EQ(MetricValue(metrics, "deltaserve_prefix_cache_bytes"),
            static_cast<double>(cache.bytes()))
      << metrics;
  EXPECT_EQ(MetricValue(metrics, "deltaserve_prefix_cache_evictions_total"), 0) << metrics;
  const v1::PrefixCacheStatus off = testing::Status(*uncached.stub).prefix_cache();
  EXPECT_EQ(off.hits(), 0);
  EXPECT_EQ(off.entries(), 0);
}

// A soak through `deltaserve serve` with a cache of room for about three
// entries: 40 generations from four clients at once, over three documents
// cut at many lengths with suffixes of their own, and prompts that share
// nothing. Each gets the tokens a server without the cache gives it; the
// cache evicts, stays within its budget, and once they have ended every
// byte of state the replica holds is an entry's: its KDA slots and the MLA
// pages that the entries' costs count, no more.
TEST(ServePrefixCacheTest, ASoakEndsWithinTheBudgetWithEveryPageAccountedFor) {
  // One entry of two pages gives the sizes of a slot and a page.
  int64_t slot = 0, page = 0;
  {
    auto probe = testing::StartServer("serve --model " + K3Tiny());
    ASSERT_NE(probe.stub, nullptr);
    ASSERT_TRUE(
        GenerateAll(*probe.stub, TokensRequest(testing::RandomTokens(130, 1), 1)).status.ok());
    // The request's own state goes with the step after its last.
    ASSERT_TRUE(testing::WaitForStatus(
        *probe.stub,
        [](const v1::ServerStatus& s) {
          return s.worker_status_size() == 1 && s.worker_status(0).held_slots() == 1;
        },
        std::chrono::seconds(10)));
    ASSERT_TRUE(testing::WaitForStatus(
        *probe.stub,
        [&](const v1::ServerStatus& s) {
          slot = s.kda_state_bytes();
          page = s.mla_cache_bytes() / 2;
          return s.prefix_cache().entries() == 1 && s.prefix_cache().bytes() == slot + 2 * page;
        },
        std::chrono::seconds(10)))
        << testing::Status(*probe.stub).DebugString();
  }
  const int64_t budget = 3 * (slot + 3 * page);
  auto server = testing::StartServer("serve --model " + K3Tiny() + " --prefix-cache-bytes " +
                                     std::to_string(budget));
  auto cold = testing::StartServer("serve --model " + K3Tiny() + " --prefix-cache-bytes 0");
  ASSERT_NE(server.stub, nullptr);
  ASSERT_NE(cold.stub, nullptr);
  const std::vector<std::vector<int32_t>> documents = {testing::RandomTokens(256, 10),
                                                       testing::RandomTokens(256, 11),
                                                       testing::RandomTokens(256, 12)};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 40; ++i) {
    std::vector<int32_t> prompt;
    if (i % 5 != 4) {
      const auto& d = documents[i % 3];
      prompt.assign(d.begin(), d.begin() + 60 + (i * 37) % 197);
    }
    const std::vector<int32_t> own = testing::RandomTokens(1 + (i * 13) % 90, 100 + i);
    prompt.insert(prompt.end(), own.begin(), own.end());
    prompts.push_back(std::move(prompt));
  }
  std::vector<std::vector<int32_t>> expected(prompts.size()), got(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Streamed alone = GenerateAll(*cold.stub, TokensRequest(prompts[i], 3));
    ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
    expected[i] = alone.ids;
  }
  std::vector<std::thread> clients;
  for (size_t c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (size_t i = c; i < prompts.size(); i += 4) {
        const Streamed r = GenerateAll(*server.stub, TokensRequest(prompts[i], 3));
        EXPECT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
        got[i] = r.ids;
      }
    });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "request " << i;
  // Once the ended requests' state has gone (with the step after their
  // last), the replica holds the entries' and nothing else.
  EXPECT_TRUE(testing::WaitForStatus(
      *server.stub,
      [](const v1::ServerStatus& s) {
        return s.running_sequences() == 0 &&
               s.kda_state_bytes() + s.mla_cache_bytes() == s.prefix_cache().bytes();
      },
      std::chrono::seconds(10)));
  const v1::ServerStatus status = testing::Status(*server.stub);
  const v1::PrefixCacheStatus& cache = status.prefix_cache();
  // A prompt of a page or less has nothing to look for.
  EXPECT_EQ(cache.lookups(), std::count_if(prompts.begin(), prompts.end(),
                                           [](const auto& p) { return p.size() > 64; }));
  EXPECT_GT(cache.hits(), 0);
  EXPECT_GT(cache.evictions(), 0);
  EXPECT_GT(cache.entries(), 0);
  EXPECT_LE(cache.bytes(), budget);
  ASSERT_EQ(status.worker_status_size(), 1);
  EXPECT_EQ(status.worker_status(0).held_slots(), cache.entries());
  EXPECT_EQ(status.kda_state_bytes(), cache.entries() * slot) << status.DebugString();
  EXPECT_EQ(status.kda_state_bytes() + status.mla_cache_bytes(), cache.bytes());
}

// bench-serve's warm-up requests reach the server before the table and are
// not in it, so the one-client row (what the speedups divide by) does not
// carry the server's first-use costs. With --http each row runs over both
// APIs.
TEST(ServeBenchTest, WarmUpRequestsAreSentAndNotCounted) {
  auto server = testing::StartServer("serve --model " + K3Tiny() + " --http-port 0");
  ASSERT_NE(server.stub, nullptr);
  int code = 0;
  const std::string flags = " --concurrency 1 --requests 2 --prompt-tokens 4 --max-tokens 2 ";
  const std::string out =
      Deltaserve("bench-serve --server " + server.address + flags + "--warmup 3 2>&1", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("# warm-up: 3 requests, not counted"), std::string::npos) << out;
  EXPECT_NE(out.find("\n| 1 | 2 | "), std::string::npos) << out;
  EXPECT_EQ(testing::Status(*server.stub).requests_finished(), 5);
  const std::string both =
      Deltaserve("bench-serve --server " + server.address + flags +
                     "--warmup 0 --http 127.0.0.1:" + std::to_string(server.http_port) + " 2>&1",
                 &code);
  ASSERT_EQ(code, 0) << both;
  EXPECT_NE(both.find("\n| gRPC | 1 | 2 | "), std::string::npos) << both;
  EXPECT_NE(both.find("\n| HTTP | 1 | 2 | "), std::string::npos) << both;
  EXPECT_EQ(testing::Status(*server.stub).requests_finished(), 9);
}

// The Python client as a package: `pip install` of a copy of examples/python
// (into a folder of its own, no index, Debian's grpcio), then its
// `deltaserve-client` command, run away from the source tree, gives the
// tokens `deltaserve client` gives.
TEST(ServePythonPackageTest, InstalledClientGivesTheCppClientsTokens) {
  namespace fs = std::filesystem;
  const std::string dir = testing::TempDir("python_package");
  fs::copy(std::string(DELTASERVE_SOURCE_DIR) + "/examples/python", dir + "/src",
           fs::copy_options::recursive);
  std::string out;
  ASSERT_EQ(testing::RunCommand(std::string(testing::kSystemPython) +
                                    " -m pip install -q --no-deps --no-build-isolation "
                                    "--no-index --target " +
                                    dir + "/site " + dir + "/src",
                                &out),
            0)
      << out;
  auto server = testing::StartServer("serve --model " + K3Tiny());
  ASSERT_NE(server.stub, nullptr);
  const std::string flags = " --server " + server.address + " --tokens 5,6,7 --max-tokens 6 --ids";
  const std::string expected = FirstLine(Deltaserve("client generate" + flags + " 2>/dev/null"));
  ASSERT_FALSE(expected.empty());
  testing::RunCommand("cd " + dir + " && PYTHONPATH=" + dir + "/site " + testing::kSystemPython +
                          " " + dir + "/site/bin/deltaserve-client generate" + flags +
                          " 2>/dev/null",
                      &out);
  EXPECT_EQ(FirstLine(out), expected) << out;
}

}  // namespace
}  // namespace deltaserve
