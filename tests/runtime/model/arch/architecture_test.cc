// What each architecture says about itself, and its residual stack run over
// stand-in sub-layers: the bank K3 builds is the one BankSizeBefore (and so
// the pipeline's stage boundary) expects.
#include "runtime/model/arch/architecture.h"

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/model/presets.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

// The tiny presets always exist.
ModelConfig Preset(const std::string& name) { return PresetConfig(name).value(); }

TEST(ArchitectureTest, NamesAndLayouts) {
  const ModelArchitecture& k3 = ArchitectureOf(Preset("k3-tiny"));
  const ModelArchitecture& linear = ArchitectureOf(Preset("kimi-linear-tiny"));
  EXPECT_EQ(k3.model_type(), "kimi_k3");
  EXPECT_EQ(linear.model_type(), "kimi_linear");
  EXPECT_EQ(k3.ModelPrefix(), "language_model.model.");
  EXPECT_EQ(linear.LmHeadName(), "lm_head.weight");
  EXPECT_EQ(k3.ALogShape(96), (std::vector<int64_t>{128}));
  EXPECT_EQ(k3.ALogShape(129), (std::vector<int64_t>{256}));
  EXPECT_EQ(linear.ALogShape(32), (std::vector<int64_t>{1, 1, 32, 1}));
}

TEST(ArchitectureTest, BankSizes) {
  const ModelConfig config = Preset("k3-tiny");  // blocks of 4
  const ModelArchitecture& k3 = ArchitectureOf(config);
  const std::vector<int64_t> expected = {0, 1, 1, 1, 1, 2, 2, 2, 2, 3};
  for (int64_t layer = 0; layer < static_cast<int64_t>(expected.size()); ++layer) {
    EXPECT_EQ(k3.BankSizeBefore(config, layer), expected[layer]) << layer;
  }
  const ModelConfig linear = Preset("kimi-linear-tiny");
  EXPECT_EQ(ArchitectureOf(linear).BankSizeBefore(linear, 7), 0);
}

// Residual mixes with a zero query average their candidates uniformly; the
// sub-layers write constants, so every value of the stack is known.
ModelWeights UniformMixWeights(const ModelConfig& c) {
  const std::vector<float> ones(c.hidden_size, 1.0f), zeros(c.hidden_size, 0.0f);
  auto mix = [&] {
    return ResMixWeights{VectorWeight::FromHost(ones), VectorWeight::FromHost(zeros)};
  };
  ModelWeights w;
  w.output_res = mix();
  w.layers.resize(c.num_layers);
  for (LayerWeights& layer : w.layers) {
    layer.attn_res = mix();
    layer.mlp_res = mix();
  }
  return w;
}

// A [rows, cols] buffer of `value`.
kernels::Buffer Filled(int64_t rows, int64_t cols, float value) {
  kernels::Buffer b(kernels::Device::kCpu, kernels::DType::kF32, rows, cols);
  std::fill_n(b.view().As<float>(), rows * cols, value);
  return b;
}

std::vector<float> Values(const kernels::Tensor& t) {
  return std::vector<float>(t.As<float>(), t.As<float>() + t.rows * t.cols);
}

Activations Start(const ModelConfig& c, int64_t rows, float value) {
  Activations act;
  act.rows = rows;
  act.prefix = Filled(rows, c.hidden_size, value);
  return act;
}

absl::Status Fill(float value, const kernels::MutableTensor& out) {
  std::fill_n(out.As<float>(), out.rows * out.cols, value);
  return absl::OkStatus();
}

TEST(ArchitectureTest, KimiLinearAddsEachSubLayer) {
  const ModelConfig c = Preset("kimi-linear-tiny");
  const int64_t rows = 3, n = rows * c.hidden_size;
  auto mixer = [&](int64_t, const kernels::Tensor&, const kernels::MutableTensor& out) {
    return Fill(1.0f, out);
  };
  auto ffn = [&](int64_t, const kernels::Tensor&, const kernels::MutableTensor& out) {
    return Fill(2.0f, out);
  };
  Activations act = Start(c, rows, 0.5f);
  const ModelArchitecture& arch = ArchitectureOf(c);
  ASSERT_TRUE(arch.RunResidualStack(c, ModelWeights{}, 2, 6, SubLayers{mixer, ffn}, &act).ok());
  EXPECT_TRUE(act.bank.empty());
  EXPECT_EQ(Values(act.prefix), std::vector<float>(n, 0.5f + 4 * 3.0f));
  EXPECT_EQ(Values(arch.FinalHidden(c, ModelWeights{}, act)), Values(act.prefix));
}

TEST(ArchitectureTest, K3BanksEachFinishedBlock) {
  const ModelConfig c = Preset("k3-tiny");  // 9 layers, blocks of 4
  const ModelWeights w = UniformMixWeights(c);
  const int64_t rows = 2, n = rows * c.hidden_size;
  auto mixer = [&](int64_t, const kernels::Tensor&, const kernels::MutableTensor& out) {
    return Fill(1.0f, out);
  };
  auto ffn = [&](int64_t, const kernels::Tensor&, const kernels::MutableTensor& out) {
    return Fill(2.0f, out);
  };
  const ModelArchitecture& arch = ArchitectureOf(c);
  for (int64_t begin : {0, 1, 4, 5}) {
    for (int64_t end = begin + 1; end <= c.num_layers; ++end) {
      Activations act = Start(c, rows, 0.5f);
      for (int64_t b = 0; b < arch.BankSizeBefore(c, begin); ++b) {
        act.bank.push_back(Filled(rows, c.hidden_size, 7.0f));
      }
      ASSERT_TRUE(arch.RunResidualStack(c, w, begin, end, SubLayers{mixer, ffn}, &act).ok());
      EXPECT_EQ(static_cast<int64_t>(act.bank.size()), arch.BankSizeBefore(c, end))
          << begin << ".." << end;
      // The prefix restarts at each block's first layer: one mixer and one
      // FFN output per layer since then.
      const int64_t block_start = (end - 1) / 4 * 4;
      const float since = 3.0f * static_cast<float>(end - std::max(begin, block_start));
      const float expected = begin > block_start ? 0.5f + since : since;
      EXPECT_EQ(Values(act.prefix), std::vector<float>(n, expected)) << begin << ".." << end;
    }
  }
}

}  // namespace
}  // namespace deltaserve
