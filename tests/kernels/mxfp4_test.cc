// kernels/mxfp4.h against the float64 decoder derived from the format: every
// code under every scale, including the NaN scale, and packed matrices.
#include "kernels/mxfp4.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/mxfp4_ref.h"
#include "kernels/tensor.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

TEST(Mxfp4Test, CodeTableIsE2m1) {
  const double want[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(ref::Mxfp4CodeRef(static_cast<uint8_t>(c)), (c & 8 ? -1 : 1) * want[c & 7]) << c;
    EXPECT_EQ(static_cast<double>(Mxfp4Code(static_cast<uint8_t>(c))),
              ref::Mxfp4CodeRef(static_cast<uint8_t>(c)))
        << c;
    EXPECT_EQ(std::signbit(Mxfp4Code(static_cast<uint8_t>(c))), (c & 8) != 0) << c;
  }
}

// Every (code, scale) pair: a value is the float64 product rounded to float32
// (exact everywhere but past float32's range, where both give inf).
TEST(Mxfp4Test, EveryCodeAndScale) {
  for (int s = 0; s < 256; ++s) {
    const double scale = ref::E8m0ScaleRef(static_cast<uint8_t>(s));
    if (s == 255) {
      EXPECT_TRUE(std::isnan(scale));
      EXPECT_TRUE(std::isnan(E8m0Scale(255)));
      continue;
    }
    EXPECT_EQ(static_cast<double>(E8m0Scale(static_cast<uint8_t>(s))), scale) << s;
    // One row of 32 values: codes 0..15 twice, under scale s.
    std::vector<uint8_t> packed(16), scales{static_cast<uint8_t>(s)};
    for (int i = 0; i < 16; ++i)
      packed[i] = static_cast<uint8_t>((2 * i % 16) | ((2 * i + 1) % 16) << 4);
    std::vector<float> out(32);
    DequantizeMxfp4(packed.data(), scales.data(), 1, 32, out.data());
    const std::vector<double> want = ref::DequantizeMxfp4Ref(packed.data(), scales.data(), 1, 32);
    for (int c = 0; c < 32; ++c) {
      EXPECT_EQ(out[c], static_cast<float>(want[c])) << "scale " << s << " column " << c;
      EXPECT_EQ(want[c], ref::Mxfp4CodeRef(static_cast<uint8_t>(c % 16)) * scale);
    }
  }
}

TEST(Mxfp4Test, MatrixGroupsAndNibbleOrder) {
  const int64_t rows = 5, cols = 96;
  std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
  const std::vector<int32_t> codes = testing::RandomTokens(rows * cols / 2, 7, 256);
  const std::vector<int32_t> powers = testing::RandomTokens(rows * cols / 32, 8, 18);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(codes[i]);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(118 + powers[i]);
  std::vector<float> out = testing::NaNs(rows * cols);
  DequantizeMxfp4(packed.data(), scales.data(), rows, cols, out.data());
  const auto want = ref::DequantizeMxfp4Ref(packed.data(), scales.data(), rows, cols);
  EXPECT_TRUE(testing::AllClose(out, want, 0.0, 0.0));
  // The even column is the low nibble.
  EXPECT_EQ(out[0], Mxfp4Code(packed[0] & 15) * E8m0Scale(scales[0]));
  EXPECT_EQ(out[1], Mxfp4Code(packed[0] >> 4) * E8m0Scale(scales[0]));
}

TEST(Mxfp4Test, FindsNanScale) {
  std::vector<uint8_t> scales(100, 127);
  EXPECT_EQ(FindNanScale(scales.data(), 100), -1);
  scales[63] = 255;
  scales[80] = 255;
  EXPECT_EQ(FindNanScale(scales.data(), 100), 63);
}

TEST(TensorTest, RowsOfEachDType) {
  std::vector<uint8_t> data(4 * 64 * 4), scales(4 * 2);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kMxfp4}) {
    Tensor t{data.data(), dtype == DType::kMxfp4 ? scales.data() : nullptr, dtype, Device::kCpu, 4,
             64};
    const Tensor r = t.Rows(2, 2);
    EXPECT_EQ(r.rows, 2);
    EXPECT_EQ(static_cast<const uint8_t*>(r.data), data.data() + 2 * t.RowBytes())
        << DTypeName(dtype);
    if (dtype == DType::kMxfp4) {
      EXPECT_EQ(r.scales, scales.data() + 4);
    }
  }
}

}  // namespace
}  // namespace deltaserve::kernels
