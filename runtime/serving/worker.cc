#include "runtime/serving/worker.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "deltaserve/v1/worker.grpc.pb.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/worker_codec.h"

namespace deltaserve {
namespace {

absl::Status RunLeader(Replica& replica, const ModelConfig& config, const WorkerOptions& options) {
  auto stub = v1::WorkerLink::NewStub(options.channel);
  grpc::ClientContext context;
  // Wait for the coordinator to come up rather than failing at once.
  context.set_wait_for_ready(true);
  if (!options.channel->WaitForConnected(
          std::chrono::system_clock::now() +
          std::chrono::milliseconds(static_cast<int64_t>(options.connect_timeout_s * 1e3)))) {
    (void)replica.Stop();
    return absl::UnavailableError(
        absl::StrCat("cannot reach the coordinator within ", options.connect_timeout_s, " s"));
  }
  auto stream = stub->Attach(&context);
  v1::WorkerMessage hello;
  *hello.mutable_hello() = MakeWorkerHello(config, replica.layout(), options.description);
  absl::Status status = absl::OkStatus();
  if (!stream->Write(hello)) {
    status = absl::UnavailableError("the coordinator closed the link before the hello");
  }
  v1::CoordinatorMessage message;
  bool told_to_stop = false;
  const size_t pp = static_cast<size_t>(replica.layout().pp);
  while (status.ok() && stream->Read(&message)) {
    if (message.has_refused()) {
      status = absl::FailedPreconditionError(
          absl::StrCat("the coordinator refused this worker: ", message.refused()));
      break;
    }
    if (message.step().shutdown()) {
      told_to_stop = true;
      break;
    }
    auto step = StepFromProto(message.step());
    if (!step.ok()) {
      status = step.status();
      break;
    }
    DELTASERVE_RETURN_IF_ERROR(replica.Start(*step));
    // With more to come, answer the older steps only: the later stages are
    // still working on them while this rank starts the next step.
    const size_t keep = step->more_coming ? pp - 1 : 0;
    bool link_ok = true;
    while (replica.outstanding() > keep && link_ok) {
      DELTASERVE_ASSIGN_OR_RETURN(StepResult result, replica.Collect());
      v1::WorkerMessage reply;
      ResultToProto(result, reply.mutable_result());
      link_ok = stream->Write(reply);
    }
    if (!link_ok) break;
  }
  DELTASERVE_RETURN_IF_ERROR(replica.Stop());
  stream->WritesDone();
  const grpc::Status finish = stream->Finish();
  if (finish.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(
        absl::StrCat("the coordinator refused this worker's credentials (--worker-token-file): ",
                     finish.error_message()));
  }
  if (!status.ok()) return status;
  if (!finish.ok() && !told_to_stop) {
    return absl::UnavailableError(
        absl::StrCat("the link to the coordinator ended: ", finish.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWorker(Replica& replica, const ModelConfig& config, const WorkerOptions& options) {
  if (replica.is_leader()) return RunLeader(replica, config, options);
  return replica.Follow();
}

}  // namespace deltaserve
