#include "runtime/serving/local_worker.h"

#include <memory>

#include "kernels/threads.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {

absl::Status LocalWorker::Attach(const ModelConfig& config, const std::string& description) {
  // The coordinator holds the connection; this object stays owned by the caller.
  std::shared_ptr<WorkerConnection> self(this, [](WorkerConnection*) {});
  return coordinator_
      .AttachWorker(MakeWorkerInfo(config, replica_.layout(), description, replica_.state_size(),
                                   replica_.state_unit_bytes()),
                    self)
      .status();
}

absl::StatusOr<std::optional<StepResult>> LocalWorker::Send(const Step& step) {
  // The thread count is a per-thread OpenMP setting: set it on the thread
  // that runs the steps.
  thread_local bool threads_set = false;
  if (!threads_set) {
    kernels::SetNumThreads(threads_);
    threads_set = true;
  }
  DELTASERVE_ASSIGN_OR_RETURN(StepResult result, replica_.Run(step));
  return std::optional<StepResult>(std::move(result));
}

}  // namespace deltaserve
