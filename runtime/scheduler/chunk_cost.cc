#include "runtime/scheduler/chunk_cost.h"

#include <algorithm>
#include <cmath>

#include "runtime/scheduler/stage_plan.h"

namespace deltaserve {
namespace {

// Weight of past steps after each new one: about the last 50 steps count.
constexpr double kForget = 0.98;
// The prior enters as this many pseudo-steps of evidence (one all per-token
// cost, one all attention pairs), forgotten like any other step: a few noisy
// first steps cannot swing the fit, and after a hundred it no longer counts.
constexpr double kPriorWeight = 2.0;
constexpr double kPriorTokens = 512;
constexpr double kPriorPairs = 512.0 * 4096;

double PairFeature(int64_t n, int64_t p) {
  return static_cast<double>(n) * (static_cast<double>(p) + (static_cast<double>(n) + 1) / 2);
}

}  // namespace

ChunkCostModel::ChunkCostModel(const ModelConfig& config, double flops_per_second) {
  // LayerCost counts T (T + 1) / 2 query-key pairs per MLA layer; one token
  // from an empty prefix has exactly one.
  double pair_flops = 0;
  double one_token = HeadCost(config, 1);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    one_token += LayerCost(config, l, 1);
    if (config.layer_kinds[static_cast<size_t>(l)] == LayerKind::kMla) {
      pair_flops += 2.0 * config.num_attention_heads *
                    (config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim);
    }
  }
  a_ = (one_token - pair_flops) / flops_per_second;
  b_ = pair_flops / flops_per_second;
  s11_ = kPriorWeight * kPriorTokens * kPriorTokens;
  s1y_ = kPriorWeight * kPriorTokens * kPriorTokens * a_;
  s22_ = kPriorWeight * kPriorPairs * kPriorPairs;
  s2y_ = kPriorWeight * kPriorPairs * kPriorPairs * b_;
}

double ChunkCostModel::Cost(int64_t tokens, int64_t prefix) const {
  return a_ * static_cast<double>(tokens) + b_ * PairFeature(tokens, prefix);
}

double ChunkCostModel::Cost(const std::vector<StepPiece>& pieces) const {
  double cost = 0;
  for (const StepPiece& piece : pieces) cost += Cost(piece.tokens, piece.prefix);
  return cost;
}

void ChunkCostModel::Observe(const std::vector<StepPiece>& pieces, double seconds) {
  double x1 = 0, x2 = 0;
  for (const StepPiece& piece : pieces) {
    x1 += static_cast<double>(piece.tokens);
    x2 += PairFeature(piece.tokens, piece.prefix);
  }
  if (x1 <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  s11_ = kForget * s11_ + x1 * x1;
  s12_ = kForget * s12_ + x1 * x2;
  s22_ = kForget * s22_ + x2 * x2;
  s1y_ = kForget * s1y_ + x1 * seconds;
  s2y_ = kForget * s2y_ + x2 * seconds;
  Refit();
}

void ChunkCostModel::Refit() {
  const double det = s11_ * s22_ - s12_ * s12_;
  if (!(det > 0)) return;
  double a = (s1y_ * s22_ - s2y_ * s12_) / det;
  double b = (s11_ * s2y_ - s12_ * s1y_) / det;
  // Both are costs: never negative. If one comes out so, refit the other alone.
  if (b < 0) {
    b = 0;
    a = s1y_ / s11_;
  } else if (a < 0) {
    a = 0;
    b = s2y_ / s22_;
  }
  if (std::isfinite(a) && std::isfinite(b) && a + b > 0) {
    a_ = a;
    b_ = b;
  }
}

int64_t ChunkCostModel::ChunkFor(int64_t prefix, double budget_s, int64_t max_tokens) const {
  if (max_tokens <= 1) return std::max<int64_t>(max_tokens, 1);
  // b/2 n^2 + (a + b (p + 1/2)) n - budget = 0, for the positive root.
  const double qa = b_ / 2;
  const double qb = a_ + b_ * (static_cast<double>(prefix) + 0.5);
  double n;
  if (qa <= 0) {
    n = qb > 0 ? budget_s / qb : static_cast<double>(max_tokens);
  } else {
    n = (-qb + std::sqrt(qb * qb + 4 * qa * budget_s)) / (2 * qa);
  }
  if (!std::isfinite(n)) n = static_cast<double>(max_tokens);
  auto chunk = static_cast<int64_t>(std::floor(n));
  // Rounding of the root: step down while over budget.
  while (chunk > 1 && Cost(chunk, prefix) > budget_s * (1 + 1e-12)) --chunk;
  return std::clamp<int64_t>(chunk, 1, max_tokens);
}

}  // namespace deltaserve
