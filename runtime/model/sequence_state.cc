#include "runtime/model/sequence_state.h"

namespace deltaserve {

SequenceState::SequenceState(const ModelConfig& config, const ModelShard& shard,
                             kernels::DType cache_dtype)
    : cache_dtype(cache_dtype),
      kda(static_cast<size_t>(config.num_layers)),
      mla(static_cast<size_t>(config.num_layers)) {
  const int64_t H = config.kda.num_heads, d = config.kda.head_dim;
  const int64_t end = shard.layer_end < 0 ? config.num_layers : shard.layer_end;
  for (int64_t i = shard.layer_begin; i < end; ++i) {
    if (config.layer_kinds[i] != LayerKind::kKda) continue;
    kda[i].conv.assign(static_cast<size_t>((config.kda.conv_kernel_size - 1) * 3 * H * d), 0.0f);
    kda[i].state.assign(static_cast<size_t>(H * d * d), 0.0f);
  }
}

int64_t SequenceState::KdaBytes() const {
  int64_t bytes = 0;
  for (const KdaLayerState& s : kda) bytes += (s.conv.size() + s.state.size()) * sizeof(float);
  return bytes;
}

int64_t SequenceState::MlaCacheBytes() const {
  int64_t bytes = 0;
  for (const MlaLayerState& s : mla) {
    bytes += s.cache.size() * sizeof(float) + s.cache_bf16.size() * sizeof(uint16_t);
  }
  return bytes;
}

}  // namespace deltaserve
