// Runs through the serving engine in this process (the path `deltaserve
// generate` and `score` take), for tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/host_data_communicator.h"
#include "runtime/comm/single_communicator.h"
#include "runtime/engine/replica.h"
#include "runtime/model/model.h"
#include "runtime/scheduler/offline_engine.h"
#include "tests/model_runs.h"

namespace deltaserve::testing {

// The whole model as a one-process replica.
class LocalReplica {
 public:
  explicit LocalReplica(const Model& model)
      : layout_(*WorldLayout::Make(1, 1, 1)),
        executor_(model, layout_, world_, stage_),
        replica_(executor_) {}
  Replica& replica() { return replica_; }

 private:
  SingleCommunicator world_;
  SingleDataCommunicator stage_;
  WorldLayout layout_;
  StepExecutor executor_;
  Replica replica_;
};

// Runs `requests` through the offline engine with fixed chunks (0: each
// prompt in one piece); the events in order.
inline std::vector<SchedulerEvent> RunEngine(const Model& model,
                                             std::vector<SequenceRequest> requests, int64_t chunk) {
  LocalReplica local(model);
  SchedulerOptions options;
  int64_t longest = 1;
  for (const auto& r : requests) longest = std::max<int64_t>(longest, r.prompt.size());
  options.step_tokens = chunk > 0 ? chunk * static_cast<int64_t>(requests.size()) : longest * 4;
  options.fixed_chunk = chunk > 0 ? chunk : longest;
  OfflineEngine engine(local.replica(), model.config(), options);
  for (auto& r : requests) engine.Add(std::move(r));
  std::vector<SchedulerEvent> events;
  const absl::Status status = engine.Run([&](const SchedulerEvent& e) { events.push_back(e); });
  EXPECT_TRUE(status.ok()) << status;
  for (const auto& e : events) {
    EXPECT_NE(e.kind, SchedulerEvent::Kind::kFailed) << e.status;
  }
  return events;
}

// Logits of every token of `tokens` through the engine: prefill pieces of
// `chunk` tokens (0: one piece), and one token per step from `decode_from`.
inline std::vector<float> EngineLogits(const Model& model, const std::vector<int32_t>& tokens,
                                       int64_t chunk, int64_t decode_from = 0) {
  SequenceRequest r;
  r.id = 1;
  r.kind = SequenceKind::kLogits;
  r.prompt = tokens;
  r.decode_from = decode_from;
  std::vector<float> logits;
  for (const auto& e : RunEngine(model, {r}, chunk)) {
    logits.insert(logits.end(), e.output.logits.begin(), e.output.logits.end());
  }
  return logits;
}

// A document as a prefix sequence (id 1) and each question as a fork of it
// (ids 10, 11, ...) of `kind`, generating up to `max_tokens`.
inline std::vector<SequenceRequest> PrefixAndForks(
    const std::vector<int32_t>& document, const std::vector<std::vector<int32_t>>& questions,
    SequenceKind kind, int64_t max_tokens) {
  std::vector<SequenceRequest> requests(1);
  requests[0].id = 1;
  requests[0].kind = SequenceKind::kPrefix;
  requests[0].prompt = document;
  requests[0].forks = static_cast<int64_t>(questions.size());
  for (size_t q = 0; q < questions.size(); ++q) {
    SequenceRequest r;
    r.id = 10 + q;
    r.kind = kind;
    r.prompt = questions[q];
    r.max_tokens = max_tokens;
    r.fork_from = 1;
    requests.push_back(std::move(r));
  }
  return requests;
}

}  // namespace deltaserve::testing
