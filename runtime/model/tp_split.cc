#include "runtime/model/tp_split.h"

#include "absl/strings/str_cat.h"

namespace deltaserve {

int64_t TpDimSize(const ModelConfig& c, TpDim dim) {
  switch (dim) {
    case TpDim::kKdaHeads:
      return c.kda.num_heads;
    case TpDim::kMlaHeads:
      return c.num_attention_heads;
    case TpDim::kDenseWidth:
      return c.intermediate_size;
    case TpDim::kSharedExpertWidth:
      return c.num_shared_experts * c.moe_intermediate_size;
  }
  return 0;
}

const char* TpDimName(TpDim dim) {
  switch (dim) {
    case TpDim::kKdaHeads:
      return "linear_attn_config.num_heads (KDA heads)";
    case TpDim::kMlaHeads:
      return "num_attention_heads (MLA heads)";
    case TpDim::kDenseWidth:
      return "intermediate_size (dense FFN width)";
    case TpDim::kSharedExpertWidth:
      return "num_shared_experts * moe_intermediate_size (shared expert width)";
  }
  return "?";
}

TpPart RankPart(const TpSplit& split, const std::vector<int64_t>& shape, int rank, int size) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  const int64_t rows = shape.empty() ? 1 : shape[0];
  // Equal slices of `total` along the cut axis.
  auto slice = [&](int64_t total, int64_t per_unit) {
    const int64_t share = total / size;
    return TpPart{share * rank, share * (rank + 1), share * per_unit};
  };
  switch (split.cut) {
    case TpCut::kReplicated:
      break;
    case TpCut::kRows:
      return slice(rows, rows > 0 ? elements / rows : 0);
    case TpCut::kColumns:
      return slice(shape[1], shape[0]);
    case TpCut::kLeading:
      return slice(split.leading, 1);
    case TpCut::kExpert:
      if (split.expert % size != rank) return TpPart{};
      break;
  }
  return TpPart{0, rows, elements};
}

absl::Status CheckTensorParallel(const ModelConfig& config, int tp) {
  if (tp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism must be at least 1, got ", tp));
  }
  for (TpDim dim :
       {TpDim::kKdaHeads, TpDim::kMlaHeads, TpDim::kDenseWidth, TpDim::kSharedExpertWidth}) {
    const int64_t size = TpDimSize(config, dim);
    if (size % tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor parallelism of ", tp, " does not divide ", TpDimName(dim), " = ", size));
    }
  }
  return absl::OkStatus();
}

}  // namespace deltaserve
