#include "runtime/serving/write_watchdog.h"

#include <algorithm>

namespace deltaserve {

WriteWatchdog::WriteWatchdog(std::chrono::milliseconds timeout)
    : timeout_(timeout), thread_([this] { Loop(); }) {}

WriteWatchdog::~WriteWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

WriteWatchdog::Watch::Watch(WriteWatchdog& dog, grpc::ServerContextBase& context) : dog_(dog) {
  std::lock_guard<std::mutex> lock(dog_.mu_);
  id_ = dog_.next_id_++;
  dog_.writes_.emplace(id_, Entry{&context, std::chrono::steady_clock::now() + dog_.timeout_});
  dog_.cv_.notify_all();  // the thread may be waiting with nothing to watch
}

WriteWatchdog::Watch::~Watch() {
  std::lock_guard<std::mutex> lock(dog_.mu_);
  dog_.writes_.erase(id_);
}

bool WriteWatchdog::Watch::fired() const {
  std::lock_guard<std::mutex> lock(dog_.mu_);
  auto it = dog_.writes_.find(id_);
  return it != dog_.writes_.end() && it->second.fired;
}

void WriteWatchdog::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    auto next = std::chrono::steady_clock::time_point::max();
    for (auto& [id, e] : writes_) {
      if (e.fired) continue;
      if (e.deadline <= now) {
        // Under mu_: the Watch, and so the RPC, outlives this call.
        e.context->TryCancel();
        e.fired = true;
      } else {
        next = std::min(next, e.deadline);
      }
    }
    if (next == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, next);
    }
  }
}

}  // namespace deltaserve
