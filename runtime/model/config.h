// The model configuration of both architectures (MODEL.md), read from a
// checkpoint's config.json: K3 (`model_type: kimi_k3`, fields under
// `text_config`) and Kimi Linear (`model_type: kimi_linear`, top level).
// A plain value type; everything downstream trusts it once Validate() passed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/quantization.h"

namespace deltaserve {

enum class Architecture { kKimiK3, kKimiLinear };

enum class LayerKind { kKda, kMla };

struct KdaConfig {
  int64_t num_heads = 0;         // linear_attn_config.num_heads
  int64_t head_dim = 0;          // linear_attn_config.head_dim
  int64_t conv_kernel_size = 4;  // linear_attn_config.short_conv_kernel_size
  bool full_rank_gate = false;   // use_full_rank_gate: g_proj vs g_a/g_b_proj
  bool has_lower_bound = false;  // K3 decay gate form (gate_lower_bound given)
  float gate_lower_bound = -5.0f;
};

struct ModelConfig {
  Architecture arch = Architecture::kKimiLinear;
  std::string model_type;  // as written at the top level of config.json

  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t vocab_size = 0;
  float rms_norm_eps = 1e-6f;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  // 0-indexed, one entry per layer (from the 1-indexed lists in config.json).
  std::vector<LayerKind> layer_kinds;
  KdaConfig kda;

  // MLA
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0: plain q_proj (Kimi Linear)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool mla_output_gate = false;  // mla_use_output_gate (K3)

  // FFN
  std::string hidden_act;  // "silu" or "situ"
  float situ_beta = 4.0f;
  float situ_linear_beta = 25.0f;
  int64_t intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t num_experts = 0;
  int64_t num_experts_per_token = 0;
  int64_t num_shared_experts = 0;
  int64_t moe_intermediate_size = 0;
  bool moe_renormalize = true;
  float routed_scaling_factor = 1.0f;
  // K3 latent MoE: routed experts work in a smaller latent space.
  int64_t routed_expert_hidden_size = 0;  // 0: not latent (Kimi Linear)
  bool latent_moe_use_norm = false;

  // K3 Block Attention Residuals; 0 for a plain residual stream.
  int64_t attn_res_block_size = 0;

  // quantization_config (K3: under text_config, or at the top level): which
  // routed experts the checkpoint may store as MXFP4. Absent: plain bf16 / f32.
  QuantizationConfig quantization;

  // For reading config.json (config.cc); what the architectures do
  // differently lives in arch/ (ArchitectureOf), not in branches on this.
  bool IsK3() const { return arch == Architecture::kKimiK3; }
  bool IsMoeLayer(int64_t layer) const { return num_experts > 0 && layer >= first_k_dense_replace; }
  // Weight name prefixes: `language_model.model.` / `model.`, and the LM head
  // (from the architecture, arch/architecture.h).
  std::string ModelPrefix() const;
  std::string LmHeadName() const;
  int64_t MlaCacheWidth() const { return kv_lora_rank + qk_rope_head_dim; }
};

// Parses config.json text; `source` names the file in error messages. Every
// key the model needs is required (K3's attention-residual, SiTU and latent-MoE
// keys included: never defaulted); a missing or ill-typed key is an error
// naming it. A quantization_config must be compressed-tensors with only MXFP4
// weight groups (format "mxfp4-pack-quantized", num_bits 4, type float,
// group_size 32, no activation or KV-cache quantization) whose target and
// ignore patterns compile; anything else is an error naming the key and value.
//
// Config text is input from a file or a peer: over kMaxConfigJsonBytes, or
// nested deeper than kMaxConfigJsonDepth, it is refused before parsing. The
// sizes are then held to limits that no real model comes near, products
// included (checked, naming the product): each projection's width, the
// tensors a model has (num_hidden_layers x num_experts), the parameters of
// each part and a sequence's KDA state, so that everything computed from a
// config (ExpectedTensors, CountParameters, state sizes) fits int64 and
// memory.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);
// DIR/config.json: a regular file of at most kMaxConfigJsonBytes
// (ReadRegularFile: a FIFO or /dev/zero is refused without blocking).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// Real configs are a few KiB, nested 5 levels.
inline constexpr int64_t kMaxConfigJsonBytes = 4 << 20;
inline constexpr int kMaxConfigJsonDepth = 32;
// The limits on sizes' products (docs/security.md, Limits). K3: 93 layers x 384
// experts, under 2^41 parameters.
inline constexpr int64_t kMaxLayerExperts = int64_t{1} << 18;
inline constexpr int64_t kMaxPartParameters = int64_t{1} << 44;
inline constexpr int64_t kMaxKdaStateFloats = int64_t{1} << 34;

// The inverse, for make-model: config.json text in the real layout.
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace deltaserve
