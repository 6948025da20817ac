// For the `deltaserve batch` tests: a mixed input, reading the records back,
// the references (`deltaserve generate` and `score` run alone), comparing
// two outputs, and a job killed and resumed until it completes.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/model/safetensors.h"
#include "tests/test_util.h"

namespace deltaserve::testing {

using Json = nlohmann::json;

inline std::string Deltaserve() { return BinPath("deltaserve"); }
inline std::string K3Tiny() { return GoldenPath("model/k3-tiny"); }

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A record's key: the id, the question, or the line for a null id.
inline std::string KeyOf(const Json& r) {
  if (r["id"].is_null()) return absl::StrCat("line ", r["line"].get<int64_t>());
  return absl::StrCat(r["id"].dump(), r.contains("question")
                                          ? absl::StrCat(" question ", r["question"].get<int>())
                                          : "");
}

// Every line of an output, parsed; a line that is not JSON, or not whole,
// fails the test. `keys` counts each key's records.
inline std::map<std::string, Json> ReadRecords(const std::string& path,
                                               std::map<std::string, int>* keys = nullptr) {
  std::map<std::string, Json> records;
  const std::string text = ReadFile(path);
  EXPECT_TRUE(text.empty() || text.back() == '\n') << path << " ends in an unfinished line";
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const Json r = Json::parse(line, nullptr, false);
    EXPECT_FALSE(r.is_discarded()) << "not JSON: " << line;
    if (r.is_discarded()) continue;
    const std::string key = KeyOf(r);
    if (keys != nullptr) ++(*keys)[key];
    records[key] = r;
  }
  return records;
}

inline std::vector<int32_t> Tokens(int64_t n, uint64_t seed) { return RandomTokens(n, seed); }

// A mix of what batch takes: greedy and seeded generation (token ids and
// text), scoring, a long document with three questions, a blank line, a
// line that is not JSON and a token id outside the vocabulary. `scale`
// multiplies the number of generate and score requests.
inline std::string MixedInput(int scale = 1, int max_tokens = 12) {
  std::vector<std::string> lines;
  for (int i = 0; i < 4 * scale; ++i) {
    Json r = {{"id", absl::StrCat("g", i)},
              {"tokens", Tokens(3 + 7 * i, 10 + i)},
              {"max_tokens", max_tokens}};
    if (i % 2 == 1) {
      r["temperature"] = 0.9;
      r["top_k"] = 40;
      r["top_p"] = 0.95;
      r["seed"] = 7 + i;
    }
    lines.push_back(r.dump());
  }
  // Seed 5, not 3: with draws keyed by (seed, position), seed 3's draw at
  // position 24 lies within float32 rounding of the boundary between tokens
  // 17 and 18 (`deltaserve generate --prefill-chunk 1` against 0 flips it),
  // so runs that batch differently would disagree on it.
  lines.push_back(Json{
      {"id", "text"},
      {"text", "Hello, batch"},
      {"max_tokens", max_tokens},
      {"temperature", 0.7},
      {"seed", 5}}.dump());
  lines.push_back("");
  // Seeds 140 + i, not 40 + i: on k3-tiny, s4's log-prob at position 21 came
  // out 1.47 apart when that position fell in a piece of 17-21 rows
  // (`deltaserve score --prefill-chunk 21`, or 2): its routing keys for the
  // seventh MoE layer's 2nd and 3rd experts were 9.9e-7 apart there, and the
  // float32 rounding of the layer's input under another chunking picked
  // expert 7 instead of 4, so a batch whose pieces were cut by load could
  // disagree with its own rerun. These 8 agree with one piece to within
  // 6.1e-5 (relative) at every --prefill-chunk from 1 to 64.
  for (int i = 0; i < scale; ++i) {
    lines.push_back(
        Json{{"id", absl::StrCat("s", i)}, {"task", "score"}, {"tokens", Tokens(60 + i, 140 + i)}}
            .dump());
  }
  lines.push_back(Json{
      {"id", 77},
      {"document", Tokens(150, 50)},
      {"questions", {Tokens(5, 51), Tokens(9, 52), Tokens(1, 53)}},
      {"max_tokens",
       max_tokens}}.dump());
  lines.push_back("{\"id\": \"broken\", ");
  lines.push_back(Json{{"id", "oob"}, {"tokens", {1, 2, 256}}}.dump());
  return absl::StrJoin(lines, "\n") + "\n";
}

// Runs a command; its exit code, and its output in *output.
inline int Run(const std::string& command, std::string* output) {
  return RunCommand(command, output);
}

// `deltaserve generate --ids` alone: the reference for a generate record.
inline std::vector<int32_t> GenerateAlone(const std::string& model,
                                          const std::vector<int32_t>& prompt, const Json& request) {
  std::string flags = absl::StrCat(" --tokens ", absl::StrJoin(prompt, ","), " --max-tokens ",
                                   request.value("max_tokens", 16));
  if (request.contains("temperature")) {
    absl::StrAppend(&flags, " --temperature ", request["temperature"].get<double>());
  }
  if (request.contains("top_k")) absl::StrAppend(&flags, " --top-k ", request["top_k"].get<int>());
  if (request.contains("top_p")) {
    absl::StrAppend(&flags, " --top-p ", request["top_p"].get<double>());
  }
  if (request.contains("seed")) absl::StrAppend(&flags, " --seed ", request["seed"].get<int>());
  std::string output;
  const int rc =
      Run(absl::StrCat(Deltaserve(), " generate --ids --model ", model, flags, " 2>/dev/null"),
          &output);
  EXPECT_EQ(rc, 0) << output;
  std::vector<int32_t> ids;
  std::istringstream in(output.substr(0, output.find('\n')));
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// log p(tokens[i + 1] | tokens[..i]) from `deltaserve score`'s logits.
inline std::vector<double> ScoreAlone(const std::string& model,
                                      const std::vector<int32_t>& tokens) {
  const std::string out = TempDir("batch_score") + "/logits.safetensors";
  std::string log;
  EXPECT_EQ(Run(absl::StrCat(Deltaserve(), " score --model ", model, " --tokens ",
                             absl::StrJoin(tokens, ","), " --logits-out ", out),
                &log),
            0)
      << log;
  auto file = SafetensorsFile::Open(out);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  auto view = (*file)->Get("logits");
  const std::vector<float> logits = *ToFloat32(**view);
  const size_t V = logits.size() / tokens.size();
  std::vector<double> logprobs;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    const float* row = logits.data() + i * V;
    double max = row[0];
    for (size_t v = 1; v < V; ++v) max = std::max<double>(max, row[v]);
    double sum = 0;
    for (size_t v = 0; v < V; ++v) sum += std::exp(row[v] - max);
    logprobs.push_back(row[tokens[i + 1]] - max - std::log(sum));
  }
  return logprobs;
}

// Log-probs agree to float32 rounding (a different batch, another order of
// summation: docs/numerics.md, "Invariance").
inline void ExpectCloseLogprobs(const Json& got, const std::vector<double>& expected,
                                const std::string& what) {
  ASSERT_TRUE(got.is_array()) << what;
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(got[i].get<double>(), expected[i], 1e-4 * (1 + std::abs(expected[i])))
        << what << " position " << i;
  }
}

// Two outputs hold the same records: the same keys, and per record the same
// tokens, text, finish and error, log-probs to rounding; timings aside.
inline void ExpectSameRecords(const std::map<std::string, Json>& got,
                              const std::map<std::string, Json>& want, bool same_errors = true) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, w] : want) {
    SCOPED_TRACE(key);
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << "missing";
    const Json& g = it->second;
    EXPECT_EQ(g.contains("error"), w.contains("error")) << g.dump() << "\n" << w.dump();
    if (w.contains("error")) {
      if (same_errors) {
        EXPECT_EQ(g["error"], w["error"]);
      }
      continue;
    }
    for (const char* field : {"token_ids", "text", "finish_reason", "stop", "usage"}) {
      EXPECT_EQ(g.value(field, Json()), w.value(field, Json())) << field;
    }
    if (w.contains("logprobs")) {
      std::vector<double> expected;
      for (const Json& v : w["logprobs"]) expected.push_back(v.get<double>());
      ExpectCloseLogprobs(g["logprobs"], expected, key);
    }
  }
}

// Checks every record of a run of MixedInput against `generate` and `score`
// run alone, and the error records.
inline void ExpectMixedRecordsMatchAlone(const std::string& input_text,
                                         const std::map<std::string, Json>& records,
                                         const std::string& model) {
  int generate = 0, score = 0, errors = 0;
  for (absl::string_view line : absl::StrSplit(input_text, '\n', absl::SkipEmpty())) {
    const Json request = Json::parse(line, nullptr, false);
    if (request.is_discarded()) {
      ++errors;
      continue;
    }
    const std::string id = request["id"].dump();
    SCOPED_TRACE(id);
    if (request.contains("document")) {
      std::vector<int32_t> document = request["document"].get<std::vector<int32_t>>();
      for (size_t q = 0; q < request["questions"].size(); ++q) {
        auto it = records.find(absl::StrCat(id, " question ", q));
        ASSERT_NE(it, records.end()) << "question " << q;
        std::vector<int32_t> prompt = document;
        for (const Json& t : request["questions"][q]) prompt.push_back(t.get<int32_t>());
        EXPECT_EQ(it->second["token_ids"].get<std::vector<int32_t>>(),
                  GenerateAlone(model, prompt, request))
            << "question " << q;
        EXPECT_EQ(it->second["usage"]["prompt_tokens"].get<size_t>(), prompt.size());
        ++generate;
      }
      continue;
    }
    auto it = records.find(id);
    ASSERT_NE(it, records.end());
    const Json& r = it->second;
    if (id == "\"oob\"") {
      EXPECT_EQ(r.value("error", ""), "tokens[2]: 256 is outside the vocabulary [0, 256)")
          << r.dump();
      ++errors;
      continue;
    }
    ASSERT_FALSE(r.contains("error")) << r.dump();
    std::vector<int32_t> prompt;
    if (request.contains("text")) {
      // The tiny models' tokenizer is bytes.
      for (unsigned char c : request["text"].get<std::string>()) prompt.push_back(c);
    } else {
      prompt = request["tokens"].get<std::vector<int32_t>>();
    }
    if (request.value("task", "") == "score") {
      EXPECT_EQ(r["token_ids"].get<std::vector<int32_t>>(), prompt);
      ExpectCloseLogprobs(r["logprobs"], ScoreAlone(model, prompt), id);
      ++score;
    } else {
      EXPECT_EQ(r["token_ids"].get<std::vector<int32_t>>(), GenerateAlone(model, prompt, request));
      EXPECT_EQ(r["finish_reason"], "length");
      EXPECT_EQ(r["usage"]["completion_tokens"], request["max_tokens"]);
      EXPECT_GT(r["timings"]["total_s"].get<double>(), 0);
      ++generate;
    }
  }
  EXPECT_GT(generate, 0);
  EXPECT_GT(score, 0);
  EXPECT_EQ(errors, 2);
  // The line that is not JSON: its record has no id, and names its line.
  bool found = false;
  for (const auto& [key, r] : records) {
    if (r["id"].is_null() && r.value("error", "").rfind("not JSON: ", 0) == 0) found = true;
  }
  EXPECT_TRUE(found) << "no record for the line that is not JSON";
}

// Whether any process of the group `pgid` is left.
inline bool GroupAlive(pid_t pgid) { return kill(-pgid, 0) == 0; }

// Whether `path` can be locked (flock, as `deltaserve batch` locks its
// output) within `limit`; a file that does not exist counts as unlocked.
inline bool WaitUnlocked(const std::string& path, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  do {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return true;
    const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    ::close(fd);  // releases the lock if taken
    if (free) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < end);
  return false;
}

inline int64_t CountLines(const std::string& path) {
  const std::string text = ReadFile(path);
  return std::count(text.begin(), text.end(), '\n');
}

// Runs `command` (a batch job writing `output`) and kills it with SIGKILL at
// a random moment: once it has written 0 to `max_records` more records,
// plus 0-30 ms (so some kills land while a record is being written and
// others while the engine is between records or still loading). Starts it
// again, `kills` times, then lets the last run finish. Returns the number
// of runs killed (a run that finishes first ends the sequence early).
inline int KillAndResume(const std::string& command, const std::string& output, int kills,
                         int max_records, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<int> records(0, max_records);
  std::uniform_int_distribution<int> extra_ms(0, 30);
  const std::string dir = TempDir("batch_kill");
  int killed = 0;
  for (int attempt = 0; attempt <= kills; ++attempt) {
    const int64_t before = CountLines(output);
    auto job = ChildProcess::Start(command, absl::StrCat(dir, "/log", attempt));
    if (attempt == kills) {
      const std::optional<int> code = job->Wait(std::chrono::minutes(5));
      EXPECT_EQ(code, 0) << job->Log();
      return killed;
    }
    const int64_t target = before + records(random);
    std::optional<int> code;
    while (!(code = job->Wait(std::chrono::milliseconds(1))) && CountLines(output) < target) {
    }
    const int ms = extra_ms(random);
    if (!code) code = job->Wait(std::chrono::milliseconds(ms));
    if (code) {
      EXPECT_EQ(*code, 0) << job->Log();
      return killed;
    }
    job->Signal(SIGKILL);
    job->Wait(std::chrono::seconds(30));
    // Every process of the job gone, and with them the lock on the output.
    // An MPI job's ranks can outlive the launcher's process group (Open MPI
    // may start them in groups of their own) until they notice it died, so
    // the lock itself is what is waited for.
    for (int i = 0; i < 500 && GroupAlive(job->pid()); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(WaitUnlocked(output, std::chrono::seconds(60)))
        << output << " still locked a minute after the job was killed";
    std::printf("run %d killed after %lld new records and %d ms\n", attempt,
                static_cast<long long>(CountLines(output) - before), ms);
    ++killed;
  }
  return killed;
}

}  // namespace deltaserve::testing
