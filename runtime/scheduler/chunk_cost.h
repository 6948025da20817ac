// How long a step takes, as a function of what it holds: each piece of n new
// tokens after a prefix of p tokens costs
//   a * n  +  b * n * (p + (n + 1) / 2)
// seconds: a for everything per token (projections, FFN/MoE, KDA, head), b for
// every query-key pair of MLA attention. The coefficients start from the
// model's FLOP counts (runtime/scheduler/stage_plan.h) at an assumed rate and
// are refitted, by least squares with forgetting, to the step times workers
// report. The scheduler uses it to cut prefill chunks that shrink as the
// prefix grows, so every step costs about what a full budget of fresh tokens
// costs and decode steps sharing it are not starved.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/config.h"

namespace deltaserve {

struct StepPiece {
  int64_t tokens = 0;  // new tokens
  int64_t prefix = 0;  // tokens the sequence held before them
};

class ChunkCostModel {
 public:
  // `flops_per_second` is the starting guess of the machine's rate.
  explicit ChunkCostModel(const ModelConfig& config, double flops_per_second = 5e10);

  double Cost(int64_t tokens, int64_t prefix) const;
  double Cost(const std::vector<StepPiece>& pieces) const;
  // Refits a and b to a step that took `seconds` (its overhead included).
  void Observe(const std::vector<StepPiece>& pieces, double seconds);
  // The largest n in [1, max_tokens] with Cost(n, prefix) <= budget_s; 1 when
  // even one token costs more (a step always makes progress).
  int64_t ChunkFor(int64_t prefix, double budget_s, int64_t max_tokens) const;

  double a() const { return a_; }
  double b() const { return b_; }

 private:
  void Refit();

  double a_, b_;
  // Forgetting sums of the normal equations for y = a x1 + b x2.
  double s11_ = 0, s12_ = 0, s22_ = 0, s1y_ = 0, s2y_ = 0;
};

}  // namespace deltaserve
