// `deltaserve batch` in one process, as a user runs it: mixed requests give
// what `generate` and `score` give alone, bad lines and requests become
// error records (numbers no double holds, nesting, lines over the length
// bound too), a job killed at random moments and resumed ends with the
// records of an uninterrupted run, each once; resuming takes only records of
// batch's shape, never the input itself; the output is a new name or a
// regular file, nothing else; progress on stderr.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>

#include "kernels/scratch.h"
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

  // A complete record, then a line that is not JSON.
  const std::string record =
      testing::ReadFile(output).substr(0, testing::ReadFile(output).find('\n') + 1);
  testing::WriteFile(dir + "/foreign.jsonl", record + "hello\n");
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

TEST(BatchTest, NumbersNoDoubleHoldsAreErrorRecordsAndResumeGoesOn) {
  const std::string dir = testing::TempDir("batch_range");
  const std::string huge(400, '9');  // an integer literal past every integer and double
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "[";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"id": 1e400, "tokens": [1]})", "id: 1e400: a number out of the range of a double"},
      {R"({"id": "t", "tokens": [1, 2], "temperature": 1e400})",
       "temperature: 1e400: a number out of the range of a double"},
      {R"({"id": "m", "tokens": [1, 2], "max_tokens": -1e400})",
       "max_tokens: -1e400: a number out of the range of a double"},
      {R"({"id": "k", "tokens": [1, )" + huge + "]}", "tokens[1]: 99999999999999999999999999"},
      {R"({"id": "u", "tokens": [1, 2], "extra": {"a": [0, 1e999]}})",
       "extra.a[1]: 1e999: a number out of the range of a double"},
      {R"({"id": "d", "document": [1], "questions": [[2], [3, 4e400]]})",
       "questions[1][1]: 4e400: a number out of the range of a double"},
      {R"({"id": "n", "tokens": [1, 2], "unknown": )" + deep, "nested deeper than the limit of 16"},
      {R"({"id": "f", "tokens": [1, 2], "temperature": 1e300})",
       "temperature: 1e+300: must be a finite number >= 0"},
      {R"({"id": "ok", "tokens": [1, 2], "max_tokens": 2})", ""},
  };
  std::string input;
  for (const auto& [line, error] : cases) input += line + "\n";
  testing::WriteFile(dir + "/in.jsonl", input);
  const std::string output = dir + "/out.jsonl";
  std::string log;
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", output), &log), 0) << log;
  EXPECT_NE(log.find("batch: wrote 9 records (8 errors)"), std::string::npos) << log;
  const auto records = testing::ReadRecords(output);
  ASSERT_EQ(records.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].first.substr(0, 80));
    // A line that is no JSON tree is keyed by its line; the rest by id.
    const std::string key = cases[i].second.find(": a number out of") != std::string::npos ||
                                    cases[i].second.find("nested") != std::string::npos ||
                                    cases[i].first.find(huge) != std::string::npos
                                ? absl::StrCat("line ", i + 1)
                                : Json::parse(cases[i].first)["id"].dump();
    ASSERT_TRUE(records.count(key)) << key;
    const Json& r = records.at(key);
    if (cases[i].second.empty()) {
      EXPECT_EQ(r["token_ids"].size(), 2u) << r.dump();
    } else {
      EXPECT_NE(r.value("error", "").find(cases[i].second), std::string::npos) << r.dump();
      EXPECT_EQ(r["line"], i + 1);
    }
  }
  // Resuming reads the same lines again: nothing left to do, nothing written twice.
  const std::string before = testing::ReadFile(output);
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", output, "--resume"), &log), 0) << log;
  EXPECT_NE(log.find("batch: wrote 0 records"), std::string::npos) << log;
  EXPECT_EQ(testing::ReadFile(output), before);
  // And a resumed output that holds such a line (not one batch writes) is
  // refused with its line, not a crash.
  testing::WriteFile(dir + "/odd.jsonl", before + R"({"id": 1e400, "line": 1, "error": "x"})"
                                                  "\n");
  EXPECT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/odd.jsonl"), &log), 1) << log;
  EXPECT_NE(log.find("odd.jsonl line 10: not JSON; not resuming"), std::string::npos) << log;
}

TEST(BatchTest, ResumeTakesOnlyBatchRecordsAndNeverTheInput) {
  const std::string dir = testing::TempDir("batch_shape");
  std::string input;
  for (int i = 0; i < 20; ++i) {
    input += Json{{"id", i}, {"tokens", testing::Tokens(4, i)}, {"max_tokens", 2}}.dump() + "\n";
  }
  const std::string in = dir + "/in.jsonl";
  testing::WriteFile(in, input);
  std::string log;
  // The input as the output, by its name, another name or a hard link.
  EXPECT_EQ(testing::Run(Batch(in, in), &log), 1) << log;
  EXPECT_NE(log.find("--output " + in + " is the same file as --input " + in), std::string::npos)
      << log;
  EXPECT_EQ(testing::Run(Batch(in, dir + "/../" + std::filesystem::path(dir).filename().string() +
                                       "/in.jsonl"),
                         &log),
            1)
      << log;
  EXPECT_NE(log.find("is the same file as --input"), std::string::npos) << log;
  std::filesystem::create_hard_link(in, dir + "/hard.jsonl");
  EXPECT_EQ(testing::Run(Batch(in, dir + "/hard.jsonl", "--overwrite"), &log), 1) << log;
  EXPECT_NE(log.find("is the same file as --input"), std::string::npos) << log;
  EXPECT_EQ(testing::ReadFile(in), input);

  // A copy of the input: requests, not records.
  testing::WriteFile(dir + "/copy.jsonl", input);
  EXPECT_EQ(testing::Run(Batch(in, dir + "/copy.jsonl"), &log), 1) << log;
  EXPECT_NE(log.find("copy.jsonl line 1: not a batch record (no token_ids); not resuming"),
            std::string::npos)
      << log;
  EXPECT_EQ(testing::ReadFile(dir + "/copy.jsonl"), input);
  // Objects with an id and a field of a record each, but not a record's shape.
  const std::vector<std::string> fakes = {
      R"({"id": 0, "error": "x"})",                                  // no line
      R"({"id": 0, "token_ids": [1], "finish_reason": "length"})",   // no usage
      R"({"id": 0, "token_ids": [1], "usage": {}, "timings": {}})",  // neither kind
      R"({"id": null, "token_ids": [1], "finish_reason": "length", "usage": {}, "timings": {}})",
      R"({"id": 0, "line": 1, "error": "x", "tokens": [1]})",  // a field of no record
      R"({"id": 0, "question": -1, "line": 1, "error": "x"})",
  };
  for (const std::string& line : fakes) {
    testing::WriteFile(dir + "/fake.jsonl", line + "\n");
    EXPECT_EQ(testing::Run(Batch(in, dir + "/fake.jsonl"), &log), 1) << line << "\n" << log;
    EXPECT_NE(log.find("fake.jsonl line 1: not a batch record ("), std::string::npos) << log;
  }
  // What batch writes is taken: a run, then a rerun that has nothing to do.
  ASSERT_EQ(testing::Run(Batch(in, dir + "/out.jsonl"), &log), 0) << log;
  ASSERT_EQ(testing::Run(Batch(in, dir + "/out.jsonl"), &log), 0) << log;
  EXPECT_NE(log.find("batch: wrote 0 records (0 errors)"), std::string::npos) << log;
  EXPECT_NE(log.find("20 records (0 errors) were there from before"), std::string::npos) << log;
}

TEST(BatchTest, ALineOverTheBoundIsAnErrorRecordAndIsNotHeldInMemory) {
  const std::string dir = testing::TempDir("batch_long_line");
  // 48 MB of token ids on one line, twice, around a good line; written in
  // pieces, so that this process stays small (a child's peak RSS counts
  // what it had from this process before exec).
  const std::string good = Json{{"id", "ok"}, {"tokens", {1, 2}}, {"max_tokens", 2}}.dump() + "\n";
  {
    std::ofstream out(dir + "/in.jsonl", std::ios::binary);
    std::string piece;
    for (int i = 0; i < (1 << 19); ++i) piece += ",1";  // 1 MiB
    for (int copy = 0; copy < 2; ++copy) {
      out << R"({"id": "long", "tokens": [1)";
      for (int i = 0; i < 48; ++i) out << piece;
      out << "]}\n";
      if (copy == 0) out << good;
    }
  }
  auto expect_records = [&](const std::string& output, int64_t bound) {
    const auto records = testing::ReadRecords(output);
    ASSERT_EQ(records.size(), 3u);
    for (const char* key : {"line 1", "line 3"}) {
      ASSERT_TRUE(records.count(key)) << key;
      EXPECT_NE(records.at(key)
                    .value("error", "")
                    .find(absl::StrCat("longer than the limit of ", bound,
                                       " bytes (--max-line-bytes); not read")),
                std::string::npos)
          << records.at(key).dump();
    }
    EXPECT_EQ(records.at("\"ok\"")["token_ids"].size(), 2u);
  };
  std::string log;
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/small.jsonl", "--max-line-bytes 1048576"),
                         &log),
            0)
      << log;
  expect_records(dir + "/small.jsonl", 1048576);
  // Neither line was held: the process's peak is its own (about 20 MiB with
  // k3-tiny; 66 MiB under ASan, whose shadow and quarantine of freed memory
  // add the rest) and a few times the bound. A 48 MB line read whole and
  // parsed takes several hundred MB (a JSON element per token id).
  struct rusage usage {};
  ASSERT_EQ(::getrusage(RUSAGE_CHILDREN, &usage), 0);
  EXPECT_LT(usage.ru_maxrss, (kernels::kAddressSanitizer ? 160 : 40) << 10) << "KiB";

  // The default for k3-tiny: 32 bytes per token of its 1,048,576-token
  // context, 32 MiB.
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/out.jsonl"), &log), 0) << log;
  expect_records(dir + "/out.jsonl", 33554432);
  // Resuming keys the long lines by line and skips them.
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/out.jsonl", "--resume"), &log), 0) << log;
  EXPECT_NE(log.find("batch: wrote 0 records"), std::string::npos) << log;

  // The bound is on the bytes before the newline.
  testing::WriteFile(dir + "/short.jsonl",
                     good + R"({"id": "x", "tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9]})"
                            "\n");
  ASSERT_EQ(testing::Run(Batch(dir + "/short.jsonl", dir + "/short_out.jsonl",
                               absl::StrCat("--max-line-bytes ", good.size() - 1)),
                         &log),
            0)
      << log;
  const auto records = testing::ReadRecords(dir + "/short_out.jsonl");
  ASSERT_TRUE(records.count("line 2"));
  EXPECT_NE(records.at("line 2").value("error", "").find("longer than the limit of 41 bytes"),
            std::string::npos);
  EXPECT_FALSE(records.at("\"ok\"").contains("error"));
  EXPECT_EQ(testing::Run(Batch(dir + "/short.jsonl", dir + "/o.jsonl", "--max-line-bytes 0"), &log),
            1);
  EXPECT_NE(log.find("--max-line-bytes must be in [1, "), std::string::npos) << log;
}

TEST(BatchTest, TheOutputIsANewNameOrARegularFileAndNothingElse) {
  const std::string dir = testing::TempDir("batch_output_kind");
  testing::WriteFile(dir + "/in.jsonl", R"({"id": 1, "tokens": [1, 2], "max_tokens": 2})"
                                        "\n");
  testing::WriteFile(dir + "/victim", "precious\n");
  std::filesystem::create_symlink(dir + "/victim", dir + "/link.jsonl");
  std::filesystem::create_symlink(dir + "/in.jsonl", dir + "/in_link.jsonl");
  ASSERT_EQ(::mkfifo((dir + "/fifo.jsonl").c_str(), 0600), 0);
  // A device node of our own (/dev/null's numbers), not the system's.
  const bool have_device =
      ::mknod((dir + "/null.jsonl").c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0;
  std::string log;
  for (const auto& [name, kind] : std::vector<std::pair<std::string, std::string>>{
           {"link.jsonl", "a symbolic link"},
           {"in_link.jsonl", "a symbolic link"},
           {"fifo.jsonl", "a FIFO"},
           {"null.jsonl", "a character device"},
       }) {
    if (name == "null.jsonl" && !have_device) continue;
    const std::string path = dir + "/" + name;
    EXPECT_EQ(testing::Run(Batch(dir + "/in.jsonl", path, "--overwrite"), &log), 1) << log;
    EXPECT_NE(log.find(path + ": is " + kind + ", not a regular file; refusing to write it"),
              std::string::npos)
        << log;
  }
  EXPECT_EQ(testing::ReadFile(dir + "/victim"), "precious\n");
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link.jsonl"));
  EXPECT_TRUE(std::filesystem::is_fifo(dir + "/fifo.jsonl"));
  ASSERT_EQ(testing::Run(Batch(dir + "/in.jsonl", dir + "/new.jsonl"), &log), 0) << log;
  EXPECT_EQ(testing::ReadRecords(dir + "/new.jsonl").size(), 1u);
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
