// Per-sequence inference state: for each KDA layer the float32 recurrent state
// and the short-convolution tail, for each MLA layer the latent cache. KDA
// state is constant in sequence length; the MLA cache grows by C + R values
// per token per MLA layer, float32 or bf16 (--kv-cache-dtype).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/tensor.h"
#include "runtime/model/config.h"
#include "runtime/model/shard.h"

namespace deltaserve {

struct KdaLayerState {
  std::vector<float> conv;   // [W - 1, 3 * H * d]: last pre-convolution q/k/v inputs
  std::vector<float> state;  // [H, d_k, d_v]
};

struct MlaLayerState {
  // [tokens, C + R]: normalised latent c, then k_rope; one of the two is used,
  // as the sequence's cache_dtype says.
  std::vector<float> cache;
  std::vector<uint16_t> cache_bf16;
};

struct SequenceState {
  // State for the layers `shard` holds, with `local` (its LocalConfig) head
  // counts; the whole model by default.
  explicit SequenceState(const ModelConfig& local, const ModelShard& shard = {},
                         kernels::DType cache_dtype = kernels::DType::kF32);

  int64_t length = 0;                                 // tokens consumed so far
  kernels::DType cache_dtype = kernels::DType::kF32;  // of the MLA caches: f32 or bf16
  // Indexed by layer; the entry of the other kind is empty.
  std::vector<KdaLayerState> kda;
  std::vector<MlaLayerState> mla;

  // Bytes held now: KDA state + conv state, and the MLA cache.
  int64_t KdaBytes() const;
  int64_t MlaCacheBytes() const;
};

}  // namespace deltaserve
