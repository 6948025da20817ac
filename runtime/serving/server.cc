#include "runtime/serving/server.h"

#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_posix.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "deltaserve/v1/generation.grpc.pb.h"
#include "deltaserve/v1/worker.grpc.pb.h"
#include "runtime/common/file_util.h"
#include "runtime/common/log.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/weight_spec.h"
#include "runtime/serving/auth.h"
#include "runtime/serving/grpc_request.h"
#include "runtime/serving/grpc_status.h"
#include "runtime/serving/h2_guard.h"
#include "runtime/serving/http_api.h"
#include "runtime/serving/http_server.h"
#include "runtime/serving/reflection.h"
#include "runtime/serving/request_validation.h"
#include "runtime/serving/tls_check.h"
#include "runtime/serving/worker_codec.h"
#include "runtime/serving/write_watchdog.h"

namespace deltaserve {
namespace {

// With mutual TLS on both ports, a certificate of the client CA must not be
// enough to attach as a worker (a worker reads every prompt and writes every
// output): the worker port needs a CA of its own, or worker tokens as well.
// The CA files are parsed and compared certificate by certificate and key
// (CheckCaFilesShareNoCa): a copy, a re-encoding or a bundle counts too.
absl::Status CheckWorkerRole(const ServerOptions& options) {
  if (options.tls.client_ca_file.empty() || options.worker_ca_file.empty() ||
      !options.worker_tokens_file.empty()) {
    return absl::OkStatus();
  }
  return CheckCaFilesShareNoCa(options.tls.client_ca_file, options.worker_ca_file);
}

constexpr auto kPollInterval = std::chrono::milliseconds(20);
// A hello is the model's config.json and a short description.
constexpr size_t kMaxHelloBytes = kMaxConfigJsonBytes + (64 << 10);

std::optional<Clock::time_point> Deadline(const grpc::ServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return std::nullopt;
  const auto left = deadline - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return std::nullopt;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

void SetPrefixCache(const PrefixCacheStats& c, v1::PrefixCacheStatus* out) {
  out->set_entries(c.entries);
  out->set_bytes(c.bytes);
  out->set_lookups(c.lookups);
  out->set_hits(c.hits);
  out->set_cached_tokens(c.cached_tokens);
  out->set_evictions(c.evictions);
}

void SetProgress(const PrefillProgress& p, v1::PrefillProgress* out) {
  out->set_tokens_done(p.tokens_done);
  out->set_tokens_total(p.tokens_total);
}

void SetTimings(const RequestOutcome& o, v1::Timings* t) {
  t->set_queue_s(o.queue_s);
  t->set_time_to_first_token_s(o.time_to_first_token_s);
  t->set_total_s(o.total_s);
}

class GenerationService final : public v1::Generation::Service {
 public:
  // `chat_format`: the validator's (null when the model has none, and the
  // validator refuses chats).
  GenerationService(Coordinator& coordinator, const Authenticator& auth,
                    const RequestValidator& validator, const ChatFormat* chat_format,
                    WriteWatchdog& watchdog)
      : coordinator_(coordinator),
        auth_(auth),
        validator_(validator),
        chat_format_(chat_format),
        watchdog_(watchdog),
        model_info_(MakeModelInfo(coordinator)) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    auto principal = auth_.Authenticate(*context);
    if (!principal.ok()) return ToGrpc(principal.status());
    auto id = validator_.RequestId(req->request_id());
    if (!id.ok()) return ToGrpc(id.status());
    bool chat = false, thinking = false;
    absl::StatusOr<ValidGenerate> valid;
    {
      const GenerateInput input = FromProto(*req);
      chat = input.prompt.form == PromptInput::Form::kChat;
      thinking = input.prompt.chat.thinking;
      valid = validator_.Generate(input);
    }
    if (!valid.ok()) return ToGrpc(valid.status());
    std::string text;  // a chat's reply, parsed from all its text at the end
    auto handle = coordinator_.SubmitGenerate(ScopedRequestId(*principal, *id), *principal,
                                              std::move(valid->prompt), std::move(valid->params),
                                              Deadline(*context));
    if (!handle.ok()) return ToGrpc(handle.status());
    while (true) {
      std::vector<TokenEvent> tokens;
      std::optional<PrefillProgress> progress;
      std::optional<RequestOutcome> outcome =
          coordinator_.Poll(*handle, &tokens, kPollInterval, &progress);
      v1::GenerateResponse response;
      response.set_request_id(*id);
      // Progress comes before any token, and alone (Poll says so).
      if (progress) SetProgress(*progress, response.mutable_progress());
      for (TokenEvent& e : tokens) {
        if (chat) text += e.text;
        v1::GeneratedToken* t = response.add_tokens();
        t->set_id(e.id);
        t->set_text(std::move(e.text));
        t->set_logprob(e.logprob);
        for (size_t i = 0; i < e.top_ids.size(); ++i) {
          v1::TopLogprob* top = t->add_top_logprobs();
          top->set_id(e.top_ids[i]);
          top->set_logprob(e.top_logprobs[i]);
        }
      }
      if (outcome && outcome->status.ok()) {
        v1::Completion* c = response.mutable_completion();
        c->set_finish_reason(outcome->reason == FinishReason::kStop ? v1::FINISH_REASON_STOP
                             : outcome->reason == FinishReason::kContext
                                 ? v1::FINISH_REASON_CONTEXT
                                 : v1::FINISH_REASON_LENGTH);
        c->set_stop(outcome->stop);
        c->mutable_usage()->set_prompt_tokens(outcome->prompt_tokens);
        c->mutable_usage()->set_completion_tokens(outcome->completion_tokens);
        c->mutable_usage()->set_cached_tokens(outcome->cached_tokens);
        SetTimings(*outcome, c->mutable_timings());
        if (chat) {
          absl::StatusOr<ChatReply> reply = ParseReply(*chat_format_, text, thinking);
          if (!reply.ok()) {
            // The tokens went out; what the model said cannot be read.
            response.clear_completion();
            if (absl::Status ok = Write(*context, *writer, response, *handle, *id); !ok.ok()) {
              return ToGrpc(ok);
            }
            return ToGrpc(reply.status());
          }
          ToProto(*reply, c->mutable_reply());
        }
      }
      if (response.tokens_size() > 0 || response.has_completion() || response.has_progress()) {
        if (absl::Status ok = Write(*context, *writer, response, *handle, *id); !ok.ok()) {
          return ToGrpc(ok);
        }
      }
      if (outcome) return ToGrpc(outcome->status);
      if (context->IsCancelled()) CancelFor(*context, *handle);
    }
  }

  grpc::Status Score(grpc::ServerContext* context, const v1::ScoreRequest* req,
                     v1::ScoreResponse* response) override {
    return ToGrpc(RunScore(*context, *req, response, nullptr));
  }

  grpc::Status ScoreStream(grpc::ServerContext* context, const v1::ScoreRequest* req,
                           grpc::ServerWriter<v1::ScoreStreamResponse>* writer) override {
    v1::ScoreStreamResponse last;
    absl::Status ok = RunScore(
        *context, *req, last.mutable_result(),
        [&](const PrefillProgress& progress, const RequestHandle& handle, const std::string& id) {
          v1::ScoreStreamResponse message;
          message.set_request_id(id);
          SetProgress(progress, message.mutable_progress());
          return Write(*context, *writer, message, handle, id);
        });
    if (!ok.ok()) return ToGrpc(ok);
    last.set_request_id(last.result().request_id());
    // The request has ended: a client that does not read gets the watchdog's
    // cancellation of the RPC, and nothing is left to cancel.
    WriteWatchdog::Watch watch(watchdog_, *context);
    if (!writer->Write(last)) return ToGrpc(absl::CancelledError("the client went away"));
    return grpc::Status::OK;
  }

  // A Score, streaming its progress through `on_progress` when given (which
  // may fail the call: the client went away).
  using ProgressWriter = std::function<absl::Status(const PrefillProgress&, const RequestHandle&,
                                                    const std::string& id)>;
  absl::Status RunScore(grpc::ServerContext& context, const v1::ScoreRequest& req,
                        v1::ScoreResponse* response, const ProgressWriter& on_progress) {
    DELTASERVE_ASSIGN_OR_RETURN(std::string principal, auth_.Authenticate(context));
    DELTASERVE_ASSIGN_OR_RETURN(std::string id, validator_.RequestId(req.request_id()));
    DELTASERVE_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, validator_.Score(FromProto(req)));
    response->mutable_token_ids()->Add(tokens.begin(), tokens.end());
    DELTASERVE_ASSIGN_OR_RETURN(RequestHandle handle,
                                coordinator_.SubmitScore(ScopedRequestId(principal, id), principal,
                                                         std::move(tokens), Deadline(context)));
    while (true) {
      std::vector<TokenEvent> unused;
      std::optional<PrefillProgress> progress;
      std::optional<RequestOutcome> outcome = coordinator_.Poll(
          handle, &unused, kPollInterval, on_progress != nullptr ? &progress : nullptr);
      if (progress && !outcome) DELTASERVE_RETURN_IF_ERROR(on_progress(*progress, handle, id));
      if (outcome) {
        if (!outcome->status.ok()) return outcome->status;
        response->set_request_id(id);
        double total = 0;
        for (float lp : outcome->score_logprobs) {
          response->add_logprobs(lp);
          total += lp;
        }
        response->set_total_logprob(total);
        response->mutable_usage()->set_prompt_tokens(outcome->prompt_tokens);
        SetTimings(*outcome, response->mutable_timings());
        return absl::OkStatus();
      }
      if (context.IsCancelled()) CancelFor(context, handle);
    }
  }

  // A principal finds only its own requests: another's id is not found,
  // the same answer as an id no one uses, so Abort tells it nothing.
  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* req,
                     v1::AbortResponse* response) override {
    auto principal = auth_.Authenticate(*context);
    if (!principal.ok()) return ToGrpc(principal.status());
    if (req->request_id().empty()) {
      return ToGrpc(absl::InvalidArgumentError("request_id: empty"));
    }
    if (req->request_id().size() > kMaxRequestIdBytes) {
      return ToGrpc(absl::InvalidArgumentError(
          absl::StrCat("request_id: ", req->request_id().size(), " bytes, over the limit of ",
                       kMaxRequestIdBytes)));
    }
    response->set_found(coordinator_.Abort(ScopedRequestId(*principal, req->request_id())));
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext* context, const v1::GetModelInfoRequest*,
                            v1::ModelInfo* info) override {
    auto principal = auth_.Authenticate(*context);
    if (!principal.ok()) return ToGrpc(principal.status());
    *info = model_info_;
    const ServerStatusData s = coordinator_.Status();
    if (s.worker_attached) {
      info->mutable_layout()->set_replicas(s.workers);
      info->mutable_layout()->set_pipeline_stages(s.pp);
      info->mutable_layout()->set_tensor_parallel(s.tp);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetServerStatus(grpc::ServerContext* context, const v1::GetServerStatusRequest*,
                               v1::ServerStatus* status) override {
    auto principal = auth_.Authenticate(*context);
    if (!principal.ok()) return ToGrpc(principal.status());
    // The prefix cache's activity is the caller's own: another's hits and
    // entries would tell it what others sent.
    const ServerStatusData s = coordinator_.Status(&*principal);
    status->set_worker_attached(s.worker_attached);
    status->set_waiting_requests(static_cast<int32_t>(s.waiting_requests));
    status->set_waiting_tokens(s.waiting_tokens);
    status->set_running_sequences(static_cast<int32_t>(s.running_sequences));
    status->set_kda_state_bytes(s.kda_state_bytes);
    status->set_mla_cache_bytes(s.mla_cache_bytes);
    status->set_mla_cache_tokens(s.mla_cache_tokens);
    status->set_steps(s.steps);
    status->set_requests_finished(s.requests_finished);
    status->set_requests_failed(s.requests_failed);
    status->set_workers(s.workers);
    SetPrefixCache(s.prefix_cache, status->mutable_prefix_cache());
    // Only the caller's own requests, by the ids it knows them by.
    for (const RequestStatusData& r : s.requests) {
      std::optional<std::string> id = OwnRequestId(*principal, r.request_id);
      if (!id) continue;
      v1::RequestStatus* e = status->add_requests();
      e->set_request_id(std::move(*id));
      e->set_kind(r.score ? v1::REQUEST_KIND_SCORE : v1::REQUEST_KIND_GENERATE);
      e->set_prompt_tokens(r.prompt_tokens);
      SetProgress(r.prefill, e->mutable_prefill());
      e->set_generated_tokens(r.generated_tokens);
      e->set_worker(r.worker);
    }
    for (const WorkerStatusData& w : s.worker_status) {
      v1::WorkerStatus* e = status->add_worker_status();
      e->set_id(w.id);
      e->set_pipeline_stages(w.pipeline_stages);
      e->set_tensor_parallel(w.tensor_parallel);
      e->set_running_sequences(static_cast<int32_t>(w.running_sequences));
      e->set_cache_pages(w.cache_pages);
      e->set_reserved_pages(w.reserved_pages);
      e->set_state_slots(w.state_slots);
      e->set_held_slots(w.held_slots);
      e->set_steps(w.steps);
      e->set_cost_per_token_s(w.cost_per_token_s);
      e->set_cost_per_pair_s(w.cost_per_pair_s);
      SetPrefixCache(w.prefix_cache, e->mutable_prefix_cache());
    }
    return grpc::Status::OK;
  }

 private:
  // What does not change while the server runs, computed once: counting the
  // parameters walks every tensor of the model.
  static v1::ModelInfo MakeModelInfo(const Coordinator& coordinator) {
    const ModelConfig& c = coordinator.config();
    v1::ModelInfo info;
    info.set_model_type(c.model_type);
    info.set_num_layers(static_cast<int32_t>(c.num_layers));
    int32_t kda = 0;
    for (LayerKind kind : c.layer_kinds) kda += kind == LayerKind::kKda;
    info.set_kda_layers(kda);
    info.set_mla_layers(static_cast<int32_t>(c.num_layers) - kda);
    info.set_context_length(c.max_position_embeddings);
    info.set_vocab_size(c.vocab_size);
    info.set_hidden_size(c.hidden_size);
    info.set_tokenizer(coordinator.tokenizer() ? coordinator.tokenizer()->name() : "none");
    info.set_parameters(CountParameters(c).total);
    return info;
  }

  // Writes one message of a request's stream; a client that went away, or
  // did not read within --client-write-timeout, cancels the request.
  template <typename Message>
  absl::Status Write(grpc::ServerContext& context, grpc::ServerWriter<Message>& writer,
                     const Message& message, const RequestHandle& handle, const std::string& id) {
    WriteWatchdog::Watch watch(watchdog_, context);
    if (writer.Write(message)) return absl::OkStatus();
    absl::Status why = absl::CancelledError("the client went away");
    if (watch.fired()) {
      why = absl::CancelledError(absl::StrCat("the client did not read its stream for ",
                                              watchdog_.timeout_seconds(),
                                              " s (--client-write-timeout)"));
      // The id may be the client's text: quoted, escaped and cut short.
      log::Warning("server", absl::StrCat("request \"", absl::CHexEscape(id.substr(0, 128)),
                                          "\" cancelled: ", why.message()));
    }
    coordinator_.Cancel(handle, why);
    return why;
  }

  void CancelFor(const grpc::ServerContext& context, const RequestHandle& handle) {
    const bool late = context.deadline() <= std::chrono::system_clock::now();
    coordinator_.Cancel(handle, late ? absl::DeadlineExceededError("the deadline passed")
                                     : absl::CancelledError("the client cancelled"));
  }

  Coordinator& coordinator_;
  const Authenticator& auth_;
  const RequestValidator& validator_;
  const ChatFormat* const chat_format_;
  WriteWatchdog& watchdog_;
  const v1::ModelInfo model_info_;
};

// Writes on one worker stream, from its scheduler thread only (the
// coordinator's one writer per worker); results come back through the
// stream's reader (WorkerLinkService::Attach), which outlives every write:
// Coordinator::DetachWorker returns only once the scheduler loop has ended.
// Cancel ends the RPC, which unblocks a write to a peer that stopped reading.
class StreamConnection final : public WorkerConnection {
 public:
  StreamConnection(grpc::ServerContext* context,
                   grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream)
      : context_(context), stream_(stream) {}
  absl::StatusOr<std::optional<StepResult>> Send(const Step& step) override {
    v1::CoordinatorMessage message;
    StepToProto(step, message.mutable_step());
    if (!stream_->Write(message)) return absl::UnavailableError("the worker's stream is closed");
    return std::nullopt;
  }
  void Shutdown() override {
    v1::CoordinatorMessage message;
    message.mutable_step()->set_shutdown(true);
    stream_->Write(message);
  }
  void Cancel() override { context_->TryCancel(); }

 private:
  grpc::ServerContext* const context_;
  grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* const stream_;
};

class WorkerLinkService final : public v1::WorkerLink::Service {
 public:
  WorkerLinkService(Coordinator& coordinator, const Authenticator& auth)
      : coordinator_(coordinator), auth_(auth) {}

  grpc::Status Attach(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    if (auto principal = auth_.Authenticate(*context); !principal.ok()) {
      return ToGrpc(principal.status());
    }
    v1::WorkerMessage message;
    if (!stream->Read(&message) || !message.has_hello()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a worker's first message must be its hello");
    }
    // Bounded before any field is used (gRPC's receive limit bounds the
    // message itself); ParseModelConfig checks the config_json's size and
    // nesting before parsing it.
    if (const size_t bytes = message.hello().ByteSizeLong(); bytes > kMaxHelloBytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("a worker's hello is ", bytes, " bytes, over the limit of ",
                                       kMaxHelloBytes));
    }
    auto connection = std::make_shared<StreamConnection>(context, stream);
    auto worker = coordinator_.AttachWorker(InfoFromHello(message.hello()), connection);
    if (!worker.ok()) {
      v1::CoordinatorMessage refused;
      refused.set_refused(std::string(worker.status().message()));
      stream->Write(refused);
      return ToGrpc(worker.status());
    }
    std::string why = "its stream ended";
    bool leaving = false;
    while (stream->Read(&message)) {
      if (message.has_leaving()) {
        leaving = true;
        // The peer's text: quoted, escaped and cut short in the log.
        why = absl::StrCat("it is leaving: \"", absl::CHexEscape(message.leaving().substr(0, 256)),
                           "\"");
        break;
      }
      if (!message.has_result()) {
        why = "it sent something other than a step result";
        break;
      }
      if (absl::Status ok = coordinator_.OnStepResult(*worker, ResultFromProto(message.result()));
          !ok.ok()) {
        why = absl::StrCat("it sent a malformed result: ", ok.message());
        break;
      }
    }
    if (context->IsCancelled() && why == "its stream ended") why = "its connection broke";
    coordinator_.DetachWorker(*worker, why, leaving);
    return grpc::Status::OK;
  }

 private:
  Coordinator& coordinator_;
  const Authenticator& auth_;
};

absl::StatusOr<std::optional<TokenSet>> TokensFrom(const std::string& path) {
  if (path.empty()) return std::optional<TokenSet>();
  auto entries = ReadTokenFile(path);
  if (!entries.ok()) return entries.status();
  return std::optional<TokenSet>(TokenSet(std::move(*entries)));
}

// What may be exposed where: off loopback every listener authenticates its
// callers unless --insecure; and a client port that authenticates needs a
// worker port that does too, or any local process could attach as a worker
// and read every prompt.
absl::Status CheckExposure(const ServerOptions& o) {
  if (o.insecure) return absl::OkStatus();
  const bool clients = !o.tls.cert_file.empty() || !o.client_tokens_file.empty();
  const bool client_auth = !o.tls.client_ca_file.empty() || !o.client_tokens_file.empty();
  const bool workers = o.worker_port < 0 || !o.worker_ca_file.empty() ||
                       !o.worker_tokens_file.empty() || !o.worker_token.empty();
  if (client_auth && !workers) {
    return absl::InvalidArgumentError(
        "clients must authenticate but workers need not: give --worker-token-file or "
        "--tls-worker-ca too (or --insecure)");
  }
  if (IsLoopbackHost(o.host) || (clients && workers)) return absl::OkStatus();
  std::string missing;
  if (!clients) missing = "clients (--tls-cert/--tls-key or --client-tokens-file)";
  if (!workers) {
    absl::StrAppend(&missing, missing.empty() ? "" : " and ",
                    "workers (--worker-token-file or --tls-worker-ca)");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--host ", o.host, " is not a loopback address and nothing secures ", missing,
      ": give those flags (docs/security.md), or --insecure to serve it unauthenticated"));
}

}  // namespace

// One gRPC port: the guard owns the listening socket, terminates TLS if the
// port has it, and hands gRPC each connection in plaintext (h2_guard.h).
// The guard is declared last so that it stops before the server it feeds
// goes.
struct GrpcPort {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<H2Guard> guard;
  int port = -1;
};

struct Server::Impl {
  MetricsRegistry metrics;
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<Authenticator> client_auth, worker_auth;
  std::unique_ptr<WriteWatchdog> watchdog;
  std::unique_ptr<ChatFormat> chat;             // null: the model has none
  std::unique_ptr<RequestValidator> validator;  // every API's requests
  std::unique_ptr<GenerationService> generation;
  std::unique_ptr<WorkerLinkService> worker_link;
  GrpcPort client;  // the client port
  GrpcPort worker;  // the worker port, when there is one
  std::unique_ptr<HttpApi> http_api;
  std::unique_ptr<HttpServer> http;  // metrics
  bool shut_down = false;
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Shutdown(); }

namespace {

// The transport's limits and SO_REUSEPORT off: with it gRPC opens a second
// socket per extra completion queue, and for port 0 that second socket got
// a port of its own that no one announced; it would also let another
// process of this user share the port.
void Configure(grpc::ServerBuilder& builder, const ServerOptions& options,
               grpc::ResourceQuota& quota) {
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_connection_streams);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, options.max_metadata_bytes);
  builder.SetResourceQuota(quota);
  // Requests over the API's own limit get INVALID_ARGUMENT naming the field;
  // the transport's limit sits above it.
  const int64_t transport_limit =
      std::min<int64_t>(4 * options.limits.max_request_bytes + (1 << 20), INT32_MAX);
  builder.SetMaxReceiveMessageSize(static_cast<int>(transport_limit));
  builder.SetMaxSendMessageSize(static_cast<int>(transport_limit));
  // A worker that vanishes without closing its connection is noticed. Its
  // own pings (worker --keepalive, at least 1 s apart) are welcome.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

// The most a worker may send in one message, which gRPC refuses past (with
// RESOURCE_EXHAUSTED) as a client's limit would let through far more: a
// hello (kMaxHelloBytes), or a step result, whose rows (prompt tokens and
// decode rows, --step-tokens plus --max-running) carry a log-prob and at
// most kMaxTopLogprobs top ids and log-probs each (under 256 bytes encoded),
// and whose outputs a short error text each; at least 16 MiB.
int WorkerMessageLimit(const ServerOptions& options) {
  const CoordinatorOptions& c = options.coordinator;
  static_assert(kMaxTopLogprobs * 10 + 16 <= 256);
  const int64_t result = (c.step_tokens + c.max_running) * 256 + c.max_running * (4 << 10);
  const int64_t limit =
      std::max({int64_t{16} << 20, static_cast<int64_t>(kMaxHelloBytes), result}) + (1 << 20);
  return static_cast<int>(std::min<int64_t>(limit, INT32_MAX));
}

// The counters of the guards of both ports.
struct GuardCounters {
  Counter& cut;        // connections closed for breaking a rule
  Counter& reclaimed;  // connections closed to free their slot
};

// Builds and starts `builder`'s server on host:port as `who` ("the client
// port"), behind an H2Guard (with TLS when `tls` is set) whose cut
// connections are logged and counted, and which `auth` tells of each
// connection that authenticated a call and asks for the client certificate
// of each call under mutual TLS.
absl::StatusOr<GrpcPort> StartPort(grpc::ServerBuilder& builder, const ServerOptions& options,
                                   int port, std::shared_ptr<const ServerTlsContext> tls,
                                   const std::string& who, const GuardCounters& counters,
                                   Authenticator& auth) {
  const std::string address = absl::StrCat(options.host, ":", port);
  GrpcPort out;
  H2GuardOptions guard;
  guard.tls = std::move(tls);
  // A block gRPC would refuse with RESOURCE_EXHAUSTED (over the metadata
  // limit) still reaches it up to twice the limit, so a client sending too
  // much metadata gets that answer; past it the connection is cut.
  guard.rules.max_header_block_bytes = 2 * int64_t{options.max_metadata_bytes} + (16 << 10);
  Counter& cut = counters.cut;
  Counter& reclaimed = counters.reclaimed;
  guard.on_cut = [who, &cut](const std::string& peer, const absl::Status& why) {
    cut.Add();
    log::Warning("server",
                 absl::StrCat(who, ": closed the connection of ", peer, ": ", why.message()));
  };
  guard.on_reclaim = [&reclaimed] { reclaimed.Add(); };
  DELTASERVE_ASSIGN_OR_RETURN(out.guard,
                              H2Guard::Listen(options.host, port, who, std::move(guard)));
  out.port = out.guard->port();
  // Calls end before the server, and the server before the guard, shuts down.
  H2Guard* guarded = out.guard.get();
  auth.SetOnAuthenticated([guarded](const std::string& peer) { guarded->MarkAuthenticated(peer); });
  auth.SetPeerIdentity([guarded](const std::string& peer) { return guarded->PeerIdentity(peer); });
  out.server = builder.BuildAndStart();
  if (out.server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the gRPC server for ", who, " on ", address));
  }
  grpc::Server* server = out.server.get();
  absl::Status started =
      out.guard->Start([server](int fd) { grpc::AddInsecureChannelFromFd(server, fd); });
  if (!started.ok()) {
    out.server->Shutdown();
    return started;
  }
  return out;
}

// Stops taking connections, shuts the servers down (their calls end, gRPC
// closes its connections), then lets the guards relay what gRPC wrote last,
// for half a second at most.
void ShutdownPorts(std::initializer_list<GrpcPort*> ports,
                   std::chrono::system_clock::time_point deadline) {
  for (GrpcPort* p : ports) {
    if (p->guard) p->guard->StopAccepting();
  }
  for (GrpcPort* p : ports) {
    if (p->server) p->server->Shutdown(deadline);
  }
  const auto flushed_by = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  for (GrpcPort* p : ports) {
    if (p->guard) {
      p->guard->Stop(std::chrono::duration_cast<std::chrono::milliseconds>(
          std::max(flushed_by - std::chrono::steady_clock::now(),
                   std::chrono::steady_clock::duration::zero())));
    }
  }
}

// Each guarded connection takes three descriptors (the client's socket and
// both ends of its socketpair), up to 1024 connections per port: the soft
// limit many systems start a process with (1024) would run out at about 330
// and leave the guard unable to accept. Raised towards the hard limit; a
// limit that stays low is said once.
void RaiseDescriptorLimit() {
  constexpr rlim_t kWanted = 8192;  // two ports' 3 x 1024, and room for the rest
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= kWanted) return;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? kWanted : std::min(kWanted, limit.rlim_max);
  if (limit.rlim_cur > before && ::setrlimit(RLIMIT_NOFILE, &limit) != 0) limit.rlim_cur = before;
  if (limit.rlim_cur < kWanted) {
    log::Warning("server", absl::StrCat("at most ", limit.rlim_cur,
                                        " open files (RLIMIT_NOFILE): each gRPC connection takes "
                                        "three, so fewer than 1024 per port can be served; raise "
                                        "the hard limit (ulimit -Hn) to ",
                                        kWanted));
  }
}

absl::Status CheckLimits(const ServerOptions& o) {
  if (o.max_connection_streams < 1) {
    return absl::InvalidArgumentError("max connection streams must be >= 1");
  }
  if (o.max_metadata_bytes < 1024) {
    return absl::InvalidArgumentError("max metadata bytes must be >= 1024");
  }
  if (o.grpc_memory_bytes < (int64_t{64} << 20)) {
    return absl::InvalidArgumentError("the gRPC memory quota must be >= 64 MiB");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  // The TLS flags first: a client CA without a certificate is a mistake
  // about clients, whatever the workers have.
  DELTASERVE_ASSIGN_OR_RETURN(std::shared_ptr<const ServerTlsContext> client_tls,
                              MakeServerTls(options.tls));
  DELTASERVE_RETURN_IF_ERROR(CheckServerCertificate(options.tls));
  DELTASERVE_RETURN_IF_ERROR(CheckExposure(options));
  DELTASERVE_RETURN_IF_ERROR(CheckLimits(options));
  auto impl = std::make_unique<Impl>();
  DELTASERVE_ASSIGN_OR_RETURN(std::optional<TokenSet> client_tokens,
                              TokensFrom(options.client_tokens_file));
  impl->client_auth = std::make_unique<Authenticator>(std::move(client_tokens),
                                                      !options.tls.client_ca_file.empty());
  std::shared_ptr<const ServerTlsContext> worker_tls;
  if (options.worker_port >= 0) {
    ServerTls worker_files = options.tls;
    worker_files.client_ca_file = options.worker_ca_file;
    DELTASERVE_ASSIGN_OR_RETURN(worker_tls, MakeServerTls(worker_files));
    DELTASERVE_ASSIGN_OR_RETURN(std::optional<TokenSet> worker_tokens,
                                TokensFrom(options.worker_tokens_file));
    if (!options.worker_token.empty()) {
      worker_tokens = TokenSet({TokenEntry{"worker", options.worker_token}});
    }
    impl->worker_auth =
        std::make_unique<Authenticator>(std::move(worker_tokens), !options.worker_ca_file.empty());
    DELTASERVE_RETURN_IF_ERROR(CheckWorkerRole(options));
  } else if (!options.worker_ca_file.empty() || !options.worker_tokens_file.empty() ||
             !options.worker_token.empty()) {
    return absl::InvalidArgumentError(
        "worker credentials are for a worker port: this server runs its worker in-process");
  }
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  std::unique_ptr<Tokenizer> tokenizer;
  auto loaded = LoadTokenizer(options.model_dir, config.vocab_size);
  if (loaded.ok()) {
    tokenizer = std::move(*loaded);
  } else if (!absl::IsNotFound(loaded.status())) {
    return loaded.status();
  }
  impl->coordinator = std::make_unique<Coordinator>(std::move(config), std::move(tokenizer),
                                                    options.coordinator, impl->metrics);
  impl->watchdog = std::make_unique<WriteWatchdog>(
      std::chrono::milliseconds(static_cast<int64_t>(options.limits.client_write_timeout_s * 1e3)));
  // The chat format, from the tokenizer files: a model without one takes
  // prompts, not conversations.
  if (auto chat = LoadChatFormat(options.model_dir); chat.ok()) {
    impl->chat = std::move(*chat);
  } else if (!absl::IsNotFound(chat.status())) {
    return chat.status();
  }
  impl->validator = std::make_unique<RequestValidator>(impl->coordinator->config(),
                                                       impl->coordinator->tokenizer(),
                                                       options.limits, impl->chat.get());
  impl->generation = std::make_unique<GenerationService>(
      *impl->coordinator, *impl->client_auth, *impl->validator, impl->chat.get(), *impl->watchdog);

  grpc::ResourceQuota quota("deltaserve");
  quota.Resize(static_cast<size_t>(options.grpc_memory_bytes));
  grpc::EnableDefaultHealthCheckService(true);
  const GuardCounters counters{
      impl->metrics.AddCounter(
          "deltaserve_http2_connections_cut_total",
          "gRPC connections closed by the HTTP/2 guard for breaking its rules "
          "(an endless or oversized header block, a flood of control frames, a bad preface or "
          "frame)."),
      impl->metrics.AddCounter(
          "deltaserve_http2_connections_reclaimed_total",
          "gRPC connections closed by the HTTP/2 guard before they sent a request, "
          "to free their slot (none within 10 s, or too many such connections).")};
  RaiseDescriptorLimit();
  grpc::ServerBuilder builder;
  Configure(builder, options, quota);
  builder.RegisterService(impl->generation.get());
  builder.SetOption(ReflectionOption());
  DELTASERVE_ASSIGN_OR_RETURN(
      impl->client, StartPort(builder, options, options.port, client_tls, "the client port",
                              counters, *impl->client_auth));
  if (options.worker_port >= 0) {
    impl->worker_link = std::make_unique<WorkerLinkService>(*impl->coordinator, *impl->worker_auth);
    grpc::ServerBuilder worker_builder;
    Configure(worker_builder, options, quota);
    worker_builder.SetMaxReceiveMessageSize(WorkerMessageLimit(options));
    worker_builder.SetOption(
        std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
    worker_builder.RegisterService(impl->worker_link.get());
    auto worker = StartPort(worker_builder, options, options.worker_port, worker_tls,
                            "the worker port", counters, *impl->worker_auth);
    if (!worker.ok()) {
      ShutdownPorts({&impl->client}, std::chrono::system_clock::now());
      return worker.status();
    }
    impl->worker = std::move(*worker);
  }
  if (options.http_port >= 0) {
    HttpApiOptions http;
    http.host = options.host;
    http.port = options.http_port;
    DELTASERVE_ASSIGN_OR_RETURN(http.tls, MakeServerTls(options.tls, TlsProtocol::kHttp11));
    http.model_name = options.model_name;
    http.max_connections = options.http_max_connections;
    http.max_body_bytes = options.limits.max_request_bytes + (1 << 20);
    http.body_memory_bytes = options.grpc_memory_bytes;
    http.principal_body_memory_bytes = options.grpc_memory_bytes / 4;
    http.write_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(options.limits.client_write_timeout_s * 1e3));
    auto started = HttpApi::Start(http, *impl->coordinator, *impl->client_auth, *impl->validator,
                                  impl->chat.get(), impl->metrics);
    if (!started.ok()) {
      ShutdownPorts({&impl->worker, &impl->client}, std::chrono::system_clock::now());
      return started.status();
    }
    impl->http_api = std::move(*started);
  }
  grpc::HealthCheckServiceInterface* health = impl->client.server->GetHealthCheckService();
  HttpApi* http_api = impl->http_api.get();
  impl->coordinator->SetServingCallback([health, http_api](bool serving) {
    health->SetServingStatus(serving);
    health->SetServingStatus("deltaserve.v1.Generation", serving);
    if (http_api != nullptr) http_api->SetServing(serving);
  });
  if (options.metrics_port >= 0) {
    MetricsRegistry* metrics = &impl->metrics;
    DELTASERVE_ASSIGN_OR_RETURN(impl->http,
                                HttpServer::Start(options.metrics_host, options.metrics_port,
                                                  [metrics](const HttpRequest& r) {
                                                    HttpResponse response;
                                                    if (r.path == "/metrics") {
                                                      response.body = metrics->Render();
                                                    } else {
                                                      response.status = 404;
                                                      response.body = "not found: try /metrics\n";
                                                    }
                                                    return response;
                                                  }));
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->client.port; }
int Server::worker_port() const { return impl_->worker.port; }
int Server::metrics_port() const { return impl_->http ? impl_->http->port() : -1; }
int Server::http_port() const { return impl_->http_api ? impl_->http_api->port() : -1; }
Coordinator& Server::coordinator() { return *impl_->coordinator; }

int64_t Server::Drain(std::chrono::duration<double> timeout) {
  if (impl_ == nullptr || impl_->shut_down) return 0;
  return impl_->coordinator->Drain(Clock::now() +
                                   std::chrono::duration_cast<Clock::duration>(timeout));
}

void Server::Shutdown() {
  if (impl_ == nullptr || impl_->shut_down) return;
  impl_->shut_down = true;
  impl_->coordinator->Shutdown();
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  ShutdownPorts({&impl_->worker, &impl_->client}, deadline);
  if (impl_->http_api) impl_->http_api->Stop();
  if (impl_->http) impl_->http->Stop();
}

}  // namespace deltaserve
