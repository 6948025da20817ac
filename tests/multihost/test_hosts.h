// For the multihost tests: N test hosts on this machine, each a network
// namespace with its own loopback and one veth link to a bridge the fixture
// creates, addressed 10.213.0.(i+1)/24 on that link only (no route anywhere
// else), and with its own hostname where tests/multihost/netns_agent.sh
// starts a process in it (a UTS namespace). Every name carries the test's
// pid: the destructor removes the namespaces and links, and a fixture made
// later removes any left by a test that was killed before its destructor
// ran (its pid gone). Either way, a process still running in a namespace is
// killed (by the pids `ip netns pids` lists) before it is removed.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "tests/test_util.h"

namespace deltaserve::testing {

class TestHosts {
 public:
  // Fails the test (and makes no host) when namespaces cannot be made: the
  // multihost tests need root.
  explicit TestHosts(int n) : tag_(std::to_string(::getpid())) {
    RemoveStale();
    Must(absl::StrCat("ip link add ", Bridge(), " type bridge && ip link set ", Bridge(), " up"));
    made_bridge_ = true;
    std::ofstream hosts(hosts_file());
    for (int i = 0; i < n; ++i) {
      const std::string ns = Namespace(i), veth = Veth(i), in = "ip netns exec " + ns + " ";
      Must("ip netns add " + ns);
      namespaces_.push_back(ns);
      Must(absl::StrCat("ip link add ", veth, " type veth peer name eth0 netns ", ns,
                        " && ip link set ", veth, " master ", Bridge(), " up && ", in,
                        "ip addr add ", address(i), "/24 dev eth0 && ", in,
                        "ip link set eth0 up && ", in, "ip link set lo up"));
      hosts << address(i) << " " << ns << " " << hostname(i) << "\n";
    }
  }
  ~TestHosts() {
    for (size_t i = 0; i < namespaces_.size(); ++i) {
      RemoveNamespace(namespaces_[i]);
      Run("ip link del " + Veth(static_cast<int>(i)));  // gone with the namespace, or now
    }
    if (made_bridge_) Run("ip link del " + Bridge());
    std::remove(hosts_file().c_str());
  }
  TestHosts(const TestHosts&) = delete;
  TestHosts& operator=(const TestHosts&) = delete;

  int size() const { return static_cast<int>(namespaces_.size()); }
  std::string address(int i) const { return absl::StrCat("10.213.0.", i + 1); }
  std::string hostname(int i) const { return absl::StrCat("host", i); }
  const std::string& ns(int i) const { return namespaces_[i]; }
  // Bytes host i has sent over its link.
  int64_t SentBytes(int i) const {
    // The bridge's side of the veth receives what the host sends.
    std::ifstream in("/sys/class/net/" + Veth(i) + "/statistics/rx_bytes");
    int64_t bytes = -1;
    in >> bytes;
    return bytes;
  }
  // `command` run on host i (its namespace and hostname), as a shell command
  // line; mpirun there reaches the other hosts through netns_agent.sh.
  std::string On(int i, const std::string& command) const {
    return absl::StrCat("env DELTASERVE_TEST_HOSTS=", hosts_file(), " ip netns exec ", ns(i),
                        " unshare --uts sh -c 'hostname ", hostname(i), " && ",
                        absl::StrReplaceAll(command, {{"'", "'\\''"}}), "'");
  }
  // The file of these hosts, a line each: `ADDRESS NAMESPACE HOSTNAME`.
  std::string hosts_file() const { return absl::StrCat("/tmp/deltaserve-test-hosts-", tag_); }
  // The index of the host process `pid` runs on, -1 for none of them.
  int HostOf(pid_t pid) const {
    std::string name;
    RunCommand(absl::StrCat("ip netns identify ", pid, " 2>/dev/null"), &name);
    while (!name.empty() && isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    for (int i = 0; i < size(); ++i) {
      if (name == namespaces_[i]) return i;
    }
    return -1;
  }
  // mpirun's flags for these hosts: `slots` processes on each of `hosts`
  // (in order: ranks fill the first, then the next), started through the
  // agent, their messages over TCP on the links only, bound to no core (each
  // host's daemon sees the machine's cores as its own and would bind the
  // ranks of every host to the same ones).
  std::string MpirunFlags(const std::vector<int>& hosts, int slots) const {
    std::string list;
    for (int i : hosts) absl::StrAppend(&list, list.empty() ? "" : ",", address(i), ":", slots);
    return absl::StrCat("--allow-run-as-root --oversubscribe --mca plm_rsh_agent ",
                        DELTASERVE_SOURCE_DIR,
                        "/tests/multihost/netns_agent.sh --mca btl tcp,self "
                        "--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "
                        "--bind-to none -np ",
                        hosts.size() * slots, " --host ", list);
  }
  // `command` started on host i in the background, its output to `log`.
  std::unique_ptr<ChildProcess> Start(int i, const std::string& command,
                                      const std::string& log) const {
    return ChildProcess::Start(On(i, command), log);
  }
  // Every process of host i killed (SIGKILL, by pid), as when it dies.
  void KillAll(int i) const { Run("ip netns pids " + ns(i) + " | xargs -r kill -9"); }
  // Host i's link down (a partition: its processes live on), or up again.
  void SetLink(int i, bool up) const {
    Must(absl::StrCat("ip link set ", Veth(i), up ? " up" : " down"));
  }

 private:
  static constexpr char kPrefix[] = "dsh";  // namespaces dsh<pid>-<i>; links dsb<pid>, dsv<pid>x<i>

  std::string Bridge() const { return absl::StrCat("dsb", tag_); }
  std::string Veth(int i) const { return absl::StrCat("dsv", tag_, "x", i); }
  std::string Namespace(int i) const { return absl::StrCat(kPrefix, tag_, "-", i); }

  static int Run(const std::string& command) {
    std::string output;
    return RunCommand(command + " 2>&1", &output);
  }
  static void Must(const std::string& command) {
    std::string output;
    const int rc = RunCommand(command + " 2>&1", &output);
    if (rc != 0) ADD_FAILURE() << command << ": " << output;
  }
  // Stops what still runs in the namespace (by pid), then removes it.
  static void RemoveNamespace(const std::string& ns) {
    Run("ip netns pids " + ns + " | xargs -r kill -9");
    Run("ip netns del " + ns);
  }
  // Namespaces and links of test processes that are gone.
  static void RemoveStale() {
    std::string listing;
    RunCommand("ip netns list 2>/dev/null; ip -o link show 2>/dev/null", &listing);
    for (absl::string_view line : absl::StrSplit(listing, '\n')) {
      for (const char* prefix : {"dsh", "dsb", "dsv"}) {
        const size_t at = line.find(prefix);
        if (at == std::string::npos) continue;
        size_t end = at + 3;
        while (end < line.size() && isdigit(static_cast<unsigned char>(line[end]))) ++end;
        if (end == at + 3) continue;
        const pid_t pid = std::stoi(std::string(line.substr(at + 3, end - at - 3)));
        if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
        size_t name_end = end;
        while (name_end < line.size() &&
               (isalnum(static_cast<unsigned char>(line[name_end])) || line[name_end] == '-')) {
          ++name_end;
        }
        const std::string name(line.substr(at, name_end - at));
        if (std::string(prefix) == "dsh") {
          RemoveNamespace(name);
        } else {
          Run("ip link del " + name);
        }
      }
    }
  }

  const std::string tag_;
  bool made_bridge_ = false;
  std::vector<std::string> namespaces_;
};

}  // namespace deltaserve::testing
