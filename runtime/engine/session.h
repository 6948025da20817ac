// One sequence's inference session: prefill any number of token pieces, then
// decode token by token, with generation on top (sampling, timings).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/sampling.h"
#include "runtime/model/model.h"

namespace deltaserve {

class Session {
 public:
  explicit Session(const Model& model)
      : model_(model), state_(model.NewSequence()) {}

  // Feeds `tokens` in pieces of at most `chunk` tokens (0: all at once).
  // Returns the logits of every token when all_logits ([T, vocab]), else of
  // the last one ([vocab]).
  absl::StatusOr<std::vector<float>> Prefill(std::span<const int32_t> tokens,
                                             int64_t chunk = 0,
                                             bool all_logits = false);
  // One token; returns its logits [vocab].
  absl::StatusOr<std::vector<float>> Decode(int32_t token);

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
  int64_t prefill_chunk = 0;  // 0: the whole prompt at once
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double time_to_first_token_s = 0;  // prefill + first sample
  double decode_s = 0;               // everything after the first token
};

// Prefills `prompt`, then samples up to max_tokens tokens, calling on_token
// for each as soon as it is chosen.
absl::StatusOr<GenerateStats> Generate(
    const Model& model, std::span<const int32_t> prompt,
    const GenerateOptions& options,
    const std::function<void(int32_t)>& on_token);

}  // namespace deltaserve
