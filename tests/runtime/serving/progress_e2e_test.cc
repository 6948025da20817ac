// Progress of long prefills, with real processes: `deltaserve coordinator`
// (--step-tokens 64, --progress-interval 0.02 s) and a `deltaserve worker` on
// k3-tiny, and a 4,096-token prompt that takes dozens of steps. Generate and
// ScoreStream send progress messages before the first token or the result,
// each further than the last; ScoreStream's log-probs are Score's;
// GetServerStatus lists a request part-way through its prefill, to its own
// principal only; `deltaserve client --progress` draws the bar on stderr
// and leaves stdout as it is without; the Python example shows it too.
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <future>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/serving/credentials.h"
#include "tests/runtime/serving/serving_test_util.h"

namespace deltaserve {
namespace {

std::string K3Tiny() { return testing::GoldenPath("model/k3-tiny"); }

constexpr double kInterval = 0.02;
constexpr char kServerFlags[] = " --step-tokens 64 --progress-interval 0.02";

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = (i * 7 + 3) % 256;
  return ids;
}

std::string Slurp(const std::string& path) {
  std::ostringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

// A coordinator with `flags` and one worker attached (with `worker_flags`).
struct Served {
  testing::ServerUnderTest coordinator;
  std::unique_ptr<testing::ChildProcess> worker;
};

Served Start(const std::string& flags, const std::string& worker_flags = "") {
  Served s;
  s.coordinator =
      testing::StartServer("coordinator --model " + K3Tiny() + kServerFlags + " " + flags);
  if (s.coordinator.stub == nullptr) return s;
  s.worker = testing::ChildProcess::Start(
      testing::BinPath("deltaserve") + " worker --coordinator " + s.coordinator.worker_address +
          " --model " + K3Tiny() + " --threads 1 " + worker_flags,
      testing::TempDir("progress_worker") + "/worker.log");
  EXPECT_TRUE(testing::WaitForHealth(s.coordinator.address, "SERVING")) << s.worker->Log();
  return s;
}

// Checks a stream's progress messages: at least two, each within the
// prompt and further than the last, of `total` tokens.
void ExpectProgress(const std::vector<v1::PrefillProgress>& progress, int64_t total) {
  EXPECT_GE(progress.size(), 2u)
      << "a 4096-token prefill at 64 tokens a step took under 2 intervals?";
  int64_t last = 0;
  for (const v1::PrefillProgress& p : progress) {
    EXPECT_EQ(p.tokens_total(), total);
    EXPECT_GT(p.tokens_done(), last);
    EXPECT_LT(p.tokens_done(), total);
    last = p.tokens_done();
  }
}

TEST(ProgressTest, GenerateAndScoreStreamTellTheirPrefillsProgressBeforeTheOutput) {
  Served s = Start("");
  ASSERT_NE(s.coordinator.stub, nullptr);
  const std::vector<int32_t> prompt = Prompt(4096);

  // Generate: progress messages alone, then tokens; none after the first.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  v1::GenerateRequest req = testing::TokensRequest(prompt, 4);
  req.set_request_id("long");
  const auto sent = std::chrono::steady_clock::now();
  auto reader = s.coordinator.stub->Generate(&context, req);
  v1::GenerateResponse response;
  std::vector<v1::PrefillProgress> progress;
  std::vector<int32_t> ids;
  bool completed = false;
  std::chrono::steady_clock::time_point first_progress, first_token;
  while (reader->Read(&response)) {
    EXPECT_EQ(response.request_id(), "long");
    if (response.tokens_size() > 0 && ids.empty()) first_token = std::chrono::steady_clock::now();
    if (response.has_progress()) {
      if (progress.empty()) first_progress = std::chrono::steady_clock::now();
      EXPECT_EQ(response.tokens_size(), 0);
      EXPECT_FALSE(response.has_completion());
      EXPECT_TRUE(ids.empty()) << "progress after the first token";
      progress.push_back(response.progress());
    }
    for (const auto& t : response.tokens()) ids.push_back(t.id());
    completed |= response.has_completion();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(completed);
  EXPECT_EQ(ids.size(), 4u);
  ExpectProgress(progress, 4096);
  // At most one message per interval, the first one interval after
  // admission (which came after `sent`): bounds the server must keep
  // whatever the network does.
  const double prefill_s = std::chrono::duration<double>(first_token - sent).count();
  EXPECT_LE(static_cast<double>(progress.size()), prefill_s / kInterval + 1) << prefill_s;
  EXPECT_GE(std::chrono::duration<double>(first_progress - sent).count(), kInterval);

  // ScoreStream: progress, then the result, which is Score's.
  grpc::ClientContext stream_context;
  v1::ScoreRequest score;
  score.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  score.set_request_id("doc");
  auto scores = s.coordinator.stub->ScoreStream(&stream_context, score);
  v1::ScoreStreamResponse message;
  progress.clear();
  std::optional<v1::ScoreResponse> streamed;
  while (scores->Read(&message)) {
    EXPECT_EQ(message.request_id(), "doc");
    EXPECT_FALSE(streamed.has_value()) << "a message after the result";
    if (message.has_progress()) progress.push_back(message.progress());
    if (message.has_result()) streamed = message.result();
  }
  ASSERT_TRUE(scores->Finish().ok());
  ASSERT_TRUE(streamed.has_value());
  ExpectProgress(progress, 4096);

  grpc::ClientContext unary_context;
  v1::ScoreResponse unary;
  ASSERT_TRUE(s.coordinator.stub->Score(&unary_context, score, &unary).ok());
  ASSERT_EQ(streamed->logprobs_size(), 4095);
  ASSERT_EQ(unary.logprobs_size(), 4095);
  EXPECT_EQ(std::vector<int32_t>(streamed->token_ids().begin(), streamed->token_ids().end()),
            prompt);
  EXPECT_EQ(streamed->request_id(), "doc");
  EXPECT_EQ(streamed->usage().prompt_tokens(), 4096);
  // The same document on the same worker; the chunks may be cut elsewhere
  // (the cost model learns between the runs), which moves the last bits of
  // a float32 log-prob, not more (chunked equals one-shot within rounding).
  for (int i = 0; i < 4095; ++i) {
    ASSERT_NEAR(streamed->logprobs(i), unary.logprobs(i),
                1e-4f * (1 + std::fabs(unary.logprobs(i))))
        << "token " << i + 1;
  }
  EXPECT_NEAR(streamed->total_logprob(), unary.total_logprob(),
              1e-5 * std::fabs(unary.total_logprob()));
}

TEST(ProgressTest, AZeroIntervalSendsNoProgress) {
  Served s = Start("--progress-interval 0");
  ASSERT_NE(s.coordinator.stub, nullptr);
  grpc::ClientContext context;
  auto reader = s.coordinator.stub->Generate(&context, testing::TokensRequest(Prompt(4096), 2));
  v1::GenerateResponse response;
  int tokens = 0;
  while (reader->Read(&response)) {
    EXPECT_FALSE(response.has_progress());
    tokens += response.tokens_size();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 2);
}

// Polls the status until one of its requests is part-way through its
// prefill; returns that request (nullopt if none was seen).
std::optional<v1::RequestStatus> CatchPrefill(v1::Generation::Stub& stub, v1::ServerStatus* seen) {
  std::optional<v1::RequestStatus> found;
  testing::WaitForStatus(
      stub,
      [&](const v1::ServerStatus& s) {
        for (const v1::RequestStatus& r : s.requests()) {
          if (r.prefill().tokens_done() > 0 &&
              r.prefill().tokens_done() < r.prefill().tokens_total()) {
            found = r;
            *seen = s;
            return true;
          }
        }
        return false;
      },
      std::chrono::seconds(60));
  return found;
}

TEST(ProgressTest, ServerStatusListsARequestPartWayThroughItsPrefill) {
  Served s = Start("");
  ASSERT_NE(s.coordinator.stub, nullptr);
  // 8k tokens: a second or two of prefill on one thread, plenty to catch.
  v1::GenerateRequest req = testing::TokensRequest(Prompt(8192), 2);
  req.set_request_id("long-one");
  auto stream = std::async(std::launch::async,
                           [&] { return testing::GenerateAll(*s.coordinator.stub, req, 120); });
  v1::ServerStatus status;
  const std::optional<v1::RequestStatus> r = CatchPrefill(*s.coordinator.stub, &status);
  ASSERT_TRUE(r.has_value()) << "never saw the prefill part-way";
  EXPECT_EQ(r->request_id(), "long-one");
  EXPECT_EQ(r->kind(), v1::REQUEST_KIND_GENERATE);
  EXPECT_EQ(r->prompt_tokens(), 8192);
  EXPECT_EQ(r->prefill().tokens_total(), 8192);
  EXPECT_EQ(r->generated_tokens(), 0);
  ASSERT_EQ(status.worker_status_size(), 1);
  EXPECT_EQ(r->worker(), status.worker_status(0).id());
  EXPECT_EQ(status.worker_status(0).running_sequences(), 1);
  EXPECT_GT(status.worker_status(0).steps(), 0);
  EXPECT_EQ(status.worker_status(0).pipeline_stages(), 1);
  EXPECT_GT(status.worker_status(0).cost_per_token_s(), 0);
  const testing::Streamed done = stream.get();
  ASSERT_TRUE(done.status.ok()) << done.status.error_message();
  // Once it has ended it is no longer listed.
  EXPECT_EQ(testing::Status(*s.coordinator.stub).requests_size(), 0);
}

TEST(ProgressTest, WithTokensACallerSeesOnlyItsOwnRequests) {
  const std::string dir = testing::TempDir("progress_tokens");
  auto secret = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    EXPECT_EQ(chmod(path.c_str(), 0600), 0);
    return path;
  };
  const std::string clients =
      secret("clients", "alice:alice-0123456789abcdef\nbob:bob-0123456789abcdef0\n");
  const std::string workers = secret("workers", "worker-secret-0123456789abcdef\n");
  Served s = Start("--client-tokens-file " + clients + " --worker-token-file " + workers,
                   "--worker-token-file " + workers);
  ASSERT_NE(s.coordinator.stub, nullptr);
  auto client = [&](const std::string& principal, const std::string& token) {
    ChannelSecurity security;
    security.token_file = secret(principal, absl::StrCat(principal, ":", token, "\n"));
    auto channel = OpenChannel(s.coordinator.address, security, grpc::ChannelArguments());
    EXPECT_TRUE(channel.ok()) << channel.status();
    return v1::Generation::NewStub(*channel);
  };
  auto alice = client("alice", "alice-0123456789abcdef");
  auto bob = client("bob", "bob-0123456789abcdef0");
  // Both use the id "mine": each namespace has its own.
  v1::GenerateRequest req = testing::TokensRequest(Prompt(8192), 2);
  req.set_request_id("mine");
  auto stream =
      std::async(std::launch::async, [&] { return testing::GenerateAll(*alice, req, 120); });
  v1::ServerStatus alices;
  const std::optional<v1::RequestStatus> r = CatchPrefill(*alice, &alices);
  ASSERT_TRUE(r.has_value()) << "alice never saw her prefill part-way";
  EXPECT_EQ(r->request_id(), "mine");  // without the principal's prefix
  const v1::ServerStatus bobs = testing::Status(*bob);
  EXPECT_EQ(bobs.requests_size(), 0) << bobs.DebugString();
  EXPECT_EQ(bobs.running_sequences(), 1);  // the totals count everyone's
  ASSERT_TRUE(stream.get().status.ok());
}

TEST(ProgressTest, TheClientDrawsABarOnStderrAndLeavesStdoutAsItIs) {
  // Each client sends the same prompt: without the prefix cache, each one's
  // is prefilled whole, with progress to draw.
  Served s = Start("--prefix-cache-bytes 0");
  ASSERT_NE(s.coordinator.stub, nullptr);
  const std::string dir = testing::TempDir("progress_client");
  const std::string tokens = absl::StrJoin(Prompt(4096), ",");
  for (const std::string command : {"score", "generate --max-tokens 4 --ids"}) {
    const std::string base =
        absl::StrCat(testing::BinPath("deltaserve"), " client ", command, " --server ",
                     s.coordinator.address, " --tokens ", tokens);
    std::string output;
    // stderr is a file here: no bar unless asked.
    ASSERT_EQ(
        testing::RunCommand(base + " >" + dir + "/plain.out 2>" + dir + "/plain.err", &output), 0)
        << Slurp(dir + "/plain.err");
    ASSERT_EQ(testing::RunCommand(base + " --progress >" + dir + "/bar.out 2>" + dir + "/bar.err",
                                  &output),
              0)
        << Slurp(dir + "/bar.err");
    const std::string plain = Slurp(dir + "/plain.out"), bar = Slurp(dir + "/bar.out");
    EXPECT_FALSE(plain.empty()) << command;
    EXPECT_EQ(Slurp(dir + "/plain.err").find("prefill ["), std::string::npos) << command;
    const std::string err = Slurp(dir + "/bar.err");
    EXPECT_NE(err.find("prefill ["), std::string::npos) << command << ": " << err;
    EXPECT_NE(err.find("/4096 tokens"), std::string::npos) << command << ": " << err;
    EXPECT_NE(err.find("tok/s, ETA "), std::string::npos) << command << ": " << err;
    EXPECT_EQ(bar.find("prefill"), std::string::npos) << command;
    if (command == "score") {
      // Scores agree within rounding (the chunks may differ between runs).
      std::istringstream a(plain), b(bar);
      int ta, tb, lines = 0;
      double la, lb;
      while (a >> ta >> la && b >> tb >> lb) {
        EXPECT_EQ(ta, tb);
        EXPECT_NEAR(la, lb, 1e-4 * (1 + std::fabs(la)));
        ++lines;
      }
      EXPECT_EQ(lines, 4095);
    } else {
      EXPECT_EQ(bar, plain) << command;  // greedy: the same tokens
    }
  }
  // The Python example prints the progress on stderr too, and the tokens
  // of the generation just run (plain.out) on stdout.
  std::string output;
  const std::string python =
      absl::StrCat(testing::kSystemPython, " ", DELTASERVE_SOURCE_DIR,
                   "/examples/python/deltaserve_client.py --stubs ", DELTASERVE_PYTHON_DIR,
                   " generate --ids --max-tokens 4 --progress --server ", s.coordinator.address,
                   " --tokens ", tokens);
  ASSERT_EQ(testing::RunCommand(python + " >" + dir + "/py.out 2>" + dir + "/py.err", &output), 0)
      << Slurp(dir + "/py.err");
  EXPECT_NE(Slurp(dir + "/py.err").find("/4096 tokens"), std::string::npos)
      << Slurp(dir + "/py.err");
  EXPECT_EQ(Slurp(dir + "/py.out"), Slurp(dir + "/plain.out"));
}

}  // namespace
}  // namespace deltaserve
