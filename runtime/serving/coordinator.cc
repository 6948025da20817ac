#include "runtime/serving/coordinator.h"

#include <algorithm>
#include <cmath>
#include <ostream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/common/log.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/tp_split.h"
#include "runtime/serving/auth.h"
#include "runtime/tokenizer/text_stream.h"

namespace deltaserve {

namespace {

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// How long a write to a remote worker may take once shutdown has begun.
constexpr auto kGoodbyeTimeout = std::chrono::seconds(2);

// A step's deadline from the cost model (CoordinatorOptions::step_timeout_s):
// trusted once it has fitted this many of the worker's steps (the first ones
// also page the weights in), with this much slack over what it expects.
constexpr int64_t kStepsBeforeExpecting = 8;
constexpr double kStepSlack = 10;
// How fast a slow step stops counting in Worker::recent_slowest_s: by this
// factor per result (a tenth of it after 22).
constexpr double kSlowestDecay = 0.9;

// Workers a request may lose before it fails: a request that takes down
// every worker it runs on (a poison request) must not take the fleet too.
constexpr int kMaxWorkersLost = 3;

// A peer's text for the log: escaped and cut short, so that it cannot forge
// lines or drive the terminal.
std::string Quoted(const std::string& text) {
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, 256)), "\"");
}

// A worker's error text as it reaches a client's status and the log: its
// first kMaxPeerErrorBytes, with control characters, quotes and bytes past
// ASCII escaped (a status message must stay one readable line).
constexpr size_t kMaxPeerErrorBytes = 1024;
std::string PeerError(const std::string& text) {
  if (text.size() <= kMaxPeerErrorBytes &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) {
    return text;
  }
  std::string out = absl::CHexEscape(text.substr(0, kMaxPeerErrorBytes));
  if (text.size() > kMaxPeerErrorBytes) {
    absl::StrAppend(&out, "... (", text.size() - kMaxPeerErrorBytes, " more bytes)");
  }
  return out;
}

// Why a checked result of a remote worker says the worker, not a request,
// failed: it refused the step, or every output it carries is an error; ""
// otherwise. The errors have been through PeerError.
std::string AllFailed(const StepResult& result) {
  if (!result.error.empty()) return absl::StrCat("it refused a step: ", result.error);
  if (result.outputs.empty() ||
      !std::all_of(result.outputs.begin(), result.outputs.end(),
                   [](const SequenceResult& out) { return !out.error.empty(); })) {
    return "";
  }
  return absl::StrCat("it failed every sequence of a step (", result.outputs.size(),
                      "), the first with: ", result.outputs.front().error);
}

}  // namespace

struct Request {
  std::string request_id;
  std::string principal;  // who sent it ("" on a port that authenticates no one)
  bool score = false;
  // What the scheduler runs: as admitted, or the continuation a lost worker
  // handed back (Scheduler::Abandon).
  SequenceRequest sequence;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;         // of the current run, from its worker's prefix cache
  std::unique_ptr<TextStream> text;  // generate, with a tokenizer

  // Progress.
  uint64_t worker = 0;   // the worker running it, once assigned to one
  int workers_lost = 0;  // workers that went away while it was on them
  int64_t generated = 0;
  std::vector<float> score_logprobs;
  Clock::time_point accepted, scheduled, first_token, last_token;
  bool was_scheduled = false;
  int64_t prefilled = 0;  // prompt tokens of the current run whose step has run
  // What its client was last told of the prefill, and when (admission
  // before the first).
  int64_t progress_told = 0;
  Clock::time_point progress_at;

  // RPC side (under the coordinator's mutex).
  std::condition_variable events_cv;  // its RPC thread waits here
  std::vector<TokenEvent> events;
  std::optional<PrefillProgress> progress;  // news for the client, taken by Poll
  bool ended = false;
  std::optional<RequestOutcome> outcome;  // set when ended, taken by Poll
};

const std::string& RequestHandle::request_id() const { return request_->request_id; }

namespace {

// Prompt tokens a request counts for in the queue: a continuation's too.
int64_t QueuedTokens(const Request& r) { return static_cast<int64_t>(r.sequence.prompt.size()); }

// --step-log: a JSON object per step and line, flushed, so that a benchmark
// reads chunk sizes and times along a prompt while it runs.
void WriteStepRecords(std::ostream& out, uint64_t worker,
                      const std::vector<Scheduler::StepRecord>& records) {
  for (const Scheduler::StepRecord& r : records) {
    out << "{\"worker\":" << worker << ",\"step\":" << r.step_id << ",\"prefill\":[";
    for (size_t i = 0; i < r.prefill.size(); ++i) {
      out << (i > 0 ? "," : "") << "{\"tokens\":" << r.prefill[i].tokens
          << ",\"prefix\":" << r.prefill[i].prefix << "}";
    }
    out << "],\"decode_rows\":" << r.decode_rows << ",\"wall_s\":" << r.wall_s
        << ",\"stage_compute_s\":[";
    for (size_t i = 0; i < r.stage_compute_s.size(); ++i) {
      out << (i > 0 ? "," : "") << r.stage_compute_s[i];
    }
    out << "]}" << std::endl;
  }
}

// One line per request at its end, for the operator (docs/deployment.md,
// "Logs"): the client's id (the text it sent, escaped by the log), who sent
// it, its tokens and times, how it ended and the worker it ended on (0: it
// never reached one).
void LogEnd(const Request& r, const RequestOutcome& outcome) {
  const bool ok = outcome.status.ok();
  const std::string id = OwnRequestId(r.principal, r.request_id).value_or(r.request_id);
  const char* reason = !ok                                        ? "error"
                       : r.score                                  ? "scored"
                       : outcome.reason == FinishReason::kStop    ? "stop"
                       : outcome.reason == FinishReason::kContext ? "context"
                                                                  : "length";
  const std::string status = ok ? "OK" : absl::StatusCodeToString(outcome.status.code());
  log::Write(ok ? log::Level::kInfo : log::Level::kWarning, "coordinator",
             ok ? "request finished" : "request failed",
             {{"request", id.substr(0, 256)},
              {"principal", r.principal},
              {"kind", r.score ? "score" : "generate"},
              {"prompt_tokens", r.prompt_tokens},
              {"generated_tokens", r.generated},
              {"time_to_first_token_s", outcome.time_to_first_token_s},
              {"total_s", outcome.total_s},
              {"finish_reason", reason},
              {"status", status},
              {"error", std::string(outcome.status.message().substr(0, 256))},
              {"worker", r.worker}});
}

}  // namespace

double StepAllowance(double expected_s, double recent_slowest_s, double floor_s, double timeout_s) {
  return std::clamp(kStepSlack * std::max(expected_s, recent_slowest_s),
                    std::min(floor_s, timeout_s), timeout_s);
}

WorkerInfo MakeWorkerInfo(const ModelConfig& config, const WorldLayout& layout,
                          const std::string& description, StatePoolSize state,
                          StateUnitBytes unit) {
  WorkerInfo info;
  info.cache_pages = state.pages;
  info.state_slots = state.slots;
  info.unit_bytes = unit;
  info.replicas = layout.replicas;
  info.pipeline_stages = layout.pp;
  info.tensor_parallel = layout.tp;
  info.description = description;
  info.config_json = ModelConfigToJson(config);
  return info;
}

Coordinator::Coordinator(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer,
                         CoordinatorOptions options, MetricsRegistry& m)
    : config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      options_(options),
      metrics_{
          m.AddHistogram("deltaserve_time_to_first_token_seconds",
                         "Time from accepting a Generate request to its first token.",
                         LatencyBuckets()),
          m.AddHistogram("deltaserve_time_per_output_token_seconds",
                         "Time between consecutive tokens of a request.", LatencyBuckets()),
          m.AddHistogram("deltaserve_e2e_request_latency_seconds",
                         "Time from accepting a request to its end.", LatencyBuckets()),
          m.AddHistogram("deltaserve_queue_time_seconds",
                         "Time from accepting a request to its first step.", LatencyBuckets()),
          m.AddGauge("deltaserve_requests_running", "Requests holding state on the worker."),
          m.AddGauge("deltaserve_requests_waiting", "Requests queued for a place."),
          m.AddCounter("deltaserve_prompt_tokens_total", "Prompt tokens prefilled."),
          m.AddCounter("deltaserve_generation_tokens_total", "Tokens generated."),
          m.AddCounter("deltaserve_requests_finished_total", "Requests that ended normally."),
          m.AddCounter("deltaserve_requests_failed_total",
                       "Requests that ended with an error, cancellation or deadline."),
          m.AddCounter("deltaserve_requests_rejected_total",
                       "Requests refused at admission (RESOURCE_EXHAUSTED)."),
          m.AddGauge("deltaserve_kda_state_bytes", "KDA state held on the worker, all ranks."),
          m.AddGauge("deltaserve_mla_cache_bytes",
                     "MLA latent cache held on the worker, all ranks."),
          m.AddGauge("deltaserve_prefill_tokens_per_second",
                     "Prompt tokens per second of the last step that prefilled."),
          m.AddGauge("deltaserve_workers_attached", "Workers (replicas) attached."),
          m.AddCounter("deltaserve_steps_total", "Steps run on the worker."),
          m.AddCounter("deltaserve_requests_rerun_total",
                       "Requests handed back by a lost worker to run on another."),
          m.AddCounter("deltaserve_workers_lost_total",
                       "Workers dropped or detached while attached."),
          m.AddGauge("deltaserve_prefix_cache_entries",
                     "Prefixes the workers' prefix caches hold (made or being made)."),
          m.AddGauge("deltaserve_prefix_cache_bytes",
                     "State the prefix caches' entries hold on a rank, summed over workers."),
          m.AddCounter("deltaserve_prefix_cache_lookups_total",
                       "Generations that looked in a prefix cache."),
          m.AddCounter("deltaserve_prefix_cache_hits_total",
                       "Generations that started from a cached prefix."),
          m.AddCounter("deltaserve_prefix_cache_tokens_total",
                       "Prompt tokens served from prefix caches instead of prefilled."),
          m.AddCounter("deltaserve_prefix_cache_evictions_total", "Cached prefixes evicted."),
      } {}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  std::vector<std::shared_ptr<Worker>> owned;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    stopped_at_ = Clock::now();
    const absl::Status status = absl::UnavailableError(
        draining_ ? "the server shut down before the request finished (--drain-timeout passed)"
                  : "the server is shutting down");
    std::vector<std::shared_ptr<Request>> live;
    for (const auto& [id, r] : by_id_) live.push_back(r);
    for (const auto& r : live) FailLocked(*r, status);
    SetServingLocked();
    // Each scheduler loop ends and says goodbye to its worker; the watchdog
    // cancels a write that does not complete within kGoodbyeTimeout.
    work_cv_.notify_all();
    watchdog_cv_.notify_all();
    ended_cv_.notify_all();
    for (const auto& [id, w] : workers_) owned.push_back(w);
    for (const auto& [id, w] : lost_) owned.push_back(w);
    threads_cv_.wait(lock, [&] {
      return std::all_of(owned.begin(), owned.end(), [](const auto& w) { return w->done; });
    });
    watchdog_stop_ = true;
    watchdog_cv_.notify_all();
  }
  for (const auto& w : owned) {
    std::thread t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      t = std::move(w->thread);
    }
    if (t.joinable()) t.join();
  }
  if (watchdog_.joinable()) watchdog_.join();
}

void Coordinator::SetServingCallback(std::function<void(bool)> callback) {
  std::lock_guard<std::mutex> lock(mu_);
  serving_callback_ = std::move(callback);
  serving_.reset();
  SetServingLocked();
}

void Coordinator::SetServingLocked() {
  const bool serving = !workers_.empty() && !draining_ && !stop_;
  if (serving_ == serving) return;
  serving_ = serving;
  if (serving_callback_) serving_callback_(serving);
}

int64_t Coordinator::Drain(Clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!draining_) {
    draining_ = true;
    SetServingLocked();
    log::Info("coordinator", absl::StrCat("draining: ", by_id_.size(),
                                          " requests running or queued, admitting no more"));
  }
  ended_cv_.wait_until(lock, until, [&] { return by_id_.empty() || stop_ || drain_cut_; });
  return static_cast<int64_t>(by_id_.size());
}

void Coordinator::CutDrain() {
  std::lock_guard<std::mutex> lock(mu_);
  drain_cut_ = true;
  ended_cv_.notify_all();
}

absl::StatusOr<RequestHandle> Coordinator::SubmitGenerate(
    std::string request_id, std::string principal, std::vector<int32_t> prompt,
    GenerateParams params, std::optional<Clock::time_point> deadline) {
  auto r = std::make_shared<Request>();
  r->request_id = std::move(request_id);
  r->principal = std::move(principal);
  SequenceRequest& s = r->sequence;
  s.kind = SequenceKind::kGenerate;
  s.prompt = std::move(prompt);
  s.sampling = params.sampling;
  s.seed = params.seed;
  s.logprobs = params.logprobs;
  s.top_logprobs = params.top_logprobs;
  s.max_tokens = params.max_tokens;
  s.stop_ids = std::move(params.stop_ids);
  s.cache_prefix = params.cache_prefix_tokens;
  // '\n' stands in no principal, so a principal and a salt cannot run into
  // another pair's.
  s.cache_namespace =
      absl::StrCat(options_.prefix_cache_shared ? "" : r->principal, "\n", params.cache_salt);
  s.cache_account = r->principal;
  s.deadline = deadline;
  if (tokenizer_ != nullptr) {
    r->text = std::make_unique<TextStream>(*tokenizer_, std::move(params.stop));
    if (!params.ignore_eos) {
      for (int32_t id : tokenizer_->end_ids()) s.stop_ids.push_back(id);
    }
  }
  return Admit(std::move(r));
}

absl::StatusOr<RequestHandle> Coordinator::SubmitScore(std::string request_id,
                                                       std::string principal,
                                                       std::vector<int32_t> tokens,
                                                       std::optional<Clock::time_point> deadline) {
  auto r = std::make_shared<Request>();
  r->request_id = std::move(request_id);
  r->principal = std::move(principal);
  r->score = true;
  r->sequence.kind = SequenceKind::kScore;
  r->sequence.prompt = std::move(tokens);
  r->sequence.deadline = deadline;
  return Admit(std::move(r));
}

absl::StatusOr<RequestHandle> Coordinator::Admit(std::shared_ptr<Request> r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return absl::UnavailableError("the server is shutting down");
  if (draining_) {
    metrics_.rejected.Add();
    return absl::UnavailableError(
        "the server is draining before it shuts down: it admits no new requests; retry on "
        "another server");
  }
  if (by_id_.contains(r->request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id: '", r->request_id, "' is already running or queued"));
  }
  r->prompt_tokens = static_cast<int64_t>(r->sequence.prompt.size());
  const bool room_to_run =
      waiting_.empty() && std::any_of(workers_.begin(), workers_.end(),
                                      [&](const auto& w) { return HasRoomLocked(*w.second); });
  if (!room_to_run) {
    if (static_cast<int64_t>(waiting_.size()) >= options_.max_waiting) {
      metrics_.rejected.Add();
      return absl::ResourceExhaustedError(
          absl::StrCat("the queue is full: ", waiting_.size(), " requests waiting (limit ",
                       options_.max_waiting, ", --max-waiting) behind the running ones"));
    }
    if (waiting_tokens_ + QueuedTokens(*r) > options_.max_waiting_tokens) {
      metrics_.rejected.Add();
      return absl::ResourceExhaustedError(
          absl::StrCat("the queue is full: ", waiting_tokens_, " prompt tokens waiting, ",
                       r->prompt_tokens, " more would pass the limit of ",
                       options_.max_waiting_tokens, " (--max-waiting-tokens)"));
    }
  }
  r->sequence.id = next_sequence_++;
  r->accepted = Clock::now();
  r->progress_at = r->accepted;
  by_id_[r->request_id] = r;
  by_sequence_[r->sequence.id] = r;
  waiting_.push_back(r);
  waiting_tokens_ += QueuedTokens(*r);
  UpdateGaugesLocked();
  work_cv_.notify_all();
  return RequestHandle(std::move(r));
}

std::optional<RequestOutcome> Coordinator::Poll(const RequestHandle& handle,
                                                std::vector<TokenEvent>* tokens,
                                                std::chrono::milliseconds wait,
                                                std::optional<PrefillProgress>* progress) {
  Request& r = *handle.request_;
  std::unique_lock<std::mutex> lock(mu_);
  r.events_cv.wait_for(lock, wait, [&] {
    return !r.events.empty() || r.ended || (progress != nullptr && r.progress);
  });
  if (progress != nullptr) {
    // Told before a token came in and taken with it: the token says more.
    *progress = r.events.empty() ? r.progress : std::nullopt;
    r.progress.reset();
  }
  for (TokenEvent& e : r.events) tokens->push_back(std::move(e));
  r.events.clear();
  if (!r.ended) return std::nullopt;
  return r.outcome;
}

void Coordinator::Cancel(const RequestHandle& handle, const absl::Status& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  FailLocked(*handle.request_, reason);
  work_cv_.notify_all();
}

bool Coordinator::Abort(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(request_id);
  if (it == by_id_.end()) return false;
  FailLocked(*it->second,
             absl::CancelledError(absl::StrCat("request '", request_id, "' was aborted")));
  work_cv_.notify_all();
  return true;
}

ServerStatusData Coordinator::Status(const std::string* account) const {
  std::lock_guard<std::mutex> lock(mu_);
  ServerStatusData s;
  s.worker_attached = !workers_.empty();
  s.workers = static_cast<int32_t>(workers_.size());
  s.waiting_requests = static_cast<int64_t>(waiting_.size());
  s.waiting_tokens = waiting_tokens_;
  for (const auto& [id, w] : workers_) {
    s.running_sequences += w->scheduler.load();
    s.kda_state_bytes += w->scheduler.held().kda_bytes;
    s.mla_cache_bytes += w->scheduler.held().mla_bytes;
    s.mla_cache_tokens += w->scheduler.held_tokens();
    s.prefix_cache += account ? w->scheduler.prefix_cache(*account) : w->scheduler.prefix_cache();
  }
  s.steps = steps_;
  s.requests_finished = finished_;
  s.requests_failed = failed_;
  for (const auto& [sequence, r] : by_sequence_) {  // sequence ids grow with admission
    RequestStatusData& e = s.requests.emplace_back();
    e.request_id = r->request_id;
    e.score = r->score;
    e.prompt_tokens = r->prompt_tokens;
    e.prefill = {r->prefilled, static_cast<int64_t>(r->sequence.prompt.size())};
    e.generated_tokens = r->generated;
    e.worker = r->worker;
  }
  for (const auto& [id, w] : workers_) {
    WorkerStatusData& e = s.worker_status.emplace_back();
    e.id = id;
    e.pipeline_stages = w->info.pipeline_stages;
    e.tensor_parallel = w->info.tensor_parallel;
    e.running_sequences = w->scheduler.load();
    e.cache_pages = w->scheduler.options().cache_pages;
    e.reserved_pages = w->scheduler.reserved_pages();
    e.state_slots = w->scheduler.options().state_slots;
    e.held_slots = w->scheduler.held_sequences();
    e.steps = w->steps;
    e.cost_per_token_s = w->scheduler.cost().a();
    e.cost_per_pair_s = w->scheduler.cost().b();
    e.prefix_cache = account ? w->scheduler.prefix_cache(*account) : w->scheduler.prefix_cache();
  }
  if (!workers_.empty()) {
    const WorkerInfo& info = workers_.begin()->second->info;
    s.pp = info.pipeline_stages;
    s.tp = info.tensor_parallel;
  }
  return s;
}

// --- Ending requests --------------------------------------------------------

void Coordinator::FinishLocked(Request& r, RequestOutcome outcome) {
  if (r.ended) return;
  const auto now = Clock::now();
  outcome.prompt_tokens = r.prompt_tokens;
  outcome.cached_tokens = r.cached_tokens;
  outcome.completion_tokens = r.generated;
  outcome.queue_s = r.was_scheduled ? Seconds(r.accepted, r.scheduled) : Seconds(r.accepted, now);
  outcome.time_to_first_token_s = r.generated == 0 ? 0 : Seconds(r.accepted, r.first_token);
  outcome.total_s = Seconds(r.accepted, now);
  if (r.score) outcome.score_logprobs = std::move(r.score_logprobs);
  // One verdict for the status counts and the metrics, so they agree.
  const bool ok = outcome.status.ok();
  (ok ? metrics_.finished : metrics_.failed).Add();
  metrics_.e2e.Observe(outcome.total_s);
  if (!r.was_scheduled) metrics_.queue.Observe(outcome.queue_s);
  LogEnd(r, outcome);
  r.ended = true;
  r.outcome = std::move(outcome);
  ++(ok ? finished_ : failed_);
  // Out of the queue, or out of its worker's scheduler (which releases its
  // state with the next step).
  auto it = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](const std::shared_ptr<Request>& p) { return p.get() == &r; });
  if (it != waiting_.end()) {
    waiting_.erase(it);
    waiting_tokens_ -= QueuedTokens(r);
  }
  if (auto w = workers_.find(r.worker); w != workers_.end()) {
    w->second->scheduler.Finish(r.sequence.id);
  }
  r.worker = 0;
  by_sequence_.erase(r.sequence.id);
  by_id_.erase(r.request_id);
  UpdateGaugesLocked();
  r.events_cv.notify_all();
  if (by_id_.empty()) ended_cv_.notify_all();
}

void Coordinator::FailLocked(Request& r, const absl::Status& status) {
  RequestOutcome outcome;
  outcome.status = status;
  FinishLocked(r, std::move(outcome));
}

void Coordinator::UpdateGaugesLocked() {
  int64_t running = 0, kda = 0, mla = 0;
  PrefixCacheStats held;  // the caches' entries and bytes now
  for (const auto& [id, w] : workers_) {
    running += w->scheduler.load();
    kda += w->scheduler.held().kda_bytes;
    mla += w->scheduler.held().mla_bytes;
    // The counters take what each cache did since they last looked.
    const PrefixCacheStats& c = w->scheduler.prefix_cache();
    PrefixCacheStats& seen = w->cache_counted;
    metrics_.cache_lookups.Add(static_cast<double>(c.lookups - seen.lookups));
    metrics_.cache_hits.Add(static_cast<double>(c.hits - seen.hits));
    metrics_.cache_tokens.Add(static_cast<double>(c.cached_tokens - seen.cached_tokens));
    metrics_.cache_evictions.Add(static_cast<double>(c.evictions - seen.evictions));
    seen = c;
    held += c;
  }
  metrics_.cache_entries.Set(static_cast<double>(held.entries));
  metrics_.cache_bytes.Set(static_cast<double>(held.bytes));
  metrics_.running.Set(static_cast<double>(running));
  metrics_.waiting.Set(static_cast<double>(waiting_.size()));
  metrics_.kda_bytes.Set(static_cast<double>(kda));
  metrics_.mla_bytes.Set(static_cast<double>(mla));
  metrics_.worker.Set(static_cast<double>(workers_.size()));
}

// --- The worker link --------------------------------------------------------

absl::StatusOr<uint64_t> Coordinator::AttachWorker(const WorkerInfo& info,
                                                   std::shared_ptr<WorkerConnection> connection) {
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig theirs,
                              ParseModelConfig(info.config_json, "the worker's config.json"));
  if (ModelConfigToJson(theirs) != ModelConfigToJson(config_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the worker's model (", theirs.model_type, ", ", theirs.num_layers,
                     " layers, hidden ", theirs.hidden_size, ", vocab ", theirs.vocab_size,
                     ") is not the coordinator's: start both with the same --model"));
  }
  // A layout the model can have: one replica, a stage per layer at most, and
  // a tensor-parallel size that divides what it splits (a hello is untrusted:
  // the scheduler keeps state per stage).
  const auto bad_layout = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the worker's layout (", info.replicas, " replicas of ", info.pipeline_stages, " stages x ",
        info.tensor_parallel, " tensor-parallel ranks) is not valid: ", why));
  };
  if (info.replicas != 1) return bad_layout("a worker is one replica");
  if (info.pipeline_stages < 1 || info.pipeline_stages > config_.num_layers) {
    return bad_layout(
        absl::StrCat("the model's ", config_.num_layers, " layers make 1 to that many stages"));
  }
  if (info.tensor_parallel < 1) return bad_layout("it needs a tensor-parallel rank");
  if (absl::Status tp = CheckTensorParallel(config_, info.tensor_parallel); !tp.ok()) {
    return bad_layout(std::string(tp.message()));
  }
  if (info.cache_pages < 0 || info.cache_pages > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("the worker's MLA cache of ", info.cache_pages,
                                                   " pages is not valid (0 to 2^31 - 1)"));
  }
  // 4 GiB a page or slot is far past any model's, and keeps an entry's cost
  // (pages of a prompt of up to 2^31 tokens) within int64.
  constexpr int64_t kMaxUnitBytes = int64_t{1} << 32;
  if (info.unit_bytes.page < 0 || info.unit_bytes.page > kMaxUnitBytes ||
      info.unit_bytes.slot < 0 || info.unit_bytes.slot > kMaxUnitBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the worker's state of ", info.unit_bytes.page,
                                                   " bytes a page and ", info.unit_bytes.slot,
                                                   " bytes a slot is not valid (0 to 2^32 each)"));
  }
  if (info.state_slots != 0 && (info.state_slots < 2 || info.state_slots > INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the worker's ", info.state_slots, " state slots are not valid (0, or 2 to 2^31 - 1)"));
  }
  SchedulerOptions options;
  options.max_running = options_.max_running;
  options.cache_pages = info.cache_pages;
  options.state_slots = info.state_slots;
  // The prefix cache counts its budget in the worker's page and slot bytes;
  // a worker that gives none has no cache.
  options.page_bytes = info.unit_bytes.page;
  options.slot_bytes = info.unit_bytes.slot;
  if (info.unit_bytes.page + info.unit_bytes.slot > 0) {
    options.prefix_cache_bytes = options_.prefix_cache_bytes;
    options.prefix_cache_account_bytes = options_.prefix_cache_principal_bytes;
  }
  options.step_tokens = options_.step_tokens;
  options.pipeline_stages = info.pipeline_stages;
  // A worker behind a link keeps its decoding sequences stepping while their
  // results travel back (Scheduler's decode_ahead); one in this process
  // answers each step at once.
  options.decode_ahead = !connection->Inline();
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return absl::UnavailableError("the coordinator is shutting down");
  auto w = std::make_shared<Worker>(next_worker_++, info, std::move(connection),
                                    Scheduler(config_, options));
  // The threads start under the lock, so they find the worker registered.
  // When one cannot be started, nothing of the worker stays.
  try {
    if (!watchdog_.joinable()) watchdog_ = std::thread([this] { Watchdog(); });
    w->thread = std::thread([this, w] { SchedulerLoop(w); });
  } catch (const std::system_error& e) {
    log::Error("coordinator", absl::StrCat("worker ", Quoted(info.description),
                                           " refused: cannot start its thread: ", e.what()));
    return absl::ResourceExhaustedError(
        absl::StrCat("the coordinator cannot start a thread for this worker: ", e.what()));
  }
  workers_[w->id] = w;
  UpdateGaugesLocked();
  SetServingLocked();
  log::Info("coordinator", absl::StrCat("worker ", w->id, " attached: ", Quoted(info.description)));
  work_cv_.notify_all();
  return w->id;
}

absl::Status CheckPeerResult(const StepResult& result, int64_t vocab_size) {
  const auto bad_time = [](double s) { return !std::isfinite(s) || s < 0; };
  if (bad_time(result.wall_s)) {
    return absl::InvalidArgumentError(absl::StrCat("wall_s is ", result.wall_s));
  }
  for (size_t i = 0; i < result.stage_compute_s.size(); ++i) {
    if (bad_time(result.stage_compute_s[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage_compute_s[", i, "] is ", result.stage_compute_s[i]));
    }
  }
  // A log-prob is at most 0 (a probability of at most 1); -infinity is one
  // the model gives no chance.
  const auto bad_logprob = [](float p) { return !(p <= 0.0f); };
  for (size_t o = 0; o < result.outputs.size(); ++o) {
    const SequenceResult& r = result.outputs[o];
    const std::string where = absl::StrCat("output ", o, " (sequence ", r.sequence_id, ")");
    if (r.token < -1 || r.token >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": token ", r.token, " outside a vocabulary of ", vocab_size));
    }
    if (r.top_ids.size() != r.top_logprobs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", r.top_ids.size(), " top ids but ",
                                                     r.top_logprobs.size(), " top log-probs"));
    }
    for (int32_t id : r.top_ids) {
      if (id < 0 || id >= vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": top id ", id, " outside a vocabulary of ", vocab_size));
      }
    }
    if (bad_logprob(r.logprob)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": logprob is ", r.logprob));
    }
    for (const std::vector<float>* list : {&r.top_logprobs, &r.target_logprobs}) {
      for (float p : *list) {
        if (bad_logprob(p)) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": a log-prob is ", p));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::OnStepResult(uint64_t worker, StepResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end()) return absl::OkStatus();
  absl::Status ok = CheckPeerResult(result, config_.vocab_size);
  if (ok.ok()) ok = it->second->scheduler.CheckResult(result);
  result.error = PeerError(result.error);
  for (SequenceResult& out : result.outputs) out.error = PeerError(out.error);
  if (!ok.ok()) {
    LoseWorkerLocked(it->second, absl::StrCat("it sent a malformed result: ", ok.message()),
                     /*end_link=*/false, /*leaving=*/false);
    return ok;
  }
  // A worker that refused the step, or failed every sequence it asked for,
  // may be what is broken: its requests run again elsewhere rather than
  // fail, and a request that fails on kMaxWorkersLost workers in turn ends
  // with the last one's error. A step where some sequences fail and others
  // do not fails just those (a prompt the model gives non-finite logits).
  if (std::string why = AllFailed(result); !why.empty()) {
    LoseWorkerLocked(it->second, why, /*end_link=*/true, /*leaving=*/false);
    return absl::OkStatus();
  }
  TakeResultLocked(*it->second, std::move(result));
  work_cv_.notify_all();
  return absl::OkStatus();
}

void Coordinator::DetachWorker(uint64_t worker, const std::string& why, bool leaving) {
  std::unique_lock<std::mutex> lock(mu_);
  if (auto it = workers_.find(worker); it != workers_.end()) {
    LoseWorkerLocked(it->second, why, /*end_link=*/false, leaving);
  }
  auto it = lost_.find(worker);
  if (it == lost_.end()) return;
  const std::shared_ptr<Worker> w = it->second;
  // A loop still writing to a peer that does not read is cut loose.
  if (!threads_cv_.wait_for(lock, std::chrono::seconds(1), [&] { return w->done; })) {
    w->connection->Cancel();
    threads_cv_.wait(lock, [&] { return w->done; });
  }
  std::thread t = std::move(w->thread);  // empty when Shutdown took it
  lost_.erase(worker);
  lock.unlock();
  if (t.joinable()) t.join();
}

void Coordinator::LoseWorkerLocked(std::shared_ptr<Worker> w, const std::string& why, bool end_link,
                                   bool leaving) {
  if (w->gone) return;
  log::Warning("coordinator", absl::StrCat("worker ", w->id, " lost: ", why));
  w->gone = true;
  metrics_.workers_lost.Add();
  workers_.erase(w->id);
  lost_[w->id] = w;  // until its thread is joined
  if (end_link) w->connection->Cancel();
  // Every request it had goes back to the front of the queue, in order, to
  // run on another replica (a generation from its tokens so far); while
  // there is none they wait, within their deadlines.
  Scheduler::Abandoned abandoned = w->scheduler.Abandon();
  w->sent.clear();
  const absl::Status status =
      absl::UnavailableError(absl::StrCat("the worker went away (", why, ")"));
  for (uint64_t id : abandoned.lost) {
    if (auto it = by_sequence_.find(id); it != by_sequence_.end()) {
      const std::shared_ptr<Request> r = it->second;
      FailLocked(*r, status);
    }
  }
  std::vector<std::shared_ptr<Request>> rerun;
  for (SequenceRequest& s : abandoned.rerun) {
    auto it = by_sequence_.find(s.id);
    if (it == by_sequence_.end()) continue;
    Request& r = *it->second;
    const bool had_started = std::find(abandoned.started.begin(), abandoned.started.end(), s.id) !=
                             abandoned.started.end();
    if (had_started && !leaving && ++r.workers_lost >= kMaxWorkersLost) {
      const std::shared_ptr<Request> keep = it->second;
      FailLocked(r, absl::UnavailableError(absl::StrCat("the request lost ", r.workers_lost,
                                                        " workers in turn, the last because ", why,
                                                        "; it is not run again")));
      continue;
    }
    if (r.score) r.score_logprobs.clear();  // scoring starts over
    r.sequence = std::move(s);
    r.prefilled = 0;
    r.worker = 0;
    waiting_tokens_ += QueuedTokens(r);
    rerun.push_back(it->second);
  }
  waiting_.insert(waiting_.begin(), rerun.begin(), rerun.end());
  if (!rerun.empty()) {
    metrics_.rerun.Add(static_cast<double>(rerun.size()));
    log::Info("coordinator",
              absl::StrCat(rerun.size(), " requests of worker ", w->id, " queued to run again",
                           workers_.empty() ? " (no worker attached: they wait for one)" : ""));
  }
  SetServingLocked();
  UpdateGaugesLocked();
  work_cv_.notify_all();
  threads_cv_.notify_all();
}

// --- Scheduling -------------------------------------------------------------

bool Coordinator::HasRoomLocked(const Worker& w) const {
  if (!w.scheduler.HasRoom()) return false;
  // New requests go to the least loaded worker.
  return std::none_of(workers_.begin(), workers_.end(), [&](const auto& other) {
    return other.second->scheduler.load() < w.scheduler.load();
  });
}

void Coordinator::AssignLocked(Worker& w) {
  // Deadlines of requests still in the queue: they end before costing more.
  const auto now = Clock::now();
  std::vector<std::shared_ptr<Request>> expired;
  for (const auto& r : waiting_) {
    if (r->sequence.deadline && now >= *r->sequence.deadline) expired.push_back(r);
  }
  for (const auto& r : expired) {
    FailLocked(*r, absl::DeadlineExceededError("the request's deadline passed"));
  }
  while (!waiting_.empty() && HasRoomLocked(w)) {
    std::shared_ptr<Request> r = std::move(waiting_.front());
    waiting_.pop_front();
    waiting_tokens_ -= QueuedTokens(*r);
    r->worker = w.id;
    w.scheduler.Add(r->sequence);
  }
  UpdateGaugesLocked();
}

void Coordinator::HandleEventsLocked(const std::vector<SchedulerEvent>& events) {
  const auto now = Clock::now();
  for (const SchedulerEvent& e : events) {
    auto it = by_sequence_.find(e.id);
    if (it == by_sequence_.end()) continue;  // ended meanwhile
    const std::shared_ptr<Request> r = it->second;
    switch (e.kind) {
      case SchedulerEvent::Kind::kStarted:
        r->cached_tokens = e.cached_tokens;
        if (!r->was_scheduled) {
          r->was_scheduled = true;
          r->scheduled = now;
          metrics_.queue.Observe(Seconds(r->accepted, now));
        }
        break;
      case SchedulerEvent::Kind::kFailed:
        FailLocked(*r, e.status);
        break;
      case SchedulerEvent::Kind::kPrefilled:  // no prefix requests over the API yet
        break;
      case SchedulerEvent::Kind::kProgress:
        OnProgressLocked(*r, e);
        break;
      case SchedulerEvent::Kind::kToken:
        OnTokenLocked(*r, e);
        break;
      case SchedulerEvent::Kind::kPiece: {
        const auto& lp = e.output.target_logprobs;
        r->score_logprobs.insert(r->score_logprobs.end(), lp.begin(), lp.end());
        if (e.finished) {
          // The last token has no target.
          r->score_logprobs.resize(std::max<int64_t>(r->prompt_tokens - 1, 0));
          FinishLocked(*r, RequestOutcome{});
        }
        break;
      }
    }
  }
}

void Coordinator::OnProgressLocked(Request& r, const SchedulerEvent& event) {
  r.prefilled = event.prefilled;
  // The client hears of it only while prompt is left (the first token or the
  // scores say the rest), before any token, at most once an interval, and
  // only past what it was told (a re-run starts its prefill over).
  const double interval = options_.progress_interval_s;
  if (!(interval > 0) || r.generated > 0 || event.prefilled >= event.prompt_tokens ||
      event.prefilled <= r.progress_told) {
    return;
  }
  const auto now = Clock::now();
  if (Seconds(r.progress_at, now) < interval) return;
  r.progress = PrefillProgress{event.prefilled, event.prompt_tokens};
  r.progress_told = event.prefilled;
  r.progress_at = now;
  r.events_cv.notify_all();
}

void Coordinator::OnTokenLocked(Request& r, const SchedulerEvent& event) {
  const auto now = Clock::now();
  const SequenceResult& out = event.output;
  ++r.generated;
  metrics_.generation_tokens.Add();
  if (r.generated == 1) {
    r.first_token = now;
    metrics_.ttft.Observe(Seconds(r.accepted, now));
  } else {
    metrics_.tpot.Observe(Seconds(r.last_token, now));
  }
  r.last_token = now;

  TokenEvent e;
  e.id = out.token;
  e.logprob = out.logprob;
  e.top_ids = out.top_ids;
  e.top_logprobs = out.top_logprobs;
  std::optional<RequestOutcome> end;
  if (event.finished) {
    end = RequestOutcome{};
    end->reason = event.reason;
    end->stop = event.stop;
  }
  if (r.text != nullptr) {
    StopStrings::Output text = r.text->Add(out.token, event.finished);
    e.text = std::move(text.text);
    if (text.stop) {
      end = RequestOutcome{};
      end->reason = FinishReason::kStop;
      end->stop = *text.stop;
    }
  }
  r.events.push_back(std::move(e));
  r.events_cv.notify_all();
  if (end) FinishLocked(r, std::move(*end));
}

void Coordinator::TakeResultLocked(Worker& w, StepResult result) {
  Scheduler::Update update = w.scheduler.TakeResult(std::move(result));
  if (options_.step_log != nullptr) WriteStepRecords(*options_.step_log, w.id, update.records);
  const auto now = Clock::now();
  for (int64_t i = 0; i < update.steps && !w.sent.empty(); ++i) {
    const double took = Seconds(std::max(w.sent.front().at, w.answered), now);
    w.recent_slowest_s = std::max(took, kSlowestDecay * w.recent_slowest_s);
    w.sent.pop_front();
  }
  if (update.steps > 0) w.answered = now;
  steps_ += update.steps;
  w.steps += update.steps;
  metrics_.steps.Add(static_cast<double>(update.steps));
  metrics_.prompt_tokens.Add(static_cast<double>(update.prefill_tokens));
  if (update.prefill_tokens > 0 && update.wall_s > 0) {
    metrics_.prefill_rate.Set(static_cast<double>(update.prefill_tokens) / update.wall_s);
  }
  HandleEventsLocked(update.events);
  UpdateGaugesLocked();
}

void Coordinator::SchedulerLoop(std::shared_ptr<Worker> w) {
  const bool timed = !w->connection->Inline();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !w->gone) {
    AssignLocked(*w);
    if (!w->scheduler.CanSchedule()) {
      work_cv_.wait(lock);
      continue;
    }
    std::vector<SchedulerEvent> events;
    std::optional<Step> step = w->scheduler.Schedule(Clock::now(), &events);
    HandleEventsLocked(events);
    if (!step) {
      work_cv_.wait_for(lock, std::chrono::milliseconds(10));
      continue;
    }
    if (timed) {
      // The result is due within the step's allowance.
      w->sent.push_back({Clock::now(), AllowedLocked(*w, step->id)});
      watchdog_cv_.notify_all();
    }
    lock.unlock();
    absl::StatusOr<std::optional<StepResult>> sent = w->connection->Send(*step);
    lock.lock();
    if (w->gone) break;
    if (!sent.ok()) {
      LoseWorkerLocked(w, absl::StrCat("the link to it broke: ", sent.status().message()),
                       /*end_link=*/true, /*leaving=*/false);
      break;
    }
    if (sent->has_value()) TakeResultLocked(*w, std::move(**sent));
  }
  if (!w->gone) {
    // Shutdown: tell the worker, so that its ranks end cleanly instead of
    // seeing a broken link.
    w->writing = Clock::now();
    watchdog_cv_.notify_all();
    lock.unlock();
    w->connection->Shutdown();
    lock.lock();
    w->writing.reset();
  }
  w->done = true;
  threads_cv_.notify_all();
}

double Coordinator::AllowedLocked(const Worker& w, uint64_t step_id) const {
  if (w.steps < kStepsBeforeExpecting) return options_.step_timeout_s;
  // The cost model fits the slowest stage; a step passes through them all.
  const double expected = w.scheduler.ExpectedSeconds(step_id) *
                          static_cast<double>(std::max(1, w.info.pipeline_stages));
  return StepAllowance(expected, w.recent_slowest_s, options_.step_timeout_floor_s,
                       options_.step_timeout_s);
}

std::optional<Clock::time_point> Coordinator::DueLocked(const Worker& w, std::string* why) const {
  if (w.connection->Inline()) return std::nullopt;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.step_timeout_s));
  std::optional<Clock::time_point> due;
  if (!w.sent.empty()) {
    // Results come in step order: the oldest step's clock starts when it was
    // sent or when the one before it was answered.
    const Worker::Sent& front = w.sent.front();
    due = std::max(front.at, w.answered) + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(front.allowed_s));
    *why = front.allowed_s < options_.step_timeout_s
               ? absl::StrCat("no answer to a step within ", front.allowed_s, " s (", kStepSlack,
                              " times what its cost model expects or its recent steps took, at "
                              "least ",
                              options_.step_timeout_floor_s, " s, --step-timeout-floor)")
               : absl::StrCat("no answer to a step within ", options_.step_timeout_s,
                              " s (--step-timeout)");
  }
  if (w.writing && (!due || *w.writing + timeout < *due)) {
    due = *w.writing + timeout;
    *why = absl::StrCat("a write to its stream did not complete within ", options_.step_timeout_s,
                        " s (--step-timeout)");
  }
  if (stop_ && (w.writing || !w.sent.empty())) {
    // Shutting down: a write still blocked after kGoodbyeTimeout is cut.
    const auto cut = stopped_at_ + kGoodbyeTimeout;
    if (!due || cut < *due) {
      due = cut;
      *why = "a write to it was still blocked 2 s into shutdown";
    }
  }
  return due;
}

void Coordinator::Watchdog() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!watchdog_stop_) {
    const auto now = Clock::now();
    std::optional<Clock::time_point> next;
    std::vector<std::pair<std::shared_ptr<Worker>, std::string>> overdue;
    for (const auto& [id, w] : workers_) {
      std::string why;
      const std::optional<Clock::time_point> due = DueLocked(*w, &why);
      if (!due) continue;
      if (*due <= now) {
        overdue.emplace_back(w, std::move(why));
      } else if (!next || *due < *next) {
        next = due;
      }
    }
    for (auto& [w, why] : overdue) LoseWorkerLocked(w, why, /*end_link=*/true, /*leaving=*/false);
    if (!overdue.empty()) continue;
    if (next) {
      watchdog_cv_.wait_until(lock, *next);
    } else {
      watchdog_cv_.wait(lock);
    }
  }
}

}  // namespace deltaserve
