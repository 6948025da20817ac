// deploy/slurm/serve.sbatch under a real one-node Slurm: the coordinator and
// replicas of 2 pipeline stages, each a job step started with
// `srun --mpi=pmix`, serve the tokens the single-process `generate` gives;
// scancel ends every step and process of the job; a replica whose rank dies
// is started again while the coordinator keeps the queued request; a second
// job attaches more replicas; SIGTERM to the script alone stops the job
// cleanly.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "tests/slurm/slurm_cluster.h"

namespace deltaserve {
namespace {

using testing::JobProcess;
using testing::WaitUntil;

// "1,2,3"
std::string Join(const std::vector<int32_t>& tokens) {
  std::string out;
  for (int32_t t : tokens) out += (out.empty() ? "" : ",") + std::to_string(t);
  return out;
}

std::string Deltaserve() { return testing::BinPath("deltaserve"); }
std::string Model() { return testing::GoldenPath("model/kimi-linear-tiny"); }

// The tokens `deltaserve generate` prints for `flags` (--tokens ... and
// sampling), one process, no Slurm.
std::string GenerateTokens(const std::string& flags) {
  std::string output;
  EXPECT_EQ(testing::RunCommand(
                Deltaserve() + " generate --model " + Model() + " " + flags + " --ids 2>/dev/null",
                &output),
            0)
      << output;
  return output;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class ServeSlurmTest : public testing::SlurmTest {
 protected:
  // Submits serve.sbatch for `replicas` replicas of 2 stages (2 ranks each,
  // more tasks than this machine's cores: --overcommit) and waits until they
  // have attached; returns the job id and sets address_.
  std::string StartServing(int replicas, const std::string& more_flags = "") {
    const std::string address_file = dir_ + "/address";
    secrets_ = dir_ + "/secrets";
    std::ostringstream args;
    args << "--ntasks=" << 2 * replicas << " --overcommit " << DELTASERVE_SOURCE_DIR
         << "/deploy/slurm/serve.sbatch --model " << Model() << " --bin " << Deltaserve()
         << " --replicas " << replicas << " --pp 2 --address-file " << address_file
         << " --secrets-dir " << secrets_ << " --worker-args '--threads 1' " << more_flags;
    const std::string job = Submit(args.str());
    if (job.empty()) return job;
    EXPECT_TRUE(
        WaitUntil([&] { return std::filesystem::exists(address_file); }, std::chrono::seconds(60)))
        << "no coordinator address; job " << job << " is '" << QueueState(job) << "':\n"
        << JobLog(job);
    // The client address, the worker address and the metrics address: free
    // ports by default, so that jobs on one node do not collide.
    std::istringstream addresses(testing::ReadWholeFile(address_file));
    addresses >> address_ >> worker_address_ >> metrics_address_;
    // Secure by default: the tokens are the job's user's alone.
    for (const char* name : {"client.token", "worker.token"}) {
      const std::string path = secrets_ + "/" + std::string(name);
      EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
                std::filesystem::perms::owner_read | std::filesystem::perms::owner_write)
          << path;
    }
    EXPECT_NE(JobLog(job).find("--token-file " + secrets_ + "/client.token"), std::string::npos)
        << JobLog(job);
    EXPECT_TRUE(WaitUntil([&] { return Workers() == replicas; }, std::chrono::seconds(60)))
        << Workers() << " workers attached, not " << replicas << ":\n"
        << JobLog(job);
    return job;
  }

  // GetServerStatus.workers (0 when the coordinator does not answer).
  int Workers() const {
    std::string output;
    if (testing::RunCommand(Deltaserve() + " client status --server " + address_ + TokenFlag(),
                            &output) != 0) {
      return 0;
    }
    std::smatch m;
    return std::regex_search(output, m, std::regex("workers: ([0-9]+)")) ? std::stoi(m[1]) : 0;
  }

  // `deltaserve client generate` with the job's client token.
  std::string ClientCommand(const std::string& flags) const {
    return Deltaserve() + " client generate --server " + address_ + TokenFlag() + " " + flags +
           " --ids 2>/dev/null";
  }
  std::string TokenFlag() const { return " --token-file " + secrets_ + "/client.token"; }

  std::string address_;          // the coordinator's client HOST:PORT, from --address-file
  std::string worker_address_;   // where workers attach, its second line
  std::string secrets_;          // the job's client.token and worker.token
  std::string metrics_address_;  // its third line
};

TEST_F(ServeSlurmTest, ReplicasServeGenerateTokensAndScancelStopsEverything) {
  const std::string job = StartServing(2);
  ASSERT_FALSE(job.empty());
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(StepNames(job),
            "batch deltaserve-coordinator deltaserve-replica-0 deltaserve-replica-1");
  // Without the job's client token the coordinator answers nothing.
  std::string refused;
  EXPECT_EQ(testing::RunCommand(Deltaserve() + " client status --server " + address_, &refused), 1);
  EXPECT_NE(refused.find("UNAUTHENTICATED"), std::string::npos) << refused;
  // Metrics on the coordinator's host, where docs/slurm.md says.
  ASSERT_EQ(metrics_address_.substr(0, metrics_address_.rfind(':')),
            address_.substr(0, address_.rfind(':')));
  std::string metrics;
  EXPECT_EQ(testing::RunCommand("curl -sf http://" + metrics_address_ + "/metrics", &metrics), 0);
  EXPECT_NE(metrics.find("deltaserve_workers_attached 2"), std::string::npos) << metrics;

  // Requests at once, so both replicas run some: greedy and sampled, a long
  // prompt (prefill in several steps) and short ones.
  const std::vector<std::string> requests = {
      "--tokens " + Join(testing::RandomTokens(400, 1)) + " --max-tokens 12",
      "--tokens " + Join(testing::RandomTokens(7, 2)) + " --max-tokens 16",
      "--tokens 1,2,3 --max-tokens 16 --temperature 0.8 --top-p 0.9 --seed 5",
      "--tokens " + Join(testing::RandomTokens(30, 3)) +
          " --max-tokens 8 --temperature 1.2 --top-k 20 --seed 9",
  };
  std::vector<std::unique_ptr<testing::ChildProcess>> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.push_back(testing::ChildProcess::Start(ClientCommand(requests[i]),
                                                   dir_ + "/client" + std::to_string(i)));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(requests[i].substr(0, 60));
    const std::string expected = GenerateTokens(requests[i]);
    ASSERT_EQ(clients[i]->Wait(std::chrono::seconds(60)), 0) << clients[i]->Log();
    EXPECT_EQ(clients[i]->Log(), expected);
    EXPECT_FALSE(expected.empty());
  }

  // scancel: SIGTERM to every step and the batch script. The coordinator
  // shuts down, the script stops without restarting anything, and nothing of
  // the job is left: no slurmstepd, srun or deltaserve.
  const auto cancelled = std::chrono::steady_clock::now();
  std::string output;
  ASSERT_EQ(testing::RunCommand("scancel " + job, &output), 0) << output;
  EXPECT_TRUE(WaitUntil([&] { return QueueState(job).empty(); }, std::chrono::seconds(30)))
      << QueueState(job);
  EXPECT_TRUE(WaitUntil([&] { return JobProcesses().empty(); }, std::chrono::seconds(10)))
      << Describe(JobProcesses());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cancelled).count();
  // Before KillWait (10 s in the test cluster) would SIGKILL what is left.
  EXPECT_LT(seconds, 10.0) << JobLog(job);
  EXPECT_EQ(FinalState(job), "CANCELLED");
  const std::string log = JobLog(job);
  EXPECT_NE(log.find("coordinator: Terminated, shutting down"), std::string::npos) << log;
  EXPECT_NE(log.find("serve.sbatch: stopped"), std::string::npos) << log;
  // A replica step may end before the script has taken the signal; it is
  // not started again.
  EXPECT_EQ(Count(log, ": started (srun pid"), 2) << log;
}

// In a directory others share, a secrets directory or an address file
// another user made first is refused, by name, before anything serves (the
// job once wrote its tokens into the first and left the second in place,
// sending clients where that user said).
TEST_F(ServeSlurmTest, ASecretsDirectoryOrAddressFileOfAnotherUserStopsTheJob) {
  const std::string theirs = dir_ + "/theirs.secrets";
  ASSERT_EQ(::mkdir(theirs.c_str(), 0777), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  const std::string planted = dir_ + "/planted.address";
  std::ofstream(planted) << "198.51.100.7:50051\n";
  ASSERT_EQ(::chown(planted.c_str(), 65534, 65534), 0);
  const std::string script = std::string("--ntasks=2 --overcommit ") + DELTASERVE_SOURCE_DIR +
                             "/deploy/slurm/serve.sbatch --model " + Model() + " --bin " +
                             Deltaserve() + " --pp 2";
  for (const auto& [flags, refusal] : std::vector<std::pair<std::string, std::string>>{
           {" --address-file " + dir_ + "/mine.address --secrets-dir " + theirs,
            "the secrets directory " + theirs + " is not this user's"},
           {" --address-file " + planted + " --secrets-dir " + dir_ + "/mine.secrets",
            "the address file " + planted + " exists and is not this user's"}}) {
    const std::string job = Submit(script + flags);
    ASSERT_FALSE(job.empty());
    EXPECT_TRUE(WaitUntil([&] { return QueueState(job).empty(); }, std::chrono::seconds(60)))
        << JobLog(job);
    EXPECT_NE(JobLog(job).find(refusal), std::string::npos) << JobLog(job);
    EXPECT_EQ(FinalState(job), "FAILED") << JobLog(job);
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/mine.address")) << JobLog(job);
  }
  EXPECT_TRUE(std::filesystem::is_empty(theirs));
  EXPECT_EQ(testing::ReadWholeFile(planted), "198.51.100.7:50051\n");
}

// Two serving jobs on one node: each takes free ports and publishes them,
// and each serves with its own tokens; the second's ranks run as many
// threads as the job has CPUs per task.
TEST_F(ServeSlurmTest, TwoJobsOnOneNodeServeSideBySide) {
  const std::string first = StartServing(1);
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(HasFailure());
  const std::string address_file = dir_ + "/second.address";
  const std::string second = Submit(std::string("--ntasks=2 --overcommit ") +
                                    DELTASERVE_SOURCE_DIR + "/deploy/slurm/serve.sbatch --model " +
                                    Model() + " --bin " + Deltaserve() + " --pp 2 --address-file " +
                                    address_file + " --secrets-dir " + dir_ + "/second.secrets");
  ASSERT_FALSE(second.empty());
  ASSERT_TRUE(
      WaitUntil([&] { return std::filesystem::exists(address_file); }, std::chrono::seconds(60)))
      << JobLog(second);
  std::istringstream lines(testing::ReadWholeFile(address_file));
  std::string address, worker_address, metrics_address;
  lines >> address >> worker_address >> metrics_address;
  const std::set<std::string> ports = {address,  worker_address,  metrics_address,
                                       address_, worker_address_, metrics_address_};
  EXPECT_EQ(ports.size(), 6u) << testing::ReadWholeFile(address_file);

  const std::string request = "--tokens " + Join(testing::RandomTokens(20, 8)) + " --max-tokens 8";
  const std::string expected = GenerateTokens(request);
  const std::string second_client = Deltaserve() + " client generate --server " + address +
                                    " --token-file " + dir_ + "/second.secrets/client.token " +
                                    request + " --ids 2>/dev/null";
  std::string got;
  EXPECT_TRUE(WaitUntil([&] { return testing::RunCommand(second_client, &got) == 0; },
                        std::chrono::seconds(60)))
      << got << JobLog(second);
  EXPECT_EQ(got, expected);
  // Its ranks run as many threads as the job's CPUs per task (1 when not
  // given), not one per CPU of the node.
  EXPECT_NE(JobLog(second).find("(pp 2, tp 1), 1 thread a rank"), std::string::npos)
      << JobLog(second);
  ASSERT_EQ(testing::RunCommand(ClientCommand(request), &got), 0) << got;
  EXPECT_EQ(got, expected);
  // Each job's token is its own.
  EXPECT_NE(testing::RunCommand(Deltaserve() + " client generate --server " + address +
                                    TokenFlag() + " " + request + " 2>&1",
                                &got),
            0);
  EXPECT_NE(got.find("UNAUTHENTICATED"), std::string::npos) << got;
}

TEST_F(ServeSlurmTest, AReplicaWhoseRankDiesIsStartedAgain) {
  const std::string job = StartServing(1, "--restart-delay 2");
  ASSERT_FALSE(job.empty());
  ASSERT_FALSE(HasFailure());
  const std::string request =
      "--tokens " + Join(testing::RandomTokens(200, 4)) + " --max-tokens 12";
  const std::string expected = GenerateTokens(request);

  // Kill the replica's second rank (stage 1) outright: srun
  // --kill-on-bad-exit ends the step, the script starts it again.
  pid_t rank1 = 0;
  std::string step;
  for (const JobProcess& p : JobProcesses()) {
    if (p.env.count("SLURM_JOB_ID") && p.env.at("SLURM_JOB_ID") == job &&
        p.cmdline.find(" worker ") != std::string::npos && p.env.count("SLURM_PROCID") &&
        p.env.at("SLURM_PROCID") == "1") {
      rank1 = p.pid;
      step = p.env.count("SLURM_STEP_ID") ? p.env.at("SLURM_STEP_ID") : "";
    }
  }
  ASSERT_NE(rank1, 0) << "no rank 1 of a worker step among the job's processes";
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] { return Workers() == 0; }, std::chrono::seconds(20))) << JobLog(job);

  // With no worker attached a request waits in the coordinator's queue, and
  // runs once the new replica step attaches.
  auto queued = testing::ChildProcess::Start(ClientCommand(request), dir_ + "/queued");
  ASSERT_EQ(queued->Wait(std::chrono::seconds(60)), 0) << queued->Log() << JobLog(job);
  EXPECT_EQ(queued->Log(), expected);
  EXPECT_EQ(Workers(), 1);
  const std::string log = JobLog(job);
  EXPECT_NE(log.find("replica 0: ended"), std::string::npos) << log;
  EXPECT_NE(log.find("restart 1 of 100 in 2 s"), std::string::npos) << log;

  // A new step of the same job, under the same name.
  std::string new_step;
  for (const JobProcess& p : JobProcesses()) {
    if (p.cmdline.find(" worker ") != std::string::npos && p.env.count("SLURM_STEP_ID")) {
      new_step = p.env.at("SLURM_STEP_ID");
    }
  }
  EXPECT_NE(new_step, step);
  EXPECT_EQ(StepNames(job), "batch deltaserve-coordinator deltaserve-replica-0");
  std::string again;
  ASSERT_EQ(testing::RunCommand(ClientCommand(request), &again), 0) << again;
  EXPECT_EQ(again, expected);
  EXPECT_EQ(QueueState(job), "RUNNING");
}

TEST_F(ServeSlurmTest, AnAttachedJobAddsReplicasAndASignalledScriptStopsCleanly) {
  const std::string job = StartServing(1);
  ASSERT_FALSE(job.empty());
  ASSERT_FALSE(HasFailure());

  // A second job of replicas only, for the first job's coordinator.
  const std::string more =
      Submit(std::string("--ntasks=2 --overcommit ") + DELTASERVE_SOURCE_DIR +
             "/deploy/slurm/serve.sbatch --model " + Model() + " --bin " + Deltaserve() +
             " --pp 2 --attach " + worker_address_ + " --worker-token-file " + secrets_ +
             "/worker.token --worker-args '--threads 1'");
  ASSERT_FALSE(more.empty());
  ASSERT_TRUE(WaitUntil([&] { return Workers() == 2; }, std::chrono::seconds(60))) << JobLog(more);
  EXPECT_EQ(StepNames(more), "batch deltaserve-replica-0");
  const std::string request = "--tokens " + Join(testing::RandomTokens(50, 6)) + " --max-tokens 10";
  const std::string expected = GenerateTokens(request);
  for (int i = 0; i < 2; ++i) {
    std::string got;
    ASSERT_EQ(testing::RunCommand(ClientCommand(request), &got), 0) << got;
    EXPECT_EQ(got, expected);
  }

  // Cancelling it takes its replica away; the first job serves on.
  std::string output;
  ASSERT_EQ(testing::RunCommand("scancel " + more, &output), 0) << output;
  EXPECT_TRUE(WaitUntil([&] { return QueueState(more).empty(); }, std::chrono::seconds(30)));
  EXPECT_TRUE(WaitUntil([&] { return Workers() == 1; }, std::chrono::seconds(10)));
  ASSERT_EQ(testing::RunCommand(ClientCommand(request), &output), 0) << output;
  EXPECT_EQ(output, expected);

  // SIGTERM to the batch script alone (as `#SBATCH --signal=B:TERM@120` does
  // before a time limit): it stops the coordinator, which tells its worker to
  // exit, and the job completes with exit code 0.
  ASSERT_EQ(testing::RunCommand("scancel --batch --signal=TERM " + job, &output), 0) << output;
  EXPECT_TRUE(WaitUntil([&] { return QueueState(job).empty(); }, std::chrono::seconds(30)));
  EXPECT_TRUE(WaitUntil([&] { return JobProcesses().empty(); }, std::chrono::seconds(10)))
      << Describe(JobProcesses());
  EXPECT_EQ(FinalState(job), "COMPLETED");
  const std::string log = JobLog(job);
  EXPECT_NE(log.find("coordinator: Terminated, shutting down"), std::string::npos) << log;
  EXPECT_NE(log.find("worker 1 lost: its stream ended"), std::string::npos) << log;
  EXPECT_NE(log.find("serve.sbatch: stopped"), std::string::npos) << log;
}

}  // namespace
}  // namespace deltaserve
