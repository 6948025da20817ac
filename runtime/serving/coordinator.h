// The coordinator: admits requests, keeps the queue, and schedules the
// attached workers (replicas), each on its own scheduler thread. A waiting
// request goes to the least loaded replica and stays there. Each step carries
// decode tokens for the replica's sequences past their prompt (1/P of them on
// a P-stage pipeline), then prefill chunks up to a token budget, each cut by a
// cost model so that chunks shrink as a sequence's MLA prefix grows
// (runtime/scheduler/chunk_cost.h). Steps that need nothing from their
// predecessor's result are sent ahead (more_coming), so pipeline stages
// overlap. Sampled tokens come back with the step's result and are
// detokenized, checked against stop conditions and handed to the request's
// RPC. Cancellation, deadlines and finished requests free the sequence's
// state on the worker with the next step. A worker that goes away fails the
// requests it held with UNAVAILABLE; requests it never started wait for
// another. Thread-safe: RPC threads submit and poll, scheduler threads run
// steps, the WorkerLink service delivers results.
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
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "deltaserve/v1/worker.pb.h"
#include "kernels/sampling.h"
#include "runtime/model/config.h"
#include "runtime/scheduler/chunk_cost.h"
#include "runtime/serving/metrics.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

using Clock = std::chrono::steady_clock;

struct CoordinatorOptions {
  int64_t max_running = 64;              // sequences holding state, per worker
  int64_t max_waiting = 1024;            // requests queued behind them
  int64_t max_waiting_tokens = 1 << 23;  // prompt tokens queued
  int64_t step_tokens = 512;             // token budget of one step
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
};

struct TokenEvent {
  int32_t id = 0;
  std::string text;
  float logprob = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

enum class FinishReason { kLength, kStop, kContext };

struct RequestOutcome {
  absl::Status status;  // not OK: failed, cancelled or timed out
  FinishReason reason = FinishReason::kLength;
  std::string stop;  // the stop string or token that ended it
  int64_t prompt_tokens = 0;
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

struct ServerStatusData {
  bool worker_attached = false;
  int32_t workers = 0;
  int64_t waiting_requests = 0, waiting_tokens = 0, running_sequences = 0;
  int64_t kda_state_bytes = 0, mla_cache_bytes = 0, mla_cache_tokens = 0;
  int64_t steps = 0, requests_finished = 0;
  int32_t pp = 0, tp = 0;  // of the first worker
};

// The link the scheduler sends step plans down; made by the WorkerLink
// service for each attached worker.
class WorkerSender {
 public:
  virtual ~WorkerSender() = default;
  virtual bool Send(const v1::CoordinatorMessage& message) = 0;  // false: link broken
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
  absl::StatusOr<RequestHandle> SubmitGenerate(std::string request_id, std::vector<int32_t> prompt,
                                               GenerateParams params,
                                               std::optional<Clock::time_point> deadline);
  absl::StatusOr<RequestHandle> SubmitScore(std::string request_id, std::vector<int32_t> tokens,
                                            std::optional<Clock::time_point> deadline);
  // Takes the tokens made since the last call, waiting up to `wait` for any;
  // returns the outcome once the request has ended (and nothing after it).
  std::optional<RequestOutcome> Poll(const RequestHandle& handle, std::vector<TokenEvent>* tokens,
                                     std::chrono::milliseconds wait);
  // Ends the request with `reason` (CANCELLED, DEADLINE_EXCEEDED) if it has
  // not ended; its state is released with the next step.
  void Cancel(const RequestHandle& handle, const absl::Status& reason);
  bool Abort(const std::string& request_id);
  ServerStatusData Status() const;

  // The worker link. Each attached worker is a replica with its own
  // scheduler thread; new requests go to the least loaded. Attach refuses a
  // worker whose model differs from ours.
  absl::StatusOr<uint64_t> AttachWorker(const v1::WorkerHello& hello,
                                        std::shared_ptr<WorkerSender> sender);
  void OnStepResult(uint64_t worker, v1::StepResult result);
  void DetachWorker(uint64_t worker, const std::string& why);
  // Called with true when a worker attaches, false when it goes.
  void SetServingCallback(std::function<void(bool)> callback);

  void Shutdown();

 private:
  struct StepItem {
    std::shared_ptr<Request> request;
    StepPiece piece;
    v1::SequenceWork::Output output;
  };
  struct InFlightStep {
    uint64_t step_id = 0;
    std::vector<StepItem> items;
  };
  // An attached worker: one replica, with its own requests, steps and
  // scheduler thread.
  struct Worker {
    uint64_t id = 0;
    v1::WorkerHello hello;
    std::shared_ptr<WorkerSender> sender;
    bool gone = false;
    std::vector<std::shared_ptr<Request>> running;  // holding (or about to hold) state
    std::vector<uint64_t> pending_release;
    std::deque<InFlightStep> in_flight;          // sent, in order
    std::map<uint64_t, v1::StepResult> results;  // arrived, not yet used
    bool promised = false;                       // the last step sent said more_coming
    int64_t held_kda = 0, held_mla = 0;          // after its last step
  };

  absl::StatusOr<RequestHandle> Admit(std::shared_ptr<Request> r);
  bool HasRoomLocked(const Worker& w) const;
  bool HasWorkLocked(const Worker& w) const;
  bool PromptLeftLocked(const Worker& w) const;
  bool DecodersOutsideLocked(const Worker& w, const std::vector<StepItem>& items) const;
  v1::StepPlan BuildStepLocked(Worker& w, std::vector<StepItem>* items);
  void ProcessResultLocked(Worker& w, const v1::StepResult& result,
                           const std::vector<StepItem>& items);
  void OnTokenLocked(Request& r, const v1::SequenceOutput& out);
  void FinishLocked(Request& r, RequestOutcome outcome);
  void FailLocked(Request& r, const absl::Status& status);
  void LoseWorkerLocked(Worker& w, const std::string& why);
  void UpdateGaugesLocked();
  void SchedulerLoop(std::shared_ptr<Worker> w);

  const ModelConfig config_;
  const std::unique_ptr<Tokenizer> tokenizer_;
  const CoordinatorOptions options_;
  ChunkCostModel cost_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // schedulers: work, results, worker changes
  bool stop_ = false;
  uint64_t next_sequence_ = 1;
  uint64_t next_step_ = 1;
  uint64_t next_worker_ = 1;
  std::map<std::string, std::shared_ptr<Request>> by_id_;  // live requests
  std::deque<std::shared_ptr<Request>> waiting_;
  std::map<uint64_t, std::shared_ptr<Worker>> workers_;
  std::vector<std::thread> schedulers_;  // one per worker ever attached
  std::function<void(bool)> serving_callback_;
  int64_t steps_ = 0, finished_ = 0;

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
  } metrics_;
};

}  // namespace deltaserve
