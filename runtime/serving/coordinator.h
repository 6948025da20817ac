// The coordinator: admits requests, keeps the queue, and drives the attached
// workers (replicas), each on its own scheduler thread with its own
// Scheduler (runtime/scheduler/scheduler.h, the batching policy). A waiting
// request goes to the least loaded replica and stays there. Sampled tokens
// come back through the scheduler's events and are detokenized, checked
// against stop strings (runtime/tokenizer/text_stream.h) and handed to the
// request's RPC. Cancellation, deadlines and finished requests free the
// sequence's state on the worker with the next step. A worker that goes away
// (killed, link broken, malformed result, no answer within the step timeout,
// or leaving) hands its requests back to the queue: they re-run on another
// replica, a generation from its tokens so far (Scheduler::Abandon), and wait
// while there is none. Drain stops admitting and lets the admitted finish.
// Each worker is owned here, with one scheduler thread that is joined when
// the worker leaves; a watchdog thread drops a remote worker whose step or
// stream write is overdue, so a stalled peer never holds shutdown.
// Thread-safe: RPC threads submit and poll, scheduler threads run steps, the
// worker link delivers results. No protobuf here: the link converts
// (runtime/serving/worker_codec.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/sampling.h"
#include "runtime/comm/world_layout.h"
#include "runtime/engine/step.h"
#include "runtime/model/config.h"
#include "runtime/scheduler/scheduler.h"
#include "runtime/serving/metrics.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

using Clock = std::chrono::steady_clock;

struct CoordinatorOptions {
  int64_t max_running = 64;              // sequences holding state, per worker
  int64_t max_waiting = 1024;            // requests queued behind them
  int64_t max_waiting_tokens = 1 << 23;  // prompt tokens queued
  int64_t step_tokens = 512;             // token budget of one step
  // A remote worker's step result, or a write to its stream, overdue by this
  // much drops the worker (its requests re-run elsewhere). Once its cost
  // model has learned from kStepsBeforeExpecting steps, a step's result is
  // due sooner (StepAllowance), counted from when it was sent or the
  // previous result came, whichever is later: a worker cut off the network,
  // whose link stays up, is noticed seconds after its step was expected.
  double step_timeout_s = 300;
  double step_timeout_floor_s = 5;
  // When set, a JSON line per step taken in (worker, step, prefill pieces,
  // decode rows, wall and stage compute times): `--step-log`.
  std::shared_ptr<std::ostream> step_log;
  // A request's prefill progress goes to its client at most this often
  // (seconds; 0: never). See Poll.
  double progress_interval_s = 1;
  // Each worker's prefix cache (Scheduler, "Prefix cache"): the bytes of
  // state its entries may hold on a rank; 0: none. `--prefix-cache-bytes`.
  int64_t prefix_cache_bytes = int64_t{1} << 30;
  // Who may start from whose entries: by default each principal only from
  // its own requests' (another's hit would tell it what it sent); shared,
  // every principal from every one's (`--prefix-cache-shared`). A request's
  // cache_salt narrows either to the requests with the same salt. And what
  // one principal's entries may hold of prefix_cache_bytes (0: all of it;
  // `--prefix-cache-principal-bytes`, a quarter by default); a server that
  // authenticates no one has one principal, "", which may hold all of it.
  bool prefix_cache_shared = false;
  int64_t prefix_cache_principal_bytes = 0;
};

struct GenerateParams {
  kernels::SamplingParams sampling;
  uint64_t seed = 0;
  int64_t max_tokens = 16;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_ids;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool ignore_eos = false;
  // SequenceRequest::cache_prefix: prompt tokens later requests will share.
  int64_t cache_prefix_tokens = 0;
  // The prefix cache namespace within the principal's (or the shared one),
  // as vLLM's cache_salt: only requests with the same salt share entries.
  std::string cache_salt;
};

struct TokenEvent {
  int32_t id = 0;
  std::string text;
  float logprob = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

// How far a prompt's prefill has come: prompt tokens whose step has run, of
// all the run prefills.
struct PrefillProgress {
  int64_t tokens_done = 0;
  int64_t tokens_total = 0;
};

struct RequestOutcome {
  absl::Status status;  // not OK: failed, cancelled or timed out
  FinishReason reason = FinishReason::kLength;
  std::string stop;  // the stop string or token that ended it
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt, from the prefix cache (not prefilled)
  int64_t completion_tokens = 0;
  double queue_s = 0, time_to_first_token_s = 0, total_s = 0;
  std::vector<float> score_logprobs;  // Score: one per token after the first
};

struct Request;  // coordinator.cc

// What the service layer sees of a request.
class RequestHandle {
 public:
  const std::string& request_id() const;

 private:
  friend class Coordinator;
  explicit RequestHandle(std::shared_ptr<Request> r) : request_(std::move(r)) {}
  std::shared_ptr<Request> request_;
};

// A live request, queued or running.
struct RequestStatusData {
  std::string request_id;  // as submitted (scoped by the service layer)
  bool score = false;
  int64_t prompt_tokens = 0;
  PrefillProgress prefill;  // of the run now on a worker
  int64_t generated_tokens = 0;
  uint64_t worker = 0;  // 0: queued
};

// An attached worker and the cost model its scheduler fitted to its steps.
struct WorkerStatusData {
  uint64_t id = 0;
  int32_t pipeline_stages = 0, tensor_parallel = 0;
  int64_t running_sequences = 0;  // assigned to it
  int64_t cache_pages = 0;        // its MLA cache pages (0: not known)
  int64_t reserved_pages = 0;     // of those, reserved by its running sequences
  int64_t state_slots = 0;        // sequences it holds state for at once (0: not known)
  int64_t held_slots = 0;         // of those, held by its sequences now
  int64_t steps = 0;
  double cost_per_token_s = 0, cost_per_pair_s = 0;  // ChunkCostModel::a() and b()
  PrefixCacheStats prefix_cache;
};

struct ServerStatusData {
  bool worker_attached = false;
  int32_t workers = 0;
  int64_t waiting_requests = 0, waiting_tokens = 0, running_sequences = 0;
  int64_t kda_state_bytes = 0, mla_cache_bytes = 0, mla_cache_tokens = 0;
  // Requests that ended normally and with an error: the counts of
  // deltaserve_requests_finished_total and deltaserve_requests_failed_total.
  int64_t steps = 0, requests_finished = 0, requests_failed = 0;
  int32_t pp = 0, tp = 0;                   // of the first worker
  PrefixCacheStats prefix_cache;            // summed over the attached workers
  std::vector<RequestStatusData> requests;  // in the order admitted
  std::vector<WorkerStatusData> worker_status;
};

// Who a worker is: its layout and model, from its hello.
struct WorkerInfo {
  int32_t replicas = 1, pipeline_stages = 1, tensor_parallel = 1;
  std::string description;  // hosts and ranks, for logs
  std::string config_json;  // must match the coordinator's model
  // Its MLA cache in pages (Scheduler admission); 0: not bounded by the
  // coordinator, the worker refuses what does not fit.
  int64_t cache_pages = 0;
  // Sequences each rank holds state for at once (Scheduler admission); 0: not
  // bounded by the coordinator.
  int64_t state_slots = 0;
  // Its first rank's page and slot bytes (the prefix cache's budget); 0: no
  // prefix cache for it.
  StateUnitBytes unit_bytes;
};

// How long a step's result may take once a worker's cost model has learned
// its steps: 10 times what the model expects of it through every stage, or
// 10 times the slowest of the worker's recent steps (so a model that guesses
// low on a worker whose steps vary does not drop it), whichever is more; at
// least floor_s, at most timeout_s.
double StepAllowance(double expected_s, double recent_slowest_s, double floor_s, double timeout_s);

WorkerInfo MakeWorkerInfo(const ModelConfig& config, const WorldLayout& layout,
                          const std::string& description, StatePoolSize state = {0, 0},
                          StateUnitBytes unit = {});

// A step result from a worker process is untrusted input: OK only if every
// field the coordinator reads makes sense for a model of `vocab_size` tokens:
// sampled and top token ids in the vocabulary (a sampled -1 only where the
// output carries no token), top ids and top log-probs of equal length,
// log-probs not NaN or +inf, timings finite and not negative. The error
// names the field, the output and the value.
absl::Status CheckPeerResult(const StepResult& result, int64_t vocab_size);

// The link the scheduler sends steps down; made for each attached worker.
class WorkerConnection {
 public:
  virtual ~WorkerConnection() = default;
  // Sends a step. A worker in this process runs it at once and returns its
  // result; a remote one returns nullopt and its result arrives through
  // Coordinator::OnStepResult. An error means the link broke.
  virtual absl::StatusOr<std::optional<StepResult>> Send(const Step& step) = 0;
  // The coordinator is going away: the worker's ranks may end.
  virtual void Shutdown() {}
  // True when Send runs the step in the calling thread (no link to time out).
  virtual bool Inline() const { return false; }
  // Ends the link now, from any thread: a Send or Shutdown blocked on it
  // returns, and so does the link's reader. Must not block.
  virtual void Cancel() {}
};

class Coordinator {
 public:
  Coordinator(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer, CoordinatorOptions options,
              MetricsRegistry& metrics);
  ~Coordinator();  // Shutdown()s

  const ModelConfig& config() const { return config_; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const CoordinatorOptions& options() const { return options_; }

  // Admission. The service layer has validated the fields; this checks the
  // request id is free and the queue limits (RESOURCE_EXHAUSTED when full).
  // `principal`: who sent it, for its log line ("" on a port that
  // authenticates no one); `request_id` is already scoped by it.
  absl::StatusOr<RequestHandle> SubmitGenerate(std::string request_id, std::string principal,
                                               std::vector<int32_t> prompt, GenerateParams params,
                                               std::optional<Clock::time_point> deadline);
  absl::StatusOr<RequestHandle> SubmitScore(std::string request_id, std::string principal,
                                            std::vector<int32_t> tokens,
                                            std::optional<Clock::time_point> deadline);
  // Takes the tokens made since the last call, waiting up to `wait` for any;
  // returns the outcome once the request has ended (and nothing after it).
  // `progress`, when given, receives the prefill's progress when there is
  // news for the client: at most every progress_interval_s (the first one
  // interval after admission), while prompt is left, before the first token
  // (never in a call that returns tokens), and only past what was last
  // reported (nullopt otherwise).
  std::optional<RequestOutcome> Poll(const RequestHandle& handle, std::vector<TokenEvent>* tokens,
                                     std::chrono::milliseconds wait,
                                     std::optional<PrefillProgress>* progress = nullptr);
  // Ends the request with `reason` (CANCELLED, DEADLINE_EXCEEDED) if it has
  // not ended; its state is released with the next step.
  void Cancel(const RequestHandle& handle, const absl::Status& reason);
  bool Abort(const std::string& request_id);
  // With `account` (a principal), every prefix cache figure is that
  // principal's part alone (Scheduler::prefix_cache(account)).
  ServerStatusData Status(const std::string* account = nullptr) const;

  // The worker link. Each attached worker is a replica with its own
  // scheduler thread; new requests go to the least loaded. Attach refuses a
  // worker whose model differs from ours, and one whose thread cannot be
  // started (RESOURCE_EXHAUSTED, nothing of it left registered).
  absl::StatusOr<uint64_t> AttachWorker(const WorkerInfo& info,
                                        std::shared_ptr<WorkerConnection> connection);
  // A remote worker's result. One that fails CheckPeerResult, or does not
  // match the step it answers (Scheduler::CheckResult), drops the worker (its
  // requests re-run elsewhere) and comes back as that error.
  absl::Status OnStepResult(uint64_t worker, StepResult result);
  // The worker's link is ending (`why` for the log; `leaving`: the worker
  // said so, on SIGTERM): it is dropped if it was not already, and its
  // scheduler thread joined before this returns. Called once per attached
  // worker by the thread that serves its link, never by a scheduler thread.
  // A worker that is never detached is joined by Shutdown. A request whose
  // worker goes runs again elsewhere; one that was running on kMaxWorkersLost
  // (3) workers that failed under it (not counting ones that left) ends with
  // UNAVAILABLE instead, so that a request that kills its worker cannot take
  // every replica down in turn.
  void DetachWorker(uint64_t worker, const std::string& why, bool leaving = false);
  // Called with true when the server can serve (a worker attached, not
  // draining), false when it stops.
  void SetServingCallback(std::function<void(bool)> callback);

  // Stops admitting (UNAVAILABLE, naming the drain), reports not serving,
  // and waits until every admitted request has ended or `until` passes.
  // Returns the number of requests still running or queued.
  int64_t Drain(Clock::time_point until);
  // Ends a Drain now (a second signal), from any thread.
  void CutDrain();
  // Ends what is left with UNAVAILABLE, says goodbye to the workers and joins
  // every thread. A write to a worker that does not complete within a few
  // seconds is cancelled, so this returns in bounded time.
  void Shutdown();

 private:
  // An attached worker: one replica, with its own scheduler and thread.
  // Owned by workers_ while attached, then by lost_ until its thread is
  // joined; the fields below `scheduler` are under mu_.
  struct Worker {
    Worker(uint64_t id, WorkerInfo info, std::shared_ptr<WorkerConnection> connection,
           Scheduler scheduler)
        : id(id),
          info(std::move(info)),
          connection(std::move(connection)),
          scheduler(std::move(scheduler)) {}
    const uint64_t id;
    const WorkerInfo info;
    const std::shared_ptr<WorkerConnection> connection;
    Scheduler scheduler;
    // Its prefix cache's counts as the metrics last took them in.
    PrefixCacheStats cache_counted;
    std::thread thread;  // its scheduler loop; joined by whoever moves it out
    bool gone = false;   // dropped: the loop ends
    bool done = false;   // the loop has ended
    // A remote worker's deadlines: when each step in flight was sent (in
    // step order), and when a write that is not a step (goodbye) began.
    struct Sent {
      Clock::time_point at;
      double allowed_s;  // how long its result may take (see CoordinatorOptions)
    };
    std::deque<Sent> sent;
    Clock::time_point answered;  // when the last result came in
    // The longest its recent results took (from when each was due to start,
    // as deadlines count): each result's time, or 0.9 of the one before.
    double recent_slowest_s = 0;
    std::optional<Clock::time_point> writing;
    int64_t steps = 0;  // results taken in
  };

  absl::StatusOr<RequestHandle> Admit(std::shared_ptr<Request> r);
  bool HasRoomLocked(const Worker& w) const;
  void AssignLocked(Worker& w);
  void TakeResultLocked(Worker& w, StepResult result);
  void HandleEventsLocked(const std::vector<SchedulerEvent>& events);
  void OnTokenLocked(Request& r, const SchedulerEvent& event);
  void OnProgressLocked(Request& r, const SchedulerEvent& event);
  void FinishLocked(Request& r, RequestOutcome outcome);
  void FailLocked(Request& r, const absl::Status& status);
  // Drops `w` (held by value: the caller's reference may be the map entry
  // this erases) and queues its requests to re-run; `end_link` cancels its
  // link too, for callers other than the link's own reader; `leaving`: the
  // worker chose to go, which no request counts against itself.
  void LoseWorkerLocked(std::shared_ptr<Worker> w, const std::string& why, bool end_link,
                        bool leaving);
  void SetServingLocked();
  void UpdateGaugesLocked();
  void SchedulerLoop(std::shared_ptr<Worker> w);
  // Drops remote workers whose step or write is overdue; runs until Shutdown.
  void Watchdog();
  std::optional<Clock::time_point> DueLocked(const Worker& w, std::string* why) const;
  // How long step `step_id`, about to be sent to `w`, may take to answer.
  double AllowedLocked(const Worker& w, uint64_t step_id) const;

  const ModelConfig config_;
  const std::unique_ptr<Tokenizer> tokenizer_;
  const CoordinatorOptions options_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // schedulers: work, results, worker changes
  bool stop_ = false;
  bool draining_ = false;
  bool drain_cut_ = false;
  std::optional<bool> serving_;         // last told to serving_callback_
  Clock::time_point stopped_at_;        // when Shutdown began
  std::condition_variable ended_cv_;    // Drain: a request ended
  std::condition_variable threads_cv_;  // a scheduler loop ended
  std::condition_variable watchdog_cv_;
  bool watchdog_stop_ = false;
  std::thread watchdog_;  // started with the first worker
  uint64_t next_sequence_ = 1;
  uint64_t next_worker_ = 1;
  std::map<std::string, std::shared_ptr<Request>> by_id_;  // live requests
  std::map<uint64_t, std::shared_ptr<Request>> by_sequence_;
  std::deque<std::shared_ptr<Request>> waiting_;         // on no worker yet
  int64_t waiting_tokens_ = 0;                           // their prompt tokens
  std::map<uint64_t, std::shared_ptr<Worker>> workers_;  // attached
  std::map<uint64_t, std::shared_ptr<Worker>> lost_;     // dropped, thread not yet joined
  std::function<void(bool)> serving_callback_;
  int64_t steps_ = 0, finished_ = 0, failed_ = 0;

  struct Metrics {
    Histogram& ttft;
    Histogram& tpot;
    Histogram& e2e;
    Histogram& queue;
    Gauge& running;
    Gauge& waiting;
    Counter& prompt_tokens;
    Counter& generation_tokens;
    Counter& finished;
    Counter& failed;
    Counter& rejected;
    Gauge& kda_bytes;
    Gauge& mla_bytes;
    Gauge& prefill_rate;
    Gauge& worker;
    Counter& steps;
    Counter& rerun;
    Counter& workers_lost;
    Gauge& cache_entries;
    Gauge& cache_bytes;
    Counter& cache_lookups;
    Counter& cache_hits;
    Counter& cache_tokens;
    Counter& cache_evictions;
  } metrics_;
};

}  // namespace deltaserve
