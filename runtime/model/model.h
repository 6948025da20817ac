// A loaded model of either architecture, or the part of it one rank holds
// (a pipeline stage, a tensor-parallel slice), and its forward pass over a
// batch of sequences (each with its own state and any number of new tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/data_communicator.h"
#include "runtime/model/config.h"
#include "runtime/model/layers.h"
#include "runtime/model/sequence_state.h"
#include "runtime/model/shard.h"
#include "runtime/model/state_pool.h"
#include "runtime/model/weights.h"

namespace deltaserve {

class ModelArchitecture;  // runtime/model/arch/architecture.h

// How a loaded model runs, beyond what its files say.
struct ModelOptions {
  // The MLA latent cache's dtype: kF32 or kBF16 (half the bytes per token;
  // docs/numerics.md measures its effect).
  kernels::DType kv_cache_dtype = kernels::DType::kF32;
  // The GEMMs' precision on bf16 weights: kF32 (exact widening, the default)
  // or kBF16 (activations rounded to bf16 for oneDNN's bf16 matmul on prefill
  // chunks; docs/numerics.md bounds its error).
  kernels::DType compute_dtype = kernels::DType::kF32;
  // Tokens the rank's MLA cache pool holds over all its sequences, in pages
  // of kCachePageTokens; 0: DefaultCacheTokens. Address space is reserved
  // for all of them; memory is committed as pages are written.
  int64_t cache_tokens = 0;
  // Sequences whose KDA state the rank holds at once (running ones and held
  // prefixes), one fixed slot each; 0: kDefaultStateSlots. Address space is
  // reserved for all; memory is committed as slots are taken.
  int64_t state_slots = 0;
  // Where the weights, activations and sequence state live (PlaceWeights):
  // the CPU, or the CUDA device of the active backend (kernels/cuda/ops.h)
  // that SelectCudaDevice chose.
  kernels::Device device = kernels::Device::kCpu;
  // What a pipeline stage sends the next (the running prefix and K3's bank
  // of block summaries): kF32, or kBF16 (half the bytes; docs/numerics.md
  // measures its effect). Every rank of a replica must have the same.
  kernels::DType boundary_dtype = kernels::DType::kF32;
  // On the CPU, the weight matrices on transparent huge pages (PlaceWeights):
  // a copy at load, after which decode reads them at the memory's rate rather
  // than the address translations'. Off, they stay views of the mapped
  // checkpoint where the loader could map them.
  bool huge_pages = true;
};

// The pool's default size: 64 sequences of the model's whole context, at
// most 1 TiB of address space for all of the model's MLA layers (so the same
// on every rank of a replica, whatever its stage).
int64_t DefaultCacheTokens(const ModelConfig& config, kernels::DType cache_dtype);

struct ForwardInput {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;  // new tokens, appended after state->length
  bool all_logits = false;          // logits of every new token, else the last one
};

// A validated batch: rows per sequence, the concatenated tokens, and which
// rows need logits.
struct PreparedBatch {
  BatchRows rows;
  std::vector<int32_t> tokens;
  std::vector<int64_t> output_rows;
};

class Model {
 public:
  // Reads DIR/config.json and the checkpoint, validates every tensor against
  // the config, and converts the tensors `shard` owns to float32. `tp` is the
  // TP data communicator of the shard's stage (rank_communicators.h; null or
  // size 1 for none); it must outlive the model.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     const ModelShard& shard = {},
                                                     DataCommunicator* tp = nullptr,
                                                     const ModelOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const ModelShard& shard() const { return shard_; }
  kernels::Device device() const { return options_.device; }
  const ModelOptions& options() const { return options_; }
  int64_t bytes_read() const { return bytes_read_; }  // from the checkpoint
  WeightBytes weight_bytes() const { return CountWeightBytes(weights_); }
  // A new sequence, its state zero; ResourceExhausted when the pool holds as
  // many sequences as it has slots.
  absl::StatusOr<std::unique_ptr<SequenceState>> NewSequence() const;
  // The rank's state: its MLA cache pages and KDA slots, shared by its sequences.
  const StatePool& state_pool() const { return *state_pool_; }

  // The whole model at once (one stage holding every layer): runs all inputs
  // as one batch and advances each state by its tokens. Returns logits
  // [rows, vocab]: per input in order, one row per new token when
  // all_logits, else one row for its last token. Token ids out of range, an
  // empty input, a context past max_position_embeddings or one state twice
  // are errors naming the input, position and value, and a batch whose MLA
  // cache pages the pool cannot hold is ResourceExhausted; no state changes
  // then.
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardInput> inputs) const;

  // The pieces Forward is made of, for pipeline stages.
  absl::StatusOr<PreparedBatch> Prepare(std::span<const ForwardInput> inputs) const;
  Activations Embed(const std::vector<int32_t>& tokens) const;  // first stage only
  // Runs the shard's layers over `act` and advances the batch's states.
  absl::Status RunLayers(const BatchRows& batch, Activations* act) const;
  // Final mix, norm and LM head for the given rows; last stage only.
  std::vector<float> Logits(const Activations& act, const std::vector<int64_t>& rows) const;
  // Bank entries K3 carries into layer `layer` (0 for Kimi Linear).
  int64_t BankSizeBefore(int64_t layer) const;

 private:
  Model(ModelConfig config, ModelShard shard, ModelWeights weights, DataCommunicator* tp,
        int64_t bytes_read, ModelOptions options, std::shared_ptr<StatePool> state_pool);

  const ModelArchitecture* arch_;  // what differs between K3 and Kimi Linear
  ModelConfig config_;
  ModelConfig local_;  // head counts of this TP rank
  ModelShard shard_;
  ModelWeights weights_;
  DataCommunicator* tp_;
  int64_t bytes_read_;
  ModelOptions options_;
  std::shared_ptr<StatePool> state_pool_;
};

}  // namespace deltaserve
