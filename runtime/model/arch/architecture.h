// What differs between the architectures of the family (MODEL.md), behind
// one small interface: the weight names, the tensors an architecture adds to
// the shared KDA / MLA / FFN layers, and the residual stack that joins the
// layers. One file per architecture, as llama.cpp keeps src/models/<arch>.cpp:
// arch/kimi_k3.cc (Block Attention Residuals) and arch/kimi_linear.cc (a
// plain pre-norm residual stream). Everything else (the layers, loading,
// tensor parallelism, planning) reads the config and has no branch on the
// architecture. Parsing config.json stays in config.cc: it is one schema whose
// keys K3 requires and Kimi Linear defaults, read top to bottom in one place.
//
// Implementations are stateless singletons, chosen by ModelConfig::arch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "runtime/model/config.h"
#include "runtime/model/layers.h"
#include "runtime/model/weight_loader.h"
#include "runtime/model/weight_spec.h"
#include "runtime/model/weights.h"

namespace deltaserve {

// The two sub-layers of decoder layer `layer`, as the residual stack calls
// them: each reads the residual value h [rows, D] it is given, applies its
// pre-norm (input_layernorm / post_attention_layernorm) and writes its output
// to out [rows, D].
using SubLayer = absl::FunctionRef<absl::Status(int64_t layer, const kernels::Tensor& h,
                                                const kernels::MutableTensor& out)>;
struct SubLayers {
  SubLayer mixer;  // KDA or MLA
  SubLayer ffn;    // dense or MoE
};

class ModelArchitecture {
 public:
  virtual ~ModelArchitecture() = default;

  // config.json's top-level model_type: "kimi_k3", "kimi_linear".
  virtual std::string_view model_type() const = 0;
  // Weight names: the decoder's prefix ("model.") and the untied LM head.
  virtual std::string ModelPrefix() const = 0;
  virtual std::string LmHeadName() const = 0;

  // The stored shape of a KDA layer's A_log, one value per head: the
  // layouts pad and broadcast it differently.
  virtual std::vector<int64_t> ALogShape(int64_t heads) const = 0;
  // Tensors beyond the shared set, appended in checkpoint order: after the
  // LM head, and in each layer after its two norms (`prefix`: "...layers.i.").
  virtual void AddHeadTensors(const ModelConfig& config, SpecList* specs) const = 0;
  virtual void AddLayerTensors(const ModelConfig& config, const std::string& prefix,
                               SpecList* specs) const = 0;
  // Loads them: `model` reads under ModelPrefix(), `layer` under the layer's.
  virtual absl::Status LoadHeadTensors(const WeightLoader& model, ModelWeights* w) const = 0;
  virtual absl::Status LoadLayerTensors(const WeightLoader& layer, LayerWeights* w) const = 0;

  // Bank entries carried into layer `layer` (what a pipeline stage starting
  // there receives besides `prefix`).
  virtual int64_t BankSizeBefore(const ModelConfig& config, int64_t layer) const = 0;
  // Runs layers [begin, end) over `act`, calling each layer's sub-layers and
  // joining their outputs into the residual.
  virtual absl::Status RunResidualStack(const ModelConfig& config, const ModelWeights& w,
                                        int64_t begin, int64_t end, const SubLayers& sub,
                                        Activations* act) const = 0;
  // The hidden state [rows, D] the final norm and LM head read.
  virtual kernels::Buffer FinalHidden(const ModelConfig& config, const ModelWeights& w,
                                      const Activations& act) const = 0;
};

const ModelArchitecture& ArchitectureOf(Architecture arch);
inline const ModelArchitecture& ArchitectureOf(const ModelConfig& config) {
  return ArchitectureOf(config.arch);
}

}  // namespace deltaserve
