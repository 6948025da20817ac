// References for tests that run a model: the plain one-shot forward pass
// (which every other way of running must match) and the plainest generation
// loop. Nothing here goes through the engine.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/sampling.h"
#include "runtime/model/model.h"
#include "runtime/model/presets.h"
#include "runtime/model/safetensors.h"
#include "tests/test_util.h"

namespace deltaserve::testing {

// Logits [T, vocab] of `tokens` in one Model::Forward call.
inline std::vector<float> OneShotLogits(const Model& model, const std::vector<int32_t>& tokens) {
  auto state = model.NewSequence().value();
  const ForwardInput input{state.get(), tokens, /*all_logits=*/true};
  auto logits = model.Forward(std::span(&input, 1));
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>{};
}

// Logits [T, vocab] of `tokens` fed to one sequence in pieces of the given
// sizes (which must add up to T), one Model::Forward call each.
inline std::vector<float> PiecewiseLogits(const Model& model, const std::vector<int32_t>& tokens,
                                          const std::vector<size_t>& pieces) {
  auto state = model.NewSequence().value();
  std::vector<float> logits;
  size_t begin = 0;
  for (size_t piece : pieces) {
    const ForwardInput input{state.get(), std::span(tokens).subspan(begin, piece), true};
    auto part = model.Forward(std::span(&input, 1));
    EXPECT_TRUE(part.ok()) << part.status();
    if (!part.ok()) return {};
    logits.insert(logits.end(), part->begin(), part->end());
    begin += piece;
  }
  EXPECT_EQ(begin, tokens.size());
  return logits;
}

// The tokens `prompt` generates, by the plainest loop: Model::Forward and
// kernels::Sample with the generator of each position (no end tokens).
inline std::vector<int32_t> ReferenceGenerate(const Model& model,
                                              const std::vector<int32_t>& prompt, int64_t n,
                                              const kernels::SamplingParams& sampling = {},
                                              uint64_t seed = 0) {
  auto state = model.NewSequence().value();
  std::vector<int32_t> out;
  std::vector<int32_t> next = prompt;
  while (static_cast<int64_t>(out.size()) < n) {
    const ForwardInput input{state.get(), next, false};
    auto logits = model.Forward(std::span(&input, 1));
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) break;
    kernels::Rng rng =
        kernels::Rng::ForPosition(seed, static_cast<int64_t>(prompt.size() + out.size()));
    out.push_back(kernels::Sample(
        kernels::Tensor::F32(logits->data(), 1, model.config().vocab_size), sampling, rng));
    next = {out.back()};
  }
  return out;
}

// A copy of the golden model `name` whose final norm weight is NaN, so that
// every logit is: what a corrupt checkpoint gives.
inline std::string NanModel(const std::string& name) {
  const std::string from = GoldenPath("model/" + name);
  const std::string dir = TempDir("nan_model");
  std::filesystem::copy_file(from + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto checkpoint = Checkpoint::Open(from);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  if (!checkpoint.ok()) return dir;
  std::vector<TensorData> tensors;
  for (const auto& [tensor, view] : (*checkpoint)->tensors()) {
    TensorData t{tensor, view->dtype, view->shape,
                 std::vector<uint8_t>(view->data, view->data + view->nbytes)};
    if (absl::EndsWith(tensor, "model.norm.weight")) {
      EXPECT_EQ(t.dtype, DType::kBF16);
      for (size_t i = 0; i + 1 < t.bytes.size(); i += 2) {
        t.bytes[i] = 0xC0;  // bf16 quiet NaN 0x7FC0, little-endian
        t.bytes[i + 1] = 0x7F;
      }
    }
    tensors.push_back(std::move(t));
  }
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  return dir;
}

// K3 at its smallest (the K3 gate, attention residuals, latent MoE) with
// `kinds` as its layers and `vocab` tokens: dims small enough that hundreds
// of thousands of tokens go through in seconds (the long-context and
// million-token score tests).
inline ModelConfig SmallestK3(std::vector<LayerKind> kinds, int64_t vocab) {
  ModelConfig c = *PresetConfig("k3-tiny");
  c.hidden_size = 16;
  c.num_layers = static_cast<int64_t>(kinds.size());
  c.vocab_size = vocab;
  c.layer_kinds = std::move(kinds);
  c.kda.num_heads = 2;
  c.kda.head_dim = 8;
  c.num_attention_heads = 1;
  c.q_lora_rank = 8;
  c.kv_lora_rank = 8;
  c.qk_nope_head_dim = 4;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 4;
  c.intermediate_size = 32;
  c.num_experts = 4;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 1;
  c.moe_intermediate_size = 8;
  c.routed_expert_hidden_size = 8;
  c.attn_res_block_size = 2;
  return c;
}

}  // namespace deltaserve::testing
