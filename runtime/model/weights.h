// The model's weights in memory, float32, arranged for the kernels: tensors
// that read the same input are concatenated row-wise so one GEMM serves them
// (q/k/v with their convolutions, MoE w1/w3, dense gate/up), and the MLA
// key up-projection is pre-transposed per head for the absorbed decode form.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/shard.h"

namespace deltaserve {

using Floats = std::vector<float>;

struct KdaWeights {
  Floats qkv_proj;  // [3 * H * d, D]: q, k, v rows
  Floats qkv_conv;  // [3 * H * d, W]
  Floats f_a;       // [rank, D]
  Floats f_b;       // [H * d, rank]
  Floats b_proj;    // [H, D]
  Floats a_log;     // [H] (padding dropped)
  Floats dt_bias;   // [H * d]
  Floats g_proj;    // full rank: [H * d, D]
  Floats g_a, g_b;  // low rank: [rank, D], [H * d, rank]
  Floats o_norm;    // [d]
  Floats o_proj;    // [D, H * d]
};

struct MlaWeights {
  Floats q_a, q_a_norm, q_b;  // q-LoRA: [ql, D], [ql], [n * (P + R), ql]
  Floats q_proj;              // plain: [n * (P + R), D]
  Floats kv_a;                // [C + R, D]
  Floats kv_a_norm;           // [C]
  Floats kv_b;                // [n * (P + Vd), C]: per head P key rows then Vd value rows
  Floats w_uk_t;              // [n, C, P]: key rows of kv_b transposed (absorbed decode)
  Floats g_proj;              // output gate [n * Vd, D] (K3), else empty
  Floats o_proj;              // [D, n * Vd]
};

struct FfnWeights {
  bool moe = false;
  // Dense
  Floats gate_up;  // [2 * I, D]
  Floats down;     // [D, I]
  // MoE
  Floats router;                   // [E, D]
  Floats router_bias;              // [E]
  std::vector<Floats> expert_w13;  // each [2 * Ie, Din]; empty if on another TP rank
  std::vector<Floats> expert_w2;   // each [Din, Ie]
  Floats shared_gate_up;           // [2 * Is, D], empty without shared experts
  Floats shared_down;              // [D, Is]
  Floats latent_down;              // [L, D] (K3 latent MoE), else empty
  Floats latent_up;                // [D, L]
  Floats latent_norm;              // [L]
};

// K3 attention-residual mix parameters: norm and projection weights
// (arch/kimi_k3.cc loads and uses them).
struct ResMixWeights {
  Floats norm;  // [D]
  Floats proj;  // [D]
};

struct LayerWeights {
  LayerKind kind = LayerKind::kKda;
  Floats input_norm, post_attention_norm;  // [D]
  KdaWeights kda;
  MlaWeights mla;
  FfnWeights ffn;
  ResMixWeights attn_res, mlp_res;  // K3 only
};

struct ModelWeights {
  Floats embed;                      // [V, D]
  Floats norm;                       // [D]
  Floats lm_head;                    // [V, D] (the embedding when tied)
  ResMixWeights output_res;          // K3 only
  std::vector<LayerWeights> layers;  // all layers; those of other stages empty
};

// Loads and converts the tensors `shard` owns: its layers, and of those its
// TP part as each tensor's spec splits it (tp_split.h; other ranks' routed
// experts stay empty); the embedding on the first stage, the head on the
// last. Only those bytes are read from the mapped files; *bytes_read
// (optional) receives their count. The checkpoint must have passed
// ValidateCheckpoint.
absl::StatusOr<ModelWeights> LoadWeights(const ModelConfig& config, const Checkpoint& checkpoint,
                                         const ModelShard& shard, int64_t* bytes_read = nullptr);

}  // namespace deltaserve
