// Kimi Linear's decoder stack (MODEL.md, "Decoder stack"): a plain pre-norm
// residual stream, h += mixer(norm(h)); h += ffn(norm(h)); the head reads h.
#include "runtime/model/arch/kimi_linear.h"

#include <cstddef>

#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/workspace.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

class KimiLinear final : public ModelArchitecture {
 public:
  std::string_view model_type() const override { return "kimi_linear"; }
  std::string ModelPrefix() const override { return "model."; }
  std::string LmHeadName() const override { return "lm_head.weight"; }

  // The broadcast shape of the reference code.
  std::vector<int64_t> ALogShape(int64_t heads) const override { return {1, 1, heads, 1}; }
  void AddHeadTensors(const ModelConfig&, SpecList*) const override {}
  void AddLayerTensors(const ModelConfig&, const std::string&, SpecList*) const override {}
  absl::Status LoadHeadTensors(const WeightLoader&, ModelWeights*) const override {
    return absl::OkStatus();
  }
  absl::Status LoadLayerTensors(const WeightLoader&, LayerWeights*) const override {
    return absl::OkStatus();
  }

  int64_t BankSizeBefore(const ModelConfig&, int64_t) const override { return 0; }

  absl::Status RunResidualStack(const ModelConfig& config, const ModelWeights&, int64_t begin,
                                int64_t end, const SubLayers& sub,
                                Activations* act) const override {
    using namespace kernels;
    const MutableTensor h = act->prefix;  // the residual stream [rows, D]
    const Temp delta(h.device, kernels::DType::kF32, act->rows, config.hidden_size);
    for (int64_t i = begin; i < end; ++i) {
      DELTASERVE_RETURN_IF_ERROR(sub.mixer(i, h, delta));
      Add(h, delta, h);
      DELTASERVE_RETURN_IF_ERROR(sub.ffn(i, h, delta));
      Add(h, delta, h);
    }
    return absl::OkStatus();
  }

  kernels::Buffer FinalHidden(const ModelConfig&, const ModelWeights&,
                              const Activations& act) const override {
    kernels::Buffer out(act.prefix.device(), act.prefix.dtype(), act.rows, act.prefix.cols());
    kernels::Convert(act.prefix, out);
    return out;
  }
};

}  // namespace

const ModelArchitecture& KimiLinearArchitecture() {
  static const KimiLinear* const arch = new KimiLinear;
  return *arch;
}

}  // namespace deltaserve
