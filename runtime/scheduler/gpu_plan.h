// Fitting a deployment onto GPUs of a given memory: what one GPU of each
// pipeline stage holds (weights, KDA state slots, the MLA latent cache, a
// workspace reserve), the largest context a replica's cache has room for,
// and the smallest PP x TP layout that fits. Plain value types on top of the
// stage planner (stage_plan.h): the same stage split, the same TP split of
// the weights and the same per-rank state and cache figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/config.h"
#include "runtime/model/state_pool.h"
#include "runtime/scheduler/stage_plan.h"

namespace deltaserve {

// A flat reserve per GPU for what the figures below do not count: the one a
// model on a GPU keeps when it sizes its own cache (state_pool.h).
inline constexpr int64_t kDefaultGpuWorkspaceBytes = kDeviceWorkspaceReserveBytes;

struct GpuBudget {
  int64_t gpu_memory_bytes = 0;  // usable memory of one GPU
  int64_t gpus_per_node = 8;     // a TP group stays inside a node
  int64_t workspace_bytes = kDefaultGpuWorkspaceBytes;
  // Sequences holding KDA state at once: each takes a slot on every rank.
  int64_t sequences = 1;
  // Weights as stored by default; cache 2 = a bf16 MLA latent cache, state 4
  // = float32 KDA state (the runtime's). activation is not used here.
  PlanBytes bytes = {.cache = 2};
};

// One GPU of one stage (TP rank 0, the largest when experts do not divide).
struct GpuStageMemory {
  StageRange layers;
  int64_t mla_layers = 0;
  int64_t weight_bytes = 0;
  int64_t kda_state_bytes = 0;  // sequences x one slot
  int64_t workspace_bytes = 0;
  // MLA cache bytes per page of kCachePageTokens tokens (all of the stage's
  // MLA layers; every TP rank holds the whole latent).
  int64_t cache_bytes_per_page = 0;

  // Everything but the cache.
  int64_t FixedBytes() const { return weight_bytes + kda_state_bytes + workspace_bytes; }
  // The cache for `tokens` tokens in whole pages.
  int64_t CacheBytes(int64_t tokens) const;
  int64_t TotalBytes(int64_t tokens) const { return FixedBytes() + CacheBytes(tokens); }
};

// The largest cache of a replica, in tokens: the planner's context limit.
inline constexpr int64_t kMaxPlannedContextTokens = int64_t{1} << 34;

struct GpuLayout {
  int pp = 1;
  int tp = 1;
  StagePlan plan;
  std::vector<GpuStageMemory> stages;
  // Tokens of MLA cache one replica has room for on every stage: a multiple
  // of kCachePageTokens, kMaxPlannedContextTokens when no stage holds MLA
  // layers, -1 when a stage does not fit even without a cache.
  int64_t max_context_tokens = -1;
  // The stage that limits max_context_tokens (the first when none does).
  size_t tightest_stage = 0;

  int64_t gpus() const { return int64_t{pp} * tp; }
  int64_t Nodes(int64_t gpus_per_node) const {
    return (gpus() + gpus_per_node - 1) / gpus_per_node;
  }
};

// The per-GPU figures of `plan` under tensor parallelism `tp` and the largest
// context that fits. Errors: those of ReportPlan, a budget value out of
// range (named), tp not dividing gpus_per_node.
absl::StatusOr<GpuLayout> FitLayout(const ModelConfig& config, const StagePlan& plan, int tp,
                                    const GpuBudget& budget);

// FitLayout of PlanStages(config, pp, context_tokens), then a check that
// `context_tokens` fit: otherwise ResourceExhausted saying which stage does
// not fit, its figures, and by how much it exceeds gpu_memory_bytes.
absl::StatusOr<GpuLayout> EvaluateLayout(const ModelConfig& config, int pp, int tp,
                                         int64_t context_tokens, const GpuBudget& budget);

// The first layout that holds `context_tokens` tokens of cache, trying one
// stage with TP 1, 2, ... up to the node (the divisors of gpus_per_node that
// divide the model's split dimensions), then PP 2, 3, ... stages of the
// largest such TP across nodes: the fewest GPUs with a TP group inside a
// node and each further stage on whole nodes. `pp` or `tp` > 0 fixes that
// dimension. ResourceExhausted when none fits, with the figures of the
// largest layout tried.
absl::StatusOr<GpuLayout> SmallestLayout(const ModelConfig& config, int64_t context_tokens,
                                         const GpuBudget& budget, int pp = 0, int tp = 0);

// "141.00 GiB" (two decimals, binary units; "512 B" below 1 KiB).
std::string ByteSizeText(int64_t bytes);

}  // namespace deltaserve
