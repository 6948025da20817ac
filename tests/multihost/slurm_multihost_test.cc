// deploy/slurm/ on a Slurm cluster of test hosts (tests/multihost/
// test_hosts.h, tests/slurm/test_cluster.sh): slurmctld on host0 and a slurmd
// on each of host1 and host2, each in its own network namespace under its own
// hostname. `sbatch -N 2` of serve.sbatch puts the coordinator and a
// replica's first stage on host1 and its second stage on host2, the stage
// boundary crosses host1's link, and a client on host3 gets the tokens one
// process gives; batch.sbatch over the two nodes writes those tokens too.
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/model/config.h"
#include "tests/multihost/test_hosts.h"
#include "tests/slurm/slurm_cluster.h"

namespace deltaserve {
namespace {

using nlohmann::json;
using testing::JobProcess;
using testing::WaitUntil;

std::string Deltaserve() { return testing::BinPath("deltaserve"); }
std::string Model() { return testing::GoldenPath("model/kimi-linear-tiny"); }

std::vector<int64_t> Ids(const std::string& text) {
  std::istringstream in(text);
  std::vector<int64_t> ids;
  for (int64_t id; in >> id;) ids.push_back(id);
  return ids;
}

// The ids `deltaserve generate FLAGS --ids` prints, one process, no Slurm.
std::vector<int64_t> GenerateIds(const std::string& flags) {
  std::string output;
  EXPECT_EQ(testing::RunCommand(
                Deltaserve() + " generate --model " + Model() + " " + flags + " --ids 2>/dev/null",
                &output),
            0)
      << output;
  return Ids(output);
}

// The bytes of a float32 stage boundary for `tokens` prompt tokens: a row of
// the hidden state each.
int64_t BoundaryBytes(int64_t tokens) {
  auto config = LoadModelConfig(Model());
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? tokens * config->hidden_size * 4 : 0;
}

class SlurmMultihostTest : public testing::SlurmTest {
 protected:
  void SetUp() override {
    hosts_ = std::make_unique<testing::TestHosts>(4);
    ASSERT_EQ(hosts_->size(), 4);
    test_hosts_ = hosts_->hosts_file() + " host0 host1 host2";
    on_controller_ = [this](const std::string& command) { return hosts_->On(0, command); };
    SlurmTest::SetUp();
  }
  void TearDown() override {
    SlurmTest::TearDown();
    hosts_.reset();
  }

  // sbatch of `script` over both nodes, a task each, with `flags`.
  std::string SubmitOverTwoNodes(const std::string& script, const std::string& flags) {
    return Submit(absl::StrCat("--nodes=2 --ntasks=2 --ntasks-per-node=1 ", DELTASERVE_SOURCE_DIR,
                               "/deploy/slurm/", script, " --model ", Model(), " --bin ",
                               Deltaserve(), " --pp 2 ", flags));
  }

  // The job's deltaserve processes whose command line has `what`.
  std::vector<JobProcess> Processes(const std::string& job, const std::string& what) const {
    std::vector<JobProcess> found;
    for (JobProcess& p : JobProcesses()) {
      if (p.comm == "deltaserve" && p.env["SLURM_JOB_ID"] == job &&
          p.cmdline.find(what) != std::string::npos) {
        found.push_back(std::move(p));
      }
    }
    return found;
  }

  std::unique_ptr<testing::TestHosts> hosts_;
};

TEST_F(SlurmMultihostTest, ServeSbatchPutsAReplicasStagesOnTwoNodes) {
  const std::string address_file = dir_ + "/address";
  const std::string secrets = dir_ + "/secrets";
  const std::string job =
      SubmitOverTwoNodes("serve.sbatch", "--address-file " + address_file + " --secrets-dir " +
                                             secrets + " --worker-args '--threads 1'");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(
      WaitUntil([&] { return std::filesystem::exists(address_file); }, std::chrono::seconds(60)))
      << "no coordinator address; job " << job << " is '" << QueueState(job) << "':\n"
      << JobLog(job);
  std::istringstream lines(testing::ReadWholeFile(address_file));
  std::string address, worker_address, metrics_address;
  lines >> address >> worker_address >> metrics_address;
  // The coordinator is on the job's first node, at that node's address.
  const std::string head = hosts_->address(1) + ":";
  for (const std::string& a : {address, worker_address, metrics_address}) {
    EXPECT_EQ(a.substr(0, head.size()), head) << testing::ReadWholeFile(address_file);
  }

  // Clients are on host3, which runs no part of the job.
  auto client = [&](const std::string& command, const std::string& flags, std::string* output) {
    return testing::RunCommand(
        hosts_->On(3, absl::StrCat(Deltaserve(), " client ", command, " --server ", address,
                                   " --token-file ", secrets, "/client.token ", flags)),
        output);
  };
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::string status;
        return client("status", "", &status) == 0 && status.find("workers: 1") != std::string::npos;
      },
      std::chrono::seconds(60)))
      << JobLog(job);

  // Where Slurm put each process: the coordinator and stage 0 on host1,
  // stage 1 on host2.
  const std::vector<JobProcess> coordinator = Processes(job, " coordinator ");
  ASSERT_EQ(coordinator.size(), 1u) << Describe(JobProcesses());
  EXPECT_EQ(hosts_->HostOf(coordinator[0].pid), 1);
  std::map<std::string, int> rank_host;
  for (const JobProcess& p : Processes(job, " worker ")) {
    rank_host[p.env.at("SLURM_PROCID")] = hosts_->HostOf(p.pid);
  }
  EXPECT_EQ(rank_host, (std::map<std::string, int>{{"0", 1}, {"1", 2}}))
      << Describe(JobProcesses());

  // A long prompt (prefill in several steps), greedy, and a short sampled
  // one, as one process gives them.
  const std::vector<int32_t> prompt = testing::RandomTokens(400, 11);
  const std::vector<std::string> requests = {
      "--tokens " + absl::StrJoin(prompt, ",") + " --max-tokens 12",
      "--tokens 1,2,3 --max-tokens 16 --temperature 0.8 --top-p 0.9 --seed 5",
  };
  const int64_t sent_before = hosts_->SentBytes(1);
  for (const std::string& request : requests) {
    SCOPED_TRACE(request.substr(0, 60));
    std::string got;
    ASSERT_EQ(client("generate", request + " --ids 2>/dev/null", &got), 0) << got;
    EXPECT_EQ(Ids(got), GenerateIds(request));
  }
  // Stage 0's activations went from host1 to host2 over host1's link.
  EXPECT_GE(hosts_->SentBytes(1) - sent_before, BoundaryBytes(prompt.size()));

  // Metrics where docs/slurm.md says: the coordinator's node's address,
  // reachable from another host.
  std::string metrics;
  EXPECT_EQ(testing::RunCommand(hosts_->On(3, "curl -sf http://" + metrics_address + "/metrics"),
                                &metrics),
            0);
  EXPECT_NE(metrics.find("deltaserve_workers_attached 1"), std::string::npos) << metrics;

  std::string output;
  ASSERT_EQ(testing::RunCommand(Slurm("scancel " + job), &output), 0) << output;
  EXPECT_TRUE(WaitUntil([&] { return QueueState(job).empty(); }, std::chrono::seconds(30)))
      << QueueState(job);
  EXPECT_TRUE(WaitUntil([&] { return JobProcesses().empty(); }, std::chrono::seconds(10)))
      << Describe(JobProcesses());
  EXPECT_EQ(FinalState(job), "CANCELLED");
}

TEST_F(SlurmMultihostTest, BatchSbatchRunsItsStagesOnTwoNodes) {
  const std::vector<int32_t> prompt = testing::RandomTokens(300, 12);
  const std::string input = dir_ + "/requests.jsonl";
  const std::string output = dir_ + "/results.jsonl";
  std::ofstream(input) << json{{"id", "long"}, {"tokens", prompt}, {"max_tokens", 10}}.dump()
                       << "\n"
                       << json{{"id", "sampled"},
                               {"tokens", {1, 2, 3}},
                               {"max_tokens", 12},
                               {"temperature", 0.8},
                               {"seed", 7}}
                              .dump()
                       << "\n";
  const int64_t sent_before = hosts_->SentBytes(1);
  const std::string job = SubmitOverTwoNodes(
      "batch.sbatch", "--input " + input + " --output " + output + " --batch-args '--threads 1'");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(WaitUntil([&] { return QueueState(job).empty(); }, std::chrono::seconds(120)))
      << JobLog(job);
  ASSERT_EQ(FinalState(job), "COMPLETED") << JobLog(job);
  EXPECT_NE(JobLog(job).find("on host[1-2]"), std::string::npos) << JobLog(job);
  // Its stage boundary crossed host1's link.
  EXPECT_GE(hosts_->SentBytes(1) - sent_before, BoundaryBytes(prompt.size()));

  const std::map<std::string, std::vector<int64_t>> expected = {
      {"long", GenerateIds("--tokens " + absl::StrJoin(prompt, ",") + " --max-tokens 10")},
      {"sampled", GenerateIds("--tokens 1,2,3 --max-tokens 12 --temperature 0.8 --seed 7")},
  };
  std::map<std::string, std::vector<int64_t>> got;
  std::ifstream in(output);
  for (std::string line; std::getline(in, line);) {
    const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(record.is_object() && record.contains("token_ids")) << line;
    got[record["id"].get<std::string>()] = record["token_ids"].get<std::vector<int64_t>>();
  }
  EXPECT_EQ(got, expected) << testing::ReadWholeFile(output);
  // The job's processes are gone, if not at once when the queue lets it go
  // (its steps' processes may still be exiting then).
  EXPECT_TRUE(WaitUntil([&] { return JobProcesses().empty(); }, std::chrono::seconds(10)))
      << Describe(JobProcesses());
}

}  // namespace
}  // namespace deltaserve
