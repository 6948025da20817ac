// The tensor-parallel split rule, as data: every TensorSpec (weight_spec.h)
// carries a TpSplit saying how a TP group of `size` ranks divides it, written
// where the tensor is declared (ExpectedTensors). The loader
// (runtime/model/weights.cc) reads each rank's part by it, the planner
// (runtime/scheduler/stage_plan.cc) counts the same part, and
// CheckTensorParallel is the one divisibility check.
//
// Parts are counted in elements of the tensor's logical shape, never in
// bytes: bytes follow from the stored dtype (a packed dtype such as MXFP4
// turns the same element range into its own byte and scale ranges).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/config.h"

namespace deltaserve {

// The model dimensions tensor parallelism splits: the size of each must be a
// multiple of the TP size.
enum class TpDim {
  kKdaHeads,           // linear_attn_config.num_heads
  kMlaHeads,           // num_attention_heads
  kDenseWidth,         // intermediate_size
  kSharedExpertWidth,  // num_shared_experts * moe_intermediate_size
};

int64_t TpDimSize(const ModelConfig& config, TpDim dim);
// The config key(s) and what they are, for error messages.
const char* TpDimName(TpDim dim);

// How one tensor is divided across a TP group.
enum class TpCut {
  kReplicated,  // every rank holds all of it
  kRows,        // dim 0 in equal slices, one per rank (heads or width)
  kColumns,     // dim 1 in equal slices (the input of an output projection)
  kLeading,     // flat: only the first `leading` values are real (one per
                // head, whatever the stored shape, e.g. K3's padded A_log),
                // in equal slices; the values beyond are not held at all
  kExpert,      // routed expert `expert`: whole on rank expert % size
};

struct TpSplit {
  TpCut cut = TpCut::kReplicated;
  TpDim dim = TpDim::kKdaHeads;  // kRows, kColumns, kLeading: what the slices divide
  int64_t leading = 0;           // kLeading: the number of real values
  int64_t expert = 0;            // kExpert

  static TpSplit Replicated() { return {}; }
  static TpSplit Rows(TpDim dim) { return {TpCut::kRows, dim}; }
  static TpSplit Columns(TpDim dim) { return {TpCut::kColumns, dim}; }
  static TpSplit Leading(TpDim dim, int64_t count) { return {TpCut::kLeading, dim, count}; }
  static TpSplit Expert(int64_t e) { return {.cut = TpCut::kExpert, .expert = e}; }
};

// What TP rank `rank` of `size` holds of a tensor of `shape` split by
// `split`: [begin, end) along the cut axis (rows for kRows and kReplicated,
// columns for kColumns, flat values for kLeading) and the element count.
// elements == 0: nothing (another rank's expert). The shape's cut axis must
// be a multiple of `size` (it is, once CheckTensorParallel passed).
struct TpPart {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t elements = 0;
};
TpPart RankPart(const TpSplit& split, const std::vector<int64_t>& shape, int rank, int size);

// OK when tp >= 1 divides the size of every TpDim; the error names the
// dimension and its config key.
absl::Status CheckTensorParallel(const ModelConfig& config, int tp);

}  // namespace deltaserve
