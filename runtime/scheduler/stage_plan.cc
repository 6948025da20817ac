#include "runtime/scheduler/stage_plan.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/arch/architecture.h"
#include "runtime/model/state_pool.h"
#include "runtime/model/weight_spec.h"

namespace deltaserve {
namespace {

// Chunk length of the chunkwise KDA prefill (MODEL.md).
constexpr double kKdaChunk = 64;
// Far beyond any context the runtime serves; keeps every byte count (cache
// width x layers x tokens x bytes) well inside int64.
constexpr int64_t kMaxContextTokens = int64_t{1} << 34;

// Multiply-adds per token of the linear parts of a KDA layer, and of its
// chunkwise state update.
double KdaMacsPerToken(const ModelConfig& c) {
  const double D = c.hidden_size, H = c.kda.num_heads, d = c.kda.head_dim;
  const double HD = H * d, K = c.kda.conv_kernel_size;
  double macs = 3 * HD * D                                 // q, k, v projections
                + 3 * HD * K                               // depthwise short convolutions
                + d * D + HD * d                           // decay gate f_b(f_a(x))
                + H * D                                    // beta
                + D * HD;                                  // o_proj
  macs += c.kda.full_rank_gate ? HD * D : d * D + HD * d;  // output gate
  // Chunkwise form per head and token (d_k = d_v = d): the state terms
  // W S, (Q e^Γ) S and the state update, ~3 d^2; the in-chunk matrices L and
  // Aqk and the products W, U and Aqk Vn, ~chunk (3 d + 2 d); the forward
  // substitution, chunk^2 / 6.
  macs += H * (3 * d * d + kKdaChunk * 5 * d + kKdaChunk * kKdaChunk / 6);
  return macs;
}

double MlaMacsPerToken(const ModelConfig& c) {
  const double D = c.hidden_size, n = c.num_attention_heads;
  const double P = c.qk_nope_head_dim, R = c.qk_rope_head_dim, Vd = c.v_head_dim;
  const double C = c.kv_lora_rank, Lq = c.q_lora_rank;
  double macs = c.q_lora_rank > 0 ? D * Lq + Lq * n * (P + R) : D * n * (P + R);
  macs += D * (C + R)         // kv_a_proj_with_mqa
          + C * n * (P + Vd)  // kv_b_proj
          + n * Vd * D;       // o_proj
  if (c.mla_output_gate) macs += D * n * Vd;
  return macs;
}

double FfnMacsPerToken(const ModelConfig& c, int64_t layer) {
  const double D = c.hidden_size;
  if (!c.IsMoeLayer(layer)) return 3 * D * c.intermediate_size;
  const double I = c.moe_intermediate_size;
  const bool latent = c.routed_expert_hidden_size > 0;
  const double Z = latent ? c.routed_expert_hidden_size : D;
  double macs = c.num_experts * D                      // router
                + c.num_experts_per_token * 3 * Z * I  // active routed experts
                + 3 * D * c.num_shared_experts * I;    // shared experts
  if (latent) macs += 2 * D * Z;                       // latent down / up
  return macs;
}

// Weight bytes of each part of the model one TP rank (rank 0, the largest
// when the experts do not divide evenly) holds, as each tensor's spec splits
// it: as the loader holds it (`weight` == PlanBytes::kAsStored: matrices in
// their stored dtype, vectors float32; HeldBytes) or `weight` bytes a value.
struct RankBytes {
  std::vector<int64_t> layer;  // [num_layers]
  int64_t embedding = 0;
  int64_t head = 0;  // final norm, LM head, output mix (K3)
};

RankBytes CountRankBytes(const ModelConfig& c, int tp, int64_t weight) {
  RankBytes out;
  out.layer.assign(static_cast<size_t>(c.num_layers), 0);
  for (const TensorSpec& spec : ExpectedTensors(c)) {
    const int64_t elements = spec.RankPart(/*rank=*/0, tp).elements;
    const int64_t held =
        weight == PlanBytes::kAsStored ? HeldBytes(spec, elements) : elements * weight;
    switch (spec.part) {
      case ModelPart::kEmbedding:
        out.embedding += held;
        break;
      case ModelPart::kHead:
        out.head += held;
        break;
      case ModelPart::kLayer:
        out.layer[static_cast<size_t>(spec.layer)] += held;
        break;
    }
  }
  return out;
}

// Cost of layers [b, e) and the ends they hold, from prefix sums.
class RangeCost {
 public:
  RangeCost(const ModelConfig& c, int64_t tokens)
      : prefix_(static_cast<size_t>(c.num_layers) + 1, 0.0),
        embedding_(EmbeddingCost(c, tokens)),
        head_(HeadCost(c, tokens)),
        layers_(c.num_layers) {
    for (int64_t i = 0; i < c.num_layers; ++i) {
      prefix_[i + 1] = prefix_[i] + LayerCost(c, i, tokens);
    }
  }
  double operator()(int64_t b, int64_t e) const {
    return prefix_[e] - prefix_[b] + (b == 0 ? embedding_ : 0.0) + (e == layers_ ? head_ : 0.0);
  }

 private:
  std::vector<double> prefix_;
  double embedding_, head_;
  int64_t layers_;
};

StagePlan FromBoundaries(const std::vector<int64_t>& starts, int64_t num_layers) {
  StagePlan plan;
  for (size_t s = 0; s < starts.size(); ++s) {
    const int64_t end = s + 1 < starts.size() ? starts[s + 1] : num_layers;
    plan.stages.push_back(StageRange{starts[s], end});
  }
  return plan;
}

// The smallest achievable maximum stage cost over partitions of L layers
// into pp contiguous non-empty stages: best[k][j] covers layers [0, j) with
// k stages. O(pp * L * stage length) with the early exit.
double MinMaxCost(const RangeCost& cost, int64_t L, int pp) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> prev(static_cast<size_t>(L) + 1, kInf), cur(prev.size(), kInf);
  for (int64_t j = 1; j <= L; ++j) prev[j] = cost(0, j);
  for (int k = 2; k <= pp; ++k) {
    std::fill(cur.begin(), cur.end(), kInf);
    for (int64_t j = k; j <= L - (pp - k); ++j) {
      double best = kInf;
      // prev[i] grows with i and cost(i, j) shrinks: stop once the last
      // stage alone is no better than the best found.
      for (int64_t i = j - 1; i >= k - 1; --i) {
        const double last = cost(i, j);
        if (last >= best) break;
        best = std::min(best, std::max(prev[i], last));
      }
      cur[j] = best;
    }
    std::swap(prev, cur);
  }
  return prev[L];
}

// Among partitions whose every stage costs at most `limit`, the one with the
// most stage starts on a multiple of `block` (block == 0: none count), then
// the smallest maximum stage cost. Both criteria extend monotonically from a
// prefix partition to a longer one, so the DP over prefixes is exact.
std::vector<int64_t> AlignedStarts(const RangeCost& cost, int64_t L, int pp, double limit,
                                   int64_t block) {
  struct Cell {
    int64_t aligned = -1;  // -1: infeasible
    double max_cost = 0;
    int64_t parent = 0;  // start of the last stage
  };
  const size_t width = static_cast<size_t>(L) + 1;
  std::vector<std::vector<Cell>> dp(static_cast<size_t>(pp) + 1, std::vector<Cell>(width));
  for (int64_t j = 1; j <= L; ++j) {
    const double c = cost(0, j);
    if (c <= limit) dp[1][j] = Cell{0, c, 0};
  }
  for (int k = 2; k <= pp; ++k) {
    for (int64_t j = k; j <= L - (pp - k); ++j) {
      Cell best;
      for (int64_t i = j - 1; i >= k - 1; --i) {
        const double last = cost(i, j);
        if (last > limit) break;  // grows as i falls
        const Cell& from = dp[k - 1][i];
        if (from.aligned < 0) continue;
        const int64_t aligned = from.aligned + (block > 0 && i % block == 0 ? 1 : 0);
        const double max_cost = std::max(from.max_cost, last);
        if (aligned > best.aligned || (aligned == best.aligned && max_cost < best.max_cost)) {
          best = Cell{aligned, max_cost, i};
        }
      }
      dp[k][j] = best;
    }
  }
  if (dp[pp][L].aligned < 0) return {};  // cannot happen: the optimum fits the limit
  std::vector<int64_t> starts(static_cast<size_t>(pp));
  int64_t j = L;
  for (int k = pp; k >= 1; --k) {
    starts[k - 1] = dp[k][j].parent;
    j = dp[k][j].parent;
  }
  return starts;
}

}  // namespace

double LayerCost(const ModelConfig& c, int64_t layer, int64_t tokens) {
  const double T = static_cast<double>(tokens);
  double macs = T * FfnMacsPerToken(c, layer);
  if (c.layer_kinds[static_cast<size_t>(layer)] == LayerKind::kKda) {
    macs += T * KdaMacsPerToken(c);
  } else {
    // Causal attention: token t attends to t + 1 positions, T (T + 1) / 2
    // query-key pairs, each (P + R) for the score and Vd for the value.
    const double heads = c.num_attention_heads;
    const double width = c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim;
    macs += T * MlaMacsPerToken(c) + T * (T + 1) / 2 * heads * width;
  }
  // Norms and attention-residual mixes are O(hidden) per token: left out.
  return 2 * macs;
}

double EmbeddingCost(const ModelConfig& c, int64_t tokens) {
  return static_cast<double>(tokens) * static_cast<double>(c.hidden_size);  // row copies
}

double HeadCost(const ModelConfig& c, int64_t tokens) {
  return 2.0 * static_cast<double>(tokens) * static_cast<double>(c.vocab_size) *
         static_cast<double>(c.hidden_size);
}

double StageCost(const ModelConfig& c, const StageRange& range, int64_t tokens) {
  double cost = 0;
  for (int64_t i = range.begin; i < range.end; ++i) cost += LayerCost(c, i, tokens);
  if (range.begin == 0) cost += EmbeddingCost(c, tokens);
  if (range.end == c.num_layers) cost += HeadCost(c, tokens);
  return cost;
}

int64_t BankEntriesBefore(const ModelConfig& c, int64_t end) {
  return end <= 0 ? 0 : ArchitectureOf(c).BankSizeBefore(c, end);
}

absl::StatusOr<StagePlan> PlanStages(const ModelConfig& config, int pp, int64_t context_tokens,
                                     const PlanOptions& options) {
  const int64_t L = config.num_layers;
  if (pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline parallelism must be at least 1, got ", pp));
  }
  if (pp > L) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline parallelism of ", pp, " stages is more than the model's ", L,
                     " layers (every stage needs at least one layer)"));
  }
  if (context_tokens < 1 || context_tokens > kMaxContextTokens) {
    return absl::InvalidArgumentError(absl::StrCat("context of ", context_tokens,
                                                   " tokens for the cost model is outside 1..",
                                                   kMaxContextTokens));
  }
  if (!(options.block_alignment_tolerance >= 0)) {
    return absl::InvalidArgumentError("block_alignment_tolerance must be >= 0");
  }
  const RangeCost cost(config, context_tokens);
  const double best = MinMaxCost(cost, L, pp);
  // K3: prefer stage starts on attention-residual block starts (layer index
  // a multiple of attn_res_block_size). The bank gains an entry at every
  // block start (the finished block sum, MODEL.md), and a boundary passes the
  // whole bank plus the running prefix of every token it forwards (DESIGN.md).
  // A stage that starts at layer k * block receives k bank entries plus a
  // prefix that is exactly the completed block sum; starting one layer later
  // already costs k + 1 entries, the same as any start up to the next block.
  // So an aligned boundary is the cheapest one of its block, and each stage
  // then holds whole blocks: the block sums it produces are complete when
  // they leave it. That is worth a little imbalance, not much: compute
  // stalls the whole pipeline, so accept it only within the tolerance.
  // Without blocks (Kimi Linear) no start counts as aligned and the search
  // below returns a plain min-max partition.
  const double limit = best * (1 + options.block_alignment_tolerance) * (1 + 1e-12);
  const std::vector<int64_t> starts = AlignedStarts(cost, L, pp, limit, config.attn_res_block_size);
  if (starts.empty()) {
    return absl::InternalError(absl::StrCat("stage planner found no partition into ", pp,
                                            " stages within its own optimum"));
  }
  return FromBoundaries(starts, L);
}

absl::StatusOr<StagePlan> StagesFromCounts(const ModelConfig& config,
                                           const std::vector<int64_t>& layers_per_stage) {
  if (layers_per_stage.empty()) {
    return absl::InvalidArgumentError("stage layer counts are empty: give one per stage");
  }
  StagePlan plan;
  int64_t begin = 0;
  for (size_t s = 0; s < layers_per_stage.size(); ++s) {
    const int64_t n = layers_per_stage[s];
    if (n <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", s, " has ", n, " layers; every stage needs at least one"));
    }
    if (n > config.num_layers - begin) {
      int64_t sum = 0;
      for (int64_t x : layers_per_stage) sum += std::max<int64_t>(x, 0);
      return absl::InvalidArgumentError(absl::StrCat(
          "stage layer counts sum to ", sum, ", but the model has ", config.num_layers, " layers"));
    }
    plan.stages.push_back(StageRange{begin, begin + n});
    begin += n;
  }
  if (begin != config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage layer counts sum to ", begin, ", but the model has ", config.num_layers, " layers"));
  }
  return plan;
}

absl::Status ValidatePlan(const ModelConfig& config, const StagePlan& plan) {
  if (plan.stages.empty()) return absl::InvalidArgumentError("stage plan has no stages");
  int64_t next = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StageRange& r = plan.stages[s];
    if (r.begin != next || r.end <= r.begin || r.end > config.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", s, " covers layers [", r.begin, ", ", r.end,
                       "); expected a non-empty range from layer ", next, " within the model's ",
                       config.num_layers, " layers"));
    }
    next = r.end;
  }
  if (next != config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage plan ends at layer ", next, ", the model has ", config.num_layers, " layers"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StageReport>> ReportPlan(const ModelConfig& c, const StagePlan& plan,
                                                    int tp, int64_t context_tokens,
                                                    const PlanBytes& bytes) {
  DELTASERVE_RETURN_IF_ERROR(ValidatePlan(c, plan));
  DELTASERVE_RETURN_IF_ERROR(CheckTensorParallel(c, tp));
  if (context_tokens < 0 || context_tokens > kMaxContextTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context of ", context_tokens, " tokens is out of range (0..", kMaxContextTokens, ")"));
  }
  const std::pair<const char*, int64_t> per_element[] = {{"weight", bytes.weight},
                                                         {"cache", bytes.cache},
                                                         {"state", bytes.state},
                                                         {"activation", bytes.activation}};
  for (const auto& [name, value] : per_element) {
    const bool as_stored = value == PlanBytes::kAsStored && name == std::string("weight");
    if (!as_stored && (value < 1 || value > 8)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " bytes per element must be 1..8, got ", value));
    }
  }
  const RankBytes held = CountRankBytes(c, tp, bytes.weight);

  const int64_t H_local = c.kda.num_heads / tp, d = c.kda.head_dim;
  const int64_t kda_state =
      H_local * d * d * bytes.state + (c.kda.conv_kernel_size - 1) * 3 * H_local * d * bytes.state;
  // The runtime holds the cache in whole pages (runtime/model/state_pool.h).
  const int64_t cache_pages = CachePagesFor(context_tokens);
  const int64_t mla_cache = c.MlaCacheWidth() * cache_pages * kCachePageTokens * bytes.cache;

  std::vector<StageReport> reports;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StageRange& range = plan.stages[s];
    const bool first = range.begin == 0, last = range.end == c.num_layers;
    StageReport r;
    r.layers = range;
    int64_t weight_bytes = 0;
    for (int64_t i = range.begin; i < range.end; ++i) {
      weight_bytes += held.layer[static_cast<size_t>(i)];
      if (c.layer_kinds[static_cast<size_t>(i)] == LayerKind::kKda) {
        ++r.kda_layers;
      } else {
        ++r.mla_layers;
      }
    }
    if (first) weight_bytes += held.embedding;
    if (last) {
      weight_bytes += held.head;
      // Tied: the LM head is the embedding matrix, held once per stage.
      if (c.tie_word_embeddings && !first) weight_bytes += held.embedding;
    }
    r.weight_bytes_per_rank = weight_bytes;
    r.kda_state_bytes_per_sequence = r.kda_layers * kda_state;
    r.mla_cache_bytes = r.mla_layers * mla_cache;
    r.mla_cache_pages = cache_pages;
    if (!last) {
      // K3: the running prefix plus every bank entry so far; the next stage
      // holds none of them. Kimi Linear: the residual stream.
      r.boundary_bytes_per_token =
          (1 + BankEntriesBefore(c, range.end)) * c.hidden_size * bytes.activation;
    }
    r.cost = StageCost(c, range, context_tokens);
    reports.push_back(r);
  }
  return reports;
}

}  // namespace deltaserve
