#include "runtime/model/weights.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/arch/architecture.h"
#include "runtime/model/weight_loader.h"
#include "runtime/model/weight_spec.h"

namespace deltaserve {
namespace {

// Each Load / Concat reads this rank's part as the tensor's spec splits it.
absl::Status LoadKda(const ModelConfig& c, const WeightLoader& l, KdaWeights* w) {
  DELTASERVE_ASSIGN_OR_RETURN(w->qkv_proj,
                              l.Concat({"q_proj.weight", "k_proj.weight", "v_proj.weight"}));
  DELTASERVE_ASSIGN_OR_RETURN(w->qkv_conv,
                              l.Concat({"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}));
  DELTASERVE_ASSIGN_OR_RETURN(w->f_a, l.Load("f_a_proj.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->f_b, l.Load("f_b_proj.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->b_proj, l.Load("b_proj.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->a_log, l.Load("A_log"));  // padding dropped
  DELTASERVE_ASSIGN_OR_RETURN(w->dt_bias, l.Load("dt_bias"));
  if (c.kda.full_rank_gate) {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_proj, l.Load("g_proj.weight"));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_a, l.Load("g_a_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->g_b, l.Load("g_b_proj.weight"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->o_norm, l.Load("o_norm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->o_proj, l.Load("o_proj.weight"));
  return absl::OkStatus();
}

absl::Status LoadMla(const ModelConfig& c, const WeightLoader& l, MlaWeights* w) {
  const int64_t P = c.qk_nope_head_dim, Vd = c.v_head_dim, C = c.kv_lora_rank;
  if (c.q_lora_rank > 0) {
    DELTASERVE_ASSIGN_OR_RETURN(w->q_a, l.Load("q_a_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->q_a_norm, l.Load("q_a_layernorm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->q_b, l.Load("q_b_proj.weight"));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(w->q_proj, l.Load("q_proj.weight"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_a, l.Load("kv_a_proj_with_mqa.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_a_norm, l.Load("kv_a_layernorm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_b, l.Load("kv_b_proj.weight"));
  if (c.mla_output_gate) {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_proj, l.Load("g_proj.weight"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->o_proj, l.Load("o_proj.weight"));

  const int64_t local = static_cast<int64_t>(w->kv_b.size()) / ((P + Vd) * C);  // this rank's heads
  w->w_uk_t.resize(static_cast<size_t>(local * C * P));
  for (int64_t h = 0; h < local; ++h) {
    const float* w_uk = w->kv_b.data() + h * (P + Vd) * C;  // [P, C]
    float* dst = w->w_uk_t.data() + h * C * P;              // [C, P]
    for (int64_t i = 0; i < P; ++i)
      for (int64_t j = 0; j < C; ++j) dst[j * P + i] = w_uk[i * C + j];
  }
  return absl::OkStatus();
}

// A gated MLP's gate/up rows and down columns (this rank's share of its width).
absl::Status LoadGatedMlp(const WeightLoader& l, Floats* gate_up, Floats* down) {
  DELTASERVE_ASSIGN_OR_RETURN(*gate_up, l.Concat({"gate_proj.weight", "up_proj.weight"}));
  DELTASERVE_ASSIGN_OR_RETURN(*down, l.Load("down_proj.weight"));
  return absl::OkStatus();
}

absl::Status LoadFfn(const ModelConfig& c, int64_t layer, const WeightLoader& l, FfnWeights* w) {
  if (!c.IsMoeLayer(layer)) return LoadGatedMlp(l.Under("mlp."), &w->gate_up, &w->down);
  w->moe = true;
  const WeightLoader m = l.Under("block_sparse_moe.");
  DELTASERVE_ASSIGN_OR_RETURN(w->router, m.Load("gate.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->router_bias, m.Load("gate.e_score_correction_bias"));
  w->expert_w13.resize(c.num_experts);
  w->expert_w2.resize(c.num_experts);
  for (int64_t e = 0; e < c.num_experts; ++e) {
    // Empty unless this rank owns expert e.
    const WeightLoader x = m.Under(absl::StrCat("experts.", e, "."));
    DELTASERVE_ASSIGN_OR_RETURN(w->expert_w13[e], x.Concat({"w1.weight", "w3.weight"}));
    DELTASERVE_ASSIGN_OR_RETURN(w->expert_w2[e], x.Load("w2.weight"));
  }
  if (c.num_shared_experts > 0) {
    DELTASERVE_RETURN_IF_ERROR(
        LoadGatedMlp(m.Under("shared_experts."), &w->shared_gate_up, &w->shared_down));
  }
  if (c.routed_expert_hidden_size > 0) {
    DELTASERVE_ASSIGN_OR_RETURN(w->latent_down, m.Load("routed_expert_down_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->latent_up, m.Load("routed_expert_up_proj.weight"));
    if (c.latent_moe_use_norm) {
      DELTASERVE_ASSIGN_OR_RETURN(w->latent_norm, m.Load("routed_expert_norm.weight"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> LoadWeights(const ModelConfig& config, const Checkpoint& checkpoint,
                                         const ModelShard& shard, int64_t* bytes_read) {
  const ModelArchitecture& arch = ArchitectureOf(config);
  const WeightLoader top(checkpoint, ExpectedTensors(config), shard.tp_rank, shard.tp_size,
                         bytes_read);
  const WeightLoader model = top.Under(config.ModelPrefix());
  ModelWeights w;
  if (shard.HasEmbedding()) {
    DELTASERVE_ASSIGN_OR_RETURN(w.embed, model.Load("embed_tokens.weight"));
  }
  if (HasHead(config, shard)) {
    DELTASERVE_ASSIGN_OR_RETURN(w.norm, model.Load("norm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w.lm_head, top.Load(config.LmHeadName()));
    DELTASERVE_RETURN_IF_ERROR(arch.LoadHeadTensors(model, &w));
  }
  w.layers.resize(static_cast<size_t>(config.num_layers));
  for (int64_t i = shard.layer_begin; i < shard.layer_end; ++i) {
    LayerWeights& layer = w.layers[i];
    const WeightLoader l = model.Under(absl::StrCat("layers.", i, "."));
    layer.kind = config.layer_kinds[i];
    DELTASERVE_ASSIGN_OR_RETURN(layer.input_norm, l.Load("input_layernorm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(layer.post_attention_norm,
                                l.Load("post_attention_layernorm.weight"));
    if (layer.kind == LayerKind::kKda) {
      DELTASERVE_RETURN_IF_ERROR(LoadKda(config, l.Under("self_attn."), &layer.kda));
    } else {
      DELTASERVE_RETURN_IF_ERROR(LoadMla(config, l.Under("self_attn."), &layer.mla));
    }
    DELTASERVE_RETURN_IF_ERROR(LoadFfn(config, i, l, &layer.ffn));
    DELTASERVE_RETURN_IF_ERROR(arch.LoadLayerTensors(l, &layer));
  }
  return w;
}

}  // namespace deltaserve
