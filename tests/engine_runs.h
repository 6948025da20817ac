// Runs of a model for tests: the plain one-shot forward pass (the reference
// every other way of running must match) and runs through the serving
// engine in this process (the path `deltaserve generate` and `score` take).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/single_communicator.h"
#include "runtime/engine/replica.h"
#include "kernels/sampling.h"
#include "runtime/model/model.h"
#include "runtime/scheduler/offline_engine.h"

namespace deltaserve::testing {

// Logits [T, vocab] of `tokens` in one Model::Forward call.
inline std::vector<float> OneShotLogits(const Model& model, const std::vector<int32_t>& tokens) {
  auto state = model.NewSequence();
  const ForwardInput input{state.get(), tokens, /*all_logits=*/true};
  auto logits = model.Forward(std::span(&input, 1));
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>{};
}

// The whole model as a one-process replica.
class LocalReplica {
 public:
  explicit LocalReplica(const Model& model)
      : layout_(*WorldLayout::Make(1, 1, 1)), executor_(model, layout_, world_), replica_(executor_) {}
  Replica& replica() { return replica_; }

 private:
  SingleCommunicator world_;
  WorldLayout layout_;
  StepExecutor executor_;
  Replica replica_;
};

// Runs `requests` through the offline engine with fixed chunks (0: each
// prompt in one piece); the events in order.
inline std::vector<SchedulerEvent> RunEngine(const Model& model,
                                             std::vector<SequenceRequest> requests,
                                             int64_t chunk) {
  LocalReplica local(model);
  SchedulerOptions options;
  int64_t longest = 1;
  for (const auto& r : requests) longest = std::max<int64_t>(longest, r.prompt.size());
  options.step_tokens = chunk > 0 ? chunk * static_cast<int64_t>(requests.size()) : longest * 4;
  options.fixed_chunk = chunk > 0 ? chunk : longest;
  OfflineEngine engine(local.replica(), model.config(), options);
  for (auto& r : requests) engine.Add(std::move(r));
  std::vector<SchedulerEvent> events;
  const absl::Status status =
      engine.Run([&](const SchedulerEvent& e) { events.push_back(e); });
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

// The tokens `prompt` generates, by the plainest loop: Model::Forward and
// kernels::Sample with the sequence's own seeded generator (no end tokens).
inline std::vector<int32_t> ReferenceGenerate(const Model& model,
                                              const std::vector<int32_t>& prompt, int64_t n,
                                              const kernels::SamplingParams& sampling = {},
                                              uint64_t seed = 0) {
  auto state = model.NewSequence();
  kernels::Rng rng(seed);
  std::vector<int32_t> out;
  std::vector<int32_t> next = prompt;
  while (static_cast<int64_t>(out.size()) < n) {
    const ForwardInput input{state.get(), next, false};
    auto logits = model.Forward(std::span(&input, 1));
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) break;
    out.push_back(kernels::Sample(logits->data(), model.config().vocab_size, sampling, rng));
    next = {out.back()};
  }
  return out;
}

}  // namespace deltaserve::testing
