// `deltaserve batch --server HOST:PORT`: the units as Generate and Score
// calls of a running server (`deltaserve serve`, or a coordinator with its
// workers), `concurrency` at a time.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "deltaserve/v1/generation.grpc.pb.h"
#include "launcher/batch_runners.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/credentials.h"
#include "runtime/serving/grpc_request.h"
#include "runtime/serving/grpc_status.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;

const char* FinishName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_CONTEXT:
      return "context";
    default:
      return "length";
  }
}

BatchTimings TimingsOf(const v1::Timings& t) {
  return {t.queue_s(), t.time_to_first_token_s(), t.total_s()};
}

// Whether a failed call is worth another try (the server restarting, its
// queue full), or the answer about this request.
bool Transient(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}
// Whether a failure is the request's (a record) rather than the job's.
bool RequestsFault(grpc::StatusCode code) {
  return code == grpc::StatusCode::INVALID_ARGUMENT ||
         code == grpc::StatusCode::FAILED_PRECONDITION || code == grpc::StatusCode::OUT_OF_RANGE ||
         code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNIMPLEMENTED;
}

// The server's prefill progress of the requests in flight, one per client
// thread: the one with the most prompt left is the progress line's.
class ServerPrefills {
 public:
  explicit ServerPrefills(BatchProgress& progress) : progress_(progress) {}

  void Set(int slot, const std::string& name, int64_t done, int64_t total) {
    std::lock_guard<std::mutex> lock(mu_);
    prefills_[slot] = {name, done, total};
    ShowLocked();
  }
  void Clear(int slot) {
    std::lock_guard<std::mutex> lock(mu_);
    if (prefills_.erase(slot) > 0) ShowLocked();
  }

 private:
  struct Prefill {
    std::string name;
    int64_t done = 0, total = 0;
  };
  void ShowLocked() {
    const Prefill* most = nullptr;
    for (const auto& [slot, p] : prefills_) {
      if (most == nullptr || p.total - p.done > most->total - most->done) most = &p;
    }
    if (most == nullptr) {
      progress_.SetPrefill("", 0, 0);
    } else {
      progress_.SetPrefill(most->name, most->done, most->total);
    }
  }

  BatchProgress& progress_;
  std::mutex mu_;
  std::map<int, Prefill> prefills_;
};

// What a call does with the server's PrefillProgress messages.
using OnProgress = std::function<void(const v1::PrefillProgress&)>;

struct Call {
  grpc::Status status;
  std::string record;  // when status is OK
  int64_t prompt_tokens = 0, generated_tokens = 0;
};

// `has_text`: the server has a tokenizer, so its tokens carry text.
Call Generate(v1::Generation::Stub& stub, const BatchUnit& unit, bool has_text,
              const OnProgress& on_progress) {
  // Fail-fast: while the server is unreachable the call fails at once
  // (UNAVAILABLE) and the caller's retries, bounded by --retry-s, wait; a
  // call waiting for readiness would wait for ever.
  grpc::ClientContext context;
  auto reader = stub.Generate(&context, ToProto(unit.request));
  v1::GenerateResponse response;
  GenerateOutcome o;
  o.has_text = has_text;
  v1::Completion completion;
  while (reader->Read(&response)) {
    if (response.has_progress()) on_progress(response.progress());
    for (const v1::GeneratedToken& t : response.tokens()) {
      o.token_ids.push_back(t.id());
      o.text += t.text();
      if (unit.logprobs()) o.logprobs.push_back(t.logprob());
      if (unit.request.top_logprobs > 0) {
        std::vector<std::pair<int32_t, float>> top;
        for (const v1::TopLogprob& alt : t.top_logprobs())
          top.emplace_back(alt.id(), alt.logprob());
        o.top_logprobs.push_back(std::move(top));
      }
    }
    if (response.has_completion()) completion = response.completion();
  }
  Call call;
  call.status = reader->Finish();
  if (!call.status.ok()) return call;
  o.finish_reason = FinishName(completion.finish_reason());
  o.stop = completion.stop();
  if (completion.has_reply()) o.reply = FromProto(completion.reply());
  o.prompt_tokens = completion.usage().prompt_tokens();
  o.timings = TimingsOf(completion.timings());
  call.record = GenerateRecord(unit, o);
  call.prompt_tokens = o.prompt_tokens;
  call.generated_tokens = static_cast<int64_t>(o.token_ids.size());
  return call;
}

Call Score(v1::Generation::Stub& stub, const BatchUnit& unit, const OnProgress& on_progress) {
  grpc::ClientContext context;  // fail-fast, as Generate's
  auto reader = stub.ScoreStream(&context, ToProto(ScoreInput{"", unit.request.prompt}));
  v1::ScoreStreamResponse message;
  v1::ScoreResponse response;
  bool got_result = false;
  while (reader->Read(&message)) {
    if (message.has_progress()) on_progress(message.progress());
    if (message.has_result()) {
      response = std::move(*message.mutable_result());
      got_result = true;
    }
  }
  Call call;
  call.status = reader->Finish();
  if (!call.status.ok()) return call;
  // The server's answer, checked before it is used: one log-prob per token
  // after the first.
  if (!got_result || response.logprobs_size() != std::max(response.token_ids_size() - 1, 0)) {
    call.status =
        grpc::Status(grpc::StatusCode::DATA_LOSS,
                     absl::StrCat("the server's ScoreStream ended without a whole result (",
                                  response.token_ids_size(), " tokens, ", response.logprobs_size(),
                                  " log-probs)"));
    return call;
  }
  ScoreOutcome o;
  o.token_ids.assign(response.token_ids().begin(), response.token_ids().end());
  o.logprobs.assign(response.logprobs().begin(), response.logprobs().end());
  o.timings = TimingsOf(response.timings());
  call.record = ScoreRecord(unit, o);
  call.prompt_tokens = static_cast<int64_t>(o.token_ids.size());
  return call;
}

}  // namespace

absl::Status RunBatchOnServer(const BatchClientOptions& options, BatchSource& source,
                              BatchProgress& progress) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  DELTASERVE_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                              OpenChannel(options.server, options.security, args));
  auto stub = v1::Generation::NewStub(channel);
  bool has_text = false;
  {
    // The server answers before any work is handed out.
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(options.retry_s * 1e3)));
    v1::ModelInfo info;
    const grpc::Status status = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("the server at ", options.server,
                                       " refused this client (--token-file, --tls-cert): ",
                                       status.error_message()));
    }
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("the server at ", options.server,
                                                 " does not answer: ", status.error_message()));
    }
    has_text = info.tokenizer() != "none";
  }

  std::mutex mu;
  absl::Status failure;
  std::atomic<bool> stop{false};
  auto fail = [&](absl::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    if (failure.ok()) failure = std::move(status);
    stop = true;
  };
  ServerPrefills prefills(progress);
  auto client = [&](int slot) {
    while (!stop) {
      absl::StatusOr<std::optional<BatchUnit>> next = source.Next();
      if (!next.ok()) return fail(next.status());
      if (!next->has_value()) return;
      const BatchUnit& unit = **next;
      Call call;
      auto retry_until =
          Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.retry_s * 1e3));
      auto backoff = std::chrono::milliseconds(100);
      const std::string name = UnitName(unit);
      const OnProgress on_progress = [&](const v1::PrefillProgress& p) {
        prefills.Set(slot, name, p.tokens_done(), p.tokens_total());
      };
      while (true) {
        call = unit.task == BatchTask::kScore ? Score(*stub, unit, on_progress)
                                              : Generate(*stub, unit, has_text, on_progress);
        prefills.Clear(slot);
        if (call.status.ok() || !Transient(call.status.error_code())) break;
        if (Clock::now() > retry_until || stop) break;
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
      }
      if (!call.status.ok() && !RequestsFault(call.status.error_code())) {
        const std::string retried =
            Transient(call.status.error_code())
                ? absl::StrCat(" and did not come back within --retry-s ", options.retry_s, " s")
                : "";
        return fail(absl::UnavailableError(absl::StrCat(
            "the server at ", options.server, " failed a request (",
            FromGrpc(call.status).ToString(), ")", retried,
            "; stopping: the records written are kept, rerun with the same --output to resume")));
      }
      const bool error = !call.status.ok();
      if (error) {
        const absl::Status s = FromGrpc(call.status);
        call.record =
            ErrorRecord(unit.id_json, unit.question, unit.line,
                        absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message()));
      }
      progress.AddPrompt(call.prompt_tokens);
      progress.AddGenerated(call.generated_tokens);
      if (absl::Status s = source.Write(unit, call.record, error); !s.ok()) return fail(s);
    }
  };
  std::vector<std::thread> threads;
  std::atomic<int> finished{0};
  for (int i = 0; i < options.concurrency; ++i) {
    threads.emplace_back([&, i] {
      client(i);
      ++finished;
    });
  }
  // Progress while the clients wait on the server.
  while (finished < options.concurrency) {
    progress.Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : threads) t.join();
  return failure;
}

}  // namespace deltaserve
