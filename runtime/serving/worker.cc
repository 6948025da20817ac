#include "runtime/serving/worker.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "deltaserve/v1/worker.grpc.pb.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/worker_codec.h"

namespace deltaserve {

void LeaveSignal::Request(std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (requested_) return;
  requested_ = true;
  why_ = std::move(why);
  if (!busy_ && idle_) SayLocked();
}

bool LeaveSignal::requested() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requested_;
}

bool LeaveSignal::said() const {
  std::lock_guard<std::mutex> lock(mu_);
  return said_;
}

void LeaveSignal::Open(std::function<void(const std::string&)> say) {
  std::lock_guard<std::mutex> lock(mu_);
  say_ = std::move(say);
  if (requested_ && !busy_ && idle_) SayLocked();
}

void LeaveSignal::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  say_ = nullptr;
}

bool LeaveSignal::BeginStep() {
  std::lock_guard<std::mutex> lock(mu_);
  if (said_) return false;
  busy_ = true;
  return true;
}

void LeaveSignal::EndStep(bool idle) {
  std::lock_guard<std::mutex> lock(mu_);
  busy_ = false;
  idle_ = idle;
  if (requested_ && idle_) SayLocked();
}

void LeaveSignal::SayLocked() {
  if (said_ || !say_) return;
  said_ = true;
  say_(why_);
}

namespace {

absl::Status RunLeader(Replica& replica, const ModelConfig& config, const WorkerOptions& options) {
  auto stub = v1::WorkerLink::NewStub(options.channel);
  grpc::ClientContext context;
  // Wait for the coordinator to come up rather than failing at once.
  context.set_wait_for_ready(true);
  // In slices, so that a worker asked to leave meanwhile does.
  const auto connect_by =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(options.connect_timeout_s * 1e3));
  while (!options.channel->WaitForConnected(
      std::min(connect_by, std::chrono::system_clock::now() + std::chrono::milliseconds(200)))) {
    if (options.leave != nullptr && options.leave->requested()) return replica.Stop();
    if (std::chrono::system_clock::now() >= connect_by) {
      (void)replica.Stop();
      return absl::UnavailableError(
          absl::StrCat("cannot reach the coordinator within ", options.connect_timeout_s, " s"));
    }
  }
  auto stream = stub->Attach(&context);
  v1::WorkerMessage hello;
  *hello.mutable_hello() = MakeWorkerHello(config, replica.layout(), options.description);
  absl::Status status = absl::OkStatus();
  if (!stream->Write(hello)) {
    status = absl::UnavailableError("the coordinator closed the link before the hello");
  }
  // Leaving is written between steps only (LeaveSignal), so never at the same
  // time as a result.
  LeaveSignal no_leave;
  LeaveSignal& leave = options.leave != nullptr ? *options.leave : no_leave;
  leave.Open([&](const std::string& why) {
    v1::WorkerMessage bye;
    bye.set_leaving(why);
    stream->Write(bye);
  });
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
    // Once it has said it is leaving, it runs nothing more: the coordinator
    // has given its requests to others and ends the stream.
    if (!leave.BeginStep()) continue;
    bool link_ok = true;
    // Answers the oldest step started.
    const auto answer = [&]() -> absl::Status {
      DELTASERVE_ASSIGN_OR_RETURN(StepResult result, replica.Collect());
      v1::WorkerMessage reply;
      ResultToProto(result, reply.mutable_result());
      link_ok = stream->Write(reply);
      return absl::OkStatus();
    };
    // A step sent ahead feeds tokens sampled by steps still running here:
    // those are answered first.
    absl::Status started = absl::OkStatus();
    while (started.ok() && link_ok && replica.outstanding() > 0 && !replica.FeedsReady(*step)) {
      started = answer();
    }
    if (started.ok() && link_ok) started = replica.Start(*step);
    // With more to come, answer the older steps only: the later stages are
    // still working on them while this rank starts the next step. Asked to
    // leave, answer them all.
    const size_t keep = step->more_coming && !leave.requested() ? pp - 1 : 0;
    while (started.ok() && link_ok && replica.outstanding() > keep) started = answer();
    if (!started.ok()) {
      leave.Close();
      return started;
    }
    leave.EndStep(replica.outstanding() == 0);
    if (!link_ok) break;
  }
  leave.Close();
  const bool left = leave.said();
  DELTASERVE_RETURN_IF_ERROR(replica.Stop());
  stream->WritesDone();
  const grpc::Status finish = stream->Finish();
  if (finish.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(
        absl::StrCat("the coordinator refused this worker's credentials (--worker-token-file): ",
                     finish.error_message()));
  }
  if (!status.ok()) return status;
  if (left) {
    std::fprintf(stderr, "deltaserve worker: detached from the coordinator\n");
    return absl::OkStatus();
  }
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
