// The embedded worker of `deltaserve serve`: the whole model in this process,
// attached to the coordinator like any worker but without a link. Each step
// runs on the coordinator's scheduler thread the moment it is sent and its
// result goes straight back to the scheduler, so a decode step costs no
// thread hand-offs and no serialisation on top of the model's own work; the
// step code (Replica) is the one remote workers run.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "runtime/engine/replica.h"
#include "runtime/serving/coordinator.h"

namespace deltaserve {

class LocalWorker final : public WorkerConnection {
 public:
  // `threads`: compute threads for the steps (0: one per core). The replica
  // and coordinator must outlive the worker's attachment.
  LocalWorker(Replica& replica, Coordinator& coordinator, int threads)
      : replica_(replica), coordinator_(coordinator), threads_(threads) {}

  // Registers with the coordinator (it refuses as it would a remote worker).
  absl::Status Attach(const ModelConfig& config, const std::string& description);
  absl::StatusOr<std::optional<StepResult>> Send(const Step& step) override;
  bool Inline() const override { return true; }

 private:
  Replica& replica_;
  Coordinator& coordinator_;
  const int threads_;
};

}  // namespace deltaserve
