// What score and generate need from whatever runs a sequence: a Session in
// one process, or this rank's part of a pipeline (runtime/engine/pipeline.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace deltaserve {

class SequenceRunner {
 public:
  virtual ~SequenceRunner() = default;

  // Feeds `tokens` in pieces of at most `chunk` tokens (0: all at once).
  // Returns the logits of every token when all_logits ([T, vocab]), else of
  // the last one ([vocab]) — on ranks that produce logits; empty elsewhere.
  virtual absl::StatusOr<std::vector<float>> Prefill(std::span<const int32_t> tokens,
                                                     int64_t chunk = 0,
                                                     bool all_logits = false) = 0;
  // One token; returns its logits [vocab] (empty where no logits are made).
  virtual absl::StatusOr<std::vector<float>> Decode(int32_t token) = 0;

  // Whether this runner's Prefill/Decode return logits, and whether it is the
  // one that reports (writes files, prints tokens).
  virtual bool HasLogits() const { return true; }
  virtual bool IsOutput() const { return true; }
  // The token the output runner chose, made known to every runner.
  virtual absl::StatusOr<int32_t> ShareToken(int32_t token) { return token; }
};

}  // namespace deltaserve
