// deploy/slurm/batch.sbatch under a real one-node Slurm: a JSONL file of
// generate and score requests runs through `deltaserve batch` as one MPI step
// of 2 pipeline stages (srun --mpi=pmix); the output has one record per id,
// with the tokens the single-process `generate` gives; submitted again after
// losing part of its output, the job redoes only the missing ids and keeps
// the records it has, byte for byte.
#include <fstream>
#include <map>
#include <sstream>

#include "nlohmann/json.hpp"
#include "tests/slurm/slurm_cluster.h"

namespace deltaserve {
namespace {

using nlohmann::json;
using testing::WaitUntil;

std::string Deltaserve() { return testing::BinPath("deltaserve"); }
std::string Model() { return testing::GoldenPath("model/kimi-linear-tiny"); }

std::string Join(const std::vector<int32_t>& tokens) {
  std::string out;
  for (int32_t t : tokens) out += (out.empty() ? "" : ",") + std::to_string(t);
  return out;
}

// The ids `deltaserve generate FLAGS --ids` prints, one process, no Slurm.
std::vector<int64_t> GenerateIds(const std::string& flags) {
  std::string output;
  EXPECT_EQ(testing::RunCommand(
                Deltaserve() + " generate --model " + Model() + " " + flags + " --ids 2>/dev/null",
                &output),
            0)
      << output;
  std::istringstream in(output);
  std::vector<int64_t> ids;
  for (int64_t id; in >> id;) ids.push_back(id);
  return ids;
}

// The output's lines by id; a failure for a line that is not a JSON object
// with an id, or an id twice.
std::map<std::string, std::string> ReadRecords(const std::string& path) {
  std::map<std::string, std::string> records;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("id")) {
      ADD_FAILURE() << "not a record with an id: " << line;
      continue;
    }
    const std::string id = record["id"].get<std::string>();
    EXPECT_EQ(records.count(id), 0u) << "id " << id << " twice";
    records[id] = line;
  }
  return records;
}

class BatchSlurmTest : public testing::SlurmTest {
 protected:
  // Submits batch.sbatch (2 stages: 2 tasks, more than a 2-core machine
  // spares: --overcommit) and waits until the job has left the queue;
  // returns its final state.
  std::string RunBatch(const std::string& input, const std::string& output) {
    const std::string job =
        Submit(std::string("--ntasks=2 --overcommit ") + DELTASERVE_SOURCE_DIR +
               "/deploy/slurm/batch.sbatch --model " + Model() + " --bin " + Deltaserve() +
               " --input " + input + " --output " + output + " --pp 2 --batch-args '--threads 1'");
    if (job.empty()) return "not submitted";
    EXPECT_TRUE(WaitUntil([&] { return QueueState(job).empty(); }, std::chrono::seconds(120)))
        << JobLog(job);
    last_log_ = JobLog(job);
    return FinalState(job);
  }
  std::string last_log_;
};

TEST_F(BatchSlurmTest, AJsonlFileRunsAsOneMpiStepAndResumes) {
  const std::vector<int32_t> long_prompt = testing::RandomTokens(600, 7);
  const std::vector<int32_t> document = testing::RandomTokens(80, 8);
  const std::vector<json> requests = {
      {{"id", "long"}, {"task", "generate"}, {"tokens", long_prompt}, {"max_tokens", 12}},
      {{"id", "sampled"},
       {"task", "generate"},
       {"tokens", {1, 2, 3}},
       {"max_tokens", 16},
       {"temperature", 0.8},
       {"top_p", 0.9},
       {"seed", 5}},
      {{"id", "text"}, {"task", "generate"}, {"text", "hello"}, {"max_tokens", 8}},
      {{"id", "doc"}, {"task", "score"}, {"tokens", document}},
  };
  // The same requests through `deltaserve generate`.
  std::map<std::string, std::vector<int64_t>> expected = {
      {"long", GenerateIds("--tokens " + Join(long_prompt) + " --max-tokens 12")},
      {"sampled",
       GenerateIds("--tokens 1,2,3 --max-tokens 16 --temperature 0.8 --top-p 0.9 --seed 5")},
      {"text", GenerateIds("--prompt hello --max-tokens 8")},
  };
  const std::string input = dir_ + "/requests.jsonl";
  const std::string output = dir_ + "/results.jsonl";
  {
    std::ofstream out(input);
    for (const json& r : requests) out << r.dump() << "\n";
  }

  ASSERT_EQ(RunBatch(input, output), "COMPLETED") << last_log_;
  std::map<std::string, std::string> first = ReadRecords(output);
  ASSERT_EQ(first.size(), requests.size()) << testing::ReadWholeFile(output);
  for (const auto& [id, tokens] : expected) {
    ASSERT_TRUE(first.count(id)) << id;
    const json record = json::parse(first[id]);
    ASSERT_TRUE(record.contains("token_ids")) << first[id];
    EXPECT_EQ(record["token_ids"].get<std::vector<int64_t>>(), tokens) << first[id];
  }
  ASSERT_TRUE(first.count("doc"));
  const json scored = json::parse(first["doc"]);
  EXPECT_FALSE(scored.contains("error")) << first["doc"];
  EXPECT_EQ(scored["logprobs"].size(), document.size() - 1) << first["doc"];

  // As if the job had died after two records: submitted again, it completes
  // the other two and keeps the two it has.
  {
    std::ofstream out(output, std::ios::trunc);
    out << first["long"] << "\n" << first["doc"] << "\n";
  }
  ASSERT_EQ(RunBatch(input, output), "COMPLETED") << last_log_;
  EXPECT_NE(last_log_.find("wrote 2 records (0 errors) to " + output), std::string::npos)
      << last_log_;
  EXPECT_NE(last_log_.find("2 records (0 errors) were there from before"), std::string::npos)
      << last_log_;
  std::map<std::string, std::string> second = ReadRecords(output);
  ASSERT_EQ(second.size(), requests.size()) << testing::ReadWholeFile(output);
  // Byte for byte: their timings would differ had they run again.
  EXPECT_EQ(second["long"], first["long"]);
  EXPECT_EQ(second["doc"], first["doc"]);
  for (const char* id : {"sampled", "text"}) {
    EXPECT_EQ(json::parse(second[id])["token_ids"], json::parse(first[id])["token_ids"]) << id;
  }
  EXPECT_TRUE(JobProcesses().empty()) << Describe(JobProcesses());
}

}  // namespace
}  // namespace deltaserve
