#include "runtime/serving/worker.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "deltaserve/v1/worker.grpc.pb.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/common/log.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/tls_check.h"
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

// A peer's text for the log: every control byte written \xNN, the rest as
// it is (so that its words read as they were).
std::string EscapeControls(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(byte, absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  return out;
}

using Link = grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>;

// Reads the coordinator's messages on a thread of its own while the leader
// computes. gRPC's synchronous API advances a connection only while a thread
// waits on it: with the leader's one thread in a step longer than the
// keepalive, the link's pings went unanswered and gRPC ended it ("keepalive
// watchdog timeout"), so a long prefill chunk cost the worker its link.
class Inbox {
 public:
  Inbox(Link& link, grpc::ClientContext& context) : link_(link), context_(context) {}
  ~Inbox() { Close(std::chrono::milliseconds(0)); }

  absl::Status Start() {
    try {
      thread_ = std::thread([this] { Read(); });
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot start the thread that reads the coordinator's link: ", e.what()));
    }
    return absl::OkStatus();
  }
  // The next message; false once the link has ended.
  bool Pop(v1::CoordinatorMessage* message) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !messages_.empty() || ended_; });
    if (messages_.empty()) return false;
    *message = std::move(messages_.front());
    messages_.pop_front();
    cv_.notify_all();
    return true;
  }
  // Gives the link `grace` to end by itself (the coordinator ends it after a
  // shutdown or when this side is done writing), then cancels it; joins.
  void Close(std::chrono::milliseconds grace) {
    if (!thread_.joinable()) return;
    {
      std::unique_lock<std::mutex> lock(mu_);
      closing_ = true;
      cv_.notify_all();
      if (!cv_.wait_for(lock, grace, [&] { return ended_; })) context_.TryCancel();
    }
    thread_.join();
  }

 private:
  // The coordinator keeps a few steps in flight; more than this unread waits.
  static constexpr size_t kMaxUnread = 64;

  void Read() {
    v1::CoordinatorMessage message;
    while (link_.Read(&message)) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return messages_.size() < kMaxUnread || closing_; });
      messages_.push_back(std::move(message));
      cv_.notify_all();
    }
    std::unique_lock<std::mutex> lock(mu_);
    ended_ = true;
    cv_.notify_all();
    // The coordinator ended the link (it dropped this replica, or went):
    // the leader finishes its step, stops the other ranks and closes. One
    // that does not within kGiveUpAfter is blocked on a rank that cannot
    // answer (a lost host, a cut link), which would hold this job, and its
    // CPUs, forever: the job ends instead, as a failed rank ends it.
    if (!cv_.wait_for(lock, kGiveUpAfter, [&] { return closing_; })) {
      log::Error("worker",
                 absl::StrCat("the link to the coordinator ended and this replica's step has not "
                              "finished ",
                              kGiveUpAfter.count(),
                              " s later: a rank of this job does not answer (a lost host or "
                              "network link); ending the job"));
      AbortMpi(1);
    }
  }

  static constexpr std::chrono::seconds kGiveUpAfter{10};

  Link& link_;
  grpc::ClientContext& context_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::CoordinatorMessage> messages_;
  bool ended_ = false;
  bool closing_ = false;
  std::thread thread_;
};

absl::Status RunLeader(Replica& replica, const ModelConfig& config, const WorkerOptions& options) {
  auto stub = v1::WorkerLink::NewStub(options.channel);
  grpc::ClientContext context;
  // Wait for the coordinator to come up rather than failing at once.
  context.set_wait_for_ready(true);
  // In slices, so that a worker asked to leave meanwhile does.
  const auto connect_by =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(options.connect_timeout_s * 1e3));
  bool probed = false;
  while (!options.channel->WaitForConnected(
      std::min(connect_by, std::chrono::system_clock::now() + std::chrono::milliseconds(200)))) {
    if (options.leave != nullptr && options.leave->requested()) return replica.Stop();
    // A plaintext connection a TLS server closes fails without a word from
    // gRPC: asked once, the server says what it speaks.
    if (!probed && !options.tls && !options.target.empty() &&
        options.channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      probed = true;
      if (SpeaksTls(options.target, std::chrono::seconds(2))) {
        (void)replica.Stop();
        return absl::FailedPreconditionError(absl::StrCat(
            "the coordinator at ", options.target,
            " speaks TLS and this worker connects in plaintext: give --tls-ca (the CA of its "
            "certificate), and --tls-cert/--tls-key if it asks for a worker certificate"));
      }
    }
    if (std::chrono::system_clock::now() >= connect_by) {
      (void)replica.Stop();
      return absl::UnavailableError(
          absl::StrCat("cannot reach the coordinator within ", options.connect_timeout_s, " s"));
    }
  }
  auto stream = stub->Attach(&context);
  v1::WorkerMessage hello;
  *hello.mutable_hello() = MakeWorkerHello(config, replica.layout(), options.description,
                                           replica.state_size(), replica.state_unit_bytes());
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
  Inbox inbox(*stream, context);
  if (status.ok()) status = inbox.Start();
  v1::CoordinatorMessage message;
  bool told_to_stop = false;
  const size_t pp = static_cast<size_t>(replica.layout().pp);
  while (status.ok() && inbox.Pop(&message)) {
    if (message.has_refused()) {
      // The peer's text: its control bytes escaped (a rogue one's could
      // hold terminal escapes), and cut short.
      status = absl::FailedPreconditionError(
          absl::StrCat("the coordinator refused this worker: \"",
                       EscapeControls(message.refused().substr(0, 512)), "\""));
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
  // A coordinator that refused this worker, or sent what it cannot run,
  // need not end the stream: it is cancelled rather than waited on.
  if (!status.ok()) context.TryCancel();
  stream->WritesDone();
  inbox.Close(std::chrono::seconds(5));
  const grpc::Status finish = stream->Finish();
  if (finish.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(
        absl::StrCat("the coordinator refused this worker's credentials (--worker-token-file): ",
                     EscapeControls(finish.error_message().substr(0, 512))));
  }
  if (!status.ok()) return status;
  if (left) {
    log::Info("worker", "detached from the coordinator");
    return absl::OkStatus();
  }
  if (!finish.ok() && !told_to_stop) {
    return absl::UnavailableError(
        absl::StrCat("the link to the coordinator ended: ",
                     EscapeControls(finish.error_message().substr(0, 512))));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWorker(Replica& replica, const ModelConfig& config, const WorkerOptions& options) {
  if (replica.is_leader()) return RunLeader(replica, config, options);
  return replica.Follow();
}

}  // namespace deltaserve
