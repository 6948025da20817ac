// kernels/gemm.h for float32, bf16 and MXFP4 weights (the skinny kernel and
// oneDNN's sgemm on widened panels) and SmallGemm of kernels/cpu/gemm_cpu.h
// against the float64 reference, at the CPU level this run selects (ctest
// runs each kernel test once per level: DELTASERVE_CPU_ISA). Linear runs on
// every device of AvailableDevices() (on CUDA: the skinny kernel up to 16
// rows, cuBLASLt above, kernels/cuda/gemm_cuda.cu), its inputs copied to the
// device and its outputs guarded; WidenRows and
// SmallGemm are the CPU backend's own helpers on host pointers, so they run
// on the CPU only, into guarded host buffers.
#include "kernels/gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/cpu/balanced_blocks.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/mxfp4.h"
#include "kernels/reference/gemm_ref.h"
#include "kernels/reference/mxfp4_ref.h"
#include "kernels/threads.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::AllClose;
using testing::DeviceTest;
using testing::DeviceTestWithParam;
using testing::GuardedBuffer;
using testing::NaNs;
using testing::RandomFloats;
using testing::ReductionTolerance;
using testing::ToDouble;

// Up to 16 rows take the skinny kernel (4-row tiles and the 1-3 rows left
// over; 4-row blocks of W and the rows left over; k in 8-lane steps and a
// tail), 17 and up the widened panels and sgemm.
constexpr int64_t kSizes[] = {0, 1, 2, 3, 5, 8, 13, 16, 17, 64, 129};
// The same sweep, fewer sizes, on CUDA, where the SIMT harness runs each
// thread as a fiber (the full sweep took 20 s a test there): both sides of
// the skinny / cuBLASLt boundary, a ragged size and a multiple of 32.
constexpr int64_t kCudaSizes[] = {0, 1, 3, 13, 16, 17, 64};
// MXFP4 rows are whole groups of 32.
constexpr int64_t kMxfp4Widths[] = {0, 32, 64, 160};

// Inputs in [-1, 1) (MXFP4 weights up to 1.5): each product is ~1/3 and
// partial sums grow like sqrt(k), so the absolute error is
// ReductionTolerance(k) times that sqrt(k) scale.
double Atol(int64_t k) {
  return 2 * ReductionTolerance(k) * std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)));
}

// A [n, k] weight of `dtype` with random values and their exact float64
// values: bf16 keeps the top half of random float32s, MXFP4 has random codes
// under scales 2^-3 .. 2^-2.
struct TestWeight {
  std::vector<uint8_t> data, scales;
  std::vector<double> values;  // [n, k]
  Tensor tensor;
};

TestWeight MakeWeight(DType dtype, int64_t n, int64_t k, uint64_t seed) {
  TestWeight w;
  const auto f = RandomFloats(n * k, seed);
  w.values.resize(n * k);
  if (dtype == DType::kF32) {
    w.data.resize(n * k * 4);
    if (!f.empty()) std::memcpy(w.data.data(), f.data(), w.data.size());  // no null memcpy
    w.values = ToDouble(f);
  } else if (dtype == DType::kBF16) {
    w.data.resize(n * k * 2);
    for (int64_t i = 0; i < n * k; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &f[i], 4);
      const uint16_t half = static_cast<uint16_t>(bits >> 16);
      std::memcpy(w.data.data() + 2 * i, &half, 2);
      const uint32_t wide = static_cast<uint32_t>(half) << 16;
      float v;
      std::memcpy(&v, &wide, 4);
      w.values[i] = v;
    }
  } else {
    const auto codes = testing::RandomTokens(n * k / 2, seed, 256);
    const auto powers = testing::RandomTokens(n * k / 32, seed + 1, 2);
    w.data.resize(n * k / 2);
    w.scales.resize(n * k / 32);
    for (size_t i = 0; i < w.data.size(); ++i) w.data[i] = static_cast<uint8_t>(codes[i]);
    for (size_t i = 0; i < w.scales.size(); ++i)
      w.scales[i] = static_cast<uint8_t>(124 + powers[i]);
    w.values = ref::DequantizeMxfp4Ref(w.data.data(), w.scales.data(), n, k);
  }
  w.tensor = Tensor{
      w.data.data(), dtype == DType::kMxfp4 ? w.scales.data() : nullptr, dtype, Device::kCpu, n, k};
  return w;
}

// A weight's bytes on `device`: the CPU's are used where they are, another
// device gets a copy in its workspace's memory, freed with this.
class DeviceWeight {
 public:
  DeviceWeight(const Tensor& w, const std::vector<uint8_t>& data,
               const std::vector<uint8_t>& scales, Device device)
      : device_(device), tensor_(w) {
    if (device == Device::kCpu) return;
    tensor_.device = device;
    tensor_.data = Copy(data, &data_);
    if (tensor_.scales != nullptr)
      tensor_.scales = static_cast<const uint8_t*>(Copy(scales, &scales_));
  }
  DeviceWeight(const DeviceWeight&) = delete;
  DeviceWeight& operator=(const DeviceWeight&) = delete;
  ~DeviceWeight() {
    for (const auto& [p, bytes] : {data_, scales_}) {
      if (p != nullptr) Workspace::Of(device_).Free(p, bytes);
    }
  }
  const Tensor& tensor() const { return tensor_; }

 private:
  using Block = std::pair<void*, size_t>;
  void* Copy(const std::vector<uint8_t>& bytes, Block* block) {
    if (bytes.empty()) return nullptr;
    block->second = bytes.size();
    block->first = Workspace::Of(device_).Allocate(bytes.size());
    Workspace::Of(device_).CopyFromHost(block->first, bytes.data(), bytes.size());
    return block->first;
  }

  Device device_;
  Tensor tensor_;
  Block data_{nullptr, 0}, scales_{nullptr, 0};
};

DeviceWeight OnDevice(const TestWeight& w, Device device) {
  return DeviceWeight(w.tensor, w.data, w.scales, device);
}

std::vector<double> Reference(const std::vector<float>& x, const std::vector<double>& w, int64_t m,
                              int64_t n, int64_t k) {
  std::vector<double> y(m * n);
  ref::Linear(ToDouble(x).data(), w.data(), m, n, k, y.data());
  return y;
}

std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                              int64_t n, int64_t k) {
  return Reference(x, ToDouble(w), m, n, k);
}

// The widths k a dtype's rows may have.
std::vector<int64_t> Widths(DType dtype) {
  if (dtype == DType::kMxfp4) return {std::begin(kMxfp4Widths), std::end(kMxfp4Widths)};
  return {std::begin(kSizes), std::end(kSizes)};
}

// Per device and weight dtype.
class LinearTest : public DeviceTestWithParam<DType> {
 protected:
  // The m and n of a sweep on this device.
  std::vector<int64_t> Sizes() const {
    if (device() == Device::kCuda) return {std::begin(kCudaSizes), std::end(kCudaSizes)};
    return {std::begin(kSizes), std::end(kSizes)};
  }
};
// Per weight dtype, on the CPU only.
class LinearCpuTest : public ::testing::TestWithParam<DType> {};
class LinearBf16ComputeTest : public DeviceTest {};

TEST_P(LinearTest, MatchesReference) {
  uint64_t seed = 1;
  for (int64_t m : Sizes()) {
    for (int64_t n : Sizes()) {
      for (int64_t k : Widths(Param())) {
        SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k);
        const auto x = RandomFloats(m * k, ++seed);
        const TestWeight w = MakeWeight(Param(), n, k, ++seed);
        const DeviceWeight dw = OnDevice(w, device());
        auto xd = Input(x);
        auto y = Output<float>(m * n);  // k == 0 must still write zeros
        Linear(xd.View(m, w.tensor.cols), dw.tensor(), y.View(m, w.tensor.rows));
        EXPECT_TRUE(
            AllClose(y.Values(), Reference(x, w.values, m, n, k), Atol(k), ReductionTolerance(k)));
        EXPECT_TRUE(y.GuardsIntact());
      }
    }
  }
}

// Many rows and a matrix larger than one widened panel (4 MiB of float32).
TEST_P(LinearTest, LargeMatchesReference) {
  const int64_t m = 40, n = 3300, k = 352;
  const auto x = RandomFloats(m * k, 77);
  const TestWeight w = MakeWeight(Param(), n, k, 78);
  const DeviceWeight dw = OnDevice(w, device());
  auto xd = Input(x);
  auto y = Output<float>(m * n);
  Linear(xd.View(m, w.tensor.cols), dw.tensor(), y.View(m, w.tensor.rows));
  EXPECT_TRUE(
      AllClose(y.Values(), Reference(x, w.values, m, n, k), Atol(k), ReductionTolerance(k)));
  EXPECT_TRUE(y.GuardsIntact());
}

TEST_P(LinearTest, Accumulates) {
  uint64_t seed = 1000;
  for (int64_t m : {1, 2, 3, 7, 16, 17, 64}) {
    for (int64_t n : {1, 3, 129}) {
      for (int64_t k : Widths(Param())) {
        SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k);
        const auto x = RandomFloats(m * k, ++seed);
        const TestWeight w = MakeWeight(Param(), n, k, ++seed);
        const auto y0 = RandomFloats(m * n, ++seed);
        auto y = Output<float>(m * n);  // accumulated into: guarded as an output
        y.Fill(y0);
        auto want = Reference(x, w.values, m, n, k);
        for (int64_t i = 0; i < m * n; ++i) want[i] += y0[i];
        const DeviceWeight dw = OnDevice(w, device());
        auto xd = Input(x);
        Linear(xd.View(m, w.tensor.cols), dw.tensor(), y.View(m, w.tensor.rows),
               /*accumulate=*/true);
        EXPECT_TRUE(
            AllClose(y.Values(), want, Atol(k) + ReductionTolerance(1), ReductionTolerance(k)));
        EXPECT_TRUE(y.GuardsIntact());
      }
    }
  }
}

// A decode batch (up to 16 rows, the skinny kernel) gives each row exactly
// what that row alone gives: a sequence's logits must not depend on which
// other sequences share its step (docs/architecture.md, "Decode ahead of
// results"), so every (row of x, row of W) pair sums in one order whatever
// the batch. Widths cover whole 32-column steps, an 8-column tail and a
// scalar tail.
TEST_P(LinearTest, ARowOfADecodeBatchEqualsThatRowAlone) {
  uint64_t seed = 1500;
  const std::vector<int64_t> widths =
      Param() == DType::kMxfp4 ? std::vector<int64_t>{32, 160} : std::vector<int64_t>{45, 1024};
  for (int64_t k : widths) {
    const int64_t n = 67;
    const TestWeight w = MakeWeight(Param(), n, k, ++seed);
    const DeviceWeight dw = OnDevice(w, device());
    const auto x = RandomFloats(16 * k, ++seed);
    std::vector<float> alone(16 * n);
    for (int64_t i = 0; i < 16; ++i) {
      auto row = Output<float>(n);
      auto xi = Input(std::vector<float>(x.begin() + i * k, x.begin() + (i + 1) * k));
      Linear(xi.View(1, k), dw.tensor(), row.View(1, n));
      ASSERT_TRUE(row.GuardsIntact()) << "k " << k << " row " << i;
      const std::vector<float> values = row.Values();
      std::copy(values.begin(), values.end(), alone.begin() + i * n);
    }
    for (int64_t m = 2; m <= 16; ++m) {
      auto out = Output<float>(m * n);
      auto xd = Input(std::vector<float>(x.begin(), x.begin() + m * k));
      Linear(xd.View(m, k), dw.tensor(), out.View(m, n));
      ASSERT_TRUE(out.GuardsIntact()) << "k " << k << " m " << m;
      const std::vector<float> batch = out.Values();
      for (int64_t e = 0; e < m * n; ++e) {
        ASSERT_EQ(batch[e], alone[e])
            << "k " << k << " m " << m << " row " << e / n << " col " << e % n;
      }
    }
  }
}

// LinearGroup gives each product what Linear gives it, bit for bit: products
// of 0 to 17 rows (the skinny kernel's one region and the many-row path in one
// group), k from 0 up, accumulating or not, each x a column block of one
// wide input and each y a column block of one wide output, as a layer's
// per-head products read and write them.
TEST_P(LinearTest, GroupGivesEachProductWhatLinearGives) {
  struct Shape {
    int64_t m, n, k;
    bool accumulate;
  };
  const std::vector<int64_t> widths = Widths(Param());
  const int64_t k1 = widths[1], k2 = widths.back();
  const std::vector<Shape> shapes = {{1, 67, k1, false}, {1, 300, k2, true},  {3, 5, k1, false},
                                     {16, 33, k2, true}, {17, 40, k1, false}, {0, 7, k1, false},
                                     {4, 9, 0, false},   {2, 0, k2, true}};
  constexpr int64_t kRows = 17;
  int64_t x_cols = 0, y_cols = 0;
  for (const Shape& s : shapes) {
    x_cols += s.k;
    y_cols += s.n;
  }
  uint64_t seed = 4000;
  const auto x = RandomFloats(kRows * x_cols, ++seed), y0 = RandomFloats(kRows * y_cols, ++seed);
  std::vector<TestWeight> weights;
  std::vector<std::unique_ptr<DeviceWeight>> device_weights;
  for (const Shape& s : shapes) {
    weights.push_back(MakeWeight(Param(), s.n, s.k, ++seed));
    device_weights.push_back(std::make_unique<DeviceWeight>(
        weights.back().tensor, weights.back().data, weights.back().scales, device()));
  }
  auto xd = Input(x);
  auto grouped = Output<float>(kRows * y_cols), alone = Output<float>(kRows * y_cols);
  grouped.Fill(y0);
  alone.Fill(y0);
  const Tensor xv = xd.View(kRows, x_cols);
  const MutableTensor gv = grouped.View(kRows, y_cols), av = alone.View(kRows, y_cols);
  std::vector<LinearProduct> products;
  int64_t xc = 0, yc = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    const Tensor xi = xv.Columns(xc, s.k).Rows(0, s.m);
    const Tensor& w = device_weights[i]->tensor();
    products.push_back({xi, w, gv.Columns(yc, s.n).Rows(0, s.m), s.accumulate});
    Linear(xi, w, av.Columns(yc, s.n).Rows(0, s.m), s.accumulate);
    xc += s.k;
    yc += s.n;
  }
  LinearGroup(products);
  EXPECT_TRUE(grouped.GuardsIntact());
  const std::vector<float> got = grouped.Values(), want = alone.Values();
  for (int64_t e = 0; e < kRows * y_cols; ++e) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[e]), std::bit_cast<uint32_t>(want[e]))
        << "row " << e / y_cols << " col " << e % y_cols;
  }
}

// Column blocks of wider rows: reads x with row stride ldx, writes y with row
// stride ldy, and leaves the other columns of y alone (and the guards around
// all of y's rows).
TEST_P(LinearTest, StridedKeepsOtherColumns) {
  uint64_t seed = 2000;
  constexpr float kSentinel = 12345.0f;
  for (int64_t m : Sizes()) {
    for (int64_t n : Sizes()) {
      for (int64_t k : Widths(Param())) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << "m " << m << " n " << n << " k " << k << " accumulate " << accumulate);
          const int64_t ldx = k + 3, ldy = n + 5,
                        col = 2;                          // y block at column 2
          const auto xw = RandomFloats(m * ldx, ++seed);  // [m, ldx]
          const TestWeight w = MakeWeight(Param(), n, k, ++seed);
          std::vector<float> x(m * k);  // the dense [m, k] view of xw
          for (int64_t i = 0; i < m; ++i)
            for (int64_t c = 0; c < k; ++c) x[i * k + c] = xw[i * ldx + c];
          std::vector<float> yw0(m * ldy, kSentinel);
          const auto y0 = RandomFloats(m * n, ++seed);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              yw0[i * ldy + col + j] = accumulate ? y0[i * n + j] : NAN;
            }
          }
          auto out = Output<float>(m * ldy);  // [m, ldy]; y is columns [col, col + n)
          out.Fill(yw0);
          const DeviceWeight dw = OnDevice(w, device());
          auto xd = Input(xw);
          Linear(xd.View(m, w.tensor.cols, ldx), dw.tensor(),
                 out.View(m, ldy).Columns(col, w.tensor.rows), accumulate);
          ASSERT_TRUE(out.GuardsIntact());
          const std::vector<float> yw = out.Values();
          auto want = Reference(x, w.values, m, n, k);
          std::vector<float> y(m * n);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < ldy; ++j) {
              if (j >= col && j < col + n) {
                y[i * n + j - col] = yw[i * ldy + j];
                if (accumulate) want[i * n + j - col] += y0[i * n + j - col];
              } else {
                ASSERT_EQ(yw[i * ldy + j], kSentinel) << "row " << i << " col " << j;
              }
            }
          }
          EXPECT_TRUE(AllClose(y, want, Atol(k) + ReductionTolerance(1), ReductionTolerance(k)));
        }
      }
    }
  }
}

// Rows of a weight in any dtype widened to float32 are exact.
TEST_P(LinearCpuTest, WidenRowsIsExact) {
  const int64_t n = 7, k = GetParam() == DType::kMxfp4 ? 96 : 45;
  const TestWeight w = MakeWeight(GetParam(), n, k, 99);
  GuardedBuffer<float> out(Device::kCpu, 3 * k);
  DELTASERVE_CPU_DISPATCH(WidenRows)(w.tensor, 2, 5, out.data());
  const std::vector<double> want(w.values.begin() + 2 * k, w.values.begin() + 5 * k);
  EXPECT_TRUE(AllClose(out.Values(), want, 0.0, 0.0));
  EXPECT_TRUE(out.GuardsIntact());
}

// MXFP4 rows of expert widths (an odd number of groups among them), every
// code, and a scale of its own for each group from 2^-3 to 2^3, against
// integer x in [-8, 8]: every product is a multiple of 2^-4 below 2^9 and every
// partial sum, in any order, stays under 2^18, so float32 holds each exactly
// and the result must equal the float64 reference to the bit. A code read
// from the wrong nibble, a scale applied to the wrong group or a group
// skipped changes the exact value. Rows of x from 1 (decode) to 97 (the
// tiled MXFP4 GEMM above 16 rows, kernels/cpu/mxfp4_gemm_cpu.cc: its 6-row
// tiles and the rows left over), k past one and several of its column blocks,
// and W of 300 rows, which threads split into panels, the last one ragged.
TEST(LinearMxfp4Test, GroupScalesAreExactOnIntegerInputs) {
  uint64_t seed = 3000;
  for (const int64_t k : {32, 96, 512, 544}) {
    for (const int64_t n : {1, 5, 300}) {
      const auto codes = testing::RandomTokens(n * k / 2, ++seed, 256);
      const auto powers = testing::RandomTokens(n * k / 32, ++seed, 7);
      std::vector<uint8_t> packed(codes.begin(), codes.end()), scales(powers.size());
      for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(124 + powers[i]);
      const std::vector<double> values =
          ref::DequantizeMxfp4Ref(packed.data(), scales.data(), n, k);
      const Tensor w{packed.data(), scales.data(), DType::kMxfp4, Device::kCpu, n, k};
      for (const int64_t m : {1, 2, 3, 4, 5, 8, 16, 17, 18, 23, 64, 97}) {
        SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k);
        const auto ints = testing::RandomTokens(m * k, ++seed, 17);
        std::vector<float> x(ints.size());
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(ints[i] - 8);
        GuardedBuffer<float> y(Device::kCpu, m * n);  // NaN until written
        Linear(Tensor::F32(x.data(), m, k), w, y.View(m, n));
        EXPECT_TRUE(testing::SameValues(y.Values(), Reference(x, values, m, n, k)));
        EXPECT_TRUE(y.GuardsIntact());
      }
    }
  }
}

// Every scale byte below float32's overflow, from 2^-127 (a subnormal half of
// it is the smallest value) to 2^125: row s of W has scale s. x's rows are
// unit vectors, so y[i, s] is the weight itself, and must be its exact value
// whichever column, code and scale; one row of x (decode), four, and seventeen
// (the widened panels).
TEST(LinearMxfp4Test, EveryScaleByteIsExact) {
  constexpr int64_t k = 64, n = 253;
  const auto codes = testing::RandomTokens(n * k / 2, 3100, 256);
  std::vector<uint8_t> packed(codes.begin(), codes.end()), scales(n * k / kMxfp4Group);
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t g = 0; g < k / kMxfp4Group; ++g)
      scales[s * (k / kMxfp4Group) + g] = static_cast<uint8_t>(s);
  }
  const std::vector<double> values = ref::DequantizeMxfp4Ref(packed.data(), scales.data(), n, k);
  const Tensor w{packed.data(), scales.data(), DType::kMxfp4, Device::kCpu, n, k};
  for (const int64_t m : {1, 4, 17}) {
    for (int64_t c0 = 0; c0 < k; c0 += m) {
      const int64_t rows = std::min(m, k - c0);
      SCOPED_TRACE(::testing::Message() << "m " << rows << " columns from " << c0);
      std::vector<float> x(rows * k, 0.0f);
      for (int64_t i = 0; i < rows; ++i) x[i * k + c0 + i] = 1.0f;
      GuardedBuffer<float> y(Device::kCpu, rows * n);
      Linear(Tensor::F32(x.data(), rows, k), w, y.View(rows, n));
      EXPECT_TRUE(testing::SameValues(y.Values(), Reference(x, values, rows, n, k)));
      EXPECT_TRUE(y.GuardsIntact());
    }
  }
}

// MXFP4 weights above 16 rows of x take the tiled GEMM at the vector levels
// (kernels/cpu/mxfp4_gemm_cpu.cc): x 6 rows at a time, outputs 64 (AVX-512)
// or 16 (AVX2) columns at a time, k in blocks of 128 (AVX-512) or 256 (AVX2)
// columns, W in panels of up to 256 rows that the threads share. Shapes on
// both sides of each edge: m not a multiple of 6; n short of, at and past a
// multiple of 16 and 64 and past one panel; k a multiple of 32 but not of
// either block, and several blocks; each overwriting (into NaN) and
// accumulating, x and y dense and strided with the columns around y's block
// left alone.
TEST(LinearMxfp4Test, TiledGemmEdgesMatchReference) {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{17, 1, 32},    {18, 16, 128},  {23, 17, 160},  {24, 63, 256},
                          {25, 64, 288},  {31, 65, 544},  {64, 130, 96},  {97, 257, 416},
                          {40, 300, 544}, {130, 520, 64}, {19, 513, 1056}};
  constexpr float kSentinel = 12345.0f;
  uint64_t seed = 4000;
  for (const Shape& s : shapes) {
    const TestWeight w = MakeWeight(DType::kMxfp4, s.n, s.k, ++seed);
    for (const bool strided : {false, true}) {
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "m " << s.m << " n " << s.n << " k " << s.k << " strided " << strided
                     << " accumulate " << accumulate);
        const int64_t ldx = s.k + (strided ? 5 : 0), ldy = s.n + (strided ? 7 : 0),
                      col = strided ? 3 : 0;  // y is columns [col, col + n) of [m, ldy]
        const auto xw = RandomFloats(s.m * ldx, ++seed);
        std::vector<float> x(s.m * s.k);  // the dense [m, k] view of xw
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t c = 0; c < s.k; ++c) x[i * s.k + c] = xw[i * ldx + c];
        const auto y0 = RandomFloats(s.m * s.n, ++seed);
        std::vector<float> yw0(s.m * ldy, kSentinel);
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t j = 0; j < s.n; ++j)
            yw0[i * ldy + col + j] = accumulate ? y0[i * s.n + j] : NAN;
        GuardedBuffer<float> out(Device::kCpu, s.m * ldy);
        out.Fill(yw0);
        Linear(Tensor::F32(xw.data(), s.m, s.k, ldx), w.tensor,
               out.View(s.m, ldy).Columns(col, s.n), accumulate);
        ASSERT_TRUE(out.GuardsIntact());
        const std::vector<float> yw = out.Values();
        auto want = Reference(x, w.values, s.m, s.n, s.k);
        std::vector<float> y(s.m * s.n);
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < ldy; ++j) {
            if (j >= col && j < col + s.n) {
              y[i * s.n + j - col] = yw[i * ldy + j];
              if (accumulate) want[i * s.n + j - col] += y0[i * s.n + j - col];
            } else {
              ASSERT_EQ(yw[i * ldy + j], kSentinel) << "row " << i << " col " << j;
            }
          }
        }
        EXPECT_TRUE(AllClose(y, want, Atol(s.k) + ReductionTolerance(1), ReductionTolerance(s.k)));
      }
    }
  }
}

// The opt-in bf16 compute on bf16 weights: above the skinny sizes, x is
// rounded to bf16 and the products summed in float32, so the float64
// reference on the rounded x bounds it as tightly as the float32 path. On a
// CPU without a bf16 matmul the same call computes in float32; CUDA always
// has one.
TEST_P(LinearBf16ComputeTest, MatchesReferenceOnRoundedActivations) {
  const bool bf16 = device() == Device::kCuda || Bf16ComputeAvailable();
  std::printf("bf16 matmul on this device: %s\n", bf16 ? "yes" : "no (float32 instead)");
  uint64_t seed = 5000;
  for (int64_t m : {17, 64, 130}) {
    for (int64_t n : {1, 33, 300}) {
      for (int64_t k : {16, 100, 512}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k);
          const auto x = RandomFloats(m * k, ++seed);
          TestWeight w = MakeWeight(DType::kBF16, n, k, ++seed);
          w.tensor.compute = DType::kBF16;
          std::vector<float> xr = x;
          if (bf16) {
            for (float& v : xr) {
              uint32_t bits;
              std::memcpy(&bits, &v, 4);
              bits += 0x7fffu + ((bits >> 16) & 1u);
              bits &= 0xffff0000u;
              std::memcpy(&v, &bits, 4);
            }
          }
          const auto y0 = accumulate ? RandomFloats(m * n, ++seed) : NaNs(m * n);
          auto y = Output<float>(m * n);
          y.Fill(y0);
          auto want = Reference(xr, w.values, m, n, k);
          if (accumulate) {
            for (int64_t i = 0; i < m * n; ++i) want[i] += y0[i];
          }
          const DeviceWeight dw = OnDevice(w, device());
          auto xd = Input(x);
          Linear(xd.View(m, w.tensor.cols), dw.tensor(), y.View(m, w.tensor.rows), accumulate);
          EXPECT_TRUE(
              AllClose(y.Values(), want, Atol(k) + ReductionTolerance(1), ReductionTolerance(k)));
          EXPECT_TRUE(y.GuardsIntact());
        }
      }
    }
  }
}

// The activations' rounding under bf16 compute is FloatToBf16 (kernels/bf16.h)
// exactly, ties to even and NaN included: through an identity weight each
// output is one rounded activation times 1, exact in float32. Without a bf16
// matmul the same call computes in float32 and gives x back unrounded.
TEST_P(LinearBf16ComputeTest, RoundsActivationsExactlyAsFloatToBf16) {
  const bool bf16 = device() == Device::kCuda || Bf16ComputeAvailable();
  const int64_t m = 40, k = 64;  // above the skinny sizes
  std::vector<uint16_t> eye(k * k, 0);
  for (int64_t i = 0; i < k; ++i) eye[i * k + i] = 0x3f80;  // 1.0
  const Tensor host_w{eye.data(), nullptr, DType::kBF16, Device::kCpu, k, k, DType::kBF16};
  std::vector<uint8_t> eye_bytes(eye.size() * 2);
  std::memcpy(eye_bytes.data(), eye.data(), eye_bytes.size());
  const DeviceWeight w(host_w, eye_bytes, {}, device());
  std::vector<float> x(m * k);
  uint64_t state = 77;
  for (int64_t i = 0; i < m * k; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t bits = static_cast<uint32_t>(state >> 32);
    // Every fourth value a tie (low half exactly 0x8000), odd and even.
    if (i % 4 == 0) bits = (bits & 0xffff0000u) | 0x8000u;
    // Normal magnitudes 2^-27 .. 2^12 (oneDNN flushes subnormals to zero).
    bits = (bits & 0x807fffffu) | ((100u + (bits >> 23) % 40u) << 23);
    std::memcpy(&x[i], &bits, sizeof(float));
  }
  x[5] = std::nanf("");  // row 0 becomes NaN throughout (NaN · 0 = NaN)
  auto out = Output<float>(m * k);
  auto xd = Input(x);
  Linear(xd.View(m, k), w.tensor(), out.View(m, k));
  EXPECT_TRUE(out.GuardsIntact());
  const std::vector<float> y = out.Values();
  for (int64_t j = 0; j < k; ++j) EXPECT_TRUE(std::isnan(y[j])) << j;
  for (int64_t i = k; i < m * k; ++i) {
    const float want = bf16 ? Bf16ToFloat(FloatToBf16(x[i])) : x[i];
    ASSERT_EQ(y[i], want) << "element " << i << " of x " << x[i];
  }
}

// LinearTest's names end in the weight dtype and the device (/f32_cpu).
DELTASERVE_INSTANTIATE_DEVICE_TEST_WITH_PARAM(
    LinearTest, ::testing::Values(DType::kF32, DType::kBF16, DType::kMxfp4), DTypeName);
INSTANTIATE_TEST_SUITE_P(, LinearCpuTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kMxfp4),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });
DELTASERVE_INSTANTIATE_DEVICE_TEST(LinearBf16ComputeTest);

// SmallGemm: c = (accumulate ? c : 0) + alpha · a · b with a in either layout
// (a_rs, a_cs), b and c at row strides wider than n (the extra columns of c
// must stay as they were), optionally a lower-triangular a. Sizes cover the
// 6-row blocks and the rows left over, 16- and 8-column panels and the
// scalar columns left over, and k = 0.
TEST(SmallGemmTest, MatchesReference) {
  uint64_t seed = 3000;
  int cases = 0;
  constexpr float kSentinel = 12345.0f;
  constexpr float kAlphas[] = {1.0f, -1.0f, 0.5f};
  for (int64_t m : {0, 1, 5, 6, 7, 13, 64}) {
    for (int64_t n : {1, 7, 8, 9, 16, 17, 40, 128}) {
      for (int64_t k : {0, 1, 8, 65, 128}) {
        for (bool transposed : {false, true}) {
          for (bool accumulate : {false, true}) {
            for (bool lower : {false, true}) {
              const float alpha = kAlphas[cases++ % 3];
              SCOPED_TRACE(::testing::Message()
                           << "m " << m << " n " << n << " k " << k << " transposed " << transposed
                           << " accumulate " << accumulate << " lower " << lower << " alpha "
                           << alpha);
              std::vector<float> dense_a = RandomFloats(m * k, ++seed);  // [m, k]
              if (lower) {
                for (int64_t i = 0; i < m; ++i)
                  for (int64_t p = i + 1; p < k; ++p) dense_a[i * k + p] = 0.0f;
              }
              // a as stored: [m, k] rows, or [k, m] rows (aᵀ) when transposed.
              std::vector<float> a(m * k);
              for (int64_t i = 0; i < m; ++i)
                for (int64_t p = 0; p < k; ++p)
                  a[transposed ? p * m + i : i * k + p] = dense_a[i * k + p];
              const int64_t a_rs = transposed ? 1 : k, a_cs = transposed ? m : 1;
              const int64_t ldb = n + 3, ldc = n + 5;
              const auto b = RandomFloats(k * ldb, ++seed);  // [k, ldb]
              std::vector<float> bt(n * k);                  // bᵀ, [n, k], for ref::Linear
              for (int64_t p = 0; p < k; ++p)
                for (int64_t j = 0; j < n; ++j) bt[j * k + p] = b[p * ldb + j];
              const auto c0 = RandomFloats(m * n, ++seed);
              std::vector<float> c_in(m * ldc, kSentinel);
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j)
                  c_in[i * ldc + j] = accumulate ? c0[i * n + j] : NAN;
              GuardedBuffer<float> guarded_c(Device::kCpu, m * ldc);
              guarded_c.Fill(c_in);
              DELTASERVE_CPU_DISPATCH(SmallGemm)
              (m, n, k, alpha, a.data(), a_rs, a_cs, b.data(), ldb, guarded_c.data(), ldc,
               accumulate, lower);
              ASSERT_TRUE(guarded_c.GuardsIntact());
              const std::vector<float> c = guarded_c.Values();
              auto want = Reference(dense_a, bt, m, n, k);
              std::vector<float> got(m * n);
              for (int64_t i = 0; i < m; ++i) {
                for (int64_t j = 0; j < ldc; ++j) {
                  if (j < n) {
                    got[i * n + j] = c[i * ldc + j];
                    want[i * n + j] = alpha * want[i * n + j] + (accumulate ? c0[i * n + j] : 0.0);
                  } else {
                    ASSERT_EQ(c[i * ldc + j], kSentinel) << "row " << i << " col " << j;
                  }
                }
              }
              EXPECT_TRUE(
                  AllClose(got, want, Atol(k) + ReductionTolerance(1), ReductionTolerance(k)));
            }
          }
        }
      }
    }
  }
}

// The KDA forward substitution's pattern: c and b are rows of one array,
// c's rows after b's, and the product reads only b's.
TEST(SmallGemmTest, OutputRowsAfterInputRowsOfOneArray) {
  constexpr int64_t kRows = 24, kDone = 16, kCols = 40;
  const auto l = RandomFloats((kRows - kDone) * kDone, 4000);       // [8, 16]
  const std::vector<float> v0 = RandomFloats(kRows * kCols, 4001);  // [24, 40]
  GuardedBuffer<float> guarded_v(Device::kCpu, kRows * kCols);
  guarded_v.Fill(v0);
  DELTASERVE_CPU_DISPATCH(SmallGemm)
  (kRows - kDone, kCols, kDone, -1.0f, l.data(), kDone, 1, guarded_v.data(), kCols,
   guarded_v.data() + kDone * kCols, kCols, /*accumulate=*/true, /*lower_a=*/false);
  EXPECT_TRUE(guarded_v.GuardsIntact());
  const std::vector<float> v = guarded_v.Values();
  const std::vector<float> done(v0.begin(), v0.begin() + kDone * kCols);
  std::vector<float> done_t(kCols * kDone);  // [40, 16]
  for (int64_t p = 0; p < kDone; ++p)
    for (int64_t j = 0; j < kCols; ++j) done_t[j * kDone + p] = done[p * kCols + j];
  std::vector<double> want = Reference(l, done_t, kRows - kDone, kCols, kDone);
  for (int64_t i = 0; i < (kRows - kDone) * kCols; ++i) want[i] = v0[kDone * kCols + i] - want[i];
  const std::vector<float> got(v.begin() + kDone * kCols, v.end());
  EXPECT_TRUE(AllClose(got, want, Atol(kDone) + ReductionTolerance(1), ReductionTolerance(kDone)));
  for (int64_t i = 0; i < kDone * kCols; ++i) ASSERT_EQ(v[i], v0[i]) << i;  // b's rows untouched
}

TEST(LinearDeathTest, EntryPointRefusesWrongShapeDtypeDeviceAndOverlap) {
  std::vector<float> x = RandomFloats(4 * 6, 1), w = RandomFloats(5 * 6, 2), y(4 * 5);
  const Tensor xv = Tensor::F32(x.data(), 4, 6), wv = Tensor::F32(w.data(), 5, 6);
  const MutableTensor yv = MutableTensor::F32(y.data(), 4, 5);
  Linear(xv, wv, yv);
  EXPECT_DEATH(Linear(Tensor::F32(x.data(), 4, 5), wv, yv),
               "x: shape \\[4, 5\\], expected \\[4, 6\\]");
  EXPECT_DEATH(Linear(xv, wv, MutableTensor::F32(y.data(), 4, 4)), "y: shape");
  Tensor x_bf16 = xv;
  x_bf16.dtype = DType::kBF16;
  EXPECT_DEATH(Linear(x_bf16, wv, yv), "x: dtype bf16, expected f32");
  Tensor w_i32 = wv;
  w_i32.dtype = DType::kI32;
  EXPECT_DEATH(Linear(xv, w_i32, yv), "w: dtype i32, but a weight is f32, bf16 or mxfp4");
  Tensor w_gpu = wv;
  w_gpu.device = Device::kCuda;
  EXPECT_DEATH(Linear(xv, w_gpu, yv), "w: device cuda");
  Tensor w_mxfp4 = wv;  // mxfp4 without scales
  w_mxfp4.dtype = DType::kMxfp4;
  EXPECT_DEATH(Linear(xv, w_mxfp4, yv), "w: mxfp4 needs cols a multiple of 32 and scales");
  EXPECT_DEATH(Linear(xv, wv, MutableTensor::F32(y.data(), 4, 5, 4)), "y: row stride 4");
  EXPECT_DEATH(Linear(Tensor::F32(x.data(), 2, 6), wv, MutableTensor::F32(x.data() + 6, 2, 5)),
               "Overlaps");
  // A group checks each product as Linear does, and that no product writes
  // what another reads or writes.
  std::vector<float> y2(4 * 5);
  const MutableTensor y2v = MutableTensor::F32(y2.data(), 4, 5);
  LinearGroup(std::vector<LinearProduct>{{xv, wv, yv}, {xv, wv, y2v}});
  EXPECT_DEATH(LinearGroup(std::vector<LinearProduct>{
                   {xv, wv, yv}, {xv, wv, y2v.Rows(0, 3)}, {Tensor::F32(x.data(), 4, 5), wv, y2v}}),
               "x: shape");
  EXPECT_DEATH(
      LinearGroup(std::vector<LinearProduct>{{xv, wv, yv}, {xv.Rows(0, 3), wv, yv.Rows(1, 3)}}),
      "Overlaps");
  EXPECT_DEATH(LinearGroup(std::vector<LinearProduct>{
                   {xv, wv, yv},
                   {Tensor::F32(y.data(), 1, 5), Tensor::F32(w.data(), 5, 5), y2v.Rows(0, 1)}}),
               "Overlaps");
}

}  // namespace
}  // namespace deltaserve::kernels

// kernels/cpu/balanced_blocks.h, which shares out the skinny kernel's blocks:
// every block runs exactly once whatever the team, in order when serial, and
// a thread held up in its share does not hold up the share's other blocks.
namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// How many times each block ran.
std::vector<int> Runs(int64_t blocks, bool parallel) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(blocks));
  ForEachBlockBalanced(blocks, parallel, [&](int64_t b) { runs[b].fetch_add(1); });
  std::vector<int> out;
  for (const auto& r : runs) out.push_back(r.load());
  return out;
}

// The kernels' thread count for a scope.
class TeamSize {
 public:
  explicit TeamSize(int threads) : saved_(NumThreads()) { SetNumThreads(threads); }
  ~TeamSize() { SetNumThreads(saved_); }

 private:
  int saved_;
};

TEST(BalancedBlocksTest, EveryBlockRunsOnceForEveryTeamSize) {
  for (const int threads : {1, 2, 3, 4, 7}) {
    const TeamSize team(threads);
    for (const int64_t blocks : {0, 1, 2, 3, 5, 8, 63, 1000}) {
      EXPECT_EQ(Runs(blocks, true), std::vector<int>(blocks, 1))
          << blocks << " blocks, " << threads << " threads";
    }
  }
}

TEST(BalancedBlocksTest, InsideAnotherRegionTheLoneThreadRunsEveryShare) {
  const TeamSize team(2);
  std::vector<std::vector<int>> runs(2);
#pragma omp parallel num_threads(2)
  runs[omp_get_thread_num()] = Runs(37, true);  // nested: a team of one, two shares
  for (const auto& r : runs) {
    if (!r.empty()) {
      EXPECT_EQ(r, std::vector<int>(37, 1));
    }
  }
}

TEST(BalancedBlocksTest, SerialRunsTheBlocksInOrderOnTheCallingThread) {
  const TeamSize team(4);
  std::vector<int64_t> order;
  ForEachBlockBalanced(9, false, [&](int64_t b) {
    EXPECT_EQ(omp_get_thread_num(), 0);
    order.push_back(b);
  });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
}

// The thread whose share holds block 0 waits in it until the last block of
// that share has run; only another thread can run it. Without taking from
// the back of a share this never ends, and the wait gives up after 30 s.
TEST(BalancedBlocksTest, AThreadHeldInItsShareDoesNotHoldUpTheRestOfIt) {
  const TeamSize team(2);
  constexpr int64_t kBlocks = 16;  // shares [0, 8) and [8, 16)
  std::atomic<bool> last_of_share_ran{false};
  std::atomic<int> runs{0};
  bool waited_out = false;
  ForEachBlockBalanced(kBlocks, true, [&](int64_t b) {
    runs.fetch_add(1);
    if (b == kBlocks / 2 - 1) last_of_share_ran.store(true);
    if (b != 0) return;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!last_of_share_ran.load()) {
      if (std::chrono::steady_clock::now() > give_up) {
        waited_out = true;
        return;
      }
      std::this_thread::yield();
    }
  });
  EXPECT_FALSE(waited_out);
  EXPECT_EQ(runs.load(), kBlocks);
}

}  // namespace
}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
