// The worker side of the coordinator link. Every rank of a replica calls
// RunWorker. The leader (stage 0, TP rank 0) opens the Attach stream, sends
// its hello, and runs each step it receives on the replica
// (runtime/engine/replica.h), answering with the step's result; the other
// ranks follow the leader. When the link ends the leader stops its ranks and
// all return.
#pragma once

#include <grpcpp/channel.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "runtime/engine/replica.h"
#include "runtime/model/config.h"

namespace deltaserve {

struct WorkerOptions {
  // The leader's channel to the coordinator (null on other ranks).
  std::shared_ptr<grpc::Channel> channel;
  std::string description;        // for the coordinator's log
  double connect_timeout_s = 60;  // waiting for the coordinator to be up
};

// Returns OK when the coordinator ended the link (shutdown), an error when it
// refused the worker or the link broke.
absl::Status RunWorker(Replica& replica, const ModelConfig& config, const WorkerOptions& options);

}  // namespace deltaserve
