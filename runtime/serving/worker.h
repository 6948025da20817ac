// The worker side of the coordinator link. Every rank of a replica calls
// RunWorker. The leader (stage 0, TP rank 0) opens the Attach stream, sends
// its hello, and for each step plan it receives broadcasts the plan to the
// replica's ranks; each rank runs its stage of the step (StepExecutor), the
// output rank sends the sampled tokens to the leader, every rank reports
// what it holds, and the leader answers the coordinator. When the link ends
// the leader tells its ranks and all return.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/status.h"
#include "runtime/engine/step_executor.h"
#include "runtime/model/config.h"

namespace deltaserve {

struct WorkerOptions {
  // The leader's channel to the coordinator (null on other ranks).
  std::shared_ptr<grpc::Channel> channel;
  std::string description;  // for the coordinator's log
  // How long to wait for the coordinator to be up; 0 for a channel that
  // cannot wait (the in-process one of `serve`).
  double connect_timeout_s = 60;
};

// Returns OK when the coordinator ended the link (shutdown), an error when it
// refused the worker or the link broke.
absl::Status RunWorker(StepExecutor& executor, const ModelConfig& config,
                       const WorkerOptions& options);

}  // namespace deltaserve
