#include "runtime/serving/local_worker.h"

#include <chrono>
#include <memory>

#include "kernels/threads.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/worker.h"

namespace deltaserve {

absl::Status LocalWorker::Attach(const ModelConfig& config, const std::string& description) {
  // The coordinator holds the sender; this object stays owned by the caller.
  std::shared_ptr<WorkerSender> self(this, [](WorkerSender*) {});
  DELTASERVE_ASSIGN_OR_RETURN(
      id_, coordinator_.AttachWorker(
               MakeWorkerHello(config, executor_.stage().layout(), description), self));
  return absl::OkStatus();
}

bool LocalWorker::Send(const v1::CoordinatorMessage& message) {
  if (!message.has_step() || message.step().shutdown()) return true;
  // The thread count is a per-thread OpenMP setting: set it on the thread
  // that runs the steps.
  thread_local bool threads_set = false;
  if (!threads_set) {
    kernels::SetNumThreads(threads_);
    threads_set = true;
  }
  const auto start = std::chrono::steady_clock::now();
  v1::StepResult result;
  if (!RunStep(executor_, message.step(), &result).ok()) return false;
  result.set_wall_s(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  coordinator_.OnStepResult(id_, std::move(result));
  return true;
}

}  // namespace deltaserve
