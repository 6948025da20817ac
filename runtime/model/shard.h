// Which part of the model one rank holds: a contiguous range of layers (its
// pipeline stage) and one slice of its tensor-parallel group. KDA and MLA
// heads, FFN width and shared-expert width are split evenly across the group;
// routed expert e lives on TP rank e % tp_size; everything else (norms,
// low-rank gate inputs, the MLA latent projection, the router, K3's latent
// down/up projections) is replicated. runtime/scheduler/stage_plan.cc counts
// weight bytes by the same rule.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/model/config.h"

namespace deltaserve {

struct ModelShard {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // exclusive; -1: through the last layer
  int tp_rank = 0;
  int tp_size = 1;

  bool HasEmbedding() const { return layer_begin == 0; }
  bool HasLayer(int64_t layer) const { return layer >= layer_begin && layer < layer_end; }
  bool OwnsExpert(int64_t expert) const { return expert % tp_size == tp_rank; }
  // [begin, end) of `total` items split evenly over the TP group.
  int64_t SliceBegin(int64_t total) const { return total / tp_size * tp_rank; }
  int64_t SliceEnd(int64_t total) const { return total / tp_size * (tp_rank + 1); }
};

// Fills layer_end, and checks the ranges and that tp_size divides every split
// dimension (the error names the dimension).
absl::StatusOr<ModelShard> ResolveShard(const ModelConfig& config, ModelShard shard);

// True when the shard holds the final mix, norm and LM head.
inline bool HasHead(const ModelConfig& config, const ModelShard& shard) {
  return shard.layer_end == config.num_layers;
}

// The config as the layers of one TP rank see it: head counts divided.
ModelConfig LocalConfig(const ModelConfig& config, const ModelShard& shard);

}  // namespace deltaserve
