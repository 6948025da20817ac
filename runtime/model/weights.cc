#include "runtime/model/weights.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

class Loader {
 public:
  Loader(const Checkpoint& checkpoint, std::string prefix)
      : checkpoint_(checkpoint), prefix_(std::move(prefix)) {}

  // The tensor `prefix + name` as float32.
  absl::StatusOr<Floats> Get(const std::string& name) const {
    DELTASERVE_ASSIGN_OR_RETURN(const TensorView* view,
                                checkpoint_.Get(prefix_ + name));
    return ToFloat32(*view);
  }

  // Several tensors concatenated (row-major, so row-wise for matrices).
  absl::StatusOr<Floats> Concat(const std::vector<std::string>& names) const {
    Floats out;
    for (const std::string& name : names) {
      DELTASERVE_ASSIGN_OR_RETURN(Floats part, Get(name));
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

 private:
  const Checkpoint& checkpoint_;
  std::string prefix_;
};

absl::Status LoadKda(const ModelConfig& c, const Loader& l, KdaWeights* w) {
  const std::string p = "self_attn.";
  DELTASERVE_ASSIGN_OR_RETURN(
      w->qkv_proj, l.Concat({p + "q_proj.weight", p + "k_proj.weight",
                             p + "v_proj.weight"}));
  DELTASERVE_ASSIGN_OR_RETURN(
      w->qkv_conv, l.Concat({p + "q_conv1d.weight", p + "k_conv1d.weight",
                             p + "v_conv1d.weight"}));
  DELTASERVE_ASSIGN_OR_RETURN(w->f_a, l.Get(p + "f_a_proj.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->f_b, l.Get(p + "f_b_proj.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->b_proj, l.Get(p + "b_proj.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->a_log, l.Get(p + "A_log"));
  // K3 pads A_log to a multiple of 128, Kimi Linear stores [1, 1, H, 1]:
  // the first H values are the heads' in both.
  w->a_log.resize(static_cast<size_t>(c.kda.num_heads));
  DELTASERVE_ASSIGN_OR_RETURN(w->dt_bias, l.Get(p + "dt_bias"));
  if (c.kda.full_rank_gate) {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_proj, l.Get(p + "g_proj.weight"));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_a, l.Get(p + "g_a_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->g_b, l.Get(p + "g_b_proj.weight"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->o_norm, l.Get(p + "o_norm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->o_proj, l.Get(p + "o_proj.weight"));
  return absl::OkStatus();
}

absl::Status LoadMla(const ModelConfig& c, const Loader& l, MlaWeights* w) {
  const std::string p = "self_attn.";
  if (c.q_lora_rank > 0) {
    DELTASERVE_ASSIGN_OR_RETURN(w->q_a, l.Get(p + "q_a_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->q_a_norm, l.Get(p + "q_a_layernorm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->q_b, l.Get(p + "q_b_proj.weight"));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(w->q_proj, l.Get(p + "q_proj.weight"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_a, l.Get(p + "kv_a_proj_with_mqa.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_a_norm, l.Get(p + "kv_a_layernorm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_b, l.Get(p + "kv_b_proj.weight"));
  if (c.mla_output_gate) {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_proj, l.Get(p + "g_proj.weight"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->o_proj, l.Get(p + "o_proj.weight"));

  const int64_t n = c.num_attention_heads, P = c.qk_nope_head_dim;
  const int64_t Vd = c.v_head_dim, C = c.kv_lora_rank;
  w->w_uk_t.resize(static_cast<size_t>(n * C * P));
  for (int64_t h = 0; h < n; ++h) {
    const float* w_uk = w->kv_b.data() + h * (P + Vd) * C;  // [P, C]
    float* dst = w->w_uk_t.data() + h * C * P;             // [C, P]
    for (int64_t i = 0; i < P; ++i)
      for (int64_t j = 0; j < C; ++j) dst[j * P + i] = w_uk[i * C + j];
  }
  return absl::OkStatus();
}

absl::Status LoadFfn(const ModelConfig& c, int64_t layer, const Loader& l,
                     FfnWeights* w) {
  if (!c.IsMoeLayer(layer)) {
    DELTASERVE_ASSIGN_OR_RETURN(
        w->gate_up, l.Concat({"mlp.gate_proj.weight", "mlp.up_proj.weight"}));
    DELTASERVE_ASSIGN_OR_RETURN(w->down, l.Get("mlp.down_proj.weight"));
    return absl::OkStatus();
  }
  w->moe = true;
  const std::string p = "block_sparse_moe.";
  DELTASERVE_ASSIGN_OR_RETURN(w->router, l.Get(p + "gate.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->router_bias,
                              l.Get(p + "gate.e_score_correction_bias"));
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const std::string ep = absl::StrCat(p, "experts.", e, ".");
    DELTASERVE_ASSIGN_OR_RETURN(
        Floats w13, l.Concat({ep + "w1.weight", ep + "w3.weight"}));
    DELTASERVE_ASSIGN_OR_RETURN(Floats w2, l.Get(ep + "w2.weight"));
    w->expert_w13.push_back(std::move(w13));
    w->expert_w2.push_back(std::move(w2));
  }
  if (c.num_shared_experts > 0) {
    DELTASERVE_ASSIGN_OR_RETURN(
        w->shared_gate_up, l.Concat({p + "shared_experts.gate_proj.weight",
                                     p + "shared_experts.up_proj.weight"}));
    DELTASERVE_ASSIGN_OR_RETURN(w->shared_down,
                                l.Get(p + "shared_experts.down_proj.weight"));
  }
  if (c.routed_expert_hidden_size > 0) {
    DELTASERVE_ASSIGN_OR_RETURN(w->latent_down,
                                l.Get(p + "routed_expert_down_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->latent_up,
                                l.Get(p + "routed_expert_up_proj.weight"));
    if (c.latent_moe_use_norm) {
      DELTASERVE_ASSIGN_OR_RETURN(w->latent_norm,
                                  l.Get(p + "routed_expert_norm.weight"));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadResMix(const Loader& l, const std::string& name,
                        ResMixWeights* w) {
  DELTASERVE_ASSIGN_OR_RETURN(w->norm, l.Get(name + "_norm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->proj, l.Get(name + "_proj.weight"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> LoadWeights(const ModelConfig& config,
                                         const Checkpoint& checkpoint) {
  ModelWeights w;
  const Loader model(checkpoint, config.ModelPrefix());
  const Loader top(checkpoint, "");
  DELTASERVE_ASSIGN_OR_RETURN(w.embed, model.Get("embed_tokens.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w.norm, model.Get("norm.weight"));
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(w.lm_head, top.Get(config.LmHeadName()));
  }
  if (config.IsK3()) {
    DELTASERVE_RETURN_IF_ERROR(LoadResMix(model, "output_attn_res", &w.output_res));
  }
  w.layers.resize(static_cast<size_t>(config.num_layers));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    LayerWeights& layer = w.layers[i];
    const Loader l(checkpoint, absl::StrCat(config.ModelPrefix(), "layers.", i, "."));
    layer.kind = config.layer_kinds[i];
    DELTASERVE_ASSIGN_OR_RETURN(layer.input_norm, l.Get("input_layernorm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(layer.post_attention_norm,
                                l.Get("post_attention_layernorm.weight"));
    if (layer.kind == LayerKind::kKda) {
      DELTASERVE_RETURN_IF_ERROR(LoadKda(config, l, &layer.kda));
    } else {
      DELTASERVE_RETURN_IF_ERROR(LoadMla(config, l, &layer.mla));
    }
    DELTASERVE_RETURN_IF_ERROR(LoadFfn(config, i, l, &layer.ffn));
    if (config.IsK3()) {
      DELTASERVE_RETURN_IF_ERROR(LoadResMix(l, "self_attention_res", &layer.attn_res));
      DELTASERVE_RETURN_IF_ERROR(LoadResMix(l, "mlp_res", &layer.mlp_res));
    }
  }
  return w;
}

}  // namespace deltaserve
