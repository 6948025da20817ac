// The worker side of the coordinator link. Every rank of a replica calls
// RunWorker. The leader (stage 0, TP rank 0) opens the Attach stream, sends
// its hello, and runs each step it receives on the replica
// (runtime/engine/replica.h), answering with the step's result; the other
// ranks follow the leader. When the link ends the leader stops its ranks and
// all return. Asked to leave (SIGTERM, through LeaveSignal), the leader
// answers every step it has started, tells the coordinator it is leaving
// (which runs its requests elsewhere) and detaches cleanly.
#pragma once

#include <grpcpp/channel.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "runtime/engine/replica.h"
#include "runtime/model/config.h"

namespace deltaserve {

// How a worker is asked to leave. Request() may come from any thread (a
// signal waiter); the leader's loop uses the rest. Leaving is said once,
// between steps: at once when the leader is idle with nothing in flight,
// otherwise when its current steps are answered.
class LeaveSignal {
 public:
  void Request(std::string why);
  bool requested() const;

  // The leader's side. Open: a link is up and `say` tells the coordinator
  // (called under this object's lock, never while a step runs). Close: it
  // is going. BeginStep: false once leaving was said (run nothing more).
  // EndStep: the step's answers are written; `idle`: none in flight.
  void Open(std::function<void(const std::string&)> say);
  void Close();
  bool BeginStep();
  void EndStep(bool idle);
  bool said() const;

 private:
  void SayLocked();
  mutable std::mutex mu_;
  bool requested_ = false, busy_ = false, idle_ = true, said_ = false;
  std::string why_;
  std::function<void(const std::string&)> say_;
};

struct WorkerOptions {
  // The leader's channel to the coordinator (null on other ranks).
  std::shared_ptr<grpc::Channel> channel;
  std::string description;        // for the coordinator's log
  double connect_timeout_s = 60;  // waiting for the coordinator to be up
  LeaveSignal* leave = nullptr;   // the leader's: asks it to detach (may be null)
  // The coordinator's address, and whether `channel` does TLS: a plaintext
  // channel to a TLS port fails at once, saying so.
  std::string target;
  bool tls = false;
};

// Returns OK when the coordinator ended the link (shutdown) or the worker
// left, an error when it refused the worker or the link broke.
absl::Status RunWorker(Replica& replica, const ModelConfig& config, const WorkerOptions& options);

}  // namespace deltaserve
