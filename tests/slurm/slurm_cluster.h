// For the slurm and multihost tests: a fixture that starts a Slurm cluster
// (tests/slurm/test_cluster.sh: munged, slurmctld and slurmd from Debian's
// packages, every file in a temp directory, on free ports), one node on this
// machine unless a fixture made from it says which test hosts to use, and
// stops it after each test, failed or not, leaving no process behind.
//
// The processes of the cluster's jobs are recognised by their environment:
// SLURM_CONF names this cluster's slurm.conf (sbatch passes the test's
// environment on, slurmd gives it to every slurmstepd) and, but for
// slurmstepd itself, SLURM_JOB_ID is set. If the test process dies (its ctest
// timeout), the cluster script notices and cleans up the same way.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace deltaserve::testing {

// A process of this cluster's jobs: a slurmstepd, a batch script, an srun
// inside a job, a task.
struct JobProcess {
  pid_t pid = 0;
  std::string comm;     // /proc/PID/comm
  std::string cmdline;  // arguments joined by spaces
  std::map<std::string, std::string> env;
};

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Polls `done` every 100 ms until it holds or `limit` passes.
template <typename Predicate>
bool WaitUntil(Predicate done, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

class SlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // slurmd starts each slurmstepd as an orphan; with this process as their
    // reaper they are reaped in TearDown, not left as zombies until init
    // gets to them.
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    dir_ = TempDir("slurm");
    conf_ = dir_ + "/slurm.conf";
    cluster_ = ChildProcess::Start("bash " + std::string(DELTASERVE_SOURCE_DIR) +
                                       "/tests/slurm/test_cluster.sh " + dir_ + " " + test_hosts_,
                                   dir_ + "/cluster.log");
    ASSERT_NE(cluster_, nullptr);
    const bool ready = WaitUntil(
        [&] { return std::filesystem::exists(dir_ + "/ready") || cluster_->Wait({}).has_value(); },
        std::chrono::seconds(60));
    ASSERT_TRUE(ready && std::filesystem::exists(dir_ + "/ready")) << "the cluster did not start:\n"
                                                                   << cluster_->Log();
    // For sbatch, squeue, scancel and, through sbatch, the jobs. Open MPI
    // ranks yield while they wait, so ranks sharing a core do not starve each
    // other.
    setenv("SLURM_CONF", conf_.c_str(), 1);
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 1);
  }

  void TearDown() override {
    unsetenv("SLURM_CONF");
    unsetenv("OMPI_MCA_mpi_yield_when_idle");
    if (cluster_ != nullptr) StopCluster();
    // The exited slurmstepd processes, now this process's children.
    WaitUntil(
        [] {
          while (waitpid(-1, nullptr, WNOHANG) > 0) {
          }
          return waitpid(-1, nullptr, WNOHANG) < 0;  // ECHILD: no child left
        },
        std::chrono::seconds(10));
    prctl(PR_SET_CHILD_SUBREAPER, 0);
  }

  void StopCluster() {
    // The script cancels the jobs and stops the daemons by pid; only it, not
    // its process group, gets the signal, so it can do that in order.
    kill(cluster_->pid(), SIGTERM);
    if (!cluster_->Wait(std::chrono::seconds(90))) {
      ADD_FAILURE() << "the cluster script did not stop within 90 s:\n" << cluster_->Log();
      cluster_->Signal(SIGKILL);
      cluster_->Wait(std::chrono::seconds(10));
    }
    // Nothing of the cluster may be left: its daemons...
    std::istringstream pids(ReadWholeFile(dir_ + "/pids"));
    std::string name;
    pid_t pid;
    while (pids >> name >> pid) {
      if (Alive(pid) && ReadWholeFile("/proc/" + std::to_string(pid) + "/comm") == name + "\n") {
        ADD_FAILURE() << name << " (pid " << pid << ") outlived the cluster script";
        kill(pid, SIGKILL);
      }
    }
    // ...and its jobs' processes.
    for (const JobProcess& p : JobProcesses()) {
      ADD_FAILURE() << "left behind: pid " << p.pid << " " << p.cmdline;
      kill(p.pid, SIGKILL);
    }
    if (HasFailure()) std::cerr << "cluster log:\n" << cluster_->Log();
  }

  // sbatch --parsable ARGS, its output in JobLog(job): the job id, or ""
  // (and a failure).
  std::string Submit(const std::string& args) {
    std::string output;
    const int rc =
        RunCommand(Slurm("sbatch --parsable --output=" + dir_ + "/job-%j.log " + args), &output);
    EXPECT_EQ(rc, 0) << output;
    if (rc != 0) return "";
    while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
    const size_t semicolon = output.find(';');  // "id;cluster" on a federation
    return output.substr(0, semicolon);
  }

  std::string JobLog(const std::string& job) const {
    return ReadWholeFile(dir_ + "/job-" + job + ".log");
  }

  // The job's state while squeue lists it (RUNNING, COMPLETING...), "" after.
  std::string QueueState(const std::string& job) const {
    std::string output;
    RunCommand(Slurm("squeue -h -j " + job + " -o %T 2>/dev/null"), &output);
    while (!output.empty() && output.back() == '\n') output.pop_back();
    return output;
  }

  // The job's final state as slurmctld keeps it (COMPLETED, CANCELLED,
  // FAILED...).
  std::string FinalState(const std::string& job) const {
    std::string output;
    RunCommand(Slurm("scontrol show job -o " + job), &output);
    const size_t at = output.find("JobState=");
    if (at == std::string::npos) return "unknown: " + output;
    return output.substr(at + 9, output.find(' ', at) - at - 9);
  }

  // The names of the job's running steps, sorted, e.g.
  // "batch deltaserve-coordinator deltaserve-replica-0".
  std::string StepNames(const std::string& job) const {
    std::string output;
    RunCommand(Slurm("squeue -h -s -j " + job + " -o %j") + " | sort | tr '\\n' ' '", &output);
    while (!output.empty() && output.back() == ' ') output.pop_back();
    return output;
  }

  std::vector<JobProcess> JobProcesses() const {
    std::vector<JobProcess> found;
    const std::string marker = "SLURM_CONF=" + conf_;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string name = entry.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      JobProcess p;
      p.pid = std::stoi(name);
      const std::string environ = ReadWholeFile(entry.path() / "environ");
      bool ours = false;
      for (size_t start = 0; start < environ.size();) {
        size_t end = environ.find('\0', start);
        if (end == std::string::npos) end = environ.size();
        const std::string var = environ.substr(start, end - start);
        if (var == marker) ours = true;
        const size_t eq = var.find('=');
        if (eq != std::string::npos) p.env[var.substr(0, eq)] = var.substr(eq + 1);
        start = end + 1;
      }
      if (!ours) continue;
      p.comm = ReadWholeFile(entry.path() / "comm");
      if (!p.comm.empty()) p.comm.pop_back();
      if (p.comm != "slurmstepd" && !p.env.count("SLURM_JOB_ID")) continue;
      p.cmdline = ReadWholeFile(entry.path() / "cmdline");
      for (char& c : p.cmdline) c = c == '\0' ? ' ' : c;
      found.push_back(std::move(p));
    }
    return found;
  }

  // "pid: command line" per line, for failure messages.
  static std::string Describe(const std::vector<JobProcess>& processes) {
    std::string text;
    for (const JobProcess& p : processes) {
      text += std::to_string(p.pid) + ": " + p.cmdline + "\n";
    }
    return text;
  }

  static bool Alive(pid_t pid) {
    const std::string stat = ReadWholeFile("/proc/" + std::to_string(pid) + "/stat");
    const size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
  }

  // A Slurm command line, run where slurmctld can be reached.
  std::string Slurm(const std::string& command) const { return on_controller_(command); }

  // Set before SetUp for a cluster of test hosts: test_cluster.sh's
  // "HOSTS CONTROLLER NODE...", and what runs a command on CONTROLLER.
  std::string test_hosts_;
  std::function<std::string(const std::string&)> on_controller_ = [](const std::string& command) {
    return command;
  };
  std::string dir_;   // the cluster's files; the tests' files too
  std::string conf_;  // dir_/slurm.conf
  std::unique_ptr<ChildProcess> cluster_;
};

}  // namespace deltaserve::testing
