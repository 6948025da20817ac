// Pipeline stage planning: which contiguous range of layers each pipeline
// stage owns, and what one rank of each stage holds in memory and sends to
// the next stage. Plain value types, no MPI: the `plan` command prints these
// figures, and the worker uses the same plan and cost model to cut the model
// and to size prefill chunks (DESIGN.md, Parallelism).
//
// The cost model counts floating-point operations of a prefill, from the
// shapes in the config: KDA linear in tokens, MLA projections linear plus
// causal attention growing with the prefix, FFN by its active experts. It is
// a model, not a measurement: its job is to rank partitions, and the pipeline
// rescales it with measured stage times.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/config.h"
#include "runtime/model/tp_split.h"

namespace deltaserve {

// Layers [begin, end).
struct StageRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool operator==(const StageRange&) const = default;
};

// Stage s owns stages[s]; the ranges are contiguous, non-empty and cover
// every layer in order.
struct StagePlan {
  std::vector<StageRange> stages;
};

// FLOPs of layer `layer` (mixer, FFN and their norms) for a prefill of
// `tokens` tokens starting from an empty sequence.
double LayerCost(const ModelConfig& config, int64_t layer, int64_t tokens);
// FLOP-equivalents of the embedding (stage 0) and of the final norm and LM
// head (last stage) for `tokens` tokens. The head is counted for every
// token, as decode and scoring run it; a generate prefill needs only its
// last row, so for that the last stage comes out slightly light.
double EmbeddingCost(const ModelConfig& config, int64_t tokens);
double HeadCost(const ModelConfig& config, int64_t tokens);
// The layers of `range`, plus the embedding when it starts at layer 0 and
// the head when it ends at the last layer.
double StageCost(const ModelConfig& config, const StageRange& range, int64_t tokens);

struct PlanOptions {
  // K3 only: stage boundaries move onto attention-residual block starts
  // when that raises the maximum stage cost by at most this fraction.
  double block_alignment_tolerance = 0.05;
};

// Splits the layers into `pp` contiguous non-empty stages that minimise the
// maximum StageCost for a prefill of `context_tokens` tokens (see the .cc
// for the K3 block-boundary preference). Errors: pp < 1, pp > num_layers,
// context_tokens < 1.
absl::StatusOr<StagePlan> PlanStages(const ModelConfig& config, int pp, int64_t context_tokens,
                                     const PlanOptions& options = {});

// An explicit split, e.g. {2, 3, 4} for a 9-layer model: the error names the
// problem when a count is <= 0 or the counts do not sum to num_layers.
absl::StatusOr<StagePlan> StagesFromCounts(const ModelConfig& config,
                                           const std::vector<int64_t>& layers_per_stage);

// OK when `plan` is contiguous, non-empty per stage and covers all layers.
absl::Status ValidatePlan(const ModelConfig& config, const StagePlan& plan);

// CheckTensorParallel (runtime/model/tp_split.h) says whether a TP size
// divides every dimension tensor parallelism splits; ReportPlan checks it.

// Bytes per element. Weights by default as each tensor is stored (StoredBytes,
// runtime/model/weight_spec.h: BF16 2, F32 4, MXFP4 routed experts 0.5 plus a
// scale byte per 32, as the config's quantization_config declares them);
// weight = 1..8 counts every weight at that many bytes instead (4: all
// converted to float32). The runtime holds the MLA cache, the KDA state and
// activations in float32 today; a bf16 plan uses cache = 2.
struct PlanBytes {
  static constexpr int64_t kAsStored = 0;
  int64_t weight = kAsStored;
  int64_t cache = 4;
  int64_t state = 4;
  int64_t activation = 4;
};

struct StageReport {
  StageRange layers;
  int64_t kda_layers = 0;
  int64_t mla_layers = 0;
  // Weight bytes one TP rank of this stage holds, as each tensor's spec splits
  // it (runtime/model/tp_split.h: split tensors divided by tp, replicated ones
  // whole, routed experts whole on rank e % tp) and stores it (PlanBytes).
  // When num_experts is not a multiple of tp this is the largest rank's
  // (rank 0).
  int64_t weight_bytes_per_rank = 0;
  // KDA recurrent state plus short-convolution tail, per sequence, per rank.
  int64_t kda_state_bytes_per_sequence = 0;
  // MLA latent cache of one sequence of context_tokens tokens, in whole pages
  // of kCachePageTokens as the runtime holds it; every rank of the TP group
  // keeps all of it.
  int64_t mla_cache_bytes = 0;
  int64_t mla_cache_pages = 0;  // pages per sequence, the same on every stage
  // Activations sent to the next stage per forwarded token; 0 for the last.
  int64_t boundary_bytes_per_token = 0;
  // StageCost at context_tokens.
  double cost = 0;
};

// The figures of each stage of `plan` under tensor parallelism `tp`.
// Errors: an invalid plan, tp not dividing a split dimension (named),
// context_tokens < 0, a bytes-per-element value outside 1..8 (weight: 0..8).
absl::StatusOr<std::vector<StageReport>> ReportPlan(const ModelConfig& config,
                                                    const StagePlan& plan, int tp,
                                                    int64_t context_tokens, const PlanBytes& bytes);

// Attention-residual bank entries that exist after layers [0, end): one per
// layer i < end with i % attn_res_block_size == 0 (the embedding is entry 0).
// 0 for a plain residual stream.
int64_t BankEntriesBefore(const ModelConfig& config, int64_t end);

}  // namespace deltaserve
