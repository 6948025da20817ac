// Which part of the model one rank holds: a contiguous range of layers (its
// pipeline stage) and one slice of its tensor-parallel group. How the group
// divides each tensor is written on the tensor's spec (weight_spec.h,
// tp_split.h): KDA and MLA heads, FFN width and shared-expert width split
// evenly, routed expert e on TP rank e % tp_size, everything else
// replicated. The loader and runtime/scheduler/stage_plan.cc both read it.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/model/config.h"
#include "runtime/model/tp_split.h"

namespace deltaserve {

struct ModelShard {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // exclusive; -1: through the last layer
  int tp_rank = 0;
  int tp_size = 1;

  bool HasEmbedding() const { return layer_begin == 0; }
  bool HasLayer(int64_t layer) const { return layer >= layer_begin && layer < layer_end; }
};

// Fills layer_end, and checks the ranges and that tp_size divides every split
// dimension (CheckTensorParallel; the error names the dimension).
absl::StatusOr<ModelShard> ResolveShard(const ModelConfig& config, ModelShard shard);

// True when the shard holds the final mix, norm and LM head.
inline bool HasHead(const ModelConfig& config, const ModelShard& shard) {
  return shard.layer_end == config.num_layers;
}

// The config as the layers of one TP rank see it: head counts divided.
ModelConfig LocalConfig(const ModelConfig& config, const ModelShard& shard);

}  // namespace deltaserve
