// Cancels a streaming RPC whose client has stopped reading (or, for a
// callback-API stream, sending). A synchronous ServerWriter::Write blocks
// once the client's flow-control window is full, which holds the RPC's
// thread and its request's state for as long as the client likes; a Watch
// around each Write lets one background thread TryCancel() the RPC after
// `timeout`, so that Write returns false and the service ends the request
// (GenerationService::Generate). A callback stream holds a Watch over each
// read or write it has started (reflection.cc): the cancel fails that
// operation, and the stream finishes.
#pragma once

#include <grpcpp/server_context.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

namespace deltaserve {

class WriteWatchdog {
 public:
  explicit WriteWatchdog(std::chrono::milliseconds timeout);
  ~WriteWatchdog();  // stops the thread; no Watch may be alive
  WriteWatchdog(const WriteWatchdog&) = delete;
  WriteWatchdog& operator=(const WriteWatchdog&) = delete;

  double timeout_seconds() const { return timeout_.count() / 1e3; }

  // Alive for the duration of one Write on `context`'s stream.
  class Watch {
   public:
    Watch(WriteWatchdog& dog, grpc::ServerContextBase& context);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    // Whether the watchdog cancelled the RPC because this write took too
    // long: read after the Write returned.
    bool fired() const;

   private:
    WriteWatchdog& dog_;
    uint64_t id_;
  };

 private:
  struct Entry {
    grpc::ServerContextBase* context;
    std::chrono::steady_clock::time_point deadline;
    bool fired = false;
  };
  void Loop();

  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Entry> writes_;
  std::thread thread_;
};

}  // namespace deltaserve
