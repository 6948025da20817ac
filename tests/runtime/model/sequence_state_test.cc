// Sequence state in a pool (runtime/model/state_pool.h, sequence_state.h):
// pages and KDA slots come from a bounded pool and go back to it, a fork
// shares its parent's full pages and copies only the partly filled last one
// and its KDA slot, and a batch or a sequence the pool cannot hold is
// refused before anything changes.
#include "runtime/model/sequence_state.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/ops.h"
#include "runtime/model/model.h"
#include "runtime/model/presets.h"
#include "runtime/model/random_checkpoint.h"
#include "runtime/model/state_pool.h"
#include "tests/model_runs.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

std::unique_ptr<Model> TinyModel(int64_t cache_tokens, kernels::DType dtype = kernels::DType::kF32,
                                 int64_t state_slots = 0) {
  static const std::string dir = [] {
    const std::string d = testing::TempDir("sequence_state_model");
    EXPECT_TRUE(WriteRandomCheckpoint(*PresetConfig("k3-tiny"), d, 3).ok());
    return d;
  }();
  ModelOptions options;
  options.cache_tokens = cache_tokens;
  options.kv_cache_dtype = dtype;
  options.state_slots = state_slots;
  auto model = Model::Load(dir, {}, nullptr, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

absl::StatusOr<std::vector<float>> Feed(const Model& model, SequenceState* state,
                                        const std::vector<int32_t>& tokens) {
  const ForwardInput input{state, tokens, /*all_logits=*/true};
  return model.Forward(std::span(&input, 1));
}

TEST(StatePoolTest, AllocatesAllOrNoneAndReusesFreedPages) {
  const ModelConfig config = *PresetConfig("k3-tiny");
  auto pool = StatePool::Create(config, {}, kernels::Device::kCpu, kernels::DType::kF32, {4, 2});
  ASSERT_TRUE(pool.ok()) << pool.status();
  StatePool& p = **pool;
  // k3-tiny: 3 MLA layers of C + R = 20 f32 values per token.
  EXPECT_EQ(p.page_bytes(), 3 * kCachePageTokens * 20 * 4);
  std::vector<int32_t> pages;
  ASSERT_TRUE(p.Allocate(3, &pages).ok());
  EXPECT_EQ(p.used_pages(), 3);
  const absl::Status full = p.Allocate(2, &pages);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("needs 2 more pages of 64 tokens, and 1 of its 4 are free"),
            std::string::npos)
      << full;
  EXPECT_EQ(pages.size(), 3u);  // none taken
  p.Retain(pages[1]);
  p.Release(pages[1]);
  EXPECT_EQ(p.Holders(pages[1]), 1);
  p.Release(pages[1]);
  EXPECT_EQ(p.used_pages(), 2);
  std::vector<int32_t> again;
  ASSERT_TRUE(p.Allocate(2, &again).ok());
  EXPECT_EQ(again[0], pages[1]);  // the freed page first
  EXPECT_EQ(p.used_pages(), 4);
}

std::vector<float> Values(const kernels::MutableTensor& t) {
  return std::vector<float>(t.As<float>(), t.As<float>() + t.rows * t.cols);
}

// A slot holds every KDA layer's state and conv tail of the rank, starts as
// zeros (also when it was used before), and there are as many as asked for.
TEST(StatePoolTest, KdaSlotsAreFixedStartAsZerosAndAreReused) {
  const ModelConfig config = *PresetConfig("k3-tiny");
  auto pool = StatePool::Create(config, {}, kernels::Device::kCpu, kernels::DType::kF32, {4, 3});
  ASSERT_TRUE(pool.ok()) << pool.status();
  StatePool& p = **pool;
  // k3-tiny: 6 KDA layers of 4 heads of 8: a [3, 96] tail and a [4, 64] state each.
  EXPECT_EQ(p.slot_bytes(), 6 * (3 * 96 + 4 * 64) * 4);
  EXPECT_EQ(p.slot_bytes(), KdaSlotBytes(config, {}));
  std::vector<int32_t> slots;
  for (int i = 0; i < 3; ++i) {
    auto slot = p.AcquireSlot();
    ASSERT_TRUE(slot.ok()) << slot.status();
    slots.push_back(*slot);
  }
  EXPECT_EQ(p.used_slots(), 3);
  const absl::StatusOr<int32_t> full = p.AcquireSlot();
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("all 3 KDA state slots are held"), std::string::npos)
      << full.status();
  int64_t kda_layer = -1, mla_layer = -1;
  for (int64_t i = 0; i < config.num_layers; ++i) {
    (config.layer_kinds[i] == LayerKind::kKda ? kda_layer : mla_layer) = i;
  }
  EXPECT_TRUE(p.KdaState(slots[0], mla_layer).empty());
  const kernels::MutableTensor state = p.KdaState(slots[1], kda_layer);
  const kernels::MutableTensor conv = p.KdaConv(slots[1], kda_layer);
  ASSERT_EQ(state.rows, 4);
  ASSERT_EQ(state.cols, 64);
  ASSERT_EQ(conv.rows, 3);
  ASSERT_EQ(conv.cols, 96);
  EXPECT_EQ(Values(state), std::vector<float>(4 * 64, 0.0f));
  std::fill_n(state.As<float>(), 4 * 64, 1.5f);
  std::fill_n(conv.As<float>(), 3 * 96, -2.0f);
  // Slots do not overlap: the neighbours are untouched.
  EXPECT_EQ(Values(p.KdaState(slots[0], kda_layer)), std::vector<float>(4 * 64, 0.0f));
  EXPECT_EQ(Values(p.KdaConv(slots[2], kda_layer)), std::vector<float>(3 * 96, 0.0f));
  p.ReleaseSlot(slots[1]);
  EXPECT_EQ(p.used_slots(), 2);
  auto again = p.AcquireSlot();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, slots[1]);  // the freed slot, as zeros
  EXPECT_EQ(Values(p.KdaState(*again, kda_layer)), std::vector<float>(4 * 64, 0.0f));
  EXPECT_EQ(Values(p.KdaConv(*again, kda_layer)), std::vector<float>(3 * 96, 0.0f));

  const absl::StatusOr<std::shared_ptr<StatePool>> one =
      StatePool::Create(config, {}, kernels::Device::kCpu, kernels::DType::kF32, {4, 1});
  EXPECT_EQ(one.status().code(), absl::StatusCode::kInvalidArgument);
}

// A fork continues from the parent's exact state: both go on with the same
// tokens and give the bits of one sequence fed the same pieces, and the fork
// holds the parent's full pages and a copy of the last one.
TEST(SequenceStateTest, ForkSharesFullPagesAndCopiesTheLastOne) {
  for (kernels::DType dtype : {kernels::DType::kF32, kernels::DType::kBF16}) {
    SCOPED_TRACE(kernels::DTypeName(dtype));
    auto model = TinyModel(0, dtype);
    ASSERT_NE(model, nullptr);
    const int64_t vocab = model->config().vocab_size;
    const std::vector<int32_t> tokens = testing::RandomTokens(200, 4, vocab);
    const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 150);
    const std::vector<int32_t> tail(tokens.begin() + 150, tokens.end());
    const std::vector<float> pieces = testing::PiecewiseLogits(*model, tokens, {150, 50});

    auto parent = model->NewSequence().value();
    ASSERT_TRUE(Feed(*model, parent.get(), head).ok());
    ASSERT_EQ(parent->pages().size(), 3u);  // 150 tokens: two full pages and 22 tokens
    const StatePool& pool = model->state_pool();
    EXPECT_EQ(pool.used_pages(), 3);
    auto fork = parent->Fork();
    ASSERT_TRUE(fork.ok()) << fork.status();
    SequenceState& child = **fork;
    EXPECT_EQ(child.length, 150);
    ASSERT_EQ(child.pages().size(), 3u);
    EXPECT_EQ(child.pages()[0], parent->pages()[0]);
    EXPECT_EQ(child.pages()[1], parent->pages()[1]);
    EXPECT_NE(child.pages()[2], parent->pages()[2]);
    EXPECT_EQ(pool.Holders(parent->pages()[0]), 2);
    EXPECT_EQ(pool.used_pages(), 4);
    EXPECT_EQ(parent->ForkCopyBytes(), parent->KdaBytes() + pool.page_bytes() / 64 * 22);
    // Its own KDA slot, holding the parent's state.
    EXPECT_NE(child.slot(), parent->slot());
    EXPECT_EQ(pool.used_slots(), 2);
    for (int64_t layer = 0; layer < model->config().num_layers; ++layer) {
      if (model->config().layer_kinds[layer] != LayerKind::kKda) continue;
      EXPECT_EQ(Values(child.KdaState(layer)), Values(parent->KdaState(layer))) << layer;
      EXPECT_EQ(Values(child.KdaConv(layer)), Values(parent->KdaConv(layer))) << layer;
    }

    // Both continue alike, as one sequence fed 150 tokens and then 50.
    const std::vector<float> want(pieces.begin() + 150 * vocab, pieces.end());
    for (SequenceState* s : {&child, parent.get()}) {
      auto logits = Feed(*model, s, tail);
      ASSERT_TRUE(logits.ok()) << logits.status();
      EXPECT_EQ(*logits, want);
    }
    // Their own pages now hold different tokens' continuations of the same
    // text; the shared ones were never written.
    EXPECT_EQ(pool.Holders(parent->pages()[1]), 2);
    EXPECT_EQ(pool.used_pages(), 6);  // 2 shared + (2 own) x 2
    parent.reset();
    EXPECT_EQ(pool.used_pages(), 4);
    EXPECT_EQ(pool.Holders(child.pages()[0]), 1);
    fork->reset();
    EXPECT_EQ(pool.used_pages(), 0);
    EXPECT_EQ(pool.used_slots(), 0);
  }
}

// A batch whose pages the pool lacks is refused whole, naming the need; the
// state is as it was, and it runs once another sequence gives pages back.
TEST(SequenceStateTest, ABatchThePoolCannotHoldIsRefusedBeforeItRuns) {
  auto model = TinyModel(4 * kCachePageTokens);
  ASSERT_NE(model, nullptr);
  const int64_t vocab = model->config().vocab_size;
  auto a = model->NewSequence().value();
  ASSERT_TRUE(Feed(*model, a.get(), testing::RandomTokens(130, 5, vocab)).ok());  // 3 pages
  auto b = model->NewSequence().value();
  const std::vector<int32_t> prompt = testing::RandomTokens(70, 6, vocab);  // 2 pages
  const auto refused = Feed(*model, b.get(), prompt);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("needs 2 more MLA cache pages of 64 tokens, and 1 of "
                                            "4 are free"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(b->length, 0);
  EXPECT_TRUE(b->pages().empty());
  EXPECT_EQ(model->state_pool().used_pages(), 3);
  a.reset();
  auto logits = Feed(*model, b.get(), prompt);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(*logits, testing::OneShotLogits(*model, prompt));
}

// A sequence, or a fork, beyond the pool's slots is refused, naming them;
// nothing changes, and a slot given back is taken again.
TEST(SequenceStateTest, ASequenceBeyondTheSlotsIsRefused) {
  auto model = TinyModel(0, kernels::DType::kF32, /*state_slots=*/2);
  ASSERT_NE(model, nullptr);
  auto a = model->NewSequence();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(
      Feed(*model, a->get(), testing::RandomTokens(100, 5, model->config().vocab_size)).ok());
  auto b = model->NewSequence();
  ASSERT_TRUE(b.ok()) << b.status();
  const auto no_room = model->NewSequence();
  EXPECT_EQ(no_room.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(no_room.status().message().find("all 2 KDA state slots are held (--kv-state-slots"),
            std::string::npos)
      << no_room.status();
  const StatePool& pool = model->state_pool();
  const int64_t pages = pool.used_pages();
  const auto no_fork = (*a)->Fork();
  EXPECT_EQ(no_fork.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.used_pages(), pages);
  EXPECT_EQ(pool.Holders((*a)->pages()[0]), 1);
  b->reset();
  auto fork = (*a)->Fork();
  ASSERT_TRUE(fork.ok()) << fork.status();
  EXPECT_EQ(pool.used_slots(), 2);
}

// The weights, activations and state go where ModelOptions::device says;
// a device models do not run on yet is refused by name, at load.
// A model on CUDA where no CUDA backend is active (no GPU, no harness) is
// refused at load, saying why; model_cuda_test runs it where one is.
TEST(SequenceStateTest, AModelOnCudaWithoutABackendIsRefusedAtLoad) {
  const std::string dir = testing::TempDir("sequence_state_device_model");
  ASSERT_TRUE(WriteRandomCheckpoint(*PresetConfig("k3-tiny"), dir, 3).ok());
  ModelOptions options;
  options.device = kernels::Device::kCuda;
  options.cache_tokens = 1024;
  auto model = Model::Load(dir, {}, nullptr, options);
  auto pool = StatePool::Create(*PresetConfig("k3-tiny"), {}, kernels::Device::kCuda,
                                kernels::DType::kF32, {4, 2});
  if (kernels::cuda::ActiveBackend() != kernels::cuda::Backend::kNone) {
    EXPECT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE(pool.ok()) << pool.status();
    return;
  }
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(model.status().message(), "weights on cuda: " + kernels::cuda::BackendProblem());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace deltaserve
