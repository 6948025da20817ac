// A network link of a given one-way delay and rate between two TAP devices,
// for bench/network_bench.sh: a frame written into one device comes out of
// the other once the link has carried it (its bits at RATE, after the frames
// before it) and DELAY has passed, in both directions. The kernel of this
// machine has no netem or fq qdisc to delay packets, so the delay is held
// here; each TAP device is then moved into a test host's network namespace.
//
//   link_emulator TAP_A TAP_B [DELAY_US] [RATE_MBIT]    (default 0 0: none)
//
// Prints "ready" once both devices exist. On SIGTERM or SIGINT it stops and
// prints, per direction, the frames and bytes it carried, those it dropped
// (its queue holds 4 MiB, a switch port's buffer), and how late frames left
// against their due time (the sleep's precision, which bounds how small a
// delay it can give).
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace deltaserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "usage: link_emulator TAP_A TAP_B [DELAY_US] [RATE_MBIT]\n"
    "A link of one-way delay DELAY_US and rate RATE_MBIT (0: none) between two TAP\n"
    "devices it creates; prints \"ready\", runs until SIGTERM, then prints what it\n"
    "carried. For bench/network_bench.sh (root).\n";
constexpr size_t kQueueBytes = 4 << 20;
constexpr size_t kFrameBytes = 65536;

std::atomic<bool> stop{false};

int OpenTap(const std::string& name) {
  const int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "link_emulator: /dev/net/tun: %s\n", std::strerror(errno));
    return -1;
  }
  ifreq request{};
  request.ifr_flags = IFF_TAP | IFF_NO_PI;
  std::strncpy(request.ifr_name, name.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &request) != 0) {
    std::fprintf(stderr, "link_emulator: cannot create TAP device %s: %s\n", name.c_str(),
                 std::strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

// One direction of the link: frames read from `in`, written to `out` when due.
class Direction {
 public:
  Direction(int in, int out, std::chrono::nanoseconds delay, int64_t rate_mbit)
      : in_(in), out_(out), delay_(delay), rate_mbit_(rate_mbit) {}

  void Read() {
    std::vector<char> buffer(kFrameBytes);
    while (!stop) {
      pollfd p{in_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = read(in_, buffer.data(), buffer.size());
      if (n <= 0) continue;
      const auto now = Clock::now();
      std::lock_guard<std::mutex> lock(mutex_);
      if (queued_bytes_ + n > kQueueBytes) {
        ++dropped_;
        continue;
      }
      // Serialization: the frame's bits leave after those queued before it.
      Clock::time_point sent = std::max(now, wire_free_);
      if (rate_mbit_ > 0) sent += std::chrono::nanoseconds(n * 8 * 1000 / rate_mbit_);
      wire_free_ = sent;
      queue_.push_back({sent + delay_, std::vector<char>(buffer.begin(), buffer.begin() + n)});
      queued_bytes_ += n;
      ready_.notify_one();
    }
  }

  void Write() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop) {
      if (queue_.empty()) {
        ready_.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
      const Clock::time_point due = queue_.front().due;
      if (Clock::now() < due) {
        ready_.wait_until(lock, due);
        continue;
      }
      Frame frame = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= frame.bytes.size();
      lock.unlock();
      const auto late = Clock::now() - frame.due;
      const bool written = write(out_, frame.bytes.data(), frame.bytes.size()) > 0;
      lock.lock();
      if (!written) {
        ++dropped_;
        continue;
      }
      ++frames_;
      bytes_ += static_cast<int64_t>(frame.bytes.size());
      late_total_ += late;
      late_max_ = std::max(late_max_, std::chrono::duration_cast<std::chrono::nanoseconds>(late));
    }
  }

  void Report(const char* name) {
    std::lock_guard<std::mutex> lock(mutex_);
    const double mean_us =
        frames_ == 0 ? 0.0
                     : std::chrono::duration<double, std::micro>(late_total_).count() / frames_;
    std::printf(
        "%s: %lld frames, %lld bytes, %lld dropped; late by %.1f us on average, %.1f us"
        " at most\n",
        name, static_cast<long long>(frames_), static_cast<long long>(bytes_),
        static_cast<long long>(dropped_), mean_us,
        std::chrono::duration<double, std::micro>(late_max_).count());
  }

 private:
  struct Frame {
    Clock::time_point due;
    std::vector<char> bytes;
  };
  const int in_, out_;
  const std::chrono::nanoseconds delay_;
  const int64_t rate_mbit_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Frame> queue_;
  size_t queued_bytes_ = 0;
  Clock::time_point wire_free_{};
  int64_t frames_ = 0, bytes_ = 0, dropped_ = 0;
  Clock::duration late_total_{};
  std::chrono::nanoseconds late_max_{};
};

bool ParseCount(const char* text, int64_t* value) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < 0 || v > (int64_t{1} << 40)) return false;
  *value = v;
  return true;
}

int Main(int argc, char** argv) {
  if (argc >= 2 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  int64_t delay_us = 0, rate_mbit = 0;
  if (argc < 3 || argc > 5 || (argc > 3 && !ParseCount(argv[3], &delay_us)) ||
      (argc > 4 && !ParseCount(argv[4], &rate_mbit))) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const int a = OpenTap(argv[1]);
  const int b = a < 0 ? -1 : OpenTap(argv[2]);
  if (b < 0) return 1;
  // The sleeps wake when due, not up to 50 us later, and the link's threads
  // run as soon as they wake, before the processes it carries traffic for
  // (real-time priority; root): a link does not wait for a free core.
  prctl(PR_SET_TIMERSLACK, 1);
  sched_param priority{};
  priority.sched_priority = 10;
  if (sched_setscheduler(0, SCHED_FIFO, &priority) != 0) {
    std::fprintf(stderr, "link_emulator: no real-time priority (%s): frames may leave late\n",
                 std::strerror(errno));
  }
  struct sigaction action {};
  action.sa_handler = [](int) { stop = true; };
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  const auto delay = std::chrono::microseconds(delay_us);
  Direction forward(a, b, delay, rate_mbit), backward(b, a, delay, rate_mbit);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { forward.Read(); });
  threads.emplace_back([&] { forward.Write(); });
  threads.emplace_back([&] { backward.Read(); });
  threads.emplace_back([&] { backward.Write(); });
  std::printf("ready\n");
  std::fflush(stdout);
  for (std::thread& t : threads) t.join();
  forward.Report((std::string(argv[1]) + " -> " + argv[2]).c_str());
  backward.Report((std::string(argv[2]) + " -> " + argv[1]).c_str());
  return 0;
}

}  // namespace
}  // namespace deltaserve::bench

int main(int argc, char** argv) { return deltaserve::bench::Main(argc, argv); }
