// Kimi K3's decoder stack with Block Attention Residuals (MODEL.md, "Decoder
// stack"): the tensor carried between layers is the partial sum `prefix` of
// the current block plus a bank of completed block sums (the embedding
// first), and every residual read is a learned softmax mix over
// bank + [prefix]. A block's first layer banks the finished sum and restarts
// it with its mixer output.
#include "runtime/model/arch/kimi_k3.h"

#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/attn_res.h"
#include "kernels/elementwise.h"
#include "kernels/workspace.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

// The attention-residual mix over bank + [prefix] into out [rows, D].
void Mix(const Activations& act, const ResMixWeights& w, float eps,
         const kernels::MutableTensor& out) {
  std::vector<kernels::Tensor> candidates(act.bank.begin(), act.bank.end());
  candidates.push_back(act.prefix);
  kernels::AttnResMix(candidates.data(), static_cast<int64_t>(candidates.size()), w.norm.view(),
                      w.proj.view(), eps, out);
}

// One mix's parameters, replicated on every TP rank: `<name>_norm.weight`
// [D] and the query `<name>_proj.weight` [1, D].
void AddResMix(const std::string& name, int64_t dim, SpecList* s) {
  s->Add(name + "_norm.weight", {dim});
  s->Add(name + "_proj.weight", {1, dim});
}

absl::Status LoadResMix(const WeightLoader& l, const std::string& name, ResMixWeights* w) {
  DELTASERVE_ASSIGN_OR_RETURN(w->norm, l.Load(name + "_norm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->proj, l.Load(name + "_proj.weight"));
  return absl::OkStatus();
}

class KimiK3 final : public ModelArchitecture {
 public:
  std::string_view model_type() const override { return "kimi_k3"; }
  std::string ModelPrefix() const override { return "language_model.model."; }
  std::string LmHeadName() const override { return "language_model.lm_head.weight"; }

  // One entry per head, padded with zeros to a multiple of 128.
  std::vector<int64_t> ALogShape(int64_t heads) const override {
    return {(heads + 127) / 128 * 128};
  }
  void AddHeadTensors(const ModelConfig& c, SpecList* s) const override {
    AddResMix(ModelPrefix() + "output_attn_res", c.hidden_size, s);
  }
  void AddLayerTensors(const ModelConfig& c, const std::string& prefix,
                       SpecList* s) const override {
    AddResMix(prefix + "self_attention_res", c.hidden_size, s);
    AddResMix(prefix + "mlp_res", c.hidden_size, s);
  }
  absl::Status LoadHeadTensors(const WeightLoader& model, ModelWeights* w) const override {
    return LoadResMix(model, "output_attn_res", &w->output_res);
  }
  absl::Status LoadLayerTensors(const WeightLoader& layer, LayerWeights* w) const override {
    DELTASERVE_RETURN_IF_ERROR(LoadResMix(layer, "self_attention_res", &w->attn_res));
    return LoadResMix(layer, "mlp_res", &w->mlp_res);
  }

  // One entry per layer i < layer with i % block == 0 (the embedding is the
  // first). attn_res_block_size >= 1: ParseModelConfig requires it for K3.
  int64_t BankSizeBefore(const ModelConfig& c, int64_t layer) const override {
    const int64_t block = c.attn_res_block_size;
    return (layer + block - 1) / block;
  }

  absl::Status RunResidualStack(const ModelConfig& c, const ModelWeights& w, int64_t begin,
                                int64_t end, const SubLayers& sub,
                                Activations* act) const override {
    using namespace kernels;
    const Device dev = act->prefix.device();
    const int64_t D = c.hidden_size;
    const float eps = c.rms_norm_eps;
    Buffer delta(dev, kernels::DType::kF32, act->rows, D);
    const Temp mixed(dev, kernels::DType::kF32, act->rows, D);
    for (int64_t i = begin; i < end; ++i) {
      const LayerWeights& layer = w.layers[i];
      Mix(*act, layer.attn_res, eps, mixed);
      DELTASERVE_RETURN_IF_ERROR(sub.mixer(i, mixed, delta));
      if (i % c.attn_res_block_size == 0) {
        // Bank the finished sum; the mixer output starts the next one.
        act->bank.push_back(std::move(act->prefix));
        act->prefix = std::exchange(delta, Buffer(dev, kernels::DType::kF32, act->rows, D));
      } else {
        Add(act->prefix, delta, act->prefix);
      }
      Mix(*act, layer.mlp_res, eps, mixed);
      DELTASERVE_RETURN_IF_ERROR(sub.ffn(i, mixed, delta));
      Add(act->prefix, delta, act->prefix);
    }
    return absl::OkStatus();
  }

  kernels::Buffer FinalHidden(const ModelConfig& c, const ModelWeights& w,
                              const Activations& act) const override {
    kernels::Buffer out(act.prefix.device(), kernels::DType::kF32, act.rows, c.hidden_size);
    Mix(act, w.output_res, c.rms_norm_eps, out);
    return out;
  }
};

}  // namespace

const ModelArchitecture& KimiK3Architecture() {
  static const KimiK3* const arch = new KimiK3;
  return *arch;
}

}  // namespace deltaserve
