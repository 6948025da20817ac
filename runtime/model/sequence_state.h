// Per-sequence inference state: for each KDA layer the float32 recurrent state
// and the short-convolution tail, for each MLA layer the latent cache. KDA
// state is constant in sequence length; the MLA cache grows by C + R floats
// per token per MLA layer.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/config.h"
#include "runtime/model/shard.h"

namespace deltaserve {

struct KdaLayerState {
  std::vector<float> conv;   // [W - 1, 3 * H * d]: last pre-convolution q/k/v inputs
  std::vector<float> state;  // [H, d_k, d_v]
};

struct MlaLayerState {
  std::vector<float> cache;  // [tokens, C + R]: normalised latent c, then k_rope
};

struct SequenceState {
  // State for the layers `shard` holds, with `local` (its LocalConfig) head
  // counts; the whole model by default.
  explicit SequenceState(const ModelConfig& local, const ModelShard& shard = {});

  int64_t length = 0;  // tokens consumed so far
  // Indexed by layer; the entry of the other kind is empty.
  std::vector<KdaLayerState> kda;
  std::vector<MlaLayerState> mla;

  // Bytes held now: KDA state + conv state, and the MLA cache.
  int64_t KdaBytes() const;
  int64_t MlaCacheBytes() const;
};

}  // namespace deltaserve
