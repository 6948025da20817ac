#include "runtime/model/model.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/attn_res.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/layers.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_spec.h"

namespace deltaserve {
namespace {

using Floats = std::vector<float>;

void Mixer(const ModelConfig& config, const LayerWeights& layer, int64_t i,
           const BatchRows& batch, const float* x, float* out) {
  if (layer.kind == LayerKind::kKda) {
    KdaForward(config, layer.kda, i, batch, x, out);
  } else {
    MlaForward(config, layer.mla, i, batch, x, out);
  }
}

// The attention-residual mix over bank + [prefix], [rows, D].
Floats Mix(const std::vector<Floats>& bank, const Floats& prefix,
           const ResMixWeights& w, int64_t rows, int64_t dim, float eps) {
  std::vector<const float*> candidates;
  for (const Floats& b : bank) candidates.push_back(b.data());
  candidates.push_back(prefix.data());
  Floats out(rows * dim);
  kernels::AttnResMix(candidates.data(), static_cast<int64_t>(candidates.size()),
                      rows, dim, w.norm.data(), w.proj.data(), eps, out.data());
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir) {
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  DELTASERVE_ASSIGN_OR_RETURN(auto checkpoint, Checkpoint::Open(dir));
  DELTASERVE_RETURN_IF_ERROR(ValidateCheckpoint(config, *checkpoint));
  DELTASERVE_ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(config, *checkpoint));
  return std::unique_ptr<Model>(new Model(std::move(config), std::move(weights)));
}

std::unique_ptr<SequenceState> Model::NewSequence() const {
  return std::make_unique<SequenceState>(config_);
}

std::vector<float> Model::Stack(const BatchRows& batch, Floats hidden) const {
  const int64_t rows = batch.rows(), D = config_.hidden_size;
  const float eps = config_.rms_norm_eps;
  Floats normed(rows * D), delta(rows * D);
  auto add = [](Floats& acc, const Floats& x) {
    for (size_t i = 0; i < acc.size(); ++i) acc[i] += x[i];
  };

  if (!config_.IsK3()) {
    // Plain pre-norm residual stream.
    for (int64_t i = 0; i < config_.num_layers; ++i) {
      const LayerWeights& layer = weights_.layers[i];
      kernels::RmsNorm(hidden.data(), layer.input_norm.data(), rows, D, eps, normed.data());
      Mixer(config_, layer, i, batch, normed.data(), delta.data());
      add(hidden, delta);
      kernels::RmsNorm(hidden.data(), layer.post_attention_norm.data(), rows, D, eps,
                       normed.data());
      FfnForward(config_, layer.ffn, rows, normed.data(), delta.data());
      add(hidden, delta);
    }
    return hidden;
  }

  // K3 Block Attention Residuals: `prefix` is the partial sum of the current
  // block, `bank` the completed block sums (the embedding first).
  std::vector<Floats> bank;
  Floats& prefix = hidden;
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const LayerWeights& layer = weights_.layers[i];
    Floats mixed = Mix(bank, prefix, layer.attn_res, rows, D, eps);
    kernels::RmsNorm(mixed.data(), layer.input_norm.data(), rows, D, eps, normed.data());
    Mixer(config_, layer, i, batch, normed.data(), delta.data());
    if (i % config_.attn_res_block_size == 0) {
      bank.push_back(prefix);  // bank the finished block before restarting the sum
      prefix = delta;
    } else {
      add(prefix, delta);
    }
    mixed = Mix(bank, prefix, layer.mlp_res, rows, D, eps);
    kernels::RmsNorm(mixed.data(), layer.post_attention_norm.data(), rows, D, eps,
                     normed.data());
    FfnForward(config_, layer.ffn, rows, normed.data(), delta.data());
    add(prefix, delta);
  }
  return Mix(bank, prefix, weights_.output_res, rows, D, eps);
}

absl::StatusOr<std::vector<float>> Model::Forward(
    std::span<const ForwardInput> inputs) const {
  const int64_t D = config_.hidden_size, V = config_.vocab_size;
  BatchRows batch;
  batch.offsets.push_back(0);
  std::vector<int32_t> tokens;
  std::vector<int64_t> output_rows;
  for (size_t b = 0; b < inputs.size(); ++b) {
    const ForwardInput& in = inputs[b];
    if (in.state == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("input ", b, ": no sequence state"));
    }
    for (size_t other = 0; other < b; ++other) {
      if (inputs[other].state == in.state) {
        return absl::InvalidArgumentError(absl::StrCat(
            "inputs ", other, " and ", b, " share one sequence state"));
      }
    }
    if (in.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("input ", b, ": no tokens"));
    }
    for (size_t p = 0; p < in.tokens.size(); ++p) {
      if (in.tokens[p] < 0 || in.tokens[p] >= V) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input ", b, ": token id ", in.tokens[p], " at position ",
            in.state->length + static_cast<int64_t>(p),
            " is out of range for the vocabulary of ", V, " tokens"));
      }
    }
    const int64_t context = in.state->length + static_cast<int64_t>(in.tokens.size());
    if (config_.max_position_embeddings > 0 && context > config_.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", b, ": context of ", context,
          " tokens exceeds the model's max_position_embeddings of ",
          config_.max_position_embeddings));
    }
    const int64_t begin = batch.offsets.back();
    tokens.insert(tokens.end(), in.tokens.begin(), in.tokens.end());
    batch.offsets.push_back(begin + static_cast<int64_t>(in.tokens.size()));
    batch.states.push_back(in.state);
    if (in.all_logits) {
      for (int64_t r = begin; r < batch.offsets.back(); ++r) output_rows.push_back(r);
    } else {
      output_rows.push_back(batch.offsets.back() - 1);
    }
  }
  const int64_t rows = batch.rows();
  Floats hidden(rows * D);
  kernels::Embedding(weights_.embed.data(), V, D, tokens.data(), rows, hidden.data());
  hidden = Stack(batch, std::move(hidden));
  for (size_t b = 0; b < inputs.size(); ++b) {
    inputs[b].state->length += batch.Count(static_cast<int64_t>(b));
  }

  const int64_t out_rows = static_cast<int64_t>(output_rows.size());
  Floats selected(out_rows * D);
  for (int64_t i = 0; i < out_rows; ++i) {
    std::copy_n(hidden.data() + output_rows[i] * D, D, selected.data() + i * D);
  }
  kernels::RmsNorm(selected.data(), weights_.norm.data(), out_rows, D,
                   config_.rms_norm_eps, selected.data());
  Floats logits(out_rows * V);
  kernels::Linear(selected.data(), weights_.lm_head.data(), out_rows, V, D, logits.data());
  return logits;
}

}  // namespace deltaserve
