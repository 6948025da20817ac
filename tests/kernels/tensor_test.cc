// kernels/tensor.h: the views Columns and Reshaped make of the same memory.
#include "kernels/tensor.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace deltaserve::kernels {
namespace {

TEST(TensorTest, ColumnsOfContiguousRows) {
  std::vector<float> x(4 * 10);
  const Tensor t = Tensor::F32(x.data(), 4, 10);
  const Tensor c = t.Columns(3, 5);
  EXPECT_EQ(c.data, x.data() + 3);
  EXPECT_EQ(c.rows, 4);
  EXPECT_EQ(c.cols, 5);
  EXPECT_EQ(c.stride, 10);
  EXPECT_EQ(c.RowStride(), 10);
  EXPECT_EQ(c.dtype, DType::kF32);
  // Bytes from the block's first element to the end of its last row's part.
  EXPECT_EQ(c.SpanBytes(), (3 * 10 + 5) * 4);
  // A block of a block keeps the rows' stride.
  const Tensor cc = c.Columns(1, 2);
  EXPECT_EQ(cc.data, x.data() + 4);
  EXPECT_EQ(cc.stride, 10);
  // The whole rows stay a contiguous view; an empty block is fine at the end.
  EXPECT_EQ(t.Columns(0, 10).stride, 0);
  EXPECT_EQ(t.Columns(10, 0).cols, 0);
}

// Column blocks of one matrix share no element however their byte spans
// interleave; blocks whose columns or rows meet do; views of other strides
// or dtypes are judged by their spans.
TEST(TensorTest, OverlapsIsExactForBlocksOfOneMatrix) {
  std::vector<float> x(6 * 10);
  const Tensor t = Tensor::F32(x.data(), 6, 10);
  EXPECT_FALSE(Overlaps(t.Columns(0, 4), t.Columns(4, 6)));
  EXPECT_FALSE(Overlaps(t.Columns(6, 4), t.Columns(0, 6)));
  EXPECT_FALSE(Overlaps(t.Columns(2, 3).Rows(1, 3), t.Columns(5, 5).Rows(0, 6)));
  EXPECT_TRUE(Overlaps(t.Columns(0, 5), t.Columns(4, 6)));
  EXPECT_TRUE(Overlaps(t.Columns(4, 6), t.Columns(0, 5)));
  EXPECT_TRUE(Overlaps(t.Columns(3, 2).Rows(2, 2), t.Columns(4, 6).Rows(3, 3)));
  EXPECT_FALSE(Overlaps(t.Columns(3, 2).Rows(0, 2), t.Columns(3, 2).Rows(2, 2)));
  EXPECT_TRUE(Overlaps(t, t.Columns(9, 1)));
  EXPECT_FALSE(Overlaps(t.Columns(0, 0), t));
  // Another stride over the same bytes: the spans decide.
  EXPECT_TRUE(Overlaps(Tensor::F32(x.data(), 3, 4, 20), t.Columns(4, 6).Rows(0, 2)));
  EXPECT_FALSE(Overlaps(Tensor::F32(x.data(), 1, 4, 20), t.Columns(4, 6).Rows(1, 2)));
}

TEST(TensorTest, ColumnsOfOtherDtypes) {
  std::vector<uint16_t> h(3 * 8);
  const MutableTensor b = MutableTensor::BF16(h.data(), 3, 8);
  const MutableTensor bc = b.Columns(6, 2);  // a writable view stays writable
  EXPECT_EQ(bc.data, h.data() + 6);
  EXPECT_EQ(bc.dtype, DType::kBF16);
  EXPECT_EQ(bc.RowStride(), 8);
  std::vector<int32_t> i(2 * 6);
  EXPECT_EQ(Tensor::I32(i.data(), 2, 6).Columns(2, 3).data, i.data() + 2);
  std::vector<double> d(2 * 6);
  EXPECT_EQ(Tensor::F64(d.data(), 2, 6).Columns(5, 1).data, d.data() + 5);
  // Columns of a strided view: the stride is the original rows'.
  std::vector<float> x(3 * 12);
  const Tensor s = Tensor::F32(x.data(), 3, 8, 12).Columns(2, 6);
  EXPECT_EQ(s.data, x.data() + 2);
  EXPECT_EQ(s.stride, 12);
}

TEST(TensorTest, ColumnsRefusesOutOfRangeAndMxfp4) {
  std::vector<float> x(4 * 10);
  const Tensor t = Tensor::F32(x.data(), 4, 10);
  EXPECT_DEATH(t.Columns(8, 3), "begin \\+ count <= cols");
  EXPECT_DEATH(t.Columns(-1, 2), "begin >= 0");
  std::vector<uint8_t> codes(2 * 16), scales(2);
  const Tensor m{codes.data(), scales.data(), DType::kMxfp4, Device::kCpu, 2, 32};
  EXPECT_DEATH(m.Columns(0, 32), "dtype != DType::kMxfp4");
}

TEST(TensorTest, Reshaped) {
  std::vector<float> x(6 * 4);
  const Tensor t = Tensor::F32(x.data(), 6, 4);
  const Tensor r = t.Reshaped(3, 8);
  EXPECT_EQ(r.data, x.data());
  EXPECT_EQ(r.rows, 3);
  EXPECT_EQ(r.cols, 8);
  EXPECT_EQ(r.stride, 0);
  EXPECT_EQ(r.SpanBytes(), t.SpanBytes());
  EXPECT_EQ(t.Reshaped(1, 24).cols, 24);
  EXPECT_EQ(Tensor::F32(nullptr, 0, 5).Reshaped(0, 7).cols, 7);
  // A stride equal to cols, or a single row, is still contiguous.
  EXPECT_EQ(Tensor::F32(x.data(), 6, 4, 4).Reshaped(2, 12).rows, 2);
  EXPECT_EQ(Tensor::F32(x.data(), 1, 4, 9).Reshaped(2, 2).cols, 2);
  // mxfp4 keeps cols a multiple of 32: [2, 64] as [4, 32].
  std::vector<uint8_t> codes(2 * 32), scales(2 * 2);
  const Tensor m{codes.data(), scales.data(), DType::kMxfp4, Device::kCpu, 2, 64};
  const Tensor mr = m.Reshaped(4, 32);
  EXPECT_EQ(mr.rows, 4);
  EXPECT_EQ(mr.ScaleRowBytes(), 1);
  EXPECT_DEATH(m.Reshaped(8, 16), "kMxfp4Group");
}

TEST(TensorTest, ReshapedRefusesStridesAndOtherSizes) {
  std::vector<float> x(6 * 4);
  EXPECT_DEATH(Tensor::F32(x.data(), 6, 4).Reshaped(5, 5),
               "new_rows \\* new_cols == rows \\* cols");
  EXPECT_DEATH(Tensor::F32(x.data(), 6, 4).Columns(0, 2).Reshaped(3, 4), "stride == 0");
}

}  // namespace
}  // namespace deltaserve::kernels
