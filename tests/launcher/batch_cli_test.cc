// `deltaserve batch` in one process, as a user runs it: mixed requests give
// what `generate` and `score` give alone, bad lines and requests become
// error records, a job killed at random moments and resumed ends with the
// records of an uninterrupted run, each once; progress on stderr.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>

#include "tests/launcher/batch_test_util.h"

namespace deltaserve {
namespace {

using testing::Json;

std::string Batch(const std::string& input, const std::string& output,
                  const std::string& flags = "") {
  return absl::StrCat(testing::Deltaserve(), " batch --model ", testing::K3Tiny(), " --input ",
                      input, " --output ", output, " ", flags);
}

TEST(BatchTest, MixedRequestsGetWhatGenerateAndScoreGiveAlone) {
  const std::string dir = testing::TempDir("batch_mixed");
  const std::string input = testing::MixedInput();
  testing::WriteFile(dir + "/in.jsonl", input);
  std::string log;
  // Four at a time: they share the engine's steps.
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/out.jsonl", "--max-running 4"), &log), 0)
      << log;
  EXPECT_NE(log.find("batch: wrote 11 records (2 errors)"), std::string::npos) << log;
  std::map<std::string, int> counts;
  const auto records = testing::ReadRecords(dir + "/out.jsonl", &counts);
  for (const auto& [key, n] : counts) EXPECT_EQ(n, 1) << key;
  testing::ExpectMixedRecordsMatchAlone(input, records, testing::K3Tiny());

  // The text request: the text `generate` prints for the same prompt.
  const Json& text = records.at("\"text\"");
  std::string generated;
  ASSERT_EQ(
      testing::Run(absl::StrCat(testing::Deltaserve(), " generate --model ", testing::K3Tiny(),
                                " --prompt 'Hello, batch' --max-tokens 12 "
                                "--temperature 0.7 --seed 5 2>/dev/null"),
                   &generated),
      0);
  EXPECT_EQ(text["text"].get<std::string>() + "\n", generated);
  EXPECT_EQ(text["usage"]["prompt_tokens"], 12);
  // Score records: one log-prob fewer than tokens, and their sum.
  const Json& score = records.at("\"s0\"");
  double total = 0;
  for (const Json& lp : score["logprobs"]) total += lp.get<double>();
  EXPECT_NEAR(score["total_logprob"].get<double>(), total, 1e-3);
  // The line that is not JSON is line 9 of the file (a blank line before).
  EXPECT_EQ(records.at("line 9")["error"].get<std::string>().rfind("not JSON", 0), 0u);
}

TEST(BatchTest, KilledAtRandomMomentsAndResumedEqualsAnUninterruptedRun) {
  const std::string dir = testing::TempDir("batch_kill");
  // 56 records: five kills after at most a few new records each leave work
  // for the last run, however fast the machine.
  testing::WriteFile(dir + "/in.jsonl", testing::MixedInput(/*scale=*/10, /*max_tokens=*/24));
  std::string log;
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/ref.jsonl", "--max-running 4"), &log), 0)
      << log;
  const auto reference = testing::ReadRecords(dir + "/ref.jsonl");
  ASSERT_EQ(reference.size(), 56u);

  const int killed = testing::KillAndResume(
      Batch(dir + "/in.jsonl", dir + "/out.jsonl", "--max-running 4 --resume"), dir + "/out.jsonl",
      /*kills=*/5, /*max_records=*/4, /*seed=*/1);
  EXPECT_GE(killed, 3) << "the job finished before it could be killed";
  std::map<std::string, int> counts;
  const auto resumed = testing::ReadRecords(dir + "/out.jsonl", &counts);
  for (const auto& [key, n] : counts) EXPECT_EQ(n, 1) << key << " written " << n << " times";
  testing::ExpectSameRecords(resumed, reference);

  // A last line cut mid-write (what a crash inside write(2) leaves) is cut
  // off and its record written again, whole.
  std::string text = testing::ReadFile(dir + "/ref.jsonl");
  testing::WriteFile(dir + "/cut.jsonl", text.substr(0, text.size() - 25));
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/cut.jsonl"), &log), 0) << log;
  EXPECT_NE(log.find("an unfinished last line"), std::string::npos) << log;
  EXPECT_NE(log.find("batch: wrote 1 records"), std::string::npos) << log;
  testing::ExpectSameRecords(testing::ReadRecords(dir + "/cut.jsonl"), reference);
}

TEST(BatchTest, OneJobPerOutputAndNoResumingIntoAForeignFile) {
  const std::string dir = testing::TempDir("batch_lock");
  testing::WriteFile(dir + "/in.jsonl", testing::MixedInput(/*scale=*/3, /*max_tokens=*/24));
  const std::string output = dir + "/out.jsonl";
  {
    // Another job holds the output (its lock, taken as `batch` takes it).
    const int fd = ::open(output.c_str(), O_RDWR | O_CREAT | O_APPEND, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    std::string log;
    EXPECT_EQ(testing::Run(Batch(dir + "/in.jsonl", output), &log), 1) << log;
    EXPECT_NE(log.find("in use by another `deltaserve batch`"), std::string::npos) << log;
    ::close(fd);
  }
  std::string log;
  EXPECT_EQ(testing::Run(Batch(dir + "/in.jsonl", output), &log), 0) << log;
  EXPECT_EQ(testing::ReadRecords(output).size(), 21u);

  testing::WriteFile(dir + "/foreign.jsonl", "{\"id\": 1, \"text\": \"x\"}\nhello\n");
  EXPECT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/foreign.jsonl"), &log), 1);
  EXPECT_NE(log.find("foreign.jsonl line 2: not JSON; not resuming"), std::string::npos) << log;
  EXPECT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/foreign.jsonl", "--overwrite"), &log), 0)
      << log;
  EXPECT_EQ(testing::ReadRecords(dir + "/foreign.jsonl").size(), 21u);
}

TEST(BatchTest, BadRequestsNameTheFieldAndTheJobGoesOn) {
  const std::string dir = testing::TempDir("batch_bad");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"id": "t", "tokens": [1, 2], "temperature": -1})", "temperature: -1: must be"},
      {R"({"id": "p", "tokens": [1, 2], "top_p": 1.5})", "top_p: 1.5: must be in (0, 1]"},
      {R"({"id": "k", "tokens": [1, 2], "top_k": "many"})", "top_k: \"many\": must be an integer"},
      {R"({"id": "u", "tokens": [1, 2], "max_token": 3})", "max_token: unknown field"},
      {R"({"id": "e", "tokens": []})", "tokens: empty"},
      {R"({"id": "b", "text": "a", "tokens": [1]})", "give exactly one of text, tokens"},
      {R"({"id": "s", "task": "score", "tokens": [1]})", "tokens: needs at least 2 tokens"},
      {R"({"id": "m", "task": "score", "tokens": [1, 2], "max_tokens": 3})",
       "max_tokens: not a field of a score request"},
      {R"({"id": "c", "tokens": [1, 2], "max_tokens": 1048575})",
       "max_tokens: 2 prompt tokens + 1048575 exceed the context of 1048576"},
      {R"({"id": "q", "document": [1, 2], "questions": [[3], [4, 999]]})",
       "questions[1][1]: 999 is outside the vocabulary"},
      {R"({"id": 1.5, "tokens": [1]})", "id: 1.5: must be a string or an integer"},
      {R"([1, 2])", "not a JSON object"},
      {R"({"id": "ok", "tokens": [1, 2], "max_tokens": 2})", ""},
  };
  std::string input;
  for (const auto& [line, error] : cases) input += line + "\n";
  testing::WriteFile(dir + "/in.jsonl", input);
  std::string log;
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/out.jsonl"), &log), 0) << log;
  const auto records = testing::ReadRecords(dir + "/out.jsonl");
  // The long document: one record per question, the good one run.
  EXPECT_EQ(records.size(), cases.size() + 1);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Json request = Json::parse(cases[i].first);
    std::string key = absl::StrCat("line ", i + 1);
    if (request.is_object() && request["id"].is_string()) key = request["id"].dump();
    if (request.is_object() && request.contains("questions")) key += " question 1";
    SCOPED_TRACE(key);
    ASSERT_TRUE(records.count(key));
    const Json& r = records.at(key);
    if (cases[i].second.empty()) {
      EXPECT_FALSE(r.contains("error")) << r.dump();
      EXPECT_EQ(r["token_ids"].size(), 2u);
    } else {
      EXPECT_NE(r.value("error", "").find(cases[i].second), std::string::npos) << r.dump();
      EXPECT_EQ(r["line"], i + 1);
    }
  }
  EXPECT_FALSE(records.at("\"q\" question 0").contains("error"));
}

TEST(BatchTest, ProgressShowsRatesTimeLeftAndWhereALongPrefillIs) {
  const std::string dir = testing::TempDir("batch_progress");
  std::string input;
  for (int i = 0; i < 3; ++i) {
    input += Json{{"id", i}, {"tokens", testing::Tokens(20, i)}, {"max_tokens", 4}}.dump() + "\n";
  }
  input += Json{{"id", "doc"},
                {"document", testing::Tokens(1200, 9)},
                {"questions", {testing::Tokens(5, 10), testing::Tokens(5, 11)}},
                {"max_tokens", 4}}
               .dump() +
           "\n";
  testing::WriteFile(dir + "/in.jsonl", input);
  std::string log;
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/out.jsonl",
                               "--step-tokens 128 --progress-interval 0.000001"),
                         &log),
            0)
      << log;
  EXPECT_NE(log.find("/4 requests, prompt "), std::string::npos) << log;
  EXPECT_NE(log.find(" tok/s, generated "), std::string::npos) << log;
  EXPECT_NE(log.find(", ETA "), std::string::npos) << log;
  // The document is prefilled once and forked for its two questions: its
  // prefill is the one shown, and the prompt tokens run are 3 x 20 + 1200 +
  // 2 x 5, not 2 x 1205 for the questions.
  EXPECT_NE(log.find("prefill of id \"doc\" document"), std::string::npos) << log;
  EXPECT_NE(log.find("/1200 tokens"), std::string::npos) << log;
  EXPECT_NE(log.find("batch: wrote 5 records (0 errors)"), std::string::npos) << log;
  EXPECT_NE(log.find("; prompt 1270 tokens ("), std::string::npos) << log;

  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/quiet.jsonl", "--quiet"), &log), 0);
  EXPECT_EQ(log.find("requests, prompt"), std::string::npos) << log;
  EXPECT_NE(log.find("batch: wrote 5 records"), std::string::npos) << log;
}

}  // namespace
}  // namespace deltaserve
