#include "runtime/scheduler/gpu_plan.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/state_pool.h"
#include "runtime/model/tp_split.h"

namespace deltaserve {
namespace {

// Far above any real count; keeps every product below inside int64.
constexpr int64_t kMaxSequences = int64_t{1} << 20;
constexpr int64_t kMaxGpusPerNode = 1024;

absl::Status CheckBudget(const GpuBudget& b, int tp) {
  if (b.gpu_memory_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU memory must be positive, got ", b.gpu_memory_bytes, " B"));
  }
  if (b.gpus_per_node < 1 || b.gpus_per_node > kMaxGpusPerNode) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPUs per node must be in 1..", kMaxGpusPerNode, ", got ", b.gpus_per_node));
  }
  if (b.workspace_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("workspace must be >= 0 B, got ", b.workspace_bytes));
  }
  if (b.sequences < 1 || b.sequences > kMaxSequences) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequences must be in 1..", kMaxSequences, ", got ", b.sequences));
  }
  if (tp < 1 || b.gpus_per_node % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism ", tp, " does not divide the ", b.gpus_per_node,
                     " GPUs of a node (a TP group stays inside one node)"));
  }
  return absl::OkStatus();
}

std::string LayersText(const StageRange& r) {
  if (r.size() == 1) return absl::StrCat(r.begin);
  return absl::StrCat(r.begin, "-", r.end - 1);
}

std::string Sequences(int64_t n) { return absl::StrCat(n, n == 1 ? " sequence" : " sequences"); }

// The stage exceeding the budget the most at `tokens`, if any.
std::optional<size_t> WorstOver(const GpuLayout& layout, int64_t tokens, int64_t memory) {
  std::optional<size_t> worst;
  int64_t worst_over = 0;
  for (size_t s = 0; s < layout.stages.size(); ++s) {
    const int64_t over = layout.stages[s].TotalBytes(tokens) - memory;
    if (over > worst_over) {
      worst = s;
      worst_over = over;
    }
  }
  return worst;
}

absl::Status DoesNotFit(const GpuLayout& layout, size_t s, int64_t tokens,
                        const GpuBudget& budget) {
  const GpuStageMemory& m = layout.stages[s];
  const int64_t total = m.TotalBytes(tokens);
  return absl::ResourceExhaustedError(absl::StrCat(
      "PP ", layout.pp, " x TP ", layout.tp, " does not fit in ",
      ByteSizeText(budget.gpu_memory_bytes), " per GPU: stage ", s, " (layers ",
      LayersText(m.layers), ") needs ", ByteSizeText(total), " per GPU (weights ",
      ByteSizeText(m.weight_bytes), ", KDA state for ", Sequences(budget.sequences), " ",
      ByteSizeText(m.kda_state_bytes), ", MLA cache for ", tokens, " tokens ",
      ByteSizeText(m.CacheBytes(tokens)), ", workspace ", ByteSizeText(m.workspace_bytes), "), ",
      ByteSizeText(total - budget.gpu_memory_bytes), " more than there is"));
}

}  // namespace

int64_t GpuStageMemory::CacheBytes(int64_t tokens) const {
  return CachePagesFor(tokens) * cache_bytes_per_page;
}

std::string ByteSizeText(int64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes > -1024 && bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while ((value >= 1024 || value <= -1024) && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f %s", value, kUnits[unit]);
  return text;
}

absl::StatusOr<GpuLayout> FitLayout(const ModelConfig& config, const StagePlan& plan, int tp,
                                    const GpuBudget& budget) {
  DELTASERVE_RETURN_IF_ERROR(CheckBudget(budget, tp));
  // Context 0: ReportPlan's cache figure is per sequence length; the cache
  // here is a pool of pages, counted below.
  DELTASERVE_ASSIGN_OR_RETURN(std::vector<StageReport> reports,
                              ReportPlan(config, plan, tp, /*context_tokens=*/0, budget.bytes));
  GpuLayout layout;
  layout.pp = static_cast<int>(plan.stages.size());
  layout.tp = tp;
  layout.plan = plan;
  int64_t limit = kMaxPlannedContextTokens;
  for (size_t s = 0; s < reports.size(); ++s) {
    const StageReport& r = reports[s];
    GpuStageMemory m;
    m.layers = r.layers;
    m.mla_layers = r.mla_layers;
    m.weight_bytes = r.weight_bytes_per_rank;
    m.kda_state_bytes = budget.sequences * r.kda_state_bytes_per_sequence;
    m.workspace_bytes = budget.workspace_bytes;
    m.cache_bytes_per_page =
        r.mla_layers * config.MlaCacheWidth() * kCachePageTokens * budget.bytes.cache;
    layout.stages.push_back(m);

    const int64_t free = budget.gpu_memory_bytes - m.FixedBytes();
    int64_t tokens = kMaxPlannedContextTokens;
    if (free < 0) {
      tokens = -1;
    } else if (m.cache_bytes_per_page > 0) {
      tokens =
          std::min(free / m.cache_bytes_per_page, kMaxPlannedContextTokens / kCachePageTokens) *
          kCachePageTokens;
    }
    if (tokens < limit) {
      limit = tokens;
      layout.tightest_stage = s;
    }
  }
  layout.max_context_tokens = limit;
  return layout;
}

absl::StatusOr<GpuLayout> EvaluateLayout(const ModelConfig& config, int pp, int tp,
                                         int64_t context_tokens, const GpuBudget& budget) {
  DELTASERVE_RETURN_IF_ERROR(CheckBudget(budget, tp));
  DELTASERVE_RETURN_IF_ERROR(CheckTensorParallel(config, tp));
  DELTASERVE_ASSIGN_OR_RETURN(StagePlan plan, PlanStages(config, pp, context_tokens));
  DELTASERVE_ASSIGN_OR_RETURN(GpuLayout layout, FitLayout(config, plan, tp, budget));
  if (auto s = WorstOver(layout, context_tokens, budget.gpu_memory_bytes)) {
    return DoesNotFit(layout, *s, context_tokens, budget);
  }
  return layout;
}

absl::StatusOr<GpuLayout> SmallestLayout(const ModelConfig& config, int64_t context_tokens,
                                         const GpuBudget& budget, int pp, int tp) {
  DELTASERVE_RETURN_IF_ERROR(CheckBudget(budget, 1));
  const int64_t L = config.num_layers;
  if (pp < 0 || pp > L || tp < 0) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline parallelism of ", pp,
                                                   " stages (tensor ", tp,
                                                   ") is outside the model's 1..", L, " layers"));
  }
  if (tp > 0) {
    DELTASERVE_RETURN_IF_ERROR(CheckBudget(budget, tp));
    DELTASERVE_RETURN_IF_ERROR(CheckTensorParallel(config, tp));
  }
  // TP sizes, smallest first: divisors of a node that split the model.
  std::vector<int> tps;
  for (int t = 1; t <= budget.gpus_per_node; ++t) {
    if (tp > 0 && t != tp) continue;
    if (budget.gpus_per_node % t == 0 && CheckTensorParallel(config, t).ok()) tps.push_back(t);
  }
  // The candidates in the order they are tried: one stage with TP growing
  // to the largest a node holds, then stages of that TP, one more at a time
  // (a fixed pp or tp keeps only its own).
  std::vector<std::pair<int, int>> candidates;  // (pp, tp)
  for (int t : tps) candidates.push_back({pp > 0 ? pp : 1, t});
  if (pp == 0) {
    for (int stages = 2; stages <= L; ++stages) candidates.push_back({stages, tps.back()});
  }
  // A lower bound per TP size: the stages' totals sum to the whole rank's
  // weights and state, the cache of every MLA layer, and one workspace each,
  // so the fullest stage holds at least their mean.
  std::vector<int64_t> spread(static_cast<size_t>(budget.gpus_per_node) + 1, 0);
  const StagePlan whole{{StageRange{0, L}}};
  for (int t : tps) {
    DELTASERVE_ASSIGN_OR_RETURN(GpuLayout one, FitLayout(config, whole, t, budget));
    spread[static_cast<size_t>(t)] = one.stages[0].weight_bytes + one.stages[0].kda_state_bytes +
                                     one.stages[0].CacheBytes(context_tokens);
  }
  for (const auto& [stages, t] : candidates) {
    if ((spread[static_cast<size_t>(t)] + stages - 1) / stages + budget.workspace_bytes >
        budget.gpu_memory_bytes) {
      continue;
    }
    auto layout = EvaluateLayout(config, stages, t, context_tokens, budget);
    if (layout.ok() || !absl::IsResourceExhausted(layout.status())) return layout;
  }
  // Nothing fits: the figures of the largest layout there is.
  const auto [max_pp, max_tp] = candidates.back();
  auto largest = EvaluateLayout(config, max_pp, max_tp, context_tokens, budget);
  if (largest.ok()) {
    return absl::InternalError("the largest layout fits, but the search found none");
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("no layout of up to ", int64_t{max_pp} * max_tp, " GPUs fits ", context_tokens,
                   " tokens of context; the largest: ", largest.status().message()));
}

}  // namespace deltaserve
