// The embedded worker of `deltaserve serve`: the whole model in this process,
// attached to the coordinator like any worker but without a link. Each step
// plan runs on the coordinator's scheduler thread the moment it is sent, so a
// decode step costs no thread hand-offs and no serialisation on top of the
// model's own work; the step code (RunStep) is the one remote workers run.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "runtime/engine/step_executor.h"
#include "runtime/serving/coordinator.h"

namespace deltaserve {

class LocalWorker final : public WorkerSender {
 public:
  // `threads`: compute threads for the steps (0: one per core). The executor
  // and coordinator must outlive the worker's attachment.
  LocalWorker(StepExecutor& executor, Coordinator& coordinator, int threads)
      : executor_(executor), coordinator_(coordinator), threads_(threads) {}

  // Registers with the coordinator (it refuses as it would a remote worker).
  absl::Status Attach(const ModelConfig& config, const std::string& description);
  bool Send(const v1::CoordinatorMessage& message) override;

 private:
  StepExecutor& executor_;
  Coordinator& coordinator_;
  const int threads_;
  uint64_t id_ = 0;
};

}  // namespace deltaserve
