// The tensors a checkpoint of either architecture holds (MODEL.md), derived
// from its ModelConfig: exact names in the real layouts (`language_model.`
// prefix for K3), shapes and stored dtypes. ValidateCheckpoint checks a
// checkpoint against this list before anything is loaded, so a wrong or
// incomplete checkpoint fails with a message naming the tensor instead of
// producing garbage later.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"

namespace deltaserve {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch layout: Linear weights [out, in]
  DType dtype = DType::kBF16;  // as stored by the real checkpoints

  int64_t NumElements() const;
};

// Every tensor of the text model, in the order the real checkpoints store
// them (embedding and head first, then layer by layer). BF16 except the
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
// shape (A_log: any shape of at least num_heads values, as the layouts
// differ) and a floating-point dtype (F32, BF16 or F16; conversion happens
// at load time). Tensors the spec does not know (vision towers, ...) are
// ignored. The error names the tensor and the checkpoint directory, and
// lists the first few problems when there are several.
absl::Status ValidateCheckpoint(const ModelConfig& config, const Checkpoint& checkpoint);

}  // namespace deltaserve
