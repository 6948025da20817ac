#include "runtime/model/presets.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/model/quantization.h"

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

// K3's mixture of experts at a size two cores can decode: 128 routed
// experts of which 8 are active (K3: 896 and 16) plus one shared, in a latent
// of 512, with attention narrowed to 4 KDA heads and 4 MLA heads. Routed
// experts are then about half of the weights one token multiplies (K3: 47%),
// and with several tokens in a step, each sent to its own experts, most of the
// bytes a step reads: 854M parameters, 805M of them routed experts (1.7 GB
// in bf16, 0.43 GB in MXFP4; 99M multiplied per token).
ModelConfig K3MoeSmall() {
  ModelConfig c = K3Small();
  c.kda.num_heads = 4;
  c.num_attention_heads = 4;
  c.q_lora_rank = 256;
  c.intermediate_size = 1024;
  c.num_experts = 128;
  c.num_experts_per_token = 8;
  c.num_shared_experts = 1;
  c.moe_intermediate_size = 512;
  c.routed_expert_hidden_size = 512;
  return c;
}

// Kimi K3 at its real size, as its config.json reads. MODEL.md gives the
// layer mix (93 layers, KDA,KDA,KDA,MLA with the last two MLA), hidden 7168,
// 96 KDA heads of 128, the latent 512 + 64, blocks of 12 and MXFP4 routed
// experts; the rest (vocabulary, 96 MLA heads, q-LoRA 1536, 896 experts of
// width 3072 in a latent of 3584, 16 active + 2 shared, dense width 33792)
// are the values public K3 configs carry, the same as the stage planner's
// tests use; CountParameters gives MODEL.md's 2.78T total and 104B active
// for them.
constexpr char kK3Json[] = R"({
  "architectures": ["KimiK3ForConditionalGeneration"],
  "model_type": "kimi_k3",
  "text_config": {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "vocab_size": 163840,
    "hidden_size": 7168,
    "intermediate_size": 33792,
    "num_hidden_layers": 93,
    "num_attention_heads": 96,
    "num_key_value_heads": 96,
    "hidden_act": "situ",
    "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 1048576,
    "tie_word_embeddings": false,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": true,
    "mla_use_output_gate": true,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_experts": 896,
    "num_experts_per_token": 16,
    "num_shared_experts": 2,
    "moe_intermediate_size": 3072,
    "routed_expert_hidden_size": 3584,
    "latent_moe_use_norm": true,
    "moe_renormalize": true,
    "moe_router_activation_func": "sigmoid",
    "routed_scaling_factor": 1.0,
    "use_grouped_topk": true,
    "num_expert_group": 1,
    "topk_group": 1,
    "attn_res_block_size": 12,
    "linear_attn_config": {
      "num_heads": 96,
      "head_dim": 128,
      "short_conv_kernel_size": 4,
      "use_full_rank_gate": true,
      "gate_lower_bound": -5.0,
      "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25,
                     26, 27, 29, 30, 31, 33, 34, 35, 37, 38, 39, 41, 42, 43, 45, 46, 47, 49,
                     50, 51, 53, 54, 55, 57, 58, 59, 61, 62, 63, 65, 66, 67, 69, 70, 71, 73,
                     74, 75, 77, 78, 79, 81, 82, 83, 85, 86, 87, 89, 90, 91],
      "full_attn_layers": [4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68,
                           72, 76, 80, 84, 88, 92, 93]
    }
  },
  "torch_dtype": "bfloat16"
})";

absl::StatusOr<ModelConfig> K3Full() {
  auto config = ParseModelConfig(kK3Json, "preset k3");
  if (!config.ok()) return config.status();
  config->quantization = RoutedExpertsMxfp4();  // MODEL.md: routed experts MXFP4
  return config;
}

}  // namespace

std::vector<std::string> PresetNames() {
  return {"k3-tiny", "kimi-linear-tiny", "k3-small", "k3-moe-small"};
}

std::vector<std::string> FullSizePresetNames() { return {"k3"}; }

absl::StatusOr<ModelConfig> PresetConfig(const std::string& name) {
  if (name == "k3-tiny") return K3Tiny();
  if (name == "kimi-linear-tiny") return KimiLinearTiny();
  if (name == "k3-small") return K3Small();
  if (name == "k3-moe-small") return K3MoeSmall();
  if (name == "k3") return K3Full();
  return absl::NotFoundError(
      absl::StrCat("unknown model preset '", name, "' (known: ", absl::StrJoin(PresetNames(), ", "),
                   ", and for plan ", absl::StrJoin(FullSizePresetNames(), ", "), ")"));
}

}  // namespace deltaserve
