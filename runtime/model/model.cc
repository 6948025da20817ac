#include "runtime/model/model.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/embedding.h"
#include "kernels/gather.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/workspace.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/arch/architecture.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_spec.h"

namespace deltaserve {

int64_t DefaultCacheTokens(const ModelConfig& config, kernels::DType cache_dtype) {
  constexpr int64_t kSequences = 64;
  constexpr int64_t kMaxReservedBytes = int64_t{1} << 40;
  const int64_t context =
      config.max_position_embeddings > 0 ? config.max_position_embeddings : int64_t{1} << 20;
  // The whole model's MLA layers, whatever the shard: every rank of a
  // replica then has the same number of pages, which the scheduler admits
  // against; a stage's share of the address space is at most this.
  int64_t mla_layers = 0;
  for (LayerKind kind : config.layer_kinds) mla_layers += kind == LayerKind::kMla ? 1 : 0;
  const int64_t token_bytes = std::max<int64_t>(1, mla_layers) * CacheRowBytes(config, cache_dtype);
  const int64_t most = std::max<int64_t>(kCachePageTokens, kMaxReservedBytes / token_bytes);
  const int64_t wanted = context <= INT64_MAX / kSequences ? context * kSequences : INT64_MAX;
  // At most 2^31 - 1 pages, the page ids' range.
  return std::min({wanted, most, int64_t{INT32_MAX} * kCachePageTokens});
}

Model::Model(ModelConfig config, ModelShard shard, ModelWeights weights, DataCommunicator* tp,
             int64_t bytes_read, ModelOptions options, std::shared_ptr<StatePool> state_pool)
    : arch_(&ArchitectureOf(config)),
      config_(std::move(config)),
      local_(LocalConfig(config_, shard)),
      shard_(shard),
      weights_(std::move(weights)),
      tp_(tp),
      bytes_read_(bytes_read),
      options_(options),
      state_pool_(std::move(state_pool)) {}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   const ModelShard& requested,
                                                   DataCommunicator* tp,
                                                   const ModelOptions& options) {
  for (const auto& [what, dtype] : {std::pair{"the MLA cache", options.kv_cache_dtype},
                                    std::pair{"the compute dtype", options.compute_dtype}}) {
    if (dtype != kernels::DType::kF32 && dtype != kernels::DType::kBF16) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " can be f32 or bf16, not ", kernels::DTypeName(dtype)));
    }
  }
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  DELTASERVE_ASSIGN_OR_RETURN(ModelShard shard, ResolveShard(config, requested));
  if (shard.tp_size > 1 && (tp == nullptr || tp->size() != shard.tp_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tensor-parallel shard of ", shard.tp_size,
                     " ranks needs a TP data communicator of that size"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(std::shared_ptr<const Checkpoint> checkpoint, Checkpoint::Open(dir));
  DELTASERVE_RETURN_IF_ERROR(ValidateCheckpoint(config, *checkpoint));
  int64_t bytes_read = 0;
  DELTASERVE_ASSIGN_OR_RETURN(ModelWeights weights,
                              LoadWeights(config, checkpoint, shard, &bytes_read));
  DELTASERVE_RETURN_IF_ERROR(PlaceWeights(&weights, options.device, options.huge_pages));
  // Weights that are all copies (on huge pages, on a GPU) read the mapping no
  // more: all of its pages leave the process and the page cache. On k3-small's
  // first four layers, releasing tensor by tensor left 41% of the file cached
  // (the folios a tensor shares with its neighbours), and paging out the whole
  // mapping 27% (pages read ahead but never mapped); the file's pages are
  // dropped too (Checkpoint::ReleasePages).
  if (CountWeightBytes(weights).mapped == 0) checkpoint->ReleasePages();
  checkpoint.reset();
  if (options.compute_dtype == kernels::DType::kBF16) {
    ForEachMatrix(&weights, [](Weight& w) {
      if (w.tensor().dtype == kernels::DType::kBF16) w.set_compute(kernels::DType::kBF16);
    });
  }
  if (options.cache_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the MLA cache of ", options.cache_tokens, " tokens: it must be >= 0"));
  }
  if (options.state_slots < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.state_slots, " KDA state slots: there must be >= 0"));
  }
  StatePoolSize size;
  size.slots = options.state_slots > 0 ? options.state_slots : kDefaultStateSlots;
  int64_t cache_tokens = options.cache_tokens;
  if (cache_tokens == 0) {
    cache_tokens = DefaultCacheTokens(config, options.kv_cache_dtype);
    if (options.device != kernels::Device::kCpu) {
      DELTASERVE_ASSIGN_OR_RETURN(
          const int64_t fits, DeviceCacheTokens(LocalConfig(config, shard), shard, options.device,
                                                options.kv_cache_dtype, size.slots));
      cache_tokens = std::min(cache_tokens, fits);
    }
  }
  size.pages = CachePagesFor(cache_tokens);
  DELTASERVE_ASSIGN_OR_RETURN(std::shared_ptr<StatePool> pool,
                              StatePool::Create(LocalConfig(config, shard), shard, options.device,
                                                options.kv_cache_dtype, size));
  return std::unique_ptr<Model>(new Model(std::move(config), shard, std::move(weights), tp,
                                          bytes_read, options, std::move(pool)));
}

absl::StatusOr<std::unique_ptr<SequenceState>> Model::NewSequence() const {
  return SequenceState::Create(state_pool_);
}

int64_t Model::BankSizeBefore(int64_t layer) const { return arch_->BankSizeBefore(config_, layer); }

absl::StatusOr<PreparedBatch> Model::Prepare(std::span<const ForwardInput> inputs) const {
  const int64_t V = config_.vocab_size;
  PreparedBatch prepared;
  BatchRows& batch = prepared.rows;
  int64_t pages = 0;  // MLA cache pages the batch takes
  batch.offsets.push_back(0);
  for (size_t b = 0; b < inputs.size(); ++b) {
    const ForwardInput& in = inputs[b];
    if (in.state == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("input ", b, ": no sequence state"));
    }
    for (size_t other = 0; other < b; ++other) {
      if (inputs[other].state == in.state) {
        return absl::InvalidArgumentError(
            absl::StrCat("inputs ", other, " and ", b, " share one sequence state"));
      }
    }
    if (in.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("input ", b, ": no tokens"));
    }
    for (size_t p = 0; p < in.tokens.size(); ++p) {
      if (in.tokens[p] < 0 || in.tokens[p] >= V) {
        return absl::InvalidArgumentError(
            absl::StrCat("input ", b, ": token id ", in.tokens[p], " at position ",
                         in.state->length + static_cast<int64_t>(p),
                         " is out of range for the vocabulary of ", V, " tokens"));
      }
    }
    const int64_t context = in.state->length + static_cast<int64_t>(in.tokens.size());
    if (config_.max_position_embeddings > 0 && context > config_.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", b, ": context of ", context,
                       " tokens exceeds the model's max_position_embeddings of ",
                       config_.max_position_embeddings));
    }
    pages += in.state->PagesNeeded(context);
    const int64_t begin = batch.offsets.back();
    prepared.tokens.insert(prepared.tokens.end(), in.tokens.begin(), in.tokens.end());
    batch.offsets.push_back(begin + static_cast<int64_t>(in.tokens.size()));
    batch.states.push_back(in.state);
    if (in.all_logits) {
      for (int64_t r = begin; r < batch.offsets.back(); ++r) prepared.output_rows.push_back(r);
    } else {
      prepared.output_rows.push_back(batch.offsets.back() - 1);
    }
  }
  const int64_t free_pages = state_pool_->capacity_pages() - state_pool_->used_pages();
  if (pages > free_pages) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the batch needs ", pages, " more MLA cache pages of ", kCachePageTokens,
                     " tokens, and ", free_pages, " of ", state_pool_->capacity_pages(),
                     " are free (--kv-cache-tokens sets the cache's size)"));
  }
  return prepared;
}

namespace {

// Host ids as an i32 [1, n] view on `device`: the ids themselves on the CPU,
// else a copy in *holder.
kernels::Tensor IdsOn(kernels::Device device, std::span<const int32_t> ids, kernels::Temp* holder) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const kernels::Tensor host = kernels::Tensor::I32(ids.data(), 1, n);
  if (device == kernels::Device::kCpu) return host;
  *holder = kernels::Temp(device, kernels::DType::kI32, 1, n);
  kernels::Workspace::Of(device).CopyFromHost(holder->view().data, ids.data(),
                                              ids.size() * sizeof(int32_t));
  return *holder;
}

}  // namespace

Activations Model::Embed(const std::vector<int32_t>& tokens) const {
  Activations act;
  act.rows = static_cast<int64_t>(tokens.size());
  act.prefix =
      kernels::Buffer(options_.device, kernels::DType::kF32, act.rows, config_.hidden_size);
  kernels::Temp ids;
  kernels::Embedding(weights_.embed, IdsOn(options_.device, tokens, &ids), act.prefix);
  return act;
}

absl::Status Model::RunLayers(const BatchRows& batch, Activations* act) const {
  const int64_t rows = act->rows, D = config_.hidden_size;
  const float eps = config_.rms_norm_eps;
  // Pages for the new tokens, before any layer writes them (Prepare checked
  // that the pool has them).
  for (int64_t b = 0; b < batch.sequences(); ++b) {
    SequenceState& state = *batch.states[b];
    DELTASERVE_RETURN_IF_ERROR(state.ReservePages(state.length + batch.Count(b)));
  }
  const kernels::Temp normed(act->prefix.device(), kernels::DType::kF32, rows, D);
  // The sub-layers with their pre-norms; the architecture decides what they
  // read and how their outputs join the residual.
  auto mixer = [&](int64_t i, const kernels::Tensor& h, const kernels::MutableTensor& out) {
    const LayerWeights& layer = weights_.layers[i];
    kernels::RmsNorm(h, layer.input_norm.view(), eps, normed);
    return layer.kind == LayerKind::kKda
               ? KdaForward(local_, layer.kda, i, batch, normed, out, tp_)
               : MlaForward(local_, layer.mla, i, batch, normed, out, tp_);
  };
  auto ffn = [&](int64_t i, const kernels::Tensor& h, const kernels::MutableTensor& out) {
    const LayerWeights& layer = weights_.layers[i];
    kernels::RmsNorm(h, layer.post_attention_norm.view(), eps, normed);
    return FfnForward(local_, layer.ffn, normed, out, tp_);
  };
  DELTASERVE_RETURN_IF_ERROR(arch_->RunResidualStack(config_, weights_, shard_.layer_begin,
                                                     shard_.layer_end, SubLayers{mixer, ffn}, act));
  for (int64_t b = 0; b < batch.sequences(); ++b) batch.states[b]->length += batch.Count(b);
  return absl::OkStatus();
}

std::vector<float> Model::Logits(const Activations& act, const std::vector<int64_t>& rows) const {
  const int64_t D = config_.hidden_size, V = config_.vocab_size;
  const kernels::Buffer hidden = arch_->FinalHidden(config_, weights_, act);
  const int64_t n = static_cast<int64_t>(rows.size());
  const kernels::Device device = hidden.device();
  const std::vector<int32_t> ids(rows.begin(), rows.end());
  kernels::Temp device_ids;
  const kernels::Temp selected(device, kernels::DType::kF32, n, D);
  kernels::GatherRows(hidden, IdsOn(device, ids, &device_ids), selected);
  kernels::RmsNorm(selected, weights_.norm.view(), config_.rms_norm_eps, selected);
  // The rows that leave the device: [n, V] in host memory.
  std::vector<float> logits(n * V);
  const kernels::MutableTensor host = kernels::MutableTensor::F32(logits.data(), n, V);
  if (device == kernels::Device::kCpu) {
    kernels::Linear(selected, weights_.lm_head, host);
    return logits;
  }
  const kernels::Temp on_device(device, kernels::DType::kF32, n, V);
  kernels::Linear(selected, weights_.lm_head, on_device);
  kernels::Workspace::Of(device).CopyToHost(logits.data(), on_device.view().data,
                                            logits.size() * sizeof(float));
  return logits;
}

absl::StatusOr<std::vector<float>> Model::Forward(std::span<const ForwardInput> inputs) const {
  if (!shard_.HasEmbedding() || !HasHead(config_, shard_)) {
    return absl::FailedPreconditionError(
        "Forward needs the whole model; a pipeline stage runs RunLayers");
  }
  DELTASERVE_ASSIGN_OR_RETURN(PreparedBatch batch, Prepare(inputs));
  Activations act = Embed(batch.tokens);
  DELTASERVE_RETURN_IF_ERROR(RunLayers(batch.rows, &act));
  return Logits(act, batch.output_rows);
}

}  // namespace deltaserve
