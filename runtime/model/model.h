// A loaded model of either architecture and its forward pass over a batch of
// sequences (each with its own state and any number of new tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/config.h"
#include "runtime/model/sequence_state.h"
#include "runtime/model/weights.h"

namespace deltaserve {

struct ForwardInput {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;  // new tokens, appended after state->length
  bool all_logits = false;          // logits of every new token, else the last one
};

class Model {
 public:
  // Reads DIR/config.json and the checkpoint, validates every tensor against
  // the config, and converts the weights to float32.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  std::unique_ptr<SequenceState> NewSequence() const;

  // Runs all inputs as one batch and advances each state by its tokens.
  // Returns logits [rows, vocab]: per input in order, one row per new token
  // when all_logits, else one row for its last token. Token ids out of range,
  // an empty input, or a context past max_position_embeddings are errors
  // naming the input, position and value; no state changes then.
  absl::StatusOr<std::vector<float>> Forward(
      std::span<const ForwardInput> inputs) const;

 private:
  Model(ModelConfig config, ModelWeights weights)
      : config_(std::move(config)), weights_(std::move(weights)) {}

  // The decoder stack on the embedded rows; returns the final hidden state
  // before the output norm, [rows, D].
  std::vector<float> Stack(const struct BatchRows& batch,
                           std::vector<float> hidden) const;

  ModelConfig config_;
  ModelWeights weights_;
};

}  // namespace deltaserve
