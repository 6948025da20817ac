#include "runtime/serving/coordinator.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {

namespace {

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

struct Request {
  std::string request_id;
  uint64_t sequence_id = 0;
  bool score = false;
  std::vector<int32_t> prompt;
  GenerateParams params;
  std::optional<Clock::time_point> deadline;

  // Scheduler side.
  uint64_t worker = 0;     // the id of the worker running it, once admitted to one
  size_t fed = 0;          // prompt tokens sent to the worker
  bool started = false;    // the worker holds state for it
  bool awaiting = false;   // a step that samples its next token is in flight
  uint64_t last_step = 0;  // the last step that carried work for it
  std::vector<int32_t> generated;
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::string text;      // generated text so far
  size_t text_sent = 0;  // bytes of `text` handed out
  std::vector<float> score_logprobs;
  Clock::time_point accepted, scheduled, first_token, last_token;
  bool was_scheduled = false;

  // RPC side (under the coordinator's mutex).
  std::condition_variable events_cv;  // its RPC thread waits here
  std::vector<TokenEvent> events;
  bool ended = false;
  std::optional<RequestOutcome> outcome;  // set when ended, taken by Poll

  int64_t length() const { return static_cast<int64_t>(fed + generated.size()); }
};

const std::string& RequestHandle::request_id() const { return request_->request_id; }

Coordinator::Coordinator(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer,
                         CoordinatorOptions options, MetricsRegistry& m)
    : config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      options_(options),
      cost_(config_),
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
      } {}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  std::vector<std::shared_ptr<WorkerSender>> senders;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    const absl::Status status = absl::UnavailableError("the server is shutting down");
    while (!waiting_.empty()) FailLocked(*waiting_.front(), status);
    for (auto& [id, w] : workers_) {
      while (!w->running.empty()) FailLocked(*w->running.front(), status);
      senders.push_back(w->sender);
    }
  }
  work_cv_.notify_all();
  for (auto& t : schedulers_) t.join();
  // Tell the workers, so their ranks end cleanly instead of seeing a broken link.
  v1::CoordinatorMessage message;
  message.mutable_step()->set_shutdown(true);
  for (auto& sender : senders) sender->Send(message);
}

void Coordinator::SetServingCallback(std::function<void(bool)> callback) {
  std::lock_guard<std::mutex> lock(mu_);
  serving_callback_ = std::move(callback);
  if (serving_callback_) serving_callback_(!workers_.empty());
}

absl::StatusOr<RequestHandle> Coordinator::SubmitGenerate(
    std::string request_id, std::vector<int32_t> prompt, GenerateParams params,
    std::optional<Clock::time_point> deadline) {
  auto r = std::make_shared<Request>();
  r->request_id = std::move(request_id);
  r->prompt = std::move(prompt);
  r->params = std::move(params);
  r->deadline = deadline;
  if (tokenizer_ != nullptr) r->detok = std::make_unique<IncrementalDetokenizer>(*tokenizer_);
  if (!r->params.ignore_eos && tokenizer_ != nullptr) {
    for (int32_t id : tokenizer_->end_ids()) r->params.stop_ids.push_back(id);
  }
  return Admit(std::move(r));
}

absl::StatusOr<RequestHandle> Coordinator::SubmitScore(std::string request_id,
                                                       std::vector<int32_t> tokens,
                                                       std::optional<Clock::time_point> deadline) {
  auto r = std::make_shared<Request>();
  r->request_id = std::move(request_id);
  r->prompt = std::move(tokens);
  r->score = true;
  r->deadline = deadline;
  return Admit(std::move(r));
}

absl::StatusOr<RequestHandle> Coordinator::Admit(std::shared_ptr<Request> r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return absl::UnavailableError("the server is shutting down");
  if (by_id_.contains(r->request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id: '", r->request_id, "' is already running or queued"));
  }
  int64_t waiting_tokens = 0;
  for (const auto& w : waiting_) waiting_tokens += static_cast<int64_t>(w->prompt.size());
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
    if (waiting_tokens + static_cast<int64_t>(r->prompt.size()) > options_.max_waiting_tokens) {
      metrics_.rejected.Add();
      return absl::ResourceExhaustedError(
          absl::StrCat("the queue is full: ", waiting_tokens, " prompt tokens waiting, ",
                       r->prompt.size(), " more would pass the limit of ",
                       options_.max_waiting_tokens, " (--max-waiting-tokens)"));
    }
  }
  r->sequence_id = next_sequence_++;
  r->accepted = Clock::now();
  by_id_[r->request_id] = r;
  waiting_.push_back(r);
  UpdateGaugesLocked();
  work_cv_.notify_all();
  return RequestHandle(std::move(r));
}

std::optional<RequestOutcome> Coordinator::Poll(const RequestHandle& handle,
                                                std::vector<TokenEvent>* tokens,
                                                std::chrono::milliseconds wait) {
  Request& r = *handle.request_;
  std::unique_lock<std::mutex> lock(mu_);
  r.events_cv.wait_for(lock, wait, [&] { return !r.events.empty() || r.ended; });
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

ServerStatusData Coordinator::Status() const {
  std::lock_guard<std::mutex> lock(mu_);
  ServerStatusData s;
  s.worker_attached = !workers_.empty();
  s.workers = static_cast<int32_t>(workers_.size());
  s.waiting_requests = static_cast<int64_t>(waiting_.size());
  for (const auto& w : waiting_) s.waiting_tokens += static_cast<int64_t>(w->prompt.size());
  for (const auto& [id, w] : workers_) {
    s.running_sequences += static_cast<int64_t>(w->running.size());
    s.kda_state_bytes += w->held_kda;
    s.mla_cache_bytes += w->held_mla;
    for (const auto& r : w->running) s.mla_cache_tokens += r->started ? r->length() : 0;
  }
  s.steps = steps_;
  s.requests_finished = finished_;
  if (!workers_.empty()) {
    const v1::WorkerHello& hello = workers_.begin()->second->hello;
    s.pp = hello.pipeline_stages();
    s.tp = hello.tensor_parallel();
  }
  return s;
}

// --- Ending requests --------------------------------------------------------

void Coordinator::FinishLocked(Request& r, RequestOutcome outcome) {
  if (r.ended) return;
  const auto now = Clock::now();
  outcome.prompt_tokens = static_cast<int64_t>(r.prompt.size());
  outcome.completion_tokens = static_cast<int64_t>(r.generated.size());
  outcome.queue_s = r.was_scheduled ? Seconds(r.accepted, r.scheduled) : Seconds(r.accepted, now);
  outcome.time_to_first_token_s = r.generated.empty() ? 0 : Seconds(r.accepted, r.first_token);
  outcome.total_s = Seconds(r.accepted, now);
  if (r.score) outcome.score_logprobs = std::move(r.score_logprobs);
  (outcome.status.ok() ? metrics_.finished : metrics_.failed).Add();
  metrics_.e2e.Observe(outcome.total_s);
  if (!r.was_scheduled) metrics_.queue.Observe(outcome.queue_s);
  r.ended = true;
  r.outcome = std::move(outcome);
  ++finished_;
  auto drop = [&](auto& list) {
    list.erase(
        std::remove_if(list.begin(), list.end(), [&](const auto& p) { return p.get() == &r; }),
        list.end());
  };
  drop(waiting_);
  if (auto it = workers_.find(r.worker); it != workers_.end()) {
    Worker* w = it->second.get();
    if (r.started) w->pending_release.push_back(r.sequence_id);
    drop(w->running);
  }
  r.started = false;
  r.worker = 0;
  by_id_.erase(r.request_id);
  UpdateGaugesLocked();
  r.events_cv.notify_all();
}

void Coordinator::FailLocked(Request& r, const absl::Status& status) {
  RequestOutcome outcome;
  outcome.status = status;
  FinishLocked(r, std::move(outcome));
}

void Coordinator::UpdateGaugesLocked() {
  int64_t running = 0, kda = 0, mla = 0;
  for (const auto& [id, w] : workers_) {
    running += static_cast<int64_t>(w->running.size());
    kda += w->held_kda;
    mla += w->held_mla;
  }
  metrics_.running.Set(static_cast<double>(running));
  metrics_.waiting.Set(static_cast<double>(waiting_.size()));
  metrics_.kda_bytes.Set(static_cast<double>(kda));
  metrics_.mla_bytes.Set(static_cast<double>(mla));
  metrics_.worker.Set(static_cast<double>(workers_.size()));
}

// --- The worker link --------------------------------------------------------

absl::StatusOr<uint64_t> Coordinator::AttachWorker(const v1::WorkerHello& hello,
                                                   std::shared_ptr<WorkerSender> sender) {
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig theirs,
                              ParseModelConfig(hello.config_json(), "the worker's config.json"));
  if (ModelConfigToJson(theirs) != ModelConfigToJson(config_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the worker's model (", theirs.model_type, ", ", theirs.num_layers,
                     " layers, hidden ", theirs.hidden_size, ", vocab ", theirs.vocab_size,
                     ") is not the coordinator's: start both with the same --model"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return absl::UnavailableError("the coordinator is shutting down");
  auto w = std::make_shared<Worker>();
  w->id = next_worker_++;
  w->hello = hello;
  w->sender = std::move(sender);
  workers_[w->id] = w;
  UpdateGaugesLocked();
  if (workers_.size() == 1 && serving_callback_) serving_callback_(true);
  std::fprintf(stderr, "coordinator: worker %llu attached: %s\n",
               static_cast<unsigned long long>(w->id), hello.description().c_str());
  schedulers_.emplace_back([this, w] { SchedulerLoop(w); });
  work_cv_.notify_all();
  return w->id;
}

void Coordinator::OnStepResult(uint64_t worker, v1::StepResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end()) return;
  Worker& w = *it->second;
  const bool expected = std::any_of(w.in_flight.begin(), w.in_flight.end(), [&](const auto& step) {
    return step.step_id == result.step_id();
  });
  if (!expected) return;
  w.results[result.step_id()] = std::move(result);
  work_cv_.notify_all();
}

void Coordinator::DetachWorker(uint64_t worker, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker);
  if (it != workers_.end()) LoseWorkerLocked(*it->second, why);
}

void Coordinator::LoseWorkerLocked(Worker& w, const std::string& why) {
  std::fprintf(stderr, "coordinator: worker %llu lost: %s\n", static_cast<unsigned long long>(w.id),
               why.c_str());
  w.gone = true;
  // What the worker held is gone: requests it had state for end; requests it
  // never saw go back to the front of the queue in their order.
  const absl::Status status =
      absl::UnavailableError(absl::StrCat("the worker went away (", why, ")"));
  std::vector<std::shared_ptr<Request>> held = w.running;
  std::vector<std::shared_ptr<Request>> unseen;
  for (const auto& r : held) {
    if (r->started || r->fed > 0) {
      r->started = false;  // nothing to release on a worker that is gone
      FailLocked(*r, status);
    } else {
      r->worker = 0;
      unseen.push_back(r);
    }
  }
  waiting_.insert(waiting_.begin(), unseen.begin(), unseen.end());
  workers_.erase(w.id);  // its scheduler thread holds it until it sees `gone`
  w.running.clear();
  w.in_flight.clear();
  w.results.clear();
  if (workers_.empty() && serving_callback_) serving_callback_(false);
  UpdateGaugesLocked();
  work_cv_.notify_all();
}

// --- Scheduling -------------------------------------------------------------

bool Coordinator::HasRoomLocked(const Worker& w) const {
  if (static_cast<int64_t>(w.running.size()) >= options_.max_running) return false;
  // New requests go to the least loaded worker.
  return std::none_of(workers_.begin(), workers_.end(), [&](const auto& other) {
    return other.second->running.size() < w.running.size();
  });
}

bool Coordinator::HasWorkLocked(const Worker& w) const {
  if (!w.pending_release.empty()) return true;
  if (!waiting_.empty() && HasRoomLocked(w)) return true;
  return !w.running.empty();
}

v1::StepPlan Coordinator::BuildStepLocked(Worker& w, std::vector<StepItem>* items) {
  const auto now = Clock::now();
  // Deadlines first: a request past its deadline ends before it costs more.
  std::vector<std::shared_ptr<Request>> live(waiting_.begin(), waiting_.end());
  live.insert(live.end(), w.running.begin(), w.running.end());
  for (const auto& r : live) {
    if (r->deadline && now >= *r->deadline) {
      FailLocked(*r, absl::DeadlineExceededError("the request's deadline passed"));
    }
  }
  while (!waiting_.empty() && HasRoomLocked(w)) {
    waiting_.front()->worker = w.id;
    w.running.push_back(waiting_.front());
    waiting_.pop_front();
  }
  UpdateGaugesLocked();

  v1::StepPlan plan;
  plan.set_step_id(next_step_++);
  for (uint64_t id : w.pending_release) plan.add_release(id);
  w.pending_release.clear();

  int64_t budget_tokens = options_.step_tokens;
  double budget_s = cost_.Cost(options_.step_tokens, 0);
  auto add = [&](const std::shared_ptr<Request>& r, std::span<const int32_t> tokens,
                 v1::SequenceWork::Output output) {
    v1::SequenceWork* w = plan.add_work();
    w->set_sequence_id(r->sequence_id);
    w->set_start(!r->started);
    if (!r->started) {
      v1::StepSampling* s = w->mutable_sampling();
      s->set_temperature(r->params.sampling.temperature);
      s->set_top_k(static_cast<int32_t>(r->params.sampling.top_k));
      s->set_top_p(r->params.sampling.top_p);
      s->set_seed(r->params.seed);
    }
    w->mutable_tokens()->Add(tokens.begin(), tokens.end());
    w->set_output(output);
    w->set_logprobs(r->params.logprobs);
    w->set_top_logprobs(r->params.top_logprobs);
    if (output == v1::SequenceWork::OUTPUT_SCORE) {
      for (size_t i = 0; i < tokens.size(); ++i) {
        const size_t next = r->fed + i + 1;
        w->add_targets(next < r->prompt.size() ? r->prompt[next] : -1);
      }
    }
    const StepPiece piece{static_cast<int64_t>(tokens.size()), r->length()};
    budget_tokens -= piece.tokens;
    budget_s -= cost_.Cost(piece.tokens, piece.prefix);
    items->push_back({r, piece, output});
    r->started = true;
    r->last_step = plan.step_id();
    if (output == v1::SequenceWork::OUTPUT_SAMPLE) r->awaiting = true;
    if (!r->was_scheduled) {
      r->was_scheduled = true;
      r->scheduled = now;
      metrics_.queue.Observe(Seconds(r->accepted, now));
    }
  };
  // Decode: one token for each sequence past its prompt whose last token is
  // known (not still being sampled in a step in flight). With P pipeline
  // stages a step takes 1/P of the decoding sequences, least recently served
  // first, so P steps of them are in the pipeline at once.
  std::vector<std::shared_ptr<Request>> decoders, ready;
  for (const auto& r : w.running) {
    if (r->fed == r->prompt.size() && !r->generated.empty()) {
      decoders.push_back(r);
      if (!r->awaiting) ready.push_back(r);
    }
  }
  const size_t stages = std::max<int64_t>(1, w.hello.pipeline_stages());
  const size_t per_step = (decoders.size() + stages - 1) / stages;
  std::stable_sort(ready.begin(), ready.end(),
                   [](const auto& x, const auto& y) { return x->last_step < y->last_step; });
  if (ready.size() > per_step) ready.resize(per_step);
  for (const auto& r : ready) {
    add(r, std::span(&r->generated.back(), 1), v1::SequenceWork::OUTPUT_SAMPLE);
  }
  // Prefill. The oldest prompt is promised a quarter of the budget, so a long
  // one keeps moving under any load; the rest of the budget goes to the
  // shortest remaining prompts first, so short requests are not stuck behind
  // a million-token prefill; what is left returns to the oldest. The oldest
  // always gets some tokens, so a prompt progresses under any decode load.
  std::vector<std::shared_ptr<Request>> prefills;
  for (const auto& r : w.running) {
    if (r->fed < r->prompt.size()) prefills.push_back(r);
  }
  if (prefills.empty()) return plan;
  const std::shared_ptr<Request> oldest = prefills.front();
  std::stable_sort(prefills.begin() + 1, prefills.end(), [](const auto& x, const auto& y) {
    return x->prompt.size() - x->fed < y->prompt.size() - y->fed;
  });
  auto prefill = [&](const std::shared_ptr<Request>& r, int64_t max_tokens, double max_s) {
    const int64_t remaining = static_cast<int64_t>(r->prompt.size() - r->fed);
    const int64_t cap = std::min(remaining, std::max<int64_t>(max_tokens, 1));
    const int64_t n = cost_.ChunkFor(r->length(), std::max(max_s, 0.0), cap);
    const auto output = r->score         ? v1::SequenceWork::OUTPUT_SCORE
                        : n == remaining ? v1::SequenceWork::OUTPUT_SAMPLE
                                         : v1::SequenceWork::OUTPUT_NONE;
    add(r, std::span(r->prompt).subspan(r->fed, n), output);
    r->fed += n;
  };
  const int64_t reserve_tokens = std::max<int64_t>(budget_tokens / 4, 1);
  const double reserve_s = std::max(budget_s / 4, 0.0);
  for (size_t i = 1; i < prefills.size(); ++i) {
    if (budget_tokens - reserve_tokens <= 0 || budget_s - reserve_s <= 0) break;
    prefill(prefills[i], budget_tokens - reserve_tokens, budget_s - reserve_s);
  }
  prefill(oldest, budget_tokens, budget_s);
  return plan;
}

void Coordinator::OnTokenLocked(Request& r, const v1::SequenceOutput& out) {
  const auto now = Clock::now();
  const int32_t token = out.token();
  r.generated.push_back(token);
  metrics_.generation_tokens.Add();
  if (r.generated.size() == 1) {
    r.first_token = now;
    metrics_.ttft.Observe(Seconds(r.accepted, now));
  } else {
    metrics_.tpot.Observe(Seconds(r.last_token, now));
  }
  r.last_token = now;

  TokenEvent e;
  e.id = token;
  e.logprob = out.logprob();
  e.top_ids.assign(out.top_ids().begin(), out.top_ids().end());
  e.top_logprobs.assign(out.top_logprobs().begin(), out.top_logprobs().end());

  std::optional<RequestOutcome> end;
  if (std::find(r.params.stop_ids.begin(), r.params.stop_ids.end(), token) !=
      r.params.stop_ids.end()) {
    end = RequestOutcome{};
    end->reason = FinishReason::kStop;
    end->stop = absl::StrCat("token ", token);
  } else if (static_cast<int64_t>(r.generated.size()) >= r.params.max_tokens) {
    end = RequestOutcome{};
    end->reason = FinishReason::kLength;
  } else if (r.length() + 1 > config_.max_position_embeddings) {
    end = RequestOutcome{};
    end->reason = FinishReason::kContext;
  }
  if (r.detok != nullptr) {
    auto piece = r.detok->Add(token);
    r.text += piece.ok() ? *piece : std::string("\xEF\xBF\xBD");
    if (end) r.text += r.detok->Finish();
    // Stop strings: the earliest complete one ends the request, and its
    // text (and anything after it) is not sent; a tail that may still grow
    // into one is held back.
    size_t emit_to = r.text.size();
    size_t max_stop = 0;
    for (const auto& s : r.params.stop) max_stop = std::max(max_stop, s.size());
    if (max_stop > 0) {
      const size_t from = r.text_sent >= max_stop ? r.text_sent - max_stop + 1 : 0;
      size_t best = std::string::npos;
      const std::string* which = nullptr;
      for (const auto& s : r.params.stop) {
        const size_t at = r.text.find(s, from);
        if (at != std::string::npos && at < best) {
          best = at;
          which = &s;
        }
      }
      if (which != nullptr) {
        emit_to = best;
        end = RequestOutcome{};
        end->reason = FinishReason::kStop;
        end->stop = *which;
      } else if (!end) {
        for (const auto& s : r.params.stop) {
          for (size_t k = std::min(s.size() - 1, r.text.size()); k > 0; --k) {
            if (r.text.compare(r.text.size() - k, k, s, 0, k) == 0) {
              emit_to = std::min(emit_to, r.text.size() - k);
              break;
            }
          }
        }
      }
    }
    emit_to = std::max(emit_to, r.text_sent);
    e.text = r.text.substr(r.text_sent, emit_to - r.text_sent);
    r.text_sent = emit_to;
  }
  r.events.push_back(std::move(e));
  r.events_cv.notify_all();
  if (end) FinishLocked(r, std::move(*end));
}

void Coordinator::ProcessResultLocked(Worker& w, const v1::StepResult& result,
                                      const std::vector<StepItem>& items) {
  ++steps_;
  metrics_.steps.Add();
  for (const auto& item : items) {
    if (item.output == v1::SequenceWork::OUTPUT_SAMPLE) item.request->awaiting = false;
  }
  w.held_kda = result.kda_state_bytes();
  w.held_mla = result.mla_cache_bytes();
  UpdateGaugesLocked();
  if (!result.error().empty()) {
    // The worker refused the step and advanced nothing: its sequences end.
    const absl::Status status =
        absl::InternalError(absl::StrCat("the worker failed a step: ", result.error()));
    for (const auto& item : items) FailLocked(*item.request, status);
    return;
  }
  std::vector<StepPiece> pieces;
  int64_t prefill_tokens = 0;
  for (const auto& item : items) {
    pieces.push_back(item.piece);
    if (item.output != v1::SequenceWork::OUTPUT_SAMPLE || item.request->generated.empty()) {
      prefill_tokens += item.piece.tokens;
    }
  }
  // The cost model learns from the slowest stage's compute time: that is
  // what bounds a step in a pipeline, and it leaves out time a stage spent
  // waiting for its neighbours. The step's wall time stands in when no stage
  // time is reported.
  double stage_s = 0;
  for (double t : result.stage_compute_s()) stage_s = std::max(stage_s, t);
  cost_.Observe(pieces, stage_s > 0 ? stage_s : result.wall_s());
  metrics_.prompt_tokens.Add(static_cast<double>(prefill_tokens));
  if (prefill_tokens > 0 && result.wall_s() > 0) {
    metrics_.prefill_rate.Set(static_cast<double>(prefill_tokens) / result.wall_s());
  }
  std::map<uint64_t, const v1::SequenceOutput*> outputs;
  for (const auto& out : result.outputs()) outputs[out.sequence_id()] = &out;
  for (const auto& item : items) {
    Request& r = *item.request;
    if (r.ended) continue;  // cancelled while the step ran; released next step
    if (item.output == v1::SequenceWork::OUTPUT_NONE) continue;
    auto it = outputs.find(r.sequence_id);
    if (it == outputs.end()) {
      FailLocked(r, absl::InternalError("the worker's step result lacks this sequence"));
      continue;
    }
    if (item.output == v1::SequenceWork::OUTPUT_SAMPLE) {
      OnTokenLocked(r, *it->second);
    } else {
      const auto& lp = it->second->target_logprobs();
      r.score_logprobs.insert(r.score_logprobs.end(), lp.begin(), lp.end());
      // Done when every piece's result is in (later pieces may have been
      // sent already, with steps in flight).
      if (r.score_logprobs.size() == r.prompt.size()) {
        r.score_logprobs.resize(r.prompt.size() - 1);  // the last token has no target
        FinishLocked(r, RequestOutcome{});
      }
    }
  }
}

bool Coordinator::PromptLeftLocked(const Worker& w) const {
  if (!waiting_.empty() && HasRoomLocked(w)) return true;
  return std::any_of(w.running.begin(), w.running.end(),
                     [](const auto& r) { return r->fed < r->prompt.size(); });
}

bool Coordinator::DecodersOutsideLocked(const Worker& w, const std::vector<StepItem>& items) const {
  return std::any_of(w.running.begin(), w.running.end(), [&](const auto& r) {
    const bool decoding = r->fed == r->prompt.size() && !r->generated.empty();
    return decoding && std::none_of(items.begin(), items.end(),
                                    [&](const StepItem& i) { return i.request == r; });
  });
}

void Coordinator::SchedulerLoop(std::shared_ptr<Worker> w) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // Results are used in step order, whatever order they arrive in.
    while (!w->in_flight.empty() && w->results.contains(w->in_flight.front().step_id)) {
      auto node = w->results.extract(w->in_flight.front().step_id);
      ProcessResultLocked(*w, node.mapped(), w->in_flight.front().items);
      w->in_flight.pop_front();
    }
    if (stop_ || w->gone) break;
    // A step goes out when nothing is in flight, or when the last one sent
    // promised a successor and the window (one step per pipeline stage) has
    // room; otherwise wait for results, work or the end.
    const bool can_send =
        w->in_flight.empty()
            ? HasWorkLocked(*w)
            : w->promised && static_cast<int64_t>(w->in_flight.size()) < w->hello.pipeline_stages();
    if (!can_send) {
      work_cv_.wait(lock);
      continue;
    }
    InFlightStep step;
    v1::CoordinatorMessage message;
    *message.mutable_step() = BuildStepLocked(*w, &step.items);
    if (message.step().work_size() == 0 && message.step().release_size() == 0 && !w->promised) {
      continue;
    }
    // When the next step has work that needs nothing from this one (prompt
    // left to prefill, or sequences decoding that are not in this step),
    // promise a successor, so the worker starts it while its later stages
    // still run this one. A sequence sampled here sits the next step out.
    w->promised = w->hello.pipeline_stages() > 1 &&
                  (PromptLeftLocked(*w) || DecodersOutsideLocked(*w, step.items));
    message.mutable_step()->set_more_coming(w->promised);
    step.step_id = message.step().step_id();
    w->in_flight.push_back(std::move(step));
    lock.unlock();
    const bool sent = w->sender->Send(message);
    lock.lock();
    if (!sent && !w->gone) LoseWorkerLocked(*w, "the link to it broke");
  }
}

}  // namespace deltaserve
