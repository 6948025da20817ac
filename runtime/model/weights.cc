#include "runtime/model/weights.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

// Reads tensors, or row / column slices of them, as float32, counting the
// bytes it reads.
class Loader {
 public:
  Loader(const Checkpoint& checkpoint, std::string prefix, int64_t* bytes_read)
      : checkpoint_(checkpoint), prefix_(std::move(prefix)), bytes_read_(bytes_read) {}

  absl::StatusOr<Floats> Get(const std::string& name) const {
    DELTASERVE_ASSIGN_OR_RETURN(const TensorView* view, checkpoint_.Get(prefix_ + name));
    return Convert(*view);
  }

  // Rows [begin, end) of the first dimension (elements of a vector).
  absl::StatusOr<Floats> Rows(const std::string& name, int64_t begin, int64_t end) const {
    DELTASERVE_ASSIGN_OR_RETURN(const TensorView* view, checkpoint_.Get(prefix_ + name));
    const int64_t rows = view->shape.empty() ? 1 : view->shape[0];
    const size_t row_bytes = view->nbytes / static_cast<size_t>(rows);
    TensorView part = *view;
    part.shape[0] = end - begin;
    part.data += begin * row_bytes;
    part.nbytes = (end - begin) * row_bytes;
    return Convert(part);
  }

  // Elements [begin, end) of the tensor read flat, whatever its shape.
  absl::StatusOr<Floats> Elements(const std::string& name, int64_t begin, int64_t end) const {
    DELTASERVE_ASSIGN_OR_RETURN(const TensorView* view, checkpoint_.Get(prefix_ + name));
    const size_t elem = DTypeSize(view->dtype);
    TensorView part = *view;
    part.shape = {end - begin};
    part.data += begin * elem;
    part.nbytes = (end - begin) * elem;
    return Convert(part);
  }

  // Columns [begin, end) of a matrix.
  absl::StatusOr<Floats> Cols(const std::string& name, int64_t begin, int64_t end) const {
    DELTASERVE_ASSIGN_OR_RETURN(const TensorView* view, checkpoint_.Get(prefix_ + name));
    const int64_t rows = view->shape[0], cols = view->shape[1];
    const size_t elem = DTypeSize(view->dtype);
    Floats out;
    out.reserve(rows * (end - begin));
    for (int64_t r = 0; r < rows; ++r) {
      TensorView part = *view;
      part.shape = {end - begin};
      part.data += (r * cols + begin) * elem;
      part.nbytes = (end - begin) * elem;
      DELTASERVE_ASSIGN_OR_RETURN(Floats row, Convert(part));
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  }

  // Row slices of several tensors, concatenated.
  absl::StatusOr<Floats> ConcatRows(const std::vector<std::string>& names, int64_t begin,
                                    int64_t end) const {
    Floats out;
    for (const std::string& name : names) {
      DELTASERVE_ASSIGN_OR_RETURN(Floats part, Rows(name, begin, end));
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

 private:
  absl::StatusOr<Floats> Convert(const TensorView& view) const {
    if (bytes_read_ != nullptr) *bytes_read_ += static_cast<int64_t>(view.nbytes);
    return ToFloat32(view);
  }

  const Checkpoint& checkpoint_;
  std::string prefix_;
  int64_t* bytes_read_;
};

absl::Status LoadKda(const ModelConfig& c, const ModelShard& s, const Loader& l, KdaWeights* w) {
  const std::string p = "self_attn.";
  const int64_t H = c.kda.num_heads, d = c.kda.head_dim;
  const int64_t h0 = s.SliceBegin(H), h1 = s.SliceEnd(H);  // this rank's heads
  DELTASERVE_ASSIGN_OR_RETURN(
      w->qkv_proj, l.ConcatRows({p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"},
                                h0 * d, h1 * d));
  DELTASERVE_ASSIGN_OR_RETURN(
      w->qkv_conv,
      l.ConcatRows({p + "q_conv1d.weight", p + "k_conv1d.weight", p + "v_conv1d.weight"}, h0 * d,
                   h1 * d));
  DELTASERVE_ASSIGN_OR_RETURN(w->f_a, l.Get(p + "f_a_proj.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->f_b, l.Rows(p + "f_b_proj.weight", h0 * d, h1 * d));
  DELTASERVE_ASSIGN_OR_RETURN(w->b_proj, l.Rows(p + "b_proj.weight", h0, h1));
  // K3 pads A_log to a multiple of 128, Kimi Linear stores [1, 1, H, 1]: the
  // first H values are the heads' in both, so a flat view works for either.
  DELTASERVE_ASSIGN_OR_RETURN(w->a_log, l.Elements(p + "A_log", h0, h1));
  DELTASERVE_ASSIGN_OR_RETURN(w->dt_bias, l.Rows(p + "dt_bias", h0 * d, h1 * d));
  if (c.kda.full_rank_gate) {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_proj, l.Rows(p + "g_proj.weight", h0 * d, h1 * d));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_a, l.Get(p + "g_a_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->g_b, l.Rows(p + "g_b_proj.weight", h0 * d, h1 * d));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->o_norm, l.Get(p + "o_norm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->o_proj, l.Cols(p + "o_proj.weight", h0 * d, h1 * d));
  return absl::OkStatus();
}

absl::Status LoadMla(const ModelConfig& c, const ModelShard& s, const Loader& l, MlaWeights* w) {
  const std::string p = "self_attn.";
  const int64_t n = c.num_attention_heads, P = c.qk_nope_head_dim;
  const int64_t R = c.qk_rope_head_dim, Vd = c.v_head_dim, C = c.kv_lora_rank;
  const int64_t h0 = s.SliceBegin(n), h1 = s.SliceEnd(n);
  if (c.q_lora_rank > 0) {
    DELTASERVE_ASSIGN_OR_RETURN(w->q_a, l.Get(p + "q_a_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->q_a_norm, l.Get(p + "q_a_layernorm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->q_b, l.Rows(p + "q_b_proj.weight", h0 * (P + R), h1 * (P + R)));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(w->q_proj, l.Rows(p + "q_proj.weight", h0 * (P + R), h1 * (P + R)));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_a, l.Get(p + "kv_a_proj_with_mqa.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_a_norm, l.Get(p + "kv_a_layernorm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_b,
                              l.Rows(p + "kv_b_proj.weight", h0 * (P + Vd), h1 * (P + Vd)));
  if (c.mla_output_gate) {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_proj, l.Rows(p + "g_proj.weight", h0 * Vd, h1 * Vd));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->o_proj, l.Cols(p + "o_proj.weight", h0 * Vd, h1 * Vd));

  const int64_t local = h1 - h0;
  w->w_uk_t.resize(static_cast<size_t>(local * C * P));
  for (int64_t h = 0; h < local; ++h) {
    const float* w_uk = w->kv_b.data() + h * (P + Vd) * C;  // [P, C]
    float* dst = w->w_uk_t.data() + h * C * P;              // [C, P]
    for (int64_t i = 0; i < P; ++i)
      for (int64_t j = 0; j < C; ++j) dst[j * P + i] = w_uk[i * C + j];
  }
  return absl::OkStatus();
}

// gate/up rows and down columns [begin, end) of a gated MLP's width.
absl::Status LoadGatedMlp(const Loader& l, const std::string& p, int64_t begin, int64_t end,
                          Floats* gate_up, Floats* down) {
  DELTASERVE_ASSIGN_OR_RETURN(
      *gate_up, l.ConcatRows({p + "gate_proj.weight", p + "up_proj.weight"}, begin, end));
  DELTASERVE_ASSIGN_OR_RETURN(*down, l.Cols(p + "down_proj.weight", begin, end));
  return absl::OkStatus();
}

absl::Status LoadFfn(const ModelConfig& c, const ModelShard& s, int64_t layer, const Loader& l,
                     FfnWeights* w) {
  if (!c.IsMoeLayer(layer)) {
    return LoadGatedMlp(l, "mlp.", s.SliceBegin(c.intermediate_size),
                        s.SliceEnd(c.intermediate_size), &w->gate_up, &w->down);
  }
  w->moe = true;
  const std::string p = "block_sparse_moe.";
  DELTASERVE_ASSIGN_OR_RETURN(w->router, l.Get(p + "gate.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->router_bias, l.Get(p + "gate.e_score_correction_bias"));
  w->expert_w13.resize(c.num_experts);
  w->expert_w2.resize(c.num_experts);
  for (int64_t e = 0; e < c.num_experts; ++e) {
    if (!s.OwnsExpert(e)) continue;
    const std::string ep = absl::StrCat(p, "experts.", e, ".");
    const int64_t inter = c.moe_intermediate_size;
    DELTASERVE_ASSIGN_OR_RETURN(w->expert_w13[e],
                                l.ConcatRows({ep + "w1.weight", ep + "w3.weight"}, 0, inter));
    DELTASERVE_ASSIGN_OR_RETURN(w->expert_w2[e], l.Get(ep + "w2.weight"));
  }
  if (c.num_shared_experts > 0) {
    const int64_t width = c.num_shared_experts * c.moe_intermediate_size;
    DELTASERVE_RETURN_IF_ERROR(LoadGatedMlp(l, p + "shared_experts.", s.SliceBegin(width),
                                            s.SliceEnd(width), &w->shared_gate_up,
                                            &w->shared_down));
  }
  if (c.routed_expert_hidden_size > 0) {
    DELTASERVE_ASSIGN_OR_RETURN(w->latent_down, l.Get(p + "routed_expert_down_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->latent_up, l.Get(p + "routed_expert_up_proj.weight"));
    if (c.latent_moe_use_norm) {
      DELTASERVE_ASSIGN_OR_RETURN(w->latent_norm, l.Get(p + "routed_expert_norm.weight"));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadResMix(const Loader& l, const std::string& name, ResMixWeights* w) {
  DELTASERVE_ASSIGN_OR_RETURN(w->norm, l.Get(name + "_norm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->proj, l.Get(name + "_proj.weight"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> LoadWeights(const ModelConfig& config, const Checkpoint& checkpoint,
                                         const ModelShard& shard, int64_t* bytes_read) {
  ModelWeights w;
  const Loader model(checkpoint, config.ModelPrefix(), bytes_read);
  const Loader top(checkpoint, "", bytes_read);
  if (shard.HasEmbedding()) {
    DELTASERVE_ASSIGN_OR_RETURN(w.embed, model.Get("embed_tokens.weight"));
  }
  if (HasHead(config, shard)) {
    DELTASERVE_ASSIGN_OR_RETURN(w.norm, model.Get("norm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w.lm_head, top.Get(config.LmHeadName()));
    if (config.IsK3()) {
      DELTASERVE_RETURN_IF_ERROR(LoadResMix(model, "output_attn_res", &w.output_res));
    }
  }
  w.layers.resize(static_cast<size_t>(config.num_layers));
  for (int64_t i = shard.layer_begin; i < shard.layer_end; ++i) {
    LayerWeights& layer = w.layers[i];
    const Loader l(checkpoint, absl::StrCat(config.ModelPrefix(), "layers.", i, "."), bytes_read);
    layer.kind = config.layer_kinds[i];
    DELTASERVE_ASSIGN_OR_RETURN(layer.input_norm, l.Get("input_layernorm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(layer.post_attention_norm,
                                l.Get("post_attention_layernorm.weight"));
    if (layer.kind == LayerKind::kKda) {
      DELTASERVE_RETURN_IF_ERROR(LoadKda(config, shard, l, &layer.kda));
    } else {
      DELTASERVE_RETURN_IF_ERROR(LoadMla(config, shard, l, &layer.mla));
    }
    DELTASERVE_RETURN_IF_ERROR(LoadFfn(config, shard, i, l, &layer.ffn));
    if (config.IsK3()) {
      DELTASERVE_RETURN_IF_ERROR(LoadResMix(l, "self_attention_res", &layer.attn_res));
      DELTASERVE_RETURN_IF_ERROR(LoadResMix(l, "mlp_res", &layer.mlp_res));
    }
  }
  return w;
}

}  // namespace deltaserve
