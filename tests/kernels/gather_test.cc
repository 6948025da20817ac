// kernels/gather.h against the float64 reference: every dtype pair, strided
// rows, repeated and empty index lists, and the check of each index.
#include "kernels/gather.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/reference/gather_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::SameValues;  // copies and one correctly rounded step: no tolerance

using testing::DeviceTest;
using testing::RandomFloats;
using testing::RandomTokens;
using testing::WithoutStride;
using testing::WithStride;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A [rows, cols] operand of either dtype at row stride `stride` on `device`,
// holding `values` (exactly, for bf16: the test picks bf16 values for it).
struct Operand {
  std::optional<testing::GuardedBuffer<float>> f32;
  std::optional<testing::GuardedBuffer<uint16_t>> bf16;
  Tensor view;
};
Operand MakeOperand(Device device, DType dtype, const std::vector<float>& values, int64_t rows,
                    int64_t cols, int64_t stride) {
  Operand o;
  const std::vector<float> strided = WithStride(values, rows, cols, stride, kNaN);
  const auto size = static_cast<int64_t>(strided.size());
  const int64_t s = stride == cols ? 0 : stride;
  if (dtype == DType::kBF16) {
    std::vector<uint16_t> bits;
    for (float v : strided) bits.push_back(FloatToBf16(v));
    o.bf16.emplace(device, size);
    o.bf16->Fill(bits);
    o.view = o.bf16->View(rows, cols, s);
  } else {
    o.f32.emplace(device, size);
    o.f32->Fill(strided);
    o.view = o.f32->View(rows, cols, s);
  }
  return o;
}

std::vector<float> Bf16Values(std::vector<float> x) {
  for (float& v : x) v = Bf16ToFloat(FloatToBf16(v));
  return x;
}

class GatherTest : public DeviceTest {
 protected:
  // Runs `write(dst_view)` on a guarded destination of `dtype`, optionally
  // filled with `initial` (dense [rows, cols]) first; returns its values.
  template <typename Write>
  std::vector<float> Into(DType dtype, int64_t rows, int64_t cols, int64_t stride,
                          const std::vector<float>* initial, Write write) {
    const int64_t s = stride == cols ? 0 : stride;
    std::vector<float> all;
    if (dtype == DType::kF32) {
      auto dst = Output<float>(rows * stride);
      if (initial != nullptr) dst.Fill(WithStride(*initial, rows, cols, stride, kNaN));
      write(dst.View(rows, cols, s));
      EXPECT_TRUE(dst.GuardsIntact());
      all = dst.Values();
    } else {
      auto dst = Output<uint16_t>(rows * stride);
      if (initial != nullptr) {
        std::vector<uint16_t> bits;
        for (float v : WithStride(*initial, rows, cols, stride, kNaN))
          bits.push_back(FloatToBf16(v));
        dst.Fill(bits);
      }
      write(dst.View(rows, cols, s));
      EXPECT_TRUE(dst.GuardsIntact());
      for (uint16_t b : dst.Values()) all.push_back(Bf16ToFloat(b));
    }
    // The gaps of a strided destination stay unwritten.
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = cols; c < stride; ++c) EXPECT_TRUE(std::isnan(all[r * stride + c]));
    }
    return WithoutStride(all, rows, cols, stride);
  }
};

TEST_P(GatherTest, GatherMatchesReference) {
  uint64_t seed = 1;
  for (DType from : {DType::kF32, DType::kBF16}) {
    for (DType to : {DType::kF32, DType::kBF16}) {
      for (int64_t n : {0, 1, 3, 40}) {
        for (int64_t cols : {0, 1, 7, 64, 300}) {
          for (int64_t pad : {0, 3}) {
            SCOPED_TRACE(::testing::Message() << DTypeName(from) << " -> " << DTypeName(to) << " n "
                                              << n << " cols " << cols << " pad " << pad);
            const int64_t src_rows = 17;
            auto values = RandomFloats(src_rows * cols, ++seed, -100.0f, 100.0f);
            if (from == DType::kBF16) values = Bf16Values(values);
            const Operand src = MakeOperand(device(), from, values, src_rows, cols, cols + 2 * pad);
            // Random rows, so repeats too.
            const auto index = RandomTokens(n, ++seed, src_rows);
            auto index_d = Input(index);
            std::vector<double> want(n * cols);
            const std::vector<double> wide(values.begin(), values.end());
            ref::GatherRows(wide.data(), index.data(), n, cols, to == DType::kBF16, want.data());
            const auto got = Into(to, n, cols, cols + pad, nullptr, [&](const MutableTensor& dst) {
              GatherRows(src.view, index_d.View(1, n), dst);
            });
            EXPECT_TRUE(SameValues(got, want));
          }
        }
      }
    }
  }
}

// Distinct rows written, the others left as they were.
TEST_P(GatherTest, ScatterMatchesReference) {
  uint64_t seed = 100;
  for (DType from : {DType::kF32, DType::kBF16}) {
    for (DType to : {DType::kF32, DType::kBF16}) {
      for (int64_t n : {0, 1, 5, 17}) {
        for (int64_t cols : {0, 1, 9, 64, 300}) {
          for (int64_t pad : {0, 2}) {
            SCOPED_TRACE(::testing::Message() << DTypeName(from) << " -> " << DTypeName(to) << " n "
                                              << n << " cols " << cols << " pad " << pad);
            const int64_t dst_rows = 17;
            auto values = RandomFloats(n * cols, ++seed, -100.0f, 100.0f);
            if (from == DType::kBF16) values = Bf16Values(values);
            const Operand src = MakeOperand(device(), from, values, n, cols, cols + pad);
            // A permutation's first n: distinct, in no order.
            std::vector<int32_t> index(dst_rows);
            for (int32_t i = 0; i < dst_rows; ++i) index[i] = (i * 7 + 3) % dst_rows;
            index.resize(n);
            auto index_d = Input(index);
            // The destination starts with values of its own dtype.
            auto initial = RandomFloats(dst_rows * cols, ++seed, -1.0f, 1.0f);
            if (to == DType::kBF16) initial = Bf16Values(initial);
            std::vector<double> want(initial.begin(), initial.end());
            const std::vector<double> wide(values.begin(), values.end());
            ref::ScatterRows(wide.data(), index.data(), n, cols, to == DType::kBF16, want.data());
            const auto got = Into(
                to, dst_rows, cols, cols + 2 * pad, &initial,
                [&](const MutableTensor& dst) { ScatterRows(src.view, index_d.View(1, n), dst); });
            EXPECT_TRUE(SameValues(got, want));
          }
        }
      }
    }
  }
}

// Scattered rows read back by the same indices: a cache round trip.
TEST_P(GatherTest, RoundTripThroughPages) {
  const int64_t n = 300, cols = 576, pages = 512;
  const auto values = Bf16Values(RandomFloats(n * cols, 7));
  std::vector<int32_t> index(n);
  for (int32_t i = 0; i < n; ++i) index[i] = (i * 37 + 11) % pages;
  auto cache = Output<uint16_t>(pages * cols);
  auto values_d = Input(values);
  auto index_d = Input(index);
  ScatterRows(values_d.View(n, cols), index_d.View(1, n), cache.View(pages, cols));
  EXPECT_TRUE(cache.GuardsIntact());
  auto back = Output<float>(n * cols);
  GatherRows(cache.View(pages, cols), index_d.View(1, n), back.View(n, cols));
  EXPECT_EQ(back.Values(), values);
  EXPECT_TRUE(back.GuardsIntact());
}

TEST_P(GatherTest, RefusesBadIndices) {
  auto src = Input(std::vector<float>(4 * 8, 1.0f));
  auto dst = Output<float>(4 * 8);
  auto past_end = Input(std::vector<int32_t>{0, 4});
  EXPECT_DEATH(GatherRows(src.View(4, 8), past_end.View(1, 2), dst.View(2, 8)),
               "GatherRows: rows\\[1\\] = 4 is outside \\[0, 4\\)");
  auto negative = Input(std::vector<int32_t>{-1, 0});
  EXPECT_DEATH(ScatterRows(src.View(2, 8), negative.View(1, 2), dst.View(4, 8)),
               "ScatterRows: rows\\[0\\] = -1 is outside \\[0, 4\\)");
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(GatherTest);

}  // namespace
}  // namespace deltaserve::kernels
