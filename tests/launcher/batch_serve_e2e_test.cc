// `deltaserve batch --server` against a `deltaserve serve` the test starts:
// the records are the embedded run's, with the model's tokenizer lent to the
// client (--model) or without it (the server checks and encodes).
#include <algorithm>
#include <filesystem>

#include "tests/launcher/batch_test_util.h"

namespace deltaserve {
namespace {

using testing::Json;

struct Server {
  std::unique_ptr<testing::ChildProcess> process;
  std::string address;
};

Server StartServe(const std::string& flags) {
  Server s;
  const std::string dir = testing::TempDir("batch_serve");
  const std::string port_file = dir + "/port";
  s.process = testing::ChildProcess::Start(
      absl::StrCat(testing::Deltaserve(), " serve --model ", testing::K3Tiny(),
                   " --host 127.0.0.1 --port 0 --port-file ", port_file, " ", flags),
      dir + "/log");
  for (int i = 0; i < 6000 && !std::filesystem::exists(port_file); ++i) {
    if (s.process->Wait(std::chrono::milliseconds(10))) break;
  }
  int port = 0;
  std::ifstream(port_file) >> port;
  EXPECT_GT(port, 0) << s.process->Log();
  s.address = absl::StrCat("127.0.0.1:", port);
  return s;
}

// dir/in.jsonl through `deltaserve batch --model` into dir/embedded.jsonl.
void RunEmbedded(const std::string& dir) {
  std::string log;
  ASSERT_EQ(
      testing::Run(absl::StrCat(testing::Deltaserve(), " batch --model ", testing::K3Tiny(),
                                " --input ", dir, "/in.jsonl --output ", dir, "/embedded.jsonl"),
                   &log),
      0)
      << log;
}

// dir/in.jsonl through `server`: the records of dir/embedded.jsonl.
void ExpectServedAsEmbedded(const Server& server, const std::string& dir) {
  std::string log;
  ASSERT_EQ(
      testing::Run(absl::StrCat(testing::Deltaserve(), " batch --server ", server.address,
                                " --input ", dir, "/in.jsonl --output ", dir, "/served.jsonl"),
                   &log),
      0)
      << log;
  testing::ExpectSameRecords(testing::ReadRecords(dir + "/served.jsonl"),
                             testing::ReadRecords(dir + "/embedded.jsonl"));
}

TEST(BatchServeTest, ThroughAServerTheRecordsAreTheEmbeddedRunsOnes) {
  const std::string dir = testing::TempDir("batch_server");
  const std::string input = testing::MixedInput(/*scale=*/2);
  testing::WriteFile(dir + "/in.jsonl", input);
  ASSERT_NO_FATAL_FAILURE(RunEmbedded(dir));
  std::string log;
  const auto embedded = testing::ReadRecords(dir + "/embedded.jsonl");

  const Server server = StartServe("--max-running 8");
  // With the model's tokenizer here: encoded and checked as the embedded run
  // does, the same records, errors included.
  ASSERT_EQ(testing::Run(absl::StrCat(testing::Deltaserve(), " batch --server ", server.address,
                                      " --model ", testing::K3Tiny(), " --concurrency 6 --input ",
                                      dir, "/in.jsonl --output ", dir, "/served.jsonl"),
                         &log),
            0)
      << log;
  std::map<std::string, int> counts;
  const auto served = testing::ReadRecords(dir + "/served.jsonl", &counts);
  for (const auto& [key, n] : counts) EXPECT_EQ(n, 1) << key;
  testing::ExpectSameRecords(served, embedded);
  testing::ExpectMixedRecordsMatchAlone(input, served, testing::K3Tiny());

  // Without it: the server encodes text and refuses the bad id itself (its
  // message names the API's field).
  ASSERT_EQ(testing::Run(absl::StrCat(testing::Deltaserve(), " batch --server ", server.address,
                                      " --input ", dir, "/in.jsonl --output ", dir, "/plain.jsonl"),
                         &log),
            0)
      << log;
  const auto plain = testing::ReadRecords(dir + "/plain.jsonl");
  testing::ExpectSameRecords(plain, embedded, /*same_errors=*/false);
  EXPECT_EQ(plain.at("\"oob\"")["error"],
            "INVALID_ARGUMENT: prompt[2]: 256 is outside the vocabulary [0, 256)");

  // A rerun finds every record there and sends nothing.
  ASSERT_EQ(testing::Run(absl::StrCat(testing::Deltaserve(), " batch --server ", server.address,
                                      " --input ", dir, "/in.jsonl --output ", dir, "/plain.jsonl"),
                         &log),
            0)
      << log;
  EXPECT_NE(log.find("batch: wrote 0 records"), std::string::npos) << log;
}

// The long-document form through a server: each question is sent with the
// document's length as the prefix others share, so the server's prefix
// cache keeps the document's state at its last page (192 of its 200
// tokens) for the questions after the first, questions longer than a page
// included; the answers are the embedded run's.
TEST(BatchServeTest, QuestionsAfterTheFirstStartFromTheServersCachedDocument) {
  const std::string dir = testing::TempDir("batch_server_cache");
  const std::string input =
      Json{{"id", "doc"},
           {"document", testing::Tokens(200, 1)},
           {"questions", {testing::Tokens(80, 2), testing::Tokens(80, 3), testing::Tokens(10, 4)}},
           {"max_tokens", 4}}
          .dump() +
      "\n";
  testing::WriteFile(dir + "/in.jsonl", input);
  ASSERT_NO_FATAL_FAILURE(RunEmbedded(dir));
  const Server server = StartServe("");
  ASSERT_NO_FATAL_FAILURE(ExpectServedAsEmbedded(server, dir));
  std::string status;
  ASSERT_EQ(testing::Run(absl::StrCat(testing::Deltaserve(), " client status --json --server ",
                                      server.address, " 2>/dev/null"),
                         &status),
            0)
      << status;
  const Json cache = Json::parse(status, nullptr, false)["prefix_cache"];
  ASSERT_TRUE(cache.is_object()) << status;
  EXPECT_EQ(cache["lookups"], "3") << status;
  EXPECT_EQ(cache["hits"], "2") << status;
  EXPECT_EQ(cache["cached_tokens"], "384") << status;
}

// Error records are kept by a plain rerun, and run again with
// --retry-errors: a text document sent without --model (which lends the
// tokenizer that cuts it into pieces) fails, and the rerun with --model and
// --retry-errors replaces those records with answers, each key once.
TEST(BatchServeTest, RetryErrorsRunsTheFailedRequestsAgain) {
  const std::string dir = testing::TempDir("batch_server_retry");
  std::string input =
      Json{{"id", "short"}, {"tokens", testing::Tokens(8, 1)}, {"max_tokens", 2}}.dump() + "\n";
  input += Json{{"id", "doc"},
                {"document", "A document, as text."},
                {"questions", {" Who?", " When?"}},
                {"max_tokens", 2}}
               .dump() +
           "\n";
  testing::WriteFile(dir + "/in.jsonl", input);
  const Server server = StartServe("");
  const std::string batch =
      absl::StrCat(testing::Deltaserve(), " batch --server ", server.address, " --input ", dir,
                   "/in.jsonl --output ", dir, "/out.jsonl");
  std::string log;
  ASSERT_EQ(testing::Run(batch, &log), 0) << log;
  EXPECT_NE(log.find("batch: wrote 3 records (2 errors)"), std::string::npos) << log;
  // A plain rerun (with --model, what the errors asked for) keeps them.
  const std::string with_model = batch + " --model " + testing::K3Tiny();
  ASSERT_EQ(testing::Run(with_model, &log), 0) << log;
  EXPECT_NE(log.find("batch: wrote 0 records"), std::string::npos) << log;
  ASSERT_EQ(testing::Run(with_model + " --resume --retry-errors", &log), 0) << log;
  EXPECT_NE(log.find("2 error records dropped to run again"), std::string::npos) << log;
  EXPECT_NE(log.find("batch: wrote 2 records (0 errors)"), std::string::npos) << log;
  std::map<std::string, int> counts;
  const auto records = testing::ReadRecords(dir + "/out.jsonl", &counts);
  ASSERT_EQ(records.size(), 3u);
  for (const auto& [key, n] : counts) EXPECT_EQ(n, 1) << key;
  for (const auto& [key, record] : records) {
    EXPECT_FALSE(record.contains("error")) << key << ": " << record.dump();
  }
  // Nothing left to retry: a second --retry-errors sends nothing.
  ASSERT_EQ(testing::Run(with_model + " --retry-errors", &log), 0) << log;
  EXPECT_NE(log.find("batch: wrote 0 records"), std::string::npos) << log;
  EXPECT_EQ(testing::Run(with_model + " --retry-errors --overwrite", &log), 1) << log;
  EXPECT_NE(log.find("give at most one of --retry-errors, --overwrite"), std::string::npos) << log;
}

TEST(BatchServeTest, StopStringsAndLogprobsAreTheApis) {
  // A stop string that the greedy continuation of the prompt meets: the
  // first printable byte not generated before it (the tiny models' tokens
  // are bytes).
  std::string output;
  ASSERT_EQ(
      testing::Run(absl::StrCat(testing::Deltaserve(), " generate --model ", testing::K3Tiny(),
                                " --prompt 'Stop here' --max-tokens 24 --ids 2>/dev/null"),
                   &output),
      0);
  std::vector<int32_t> alone;
  std::istringstream in(output);
  for (int32_t id; in >> id;) alone.push_back(id);
  size_t at = 3;
  while (at < alone.size() &&
         (alone[at] < 0x21 || alone[at] > 0x7e || alone[at] == '"' || alone[at] == '\\' ||
          std::find(alone.begin(), alone.begin() + at, alone[at]) != alone.begin() + at)) {
    ++at;
  }
  ASSERT_LT(at, alone.size()) << output;
  const std::string stop(1, static_cast<char>(alone[at]));
  const std::string dir = testing::TempDir("batch_stop");
  testing::WriteFile(dir + "/in.jsonl", Json{{"id", "stop"},
                                             {"text", "Stop here"},
                                             {"max_tokens", 24},
                                             {"stop", {stop}},
                                             {"logprobs", true},
                                             {"top_logprobs", 3}}
                                                .dump() +
                                            "\n");
  ASSERT_NO_FATAL_FAILURE(RunEmbedded(dir));
  const Json embedded = testing::ReadRecords(dir + "/embedded.jsonl").at("\"stop\"");
  // The token that completes the stop string is the last; the text ends
  // before the stop string.
  EXPECT_EQ(embedded["token_ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(alone.begin(), alone.begin() + at + 1));
  EXPECT_EQ(embedded["finish_reason"], "stop");
  EXPECT_EQ(embedded["stop"], stop);
  EXPECT_EQ(embedded["text"].get<std::string>().find(stop), std::string::npos);
  ASSERT_EQ(embedded["logprobs"].size(), at + 1);
  ASSERT_EQ(embedded["top_logprobs"].size(), at + 1);
  for (const Json& top : embedded["top_logprobs"]) EXPECT_EQ(top.size(), 3u);
  // Greedy: the sampled token is the most likely one.
  EXPECT_EQ(embedded["top_logprobs"][0][0]["id"], alone[0]);
  EXPECT_NEAR(embedded["top_logprobs"][0][0]["logprob"].get<double>(),
              embedded["logprobs"][0].get<double>(), 1e-6);

  const Server server = StartServe("");
  ASSERT_NO_FATAL_FAILURE(ExpectServedAsEmbedded(server, dir));
}

// The server's progress messages reach the progress line: the long prompt
// in flight, generated or scored, is the one shown, at tokens of its total.
TEST(BatchServeTest, TheProgressLineShowsTheServersPrefillProgress) {
  const std::string dir = testing::TempDir("batch_server_progress");
  std::string input =
      Json{{"id", "short"}, {"tokens", testing::Tokens(20, 1)}, {"max_tokens", 2}}.dump() + "\n";
  input +=
      Json{{"id", "long"}, {"tokens", testing::Tokens(4096, 2)}, {"max_tokens", 2}}.dump() + "\n";
  input +=
      Json{{"id", "doc"}, {"task", "score"}, {"tokens", testing::Tokens(4096, 3)}}.dump() + "\n";
  testing::WriteFile(dir + "/in.jsonl", input);
  const Server server = StartServe("--step-tokens 64 --progress-interval 0.02 --threads 1");
  std::string log;
  ASSERT_EQ(testing::Run(absl::StrCat(testing::Deltaserve(), " batch --server ", server.address,
                                      " --concurrency 1 --progress-interval 0.000001 --input ", dir,
                                      "/in.jsonl --output ", dir, "/out.jsonl"),
                         &log),
            0)
      << log;
  EXPECT_NE(log.find("prefill of id \"long\" at "), std::string::npos) << log;
  EXPECT_NE(log.find("prefill of id \"doc\" at "), std::string::npos) << log;
  EXPECT_NE(log.find("/4096 tokens"), std::string::npos) << log;
  EXPECT_EQ(log.find("prefill of id \"short\""), std::string::npos) << log;
  EXPECT_NE(log.find("batch: wrote 3 records (0 errors)"), std::string::npos) << log;
}

TEST(BatchServeTest, KilledClientResumesAndAServerThatIsGoneStopsTheJob) {
  const std::string dir = testing::TempDir("batch_server_kill");
  testing::WriteFile(dir + "/in.jsonl", testing::MixedInput(/*scale=*/8, /*max_tokens=*/32));
  Server server = StartServe("");
  const std::string batch =
      absl::StrCat(testing::Deltaserve(), " batch --server ", server.address, " --model ",
                   testing::K3Tiny(), " --concurrency 4 --input ", dir, "/in.jsonl --output ");
  std::string log;
  ASSERT_EQ(testing::Run(batch + dir + "/ref.jsonl", &log), 0) << log;
  const auto reference = testing::ReadRecords(dir + "/ref.jsonl");
  const int killed = testing::KillAndResume(batch + dir + "/out.jsonl", dir + "/out.jsonl",
                                            /*kills=*/3, /*max_records=*/3, /*seed=*/2);
  EXPECT_GE(killed, 2);
  std::map<std::string, int> counts;
  testing::ExpectSameRecords(testing::ReadRecords(dir + "/out.jsonl", &counts), reference);
  for (const auto& [key, n] : counts) EXPECT_EQ(n, 1) << key;

  // The server goes away: the job stops with an error instead of writing
  // error records for what it could not run, and a rerun can finish it.
  server.process->Signal(SIGTERM);
  server.process->Wait(std::chrono::seconds(30));
  EXPECT_EQ(testing::Run(batch + dir + "/gone.jsonl --retry-s 1", &log), 1) << log;
  EXPECT_NE(log.find("does not answer"), std::string::npos) << log;
  EXPECT_TRUE(testing::ReadRecords(dir + "/gone.jsonl").size() <= 2u);
}

// The server dies in the middle of a job: the job retries for --retry-s,
// then stops saying why, with the records it wrote kept, and a rerun with
// the same --output against a new server finishes it (a call that waited
// for the server's readiness once waited for ever, whatever --retry-s said).
TEST(BatchServeTest, AServerThatDiesMidJobStopsItAfterRetrySAndARerunResumes) {
  const std::string dir = testing::TempDir("batch_server_dies");
  testing::WriteFile(dir + "/in.jsonl", testing::MixedInput(/*scale=*/8, /*max_tokens=*/48));
  Server server = StartServe("--max-running 2");
  const std::string output = dir + "/out.jsonl";
  auto batch = [&](const std::string& address) {
    return absl::StrCat(testing::Deltaserve(), " batch --server ", address, " --model ",
                        testing::K3Tiny(), " --concurrency 2 --retry-s 3 --quiet --input ", dir,
                        "/in.jsonl --output ", output);
  };
  auto job = testing::ChildProcess::Start(batch(server.address), dir + "/job.log");
  // Once a record is out, the server is killed.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (testing::ReadFile(output).find('\n') == std::string::npos &&
         std::chrono::steady_clock::now() < end && !job->Wait(std::chrono::milliseconds(20))) {
  }
  server.process->Signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  const std::optional<int> code = job->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "the job did not stop: " << job->Log();
  EXPECT_EQ(*code, 1) << job->Log();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(30));
  EXPECT_NE(job->Log().find("did not come back within --retry-s 3 s"), std::string::npos)
      << job->Log();
  EXPECT_NE(job->Log().find("rerun with the same --output to resume"), std::string::npos)
      << job->Log();
  const size_t kept = testing::ReadRecords(output).size();
  EXPECT_GE(kept, 1u);

  const Server again = StartServe("");
  std::string log;
  ASSERT_EQ(testing::Run(batch(again.address), &log), 0) << log;
  std::map<std::string, int> counts;
  const auto records = testing::ReadRecords(output, &counts);
  RunEmbedded(dir);
  testing::ExpectSameRecords(records, testing::ReadRecords(dir + "/embedded.jsonl"));
  for (const auto& [key, n] : counts) EXPECT_EQ(n, 1) << key;
}

}  // namespace
}  // namespace deltaserve
