#include "runtime/model/presets.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deltaserve {
namespace {

// 1-indexed lists, as config.json writes them.
std::vector<LayerKind> LayerKinds(int64_t num_layers, const std::vector<int64_t>& mla_layers) {
  std::vector<LayerKind> kinds(static_cast<size_t>(num_layers), LayerKind::kKda);
  for (int64_t layer : mla_layers) kinds[static_cast<size_t>(layer - 1)] = LayerKind::kMla;
  return kinds;
}

// Fields both tiny golden models share.
ModelConfig TinyCommon() {
  ModelConfig c;
  c.hidden_size = 64;
  c.num_layers = 9;
  c.vocab_size = 256;
  c.rms_norm_eps = 1e-5f;
  c.max_position_embeddings = 1048576;
  c.tie_word_embeddings = false;
  c.layer_kinds = LayerKinds(9, {4, 8, 9});  // K,K,K,M,K,K,K,M,M
  c.kda.num_heads = 4;
  c.kda.head_dim = 8;
  c.kda.conv_kernel_size = 4;
  c.num_attention_heads = 4;
  c.kv_lora_rank = 16;
  c.qk_nope_head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 8;
  c.intermediate_size = 96;
  c.first_k_dense_replace = 1;
  c.num_experts = 8;
  c.num_experts_per_token = 2;
  c.moe_intermediate_size = 24;
  c.moe_renormalize = true;
  return c;
}

ModelConfig K3Tiny() {
  ModelConfig c = TinyCommon();
  c.arch = Architecture::kKimiK3;
  c.model_type = "kimi_k3";
  c.kda.full_rank_gate = true;
  c.kda.has_lower_bound = true;
  c.kda.gate_lower_bound = -5.0f;
  c.q_lora_rank = 32;
  c.mla_output_gate = true;
  c.hidden_act = "situ";
  c.situ_beta = 4.0f;
  c.situ_linear_beta = 25.0f;
  c.num_shared_experts = 2;
  c.routed_scaling_factor = 1.0f;
  c.routed_expert_hidden_size = 32;
  c.latent_moe_use_norm = true;
  c.attn_res_block_size = 4;
  return c;
}

ModelConfig KimiLinearTiny() {
  ModelConfig c = TinyCommon();
  c.arch = Architecture::kKimiLinear;
  c.model_type = "kimi_linear";
  c.q_lora_rank = 0;  // plain q_proj
  c.hidden_act = "silu";
  c.num_shared_experts = 1;
  c.routed_scaling_factor = 2.446f;
  return c;
}

// 110.8M parameters (82.5M active per token): big enough that the
// benchmarks measure matrix work rather than overheads, small enough for one
// GPU and a quick random checkpoint.
ModelConfig K3Small() {
  ModelConfig c;
  c.arch = Architecture::kKimiK3;
  c.model_type = "kimi_k3";
  c.hidden_size = 1024;
  c.num_layers = 9;
  c.vocab_size = 256;
  c.rms_norm_eps = 1e-5f;
  c.max_position_embeddings = 1048576;
  c.tie_word_embeddings = false;
  c.layer_kinds = LayerKinds(9, {4, 8, 9});
  c.kda.num_heads = 8;
  c.kda.head_dim = 128;
  c.kda.conv_kernel_size = 4;
  c.kda.full_rank_gate = true;
  c.kda.has_lower_bound = true;
  c.kda.gate_lower_bound = -5.0f;
  c.num_attention_heads = 8;
  c.q_lora_rank = 512;
  c.kv_lora_rank = 256;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.mla_output_gate = true;
  c.hidden_act = "situ";
  c.situ_beta = 4.0f;
  c.situ_linear_beta = 25.0f;
  c.intermediate_size = 2816;
  c.first_k_dense_replace = 1;
  c.num_experts = 8;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 1;
  c.moe_intermediate_size = 384;
  c.moe_renormalize = true;
  c.routed_scaling_factor = 2.5f;
  c.routed_expert_hidden_size = 512;
  c.latent_moe_use_norm = true;
  c.attn_res_block_size = 4;
  return c;
}

}  // namespace

std::vector<std::string> PresetNames() { return {"k3-tiny", "kimi-linear-tiny", "k3-small"}; }

absl::StatusOr<ModelConfig> PresetConfig(const std::string& name) {
  if (name == "k3-tiny") return K3Tiny();
  if (name == "kimi-linear-tiny") return KimiLinearTiny();
  if (name == "k3-small") return K3Small();
  return absl::NotFoundError(absl::StrCat("unknown model preset '", name,
                                          "' (known: ", absl::StrJoin(PresetNames(), ", "), ")"));
}

}  // namespace deltaserve
