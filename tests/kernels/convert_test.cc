// kernels/convert.h against the float64 reference, and bit for bit against
// kernels/bf16.h, over every dtype pair, shape and stride.
#include "kernels/convert.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/reference/convert_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::SameValues;  // every conversion is exact or one correctly rounded step: no tolerance

using testing::DeviceTest;
using testing::RandomFloats;
using testing::WithoutStride;
using testing::WithStride;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<uint16_t> Narrow(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = FloatToBf16(x[i]);
  return out;
}

std::vector<float> Widen(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = Bf16ToFloat(x[i]);
  return out;
}

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

std::vector<double> Reference(const std::vector<float>& src, bool to_bf16) {
  std::vector<double> want(src.size());
  const std::vector<double> wide(src.begin(), src.end());
  ref::Convert(wide.data(), static_cast<int64_t>(src.size()), to_bf16, want.data());
  return want;
}

class ConvertTest : public DeviceTest {};

// Each dtype pair over shapes and strides on either side; the gaps of a
// strided destination stay unwritten.
TEST_P(ConvertTest, MatchesReferenceOverShapes) {
  uint64_t seed = 1;
  for (DType from : {DType::kF32, DType::kBF16}) {
    for (DType to : {DType::kF32, DType::kBF16}) {
      for (int64_t rows : {0, 1, 2, 5, 33}) {
        for (int64_t cols : {0, 1, 7, 8, 17, 100, 1000}) {
          for (int64_t pad : {0, 5}) {
            SCOPED_TRACE(::testing::Message()
                         << DTypeName(from) << " -> " << DTypeName(to) << " rows " << rows
                         << " cols " << cols << " pad " << pad);
            const int64_t src_stride = cols + 2 * pad, dst_stride = cols + pad;
            auto values = RandomFloats(rows * cols, ++seed, -1e3f, 1e3f);
            // The value a bf16 source holds: the source's exact value.
            if (from == DType::kBF16) values = Widen(Narrow(values));
            const auto want = Reference(values, to == DType::kBF16);
            const auto src32 = WithStride(values, rows, cols, src_stride, kNaN);
            const auto src16 = Narrow(src32);
            auto src32_d = Input(src32);
            auto src16_d = Input(src16);
            const Tensor src = from == DType::kF32
                                   ? Tensor(src32_d.View(rows, cols, pad ? src_stride : 0))
                                   : Tensor(src16_d.View(rows, cols, pad ? src_stride : 0));
            std::vector<float> got;
            if (to == DType::kF32) {
              auto dst = Output<float>(rows * dst_stride);
              Convert(src, dst.View(rows, cols, pad ? dst_stride : 0));
              const auto all = dst.Values();
              for (int64_t r = 0; r < rows; ++r) {
                for (int64_t c = cols; c < dst_stride; ++c) {
                  EXPECT_EQ(Bits(all[r * dst_stride + c]), 0x7fc00000u);
                }
              }
              got = WithoutStride(all, rows, cols, dst_stride);
              EXPECT_TRUE(dst.GuardsIntact());
            } else {
              auto dst = Output<uint16_t>(rows * dst_stride);
              Convert(src, dst.View(rows, cols, pad ? dst_stride : 0));
              const auto all = dst.Values();
              for (int64_t r = 0; r < rows; ++r) {
                for (int64_t c = cols; c < dst_stride; ++c)
                  EXPECT_EQ(all[r * dst_stride + c], 0x7fc0);
              }
              got = Widen(WithoutStride(all, rows, cols, dst_stride));
              EXPECT_TRUE(dst.GuardsIntact());
            }
            EXPECT_TRUE(SameValues(got, want));
          }
        }
      }
    }
  }
}

// f32 -> bf16 equals FloatToBf16 and the reference for every high half
// with the low halves that decide the rounding (zero, just below and above
// the tie, the tie, all ones), which covers ties to even both ways, carries
// into the exponent and to inf, subnormals, and NaNs of every payload.
TEST_P(ConvertTest, NarrowingBitForBit) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  std::vector<float> x;
  for (uint32_t high = 0; high < 0x10000; ++high) {
    for (uint32_t low : lows) {
      const uint32_t bits = high << 16 | low;
      float f;
      std::memcpy(&f, &bits, 4);
      x.push_back(f);
    }
  }
  const auto n = static_cast<int64_t>(x.size());
  auto dst = Output<uint16_t>(n);
  auto x_d = Input(x);
  Convert(x_d.View(1, n), dst.View(1, n));
  const auto got = dst.Values();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], FloatToBf16(x[i])) << std::hex << "bits 0x" << Bits(x[i]);
    const double want = ref::RoundToBf16(x[i]);
    const float value = Bf16ToFloat(got[i]);
    ASSERT_TRUE(std::isnan(want) ? std::isnan(value) : value == want)
        << std::hex << "bits 0x" << Bits(x[i]);
  }
  EXPECT_TRUE(dst.GuardsIntact());
}

// bf16 -> f32 is exact for all 65536 patterns, NaNs keeping their bits.
TEST_P(ConvertTest, WideningBitForBit) {
  std::vector<uint16_t> x(0x10000);
  for (uint32_t i = 0; i < 0x10000; ++i) x[i] = static_cast<uint16_t>(i);
  auto dst = Output<float>(0x10000);
  auto x_d = Input(x);
  Convert(x_d.View(1, 0x10000), dst.View(1, 0x10000));
  const auto got = dst.Values();
  for (uint32_t i = 0; i < 0x10000; ++i) ASSERT_EQ(Bits(got[i]), i << 16);
  EXPECT_TRUE(dst.GuardsIntact());
}

// The splits the layers make: a fused [rows, 3 * hd] projection into its
// three parts, and the rope block [rows * n, R] at column P of rows P + R
// wide, both through Tensor::Columns.
TEST_P(ConvertTest, ColumnBlocks) {
  const int64_t rows = 9, hd = 40;
  const auto fused = RandomFloats(rows * 3 * hd, 3);
  auto fused_d = Input(fused);
  const Tensor all = fused_d.View(rows, 3 * hd);
  for (int64_t part = 0; part < 3; ++part) {
    auto dst = Output<float>(rows * hd);
    Convert(all.Columns(part * hd, hd), dst.View(rows, hd));
    const auto got = dst.Values();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < hd; ++c) {
        ASSERT_EQ(Bits(got[r * hd + c]), Bits(fused[r * 3 * hd + part * hd + c]));
      }
    }
    EXPECT_TRUE(dst.GuardsIntact());
  }
  const int64_t heads = 4, p = 24, rope = 8;
  const auto q = RandomFloats(rows * heads * (p + rope), 4);
  auto dst = Output<float>(rows * heads * rope);
  auto q_d = Input(q);
  Convert(Tensor(q_d.View(rows * heads, p + rope)).Columns(p, rope), dst.View(rows * heads, rope));
  const auto got = dst.Values();
  for (int64_t r = 0; r < rows * heads; ++r) {
    for (int64_t c = 0; c < rope; ++c) {
      ASSERT_EQ(Bits(got[r * rope + c]), Bits(q[r * (p + rope) + p + c]));
    }
  }
  EXPECT_TRUE(dst.GuardsIntact());
}

// Enough rows to run on several threads.
TEST_P(ConvertTest, ThreadedRows) {
  const int64_t rows = 300, cols = 700;
  const auto x = RandomFloats(rows * cols, 9, -5.0f, 5.0f);
  auto dst = Output<uint16_t>(rows * cols);
  auto x_d = Input(x);
  Convert(x_d.View(rows, cols), dst.View(rows, cols));
  EXPECT_EQ(dst.Values(), Narrow(x));
  EXPECT_TRUE(dst.GuardsIntact());
}

TEST_P(ConvertTest, RefusesOverlapAndOtherDtypes) {
  auto buffer = Input(std::vector<float>(64, 1.0f));
  auto ids = Input(std::vector<int32_t>(4));
  const MutableTensor x = buffer.View(4, 16);
  EXPECT_DEATH(Convert(x.Rows(0, 2), x.Rows(1, 2)), "Overlaps\\(src, dst\\)");
  EXPECT_DEATH(Convert(ids.View(1, 4), x.Rows(0, 1).Columns(0, 4)), "src.dtype");
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(ConvertTest);

}  // namespace
}  // namespace deltaserve::kernels
