// The tensors a checkpoint of either architecture holds (MODEL.md), derived
// from its ModelConfig: exact names in the real layouts (`language_model.`
// prefix for K3), shapes, stored dtypes, the part of the model each belongs
// to and how tensor parallelism splits it (tp_split.h: the loader and the
// stage planner both read that). ValidateCheckpoint checks a checkpoint
// against this list before anything is loaded, so a wrong or incomplete
// checkpoint fails with a message naming the tensor instead of producing
// garbage later.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tp_split.h"

namespace deltaserve {

// Which pipeline stage holds a tensor: the first (the embedding), the one
// owning its layer, or the last (final norm, LM head, K3's output mix).
enum class ModelPart { kEmbedding, kLayer, kHead };

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch layout: Linear weights [out, in]
  DType dtype = DType::kBF16;  // as stored by the real checkpoints
  ModelPart part = ModelPart::kLayer;
  int64_t layer = -1;  // kLayer: its layer
  TpSplit split;       // how a tensor-parallel group divides it

  int64_t NumElements() const;
  // What TP rank `rank` of `size` holds of it.
  TpPart RankPart(int rank, int size) const {
    return deltaserve::RankPart(split, shape, rank, size);
  }
};

// Appends specs, each stamped with the part of the model being declared;
// BF16 and replicated unless stated.
class SpecList {
 public:
  explicit SpecList(std::vector<TensorSpec>* out) : out_(out) {}
  // The specs added next belong to `part` (and `layer`).
  void Begin(ModelPart part, int64_t layer = -1) {
    part_ = part;
    layer_ = layer;
  }
  void Add(std::string name, std::vector<int64_t> shape, DType dtype = DType::kBF16,
           TpSplit split = TpSplit::Replicated());
  void Add(std::string name, std::vector<int64_t> shape, TpSplit split) {
    Add(std::move(name), std::move(shape), DType::kBF16, split);
  }

 private:
  std::vector<TensorSpec>* out_;
  ModelPart part_ = ModelPart::kEmbedding;
  int64_t layer_ = -1;
};

// Every tensor of the text model, in the order the real checkpoints store
// them (embedding and head first, then layer by layer), each with its TP
// split: attention tensors by heads (output projections by their input
// columns), FFNs by width, routed experts whole on rank e % tp, the rest
// (norms, low-rank gate inputs, the MLA latent projection, the router, K3's
// latent down / up projections and residual mixes) replicated. BF16 except the
// F32 KDA parameters (A_log, dt_bias, *_conv1d, o_norm) and the router's
// e_score_correction_bias. With tie_word_embeddings there is no lm_head.
// The config must have come from ParseModelConfig (or a preset).
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

// Parameter counts of a model: all of them, and those one token reads (the
// routed experts it is not sent to excluded). The head counts once when tied.
struct ParameterCount {
  int64_t total = 0;
  int64_t active_per_token = 0;
};
ParameterCount CountParameters(const ModelConfig& config);

// Checks that every expected tensor is present with exactly the expected
// shape (a TpCut::kLeading tensor such as A_log: any shape of at least its
// leading values, as the layouts differ) and a floating-point dtype (F32,
// BF16 or F16; conversion happens at load time). Tensors the spec does not
// know (vision towers, ...) are ignored. The error names the tensor and the
// checkpoint directory, and lists the first few problems when there are
// several.
absl::Status ValidateCheckpoint(const ModelConfig& config, const Checkpoint& checkpoint);

}  // namespace deltaserve
