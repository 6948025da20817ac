// kernels/embedding.h against the float64 reference: a copy, so exact.
#include "kernels/embedding.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mxfp4.h"
#include "kernels/reference/embedding_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::AllClose;
using testing::DeviceTest;
using testing::RandomFloats;
using testing::ToDouble;

class EmbeddingTest : public DeviceTest {};

TEST_P(EmbeddingTest, CopiesRowsExactly) {
  uint64_t seed = 1;
  for (int64_t vocab : {1, 5, 256}) {
    for (int64_t dim : {1, 3, 64, 129}) {
      for (int64_t t : {1, 2, 17, 600}) {  // 600 x 129 crosses the OpenMP threshold
        SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " dim " << dim << " t " << t);
        const auto table = RandomFloats(vocab * dim, ++seed);
        std::vector<int32_t> tokens(t);
        for (int64_t i = 0; i < t; ++i) {
          // First and last ids, repeats, and a stride through the rest.
          tokens[i] = static_cast<int32_t>(i == 0 ? vocab - 1 : (i * 7) % vocab);
        }
        auto out = Output<float>(t * dim);
        auto table_d = Input(table);
        auto tokens_d = Input(tokens);
        Embedding(table_d.View(vocab, dim), tokens_d.View(1, t), out.View(t, dim));
        std::vector<double> want(t * dim);
        ref::Embedding(ToDouble(table).data(), vocab, dim, tokens.data(), t, want.data());
        EXPECT_TRUE(AllClose(out.Values(), want, 0.0, 0.0));
        EXPECT_TRUE(out.GuardsIntact());
      }
    }
  }
}

// A bf16 table (how checkpoints store it) widens each row exactly.
TEST_P(EmbeddingTest, Bf16RowsWidenExactly) {
  const int64_t vocab = 9, dim = 37;
  std::vector<uint16_t> table(vocab * dim);
  const auto f = RandomFloats(vocab * dim, 5);
  std::vector<double> values(vocab * dim);
  for (size_t i = 0; i < table.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &f[i], 4);
    table[i] = static_cast<uint16_t>(bits >> 16);
    const uint32_t wide = bits & 0xffff0000u;
    float v;
    std::memcpy(&v, &wide, 4);
    values[i] = v;
  }
  const std::vector<int32_t> tokens = {8, 0, 3, 3};
  auto out = Output<float>(4 * dim);
  auto table_d = Input(table);  // bf16 bits
  auto tokens_d = Input(tokens);
  Embedding(table_d.View(vocab, dim), tokens_d.View(1, 4), out.View(4, dim));
  std::vector<double> want(4 * dim);
  ref::Embedding(values.data(), vocab, dim, tokens.data(), 4, want.data());
  EXPECT_TRUE(AllClose(out.Values(), want, 0.0, 0.0));
  EXPECT_TRUE(out.GuardsIntact());
}

// An MXFP4 table (K3's experts' format) widens each row exactly as
// DequantizeMxfp4 decodes it, every code and scales across the range.
TEST_P(EmbeddingTest, Mxfp4RowsWidenExactly) {
  const int64_t vocab = 6, dim = 64;
  // Codes and scales as bytes, carried in uint16 buffers (two bytes each).
  std::vector<uint16_t> packed(vocab * dim / 4), scales(vocab * dim / 32 / 2);
  auto* code_bytes = reinterpret_cast<uint8_t*>(packed.data());
  auto* scale_bytes = reinterpret_cast<uint8_t*>(scales.data());
  for (int64_t i = 0; i < vocab * dim / 2; ++i) code_bytes[i] = static_cast<uint8_t>(i * 37 + 11);
  const uint8_t scale_values[] = {0, 1, 100, 127, 128, 200, 250, 254, 3, 127, 60, 130};
  for (int64_t i = 0; i < vocab * dim / 32; ++i) scale_bytes[i] = scale_values[i % 12];
  std::vector<float> widened(vocab * dim);
  DequantizeMxfp4(code_bytes, scale_bytes, vocab, dim, widened.data());
  const std::vector<int32_t> tokens = {5, 0, 2, 2, 4, 1, 3};
  const auto t = static_cast<int64_t>(tokens.size());
  auto packed_d = Input(packed), scales_d = Input(scales);
  auto tokens_d = Input(tokens);
  const Tensor table{packed_d.View(1, packed_d.size()).data,
                     static_cast<const uint8_t*>(scales_d.View(1, scales_d.size()).data),
                     DType::kMxfp4,
                     device(),
                     vocab,
                     dim};
  auto out = Output<float>(t * dim);
  Embedding(table, tokens_d.View(1, t), out.View(t, dim));
  const std::vector<float> got = out.Values();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t c = 0; c < dim; ++c) {
      const float want = widened[tokens[i] * dim + c];
      ASSERT_EQ(std::memcmp(&got[i * dim + c], &want, 4), 0)
          << "token " << i << " column " << c << ": " << got[i * dim + c] << " vs " << want;
    }
  }
  EXPECT_TRUE(out.GuardsIntact());
}

TEST_P(EmbeddingTest, NoTokensIsNoOp) {
  auto table = Input(RandomFloats(4 * 3, 9));
  auto tokens = Input(std::vector<int32_t>{});
  auto out = Output<float>(0);
  Embedding(table.View(4, 3), tokens.View(1, 0), out.View(0, 3));
  EXPECT_TRUE(out.GuardsIntact());
}

class EmbeddingDeathTest : public DeviceTest {};

TEST_P(EmbeddingDeathTest, OutOfRangeTokenAborts) {
  auto table = Input(RandomFloats(4 * 3, 9));
  auto tokens = Input(std::vector<int32_t>{1, 4});
  auto out = Output<float>(2 * 3);
  EXPECT_DEATH(Embedding(table.View(4, 3), tokens.View(1, 2), out.View(2, 3)), "check failed");
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(EmbeddingTest);
DELTASERVE_INSTANTIATE_DEVICE_TEST(EmbeddingDeathTest);

}  // namespace
}  // namespace deltaserve::kernels
