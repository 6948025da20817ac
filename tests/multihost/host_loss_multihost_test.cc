// Losing a host, on test hosts (tests/multihost/test_hosts.h): a coordinator
// on host 0, replica A a PP2 MPI worker job over hosts 1 and 2, replica B a
// worker on host 3, clients on host 0. While requests run on both replicas,
// host 2 dies (every process killed) or its link goes down (a partition:
// its processes live on). The coordinator notices within seconds (a broken
// connection; a step overdue by the cost model's deadline), A's requests
// run again on B, and every request ends with the tokens `deltaserve
// generate` gives it alone: nothing lost, nothing duplicated. A's job ends
// by itself (cut off, once its link is back), and started again it serves.
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/multihost/test_hosts.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;

std::string Model() { return testing::GoldenPath("model/k3-tiny"); }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The first line of a `--ids` run's output.
std::string FirstLine(const std::string& output) { return output.substr(0, output.find('\n')); }

struct Request {
  std::string flags;     // prompt and sampling
  std::string expected;  // the ids `generate` prints alone
  std::unique_ptr<testing::ChildProcess> client;
  std::string log;
};

class HostLossTest : public ::testing::TestWithParam<bool> {};

// GetParam(): true, host 2's processes are killed; false, its link goes down.
TEST_P(HostLossTest, ARequestOfTheLostReplicaEndsOnTheOtherWithItsTokens) {
  const bool kill = GetParam();
  const std::string bin = testing::BinPath("deltaserve");
  const std::string dir = testing::TempDir("host_loss");
  // Long enough that replica A is still generating when its host goes (this
  // machine's fastest CPUs decode k3-tiny's 1,000 tokens in 1.4 s on A).
  constexpr int kMaxTokens = 2000;
  std::vector<Request> requests(4);
  for (size_t r = 0; r < requests.size(); ++r) {
    requests[r].flags = absl::StrCat("--tokens 1,2,", r + 3, " --max-tokens ", kMaxTokens,
                                     r % 2 ? " --temperature 0.9 --seed 7" : "", " --ids");
    std::string out;
    ASSERT_EQ(testing::RunCommand(absl::StrCat(bin, " generate --threads 1 --model ", Model(), " ",
                                               requests[r].flags, " 2>/dev/null"),
                                  &out),
              0)
        << out;
    requests[r].expected = FirstLine(out);
  }

  testing::TestHosts hosts(4);
  ASSERT_EQ(hosts.size(), 4);
  const std::string port_file = dir + "/port";
  // A step is due within 10 times the cost model's expectation (or the
  // replica's recent steps), but at least --step-timeout-floor: its default
  // (5 s), so a partition shows within seconds as operators get it.
  auto coordinator =
      hosts.Start(0,
                  absl::StrCat(bin, " coordinator --model ", Model(), " --host ", hosts.address(0),
                               " --port 0 --worker-port 0 --port-file ", port_file, " --insecure"),
                  dir + "/coordinator.log");
  const auto started = Clock::now();
  while (!std::ifstream(port_file).good() && Clock::now() - started < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int port = 0, metrics_port = 0, worker_port = 0;
  std::ifstream(port_file) >> port >> metrics_port >> worker_port;
  ASSERT_GT(worker_port, 0) << ReadAll(dir + "/coordinator.log");
  const std::string server = absl::StrCat(hosts.address(0), ":", port);
  const std::string worker = absl::StrCat(bin, " worker --coordinator ", hosts.address(0), ":",
                                          worker_port, " --model ", Model(), " --threads 1");
  auto replica_a =
      hosts.Start(1, absl::StrCat("mpirun ", hosts.MpirunFlags({1, 2}, 1), " ", worker, " --pp 2"),
                  dir + "/a.log");
  auto replica_b = hosts.Start(3, worker, dir + "/b.log");
  // Whether both replicas are attached (within a minute).
  auto BothAttached = [&] {
    std::string status;
    for (int i = 0; i < 600 && status.find("\"workers\":2") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      testing::RunCommand(hosts.On(0, bin + " client status --json --server " + server) + " 2>&1",
                          &status);
    }
    return status.find("\"workers\":2") != std::string::npos;
  };
  ASSERT_TRUE(BothAttached()) << ReadAll(dir + "/coordinator.log");

  for (size_t r = 0; r < requests.size(); ++r) {
    requests[r].log = absl::StrCat(dir, "/request", r, ".log");
    requests[r].client = hosts.Start(
        0, absl::StrCat(bin, " client generate --server ", server, " ", requests[r].flags),
        requests[r].log);
  }
  // Both replicas are generating: A has served steps of its own.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  const auto fault = Clock::now();
  if (kill) {
    hosts.KillAll(2);
  } else {
    hosts.SetLink(2, false);
  }
  for (Request& r : requests) {
    const std::optional<int> rc = r.client->Wait(std::chrono::seconds(90));
    ASSERT_TRUE(rc.has_value()) << "a request did not end: " << ReadAll(dir + "/coordinator.log");
    EXPECT_EQ(*rc, 0) << ReadAll(r.log);
    EXPECT_EQ(FirstLine(ReadAll(r.log)), r.expected) << r.flags;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - fault).count();
  const std::string log = ReadAll(dir + "/coordinator.log");
  std::printf("host 2 %s: every request done %.1f s after\n", kill ? "killed" : "cut off", seconds);
  // Noticed as the fault it was, and A's requests ran again.
  EXPECT_NE(log.find(kill ? "lost: its connection broke" : "lost: no answer to a step within"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("queued to run again"), std::string::npos) << log;
  // The partition within the floor and the re-run's time, not the 300 s of
  // --step-timeout (nor the 30 s of a floor that took no account of how
  // long steps take).
  EXPECT_LT(seconds, 25) << log;

  // Replica A's job ends by itself: killed, with its host; cut off, its
  // leader gives up on the rank that does not answer once the coordinator
  // has dropped it, and the job ends when the link is back (mpirun cannot
  // tell the cut-off host's ranks before).
  if (!kill) {
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (ReadAll(dir + "/a.log").find("ending the job") == std::string::npos &&
           Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_NE(ReadAll(dir + "/a.log").find("does not answer"), std::string::npos)
        << ReadAll(dir + "/a.log");
    hosts.SetLink(2, true);
  }
  const std::optional<int> a_rc = replica_a->Wait(std::chrono::seconds(40));
  std::printf("replica A's job %s %.1f s after the fault\n", a_rc ? "ended" : "still runs",
              std::chrono::duration<double>(Clock::now() - fault).count());
  EXPECT_TRUE(a_rc.has_value()) << ReadAll(dir + "/a.log");
  if (a_rc) {
    EXPECT_NE(*a_rc, 0);
  }

  // Started again over the hosts (as serve.sbatch restarts a replica whose
  // step ended), A attaches and serves beside B.
  replica_a =
      hosts.Start(1, absl::StrCat("mpirun ", hosts.MpirunFlags({1, 2}, 1), " ", worker, " --pp 2"),
                  dir + "/a2.log");
  EXPECT_TRUE(BothAttached()) << ReadAll(dir + "/a2.log");
  std::string out;
  EXPECT_EQ(testing::RunCommand(hosts.On(0, absl::StrCat(bin, " client generate --server ", server,
                                                         " ", requests[0].flags)) +
                                    " 2>/dev/null",
                                &out),
            0);
  EXPECT_EQ(FirstLine(out), requests[0].expected);
  for (int i = 0; i < hosts.size(); ++i) hosts.KillAll(i);
}

INSTANTIATE_TEST_SUITE_P(Faults, HostLossTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Killed" : "CutOff"; });

}  // namespace
}  // namespace deltaserve
