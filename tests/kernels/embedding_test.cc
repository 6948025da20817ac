// kernels/embedding.h against the float64 reference: a copy, so exact.
#include "kernels/embedding.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
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
        Embedding(Tensor::F32(table.data(), vocab, dim), Tensor::I32(tokens.data(), 1, t),
                  out.View(t, dim));
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
  const int32_t tokens[] = {8, 0, 3, 3};
  auto out = Output<float>(4 * dim);
  Embedding(Tensor{table.data(), nullptr, DType::kBF16, Device::kCpu, vocab, dim},
            Tensor::I32(tokens, 1, 4), out.View(4, dim));
  std::vector<double> want(4 * dim);
  ref::Embedding(values.data(), vocab, dim, tokens, 4, want.data());
  EXPECT_TRUE(AllClose(out.Values(), want, 0.0, 0.0));
  EXPECT_TRUE(out.GuardsIntact());
}

TEST_P(EmbeddingTest, NoTokensIsNoOp) {
  const auto table = RandomFloats(4 * 3, 9);
  auto out = Output<float>(0);
  Embedding(Tensor::F32(table.data(), 4, 3), Tensor::I32(nullptr, 1, 0), out.View(0, 3));
  EXPECT_TRUE(out.GuardsIntact());
}

class EmbeddingDeathTest : public DeviceTest {};

TEST_P(EmbeddingDeathTest, OutOfRangeTokenAborts) {
  const auto table = RandomFloats(4 * 3, 9);
  const int32_t tokens[] = {1, 4};
  auto out = Output<float>(2 * 3);
  EXPECT_DEATH(
      Embedding(Tensor::F32(table.data(), 4, 3), Tensor::I32(tokens, 1, 2), out.View(2, 3)),
      "check failed");
}

DELTASERVE_INSTANTIATE_CPU_TEST(EmbeddingTest);
DELTASERVE_INSTANTIATE_CPU_TEST(EmbeddingDeathTest);

}  // namespace
}  // namespace deltaserve::kernels
