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

// How a checkpoint stores a tensor of logical shape [out, in].
enum class Storage {
  kFloat,  // one tensor `name`, F32, BF16 or F16
  // Routed expert matrices only (MODEL.md, kernels/mxfp4.h): no `name`, but
  // `name`_packed U8 [out, in / 2] (two E2M1 codes a byte, even column in the
  // low nibble) and `name`_scale U8 [out, in / 32] (E8M0), in a multiple of 32.
  kMxfp4,
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch layout: Linear weights [out, in]
  DType dtype = DType::kBF16;  // kFloat: as stored by the real bf16 checkpoints
  ModelPart part = ModelPart::kLayer;
  int64_t layer = -1;  // kLayer: its layer
  TpSplit split;       // how a tensor-parallel group divides it
  // How the tensor is stored. ExpectedTensors: as the config declares it, like
  // `dtype` (kMxfp4 for a routed expert matrix its quantization_config targets
  // and does not ignore, as real K3 checkpoints store them); the planner counts
  // that. CheckpointTensors: as the checkpoint holds it (a targeted expert may
  // still be stored as float); the loader reads that.
  Storage stored = Storage::kFloat;

  int64_t NumElements() const;
  // The two tensors of the kMxfp4 form ("...w1.weight_packed", "..._scale").
  std::string PackedName() const { return name + "_packed"; }
  std::string ScaleName() const { return name + "_scale"; }
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
// e_score_correction_bias, and MXFP4 routed experts where the config's
// quantization_config says so (`stored`). With tie_word_embeddings there is
// no lm_head.
// The config must have come from ParseModelConfig (or a preset).
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

// Parameter counts of a model: all of them, and those one token reads (the
// routed experts it is not sent to excluded). The head counts once when tied.
struct ParameterCount {
  int64_t total = 0;
  int64_t active_per_token = 0;
};
ParameterCount CountParameters(const ModelConfig& config);

// Bytes of `elements` values of `spec` (all of it, or a TP rank's part: whole
// rows) as it is stored: kMxfp4 half a byte a value plus a scale byte per 32
// of a row, kFloat DTypeSize(dtype) a value (BF16 2, F32 4).
int64_t StoredBytes(const TensorSpec& spec, int64_t elements);

// Whether the loader keeps the tensor as a matrix in its stored dtype (2-D
// with more than one row: what Linear multiplies) rather than as a float32
// vector (norm gains, biases, convolution taps, A_log, dt_bias, K3's [1, D]
// residual-mix projections). runtime/model/weights.h says why.
bool HeldAsMatrix(const TensorSpec& spec);
// Bytes a loaded model holds for `elements` values of `spec`: matrices as
// stored (StoredBytes), vectors 4 a value.
int64_t HeldBytes(const TensorSpec& spec, int64_t elements);

// ExpectedTensors(config), each with `stored` set to the form `checkpoint`
// holds, once every check below passed: the one place a checkpoint is checked
// against its config, before anything is loaded.
//
// Each expected tensor must be present with exactly the expected shape (a
// TpCut::kLeading tensor such as A_log: any shape of at least its leading
// values, as the layouts differ) and a floating-point dtype (F32, BF16 or
// F16; conversion happens at load time). A routed expert matrix may instead
// be the MXFP4 pair (Storage::kMxfp4), found by its names: both halves, U8,
// of exactly their shapes, its input width a multiple of 32, in a checkpoint
// whose config has a quantization_config whose targets select the module (the
// name without ".weight") and whose ignore list does not. Holding both forms
// of one tensor is an error; different experts may differ in form. Tensors
// the spec does not know (vision towers, ...) are ignored. The error names the
// tensor, what was expected and what was found, and the checkpoint
// directory, and lists the first few problems when there are several:
// NotFound when the first is a missing tensor, else InvalidArgument.
absl::StatusOr<std::vector<TensorSpec>> CheckpointTensors(const ModelConfig& config,
                                                          const Checkpoint& checkpoint);
// CheckpointTensors' checks alone.
absl::Status ValidateCheckpoint(const ModelConfig& config, const Checkpoint& checkpoint);

// The two halves of a kMxfp4 tensor of a checkpoint that passed
// CheckpointTensors, for the loader: packed U8 [out, in / 2] and scale U8
// [out, in / 32], views into the mapped files. Scale bytes are read (1/17 of
// the tensor): a NaN scale (255) is an error naming the tensor, row and
// group, so kernels never see one. An error too for a spec that is not
// kMxfp4 or a checkpoint without the pair.
struct Mxfp4Views {
  const TensorView* packed = nullptr;
  const TensorView* scale = nullptr;
};
absl::StatusOr<Mxfp4Views> GetMxfp4(const Checkpoint& checkpoint, const TensorSpec& spec);

}  // namespace deltaserve
