// The worker side of the coordinator link. Every rank of a replica calls
// RunWorker. The leader (stage 0, TP rank 0) opens the Attach stream, sends
// its hello, and for each step plan it receives broadcasts the plan to the
// replica's ranks; each rank runs its stage of the step (StepExecutor), the
// output rank sends the sampled tokens to the leader, every rank reports
// what it holds, and the leader answers the coordinator. When the link ends
// the leader tells its ranks and all return.
#pragma once

#include <grpcpp/channel.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "deltaserve/v1/worker.pb.h"
#include "runtime/engine/step_executor.h"
#include "runtime/model/config.h"

namespace deltaserve {

struct WorkerOptions {
  // The leader's channel to the coordinator (null on other ranks).
  std::shared_ptr<grpc::Channel> channel;
  std::string description;        // for the coordinator's log
  double connect_timeout_s = 60;  // waiting for the coordinator to be up
};

// What one rank reports to the leader after each step.
struct RankReport {
  int64_t kda_bytes = 0, mla_bytes = 0, sequences = 0;
  int32_t stage = 0;
  double compute_s = 0;
};

// This rank's part of a step: ExecuteStep runs the plan's work here (every
// rank of the replica, in plan order) and sends the output rank's tokens
// and this rank's report to the leader; on the leader, CollectStep then
// gathers them into the step's result. The leader may execute later plans
// before collecting an earlier one (messages between two ranks keep order).
struct LocalStep {
  uint64_t step_id = 0;
  std::string error;       // the executor refused the step
  v1::StepResult outputs;  // on the output rank
  RankReport report;
};
absl::StatusOr<LocalStep> ExecuteStep(StepExecutor& executor, const v1::StepPlan& plan);
absl::Status CollectStep(StepExecutor& executor, LocalStep local, v1::StepResult* result);

// Both at once: runs one step plan on this rank (every rank of the replica calls it with
// the same plan). On the leader, fills `result` with the output rank's tokens
// and every rank's held state; a step the executor refused is reported in
// result->error(). An error return means this rank's communication failed
// and the job cannot go on.
absl::Status RunStep(StepExecutor& executor, const v1::StepPlan& plan, v1::StepResult* result);

v1::WorkerHello MakeWorkerHello(const ModelConfig& config, const WorldLayout& layout,
                                const std::string& description);

// Returns OK when the coordinator ended the link (shutdown), an error when it
// refused the worker or the link broke.
absl::Status RunWorker(StepExecutor& executor, const ModelConfig& config,
                       const WorkerOptions& options);

}  // namespace deltaserve
