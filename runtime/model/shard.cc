#include "runtime/model/shard.h"

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {

absl::StatusOr<ModelShard> ResolveShard(const ModelConfig& config, ModelShard shard) {
  if (shard.layer_end < 0) shard.layer_end = config.num_layers;
  if (shard.layer_begin < 0 || shard.layer_begin >= shard.layer_end ||
      shard.layer_end > config.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer range [", shard.layer_begin, ", ", shard.layer_end,
                     ") is not a non-empty part of the model's ", config.num_layers, " layers"));
  }
  if (shard.tp_size < 1 || shard.tp_rank < 0 || shard.tp_rank >= shard.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel rank ", shard.tp_rank, " of ", shard.tp_size, " is invalid"));
  }
  DELTASERVE_RETURN_IF_ERROR(CheckTensorParallel(config, shard.tp_size));
  return shard;
}

ModelConfig LocalConfig(const ModelConfig& config, const ModelShard& shard) {
  ModelConfig local = config;
  local.kda.num_heads /= shard.tp_size;
  local.num_attention_heads /= shard.tp_size;
  local.intermediate_size /= shard.tp_size;
  return local;
}

}  // namespace deltaserve
