// One sequence's inference session in one process: prefill any number of
// token pieces, then decode token by token; and generation on top of any
// SequenceRunner (sampling, timings).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/sampling.h"
#include "runtime/engine/sequence_runner.h"
#include "runtime/model/model.h"

namespace deltaserve {

class Session : public SequenceRunner {
 public:
  explicit Session(const Model& model) : model_(model), state_(model.NewSequence()) {}

  absl::StatusOr<std::vector<float>> Prefill(std::span<const int32_t> tokens, int64_t chunk = 0,
                                             bool all_logits = false) override;
  absl::StatusOr<std::vector<float>> Decode(int32_t token) override;

  const SequenceState& state() const { return *state_; }
  int64_t length() const { return state_->length; }

 private:
  const Model& model_;
  std::unique_ptr<SequenceState> state_;
};

struct GenerateOptions {
  int64_t max_tokens = 32;
  kernels::SamplingParams sampling;
  uint64_t seed = 0;
  int64_t prefill_chunk = 0;      // 0: the whole prompt at once
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double time_to_first_token_s = 0;  // prefill + first sample
  double decode_s = 0;               // everything after the first token
};

// Prefills `prompt`, then samples up to max_tokens tokens, calling on_token
// for each as soon as it is chosen (on every runner, after ShareToken); a
// token in stop_ids is the last.
absl::StatusOr<GenerateStats> Generate(SequenceRunner& runner, int64_t vocab,
                                       std::span<const int32_t> prompt,
                                       const GenerateOptions& options,
                                       const std::function<void(int32_t)>& on_token);

// Logits of every token: the first `decode_from` tokens (all when <= 0) by
// prefill in pieces of `chunk`, the rest one decode step each. [T, vocab] on
// runners with logits.
absl::StatusOr<std::vector<float>> ScoreTokens(SequenceRunner& runner,
                                               std::span<const int32_t> tokens, int64_t chunk,
                                               int64_t decode_from);

}  // namespace deltaserve
