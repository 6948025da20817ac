// Runs through the serving engine in this process (the path `deltaserve
// generate` and `score` take), for tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/host_data_communicator.h"
#include "runtime/comm/single_communicator.h"
#include "runtime/engine/replica.h"
#include "runtime/model/model.h"
#include "runtime/scheduler/offline_engine.h"
#include "tests/model_runs.h"
#include "tests/test_util.h"

namespace deltaserve::testing {

// Fails the test for each sequence that failed.
inline void ExpectNoneFailed(const std::vector<SchedulerEvent>& events) {
  for (const auto& e : events) {
    EXPECT_NE(e.kind, SchedulerEvent::Kind::kFailed) << e.status;
  }
}

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
  ExpectNoneFailed(events);
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

// What a generation gives: its greedy tokens and the log-probs of each
// token's top alternatives.
struct Answer {
  std::vector<int32_t> tokens;
  std::vector<double> top_logprobs;
};
inline std::map<uint64_t, Answer> Answers(const std::vector<SchedulerEvent>& events) {
  std::map<uint64_t, Answer> answers;
  for (const SchedulerEvent& e : events) {
    if (e.kind != SchedulerEvent::Kind::kToken) continue;
    answers[e.id].tokens.push_back(e.output.token);
    for (float p : e.output.top_logprobs) answers[e.id].top_logprobs.push_back(p);
  }
  return answers;
}

// The same greedy tokens, and the top log-probs to the rounding that cutting
// a prompt differently gives (docs/numerics.md, "Invariance").
inline void ExpectAnswersEqual(const std::map<uint64_t, Answer>& got,
                               const std::map<uint64_t, Answer>& expected) {
  for (const auto& [id, want] : expected) {
    auto it = got.find(id);
    ASSERT_NE(it, got.end()) << "request " << id;
    EXPECT_EQ(it->second.tokens, want.tokens) << "request " << id;
    EXPECT_LE(
        RelL2(std::vector<float>(it->second.top_logprobs.begin(), it->second.top_logprobs.end()),
              want.top_logprobs),
        5e-5)
        << "request " << id;
  }
}

// A greedy generation of 6 tokens with its top 5 log-probs.
inline SequenceRequest Question(uint64_t id, std::vector<int32_t> prompt) {
  SequenceRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = 6;
  r.top_logprobs = 5;
  return r;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Generations for the prefix cache, to run one after another, and the
// prompt tokens each finds cached (pages of kCachePageTokens = 64): turns
// of a chat, each extending the last, and questions sharing a document up
// to a page boundary and past one.
struct PrefixCacheCase {
  std::vector<SequenceRequest> requests;
  std::map<uint64_t, int64_t> cached;
};
inline PrefixCacheCase MakePrefixCacheCase() {
  const std::vector<int32_t> document = RandomTokens(200, 31);
  const std::vector<int32_t> turn1 = Concat(document, RandomTokens(7, 32));
  const std::vector<int32_t> turn2 = Concat(turn1, RandomTokens(90, 33));
  const auto part = [&](size_t n, size_t more, uint64_t seed) {
    return Concat(std::vector<int32_t>(document.begin(), document.begin() + n),
                  RandomTokens(more, seed));
  };
  PrefixCacheCase c;
  c.requests = {
      Question(1, turn1),                 // a miss: an entry at 192
      Question(2, turn2),                 // its next turn: 192 from it
      Question(3, part(200, 30, 34)),     // the document again: 192
      Question(4, part(150, 10, 35)),     // shares 128 of it: an entry there
      Question(5, part(150, 20, 36)),     // which this one hits
      Question(6, RandomTokens(70, 37)),  // nothing shared
  };
  c.cached = {{1, 0}, {2, 192}, {3, 192}, {4, 0}, {5, 128}, {6, 0}};
  return c;
}

// `options` with a prefix cache of room for `entries` entries of a slot and
// four pages each, counted in `unit`.
inline SchedulerOptions WithPrefixCache(SchedulerOptions options, StateUnitBytes unit,
                                        int64_t entries) {
  options.page_bytes = unit.page;
  options.slot_bytes = unit.slot;
  options.prefix_cache_bytes = entries * (unit.slot + 4 * unit.page);
  return options;
}

// Runs `requests` through one engine, each after the last has ended (so
// each finds what the last left in the cache), then releases the cache's
// state on the replica; the events in order.
inline std::vector<SchedulerEvent> RunOneAfterAnother(
    Replica& replica, const ModelConfig& config, const SchedulerOptions& options,
    const std::vector<SequenceRequest>& requests) {
  OfflineEngine engine(replica, config, options);
  std::vector<SchedulerEvent> events;
  for (const SequenceRequest& r : requests) {
    engine.Add(r);
    const absl::Status status = engine.Run([&](const SchedulerEvent& e) { events.push_back(e); });
    EXPECT_TRUE(status.ok()) << status;
  }
  ExpectNoneFailed(events);
  const absl::Status cleared = engine.ClearPrefixCache();
  EXPECT_TRUE(cleared.ok()) << cleared;
  return events;
}

// The prompt tokens each generation found cached, from its kStarted.
inline std::map<uint64_t, int64_t> CachedTokens(const std::vector<SchedulerEvent>& events) {
  std::map<uint64_t, int64_t> cached;
  for (const SchedulerEvent& e : events) {
    if (e.kind == SchedulerEvent::Kind::kStarted) cached[e.id] = e.cached_tokens;
  }
  return cached;
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
