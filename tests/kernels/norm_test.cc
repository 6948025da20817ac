// kernels/norm.h against the float64 reference.
#include "kernels/norm.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/norm_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::AllClose;
using testing::DeviceTest;
using testing::RandomFloats;
using testing::ReductionTolerance;
using testing::ToDouble;

constexpr int64_t kRows[] = {1, 3, 17, 64};
// 4100 rows x 17 and 300 x 4096 below cross the OpenMP threshold.
constexpr int64_t kDims[] = {1, 3, 7, 8, 17, 64, 129, 4096};

class RmsNormTest : public DeviceTest {};
class L2NormTest : public DeviceTest {};
class NormDeathTest : public DeviceTest {};

// The sum of squares is a reduction over dim; the scaled write adds a few
// roundings, covered by ReductionTolerance's safety factor.
TEST_P(RmsNormTest, MatchesReference) {
  uint64_t seed = 1;
  for (int64_t rows : kRows) {
    for (int64_t dim : kDims) {
      for (bool gain : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "rows " << rows << " dim " << dim << " gain " << gain);
        const auto x = RandomFloats(rows * dim, ++seed, -2.0f, 2.0f);
        const auto w = RandomFloats(dim, ++seed, 0.5f, 1.5f);
        const float eps = 1e-6f;
        auto y = Output<float>(rows * dim);
        auto xd = Input(x), w_device = Input(w);
        RmsNorm(xd.View(rows, dim), gain ? Tensor(w_device.View(1, dim)) : Tensor{}, eps,
                y.View(rows, dim));
        std::vector<double> want(rows * dim);
        const auto wd = ToDouble(w);
        ref::RmsNorm(ToDouble(x).data(), gain ? wd.data() : nullptr, rows, dim, eps, want.data());
        const double tol = ReductionTolerance(dim);
        EXPECT_TRUE(AllClose(y.Values(), want, tol, tol));
        EXPECT_TRUE(y.GuardsIntact());
      }
    }
  }
}

TEST_P(RmsNormTest, InPlaceAndThreaded) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{4100, 17}, {300, 4096}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " dim " << dim);
    auto x = Output<float>(rows * dim);  // in place: guarded as an output
    x.Fill(RandomFloats(rows * dim, 7 + rows));
    const auto w = RandomFloats(dim, 8 + dim, 0.5f, 1.5f);
    auto wd = Input(w);
    std::vector<double> want(rows * dim);
    ref::RmsNorm(ToDouble(x.Values()).data(), ToDouble(w).data(), rows, dim, 1e-5f, want.data());
    RmsNorm(x.View(rows, dim), wd.View(1, dim), 1e-5f, x.View(rows, dim));
    const double tol = ReductionTolerance(dim);
    EXPECT_TRUE(AllClose(x.Values(), want, tol, tol));
    EXPECT_TRUE(x.GuardsIntact());
  }
}

// A column block of wider rows (MLA's latent c inside [c | kr]), in place:
// each row is normalised as it would be alone, to the bit, and the other
// columns are untouched.
TEST_P(RmsNormTest, StridedColumnBlockInPlace) {
  for (int64_t rows : {1, 5, 200}) {
    const int64_t dim = 16, width = 20;
    auto x = Output<float>(rows * width);
    const std::vector<float> given = RandomFloats(rows * width, 40 + rows);
    x.Fill(given);
    auto wd = Input(RandomFloats(dim, 41, 0.5f, 1.5f));
    const MutableTensor block = x.View(rows, width).Columns(0, dim);
    RmsNorm(block, wd.View(1, dim), 1e-6f, block);
    const std::vector<float> got = x.Values();
    for (int64_t r = 0; r < rows; ++r) {
      auto alone =
          Input(std::vector<float>(given.begin() + r * width, given.begin() + r * width + dim));
      RmsNorm(alone.View(1, dim), wd.View(1, dim), 1e-6f, alone.View(1, dim));
      const std::vector<float> normalised = alone.Values();
      for (int64_t c = 0; c < width; ++c) {
        const float want = c < dim ? normalised[c] : given[r * width + c];
        ASSERT_EQ(got[r * width + c], want) << "row " << r << " column " << c;
      }
    }
    EXPECT_TRUE(x.GuardsIntact());
  }
}

// Squares of 1e20 overflow float32; the accumulation must not.
TEST_P(RmsNormTest, HugeAndTinyRows) {
  const int64_t dim = 256;
  for (float scale : {1e20f, 1e-20f}) {
    auto x = RandomFloats(dim, 3);
    for (float& v : x) v *= scale;
    auto y = Output<float>(dim);
    auto xd = Input(x);
    RmsNorm(xd.View(1, dim), Tensor{}, 0.0f, y.View(1, dim));
    std::vector<double> want(dim);
    ref::RmsNorm(ToDouble(x).data(), nullptr, 1, dim, 0.0, want.data());
    const double tol = ReductionTolerance(dim);
    EXPECT_TRUE(AllClose(y.Values(), want, tol, tol)) << "scale " << scale;
    EXPECT_TRUE(y.GuardsIntact());
  }
}

// An all-zero row normalises to zeros (eps keeps it finite).
TEST_P(RmsNormTest, ZeroRowIsZero) {
  auto x = Input(std::vector<float>(5, 0.0f));
  auto y = Output<float>(5);
  RmsNorm(x.View(1, 5), Tensor{}, 1e-6f, y.View(1, 5));
  for (float v : y.Values()) EXPECT_EQ(v, 0.0f);
  EXPECT_TRUE(y.GuardsIntact());
}

TEST_P(L2NormTest, MatchesReference) {
  uint64_t seed = 100;
  for (int64_t rows : kRows) {
    for (int64_t dim : kDims) {
      for (float scale : {1.0f, 0.125f}) {
        SCOPED_TRACE(::testing::Message()
                     << "rows " << rows << " dim " << dim << " scale " << scale);
        const auto x = RandomFloats(rows * dim, ++seed);
        auto y = Output<float>(rows * dim);
        auto xd = Input(x);
        L2Norm(xd.View(rows, dim), 1e-6f, scale, y.View(rows, dim));
        std::vector<double> want(rows * dim);
        ref::L2Norm(ToDouble(x).data(), rows, dim, static_cast<double>(1e-6f), scale, want.data());
        // Outputs are O(scale / sqrt(dim)): the absolute part scales too.
        const double tol = ReductionTolerance(dim);
        EXPECT_TRUE(AllClose(y.Values(), want, tol * scale, tol));
        EXPECT_TRUE(y.GuardsIntact());
      }
    }
  }
}

TEST_P(L2NormTest, InPlaceAndThreaded) {
  const int64_t rows = 2000, dim = 128;  // KDA: one row per head and token
  auto x = Output<float>(rows * dim);    // in place: guarded as an output
  x.Fill(RandomFloats(rows * dim, 11));
  std::vector<double> want(rows * dim);
  const double scale = 1.0 / std::sqrt(128.0);
  ref::L2Norm(ToDouble(x.Values()).data(), rows, dim, static_cast<double>(1e-6f),
              static_cast<float>(scale), want.data());
  L2Norm(x.View(rows, dim), 1e-6f, static_cast<float>(scale), x.View(rows, dim));
  const double tol = ReductionTolerance(dim);
  EXPECT_TRUE(AllClose(x.Values(), want, tol, tol));
  EXPECT_TRUE(x.GuardsIntact());
}

// The entry point checks the whole contract before any variant runs: each
// wrong argument aborts with a message naming it and what is wrong.
TEST_P(NormDeathTest, EntryPointRefusesWrongShapeDtypeDeviceAndOverlap) {
  auto x = Input(RandomFloats(3 * 8, 1)), w = Input(RandomFloats(8, 2));
  auto big = Output<float>(4 * 8);
  const Tensor xv = x.View(3, 8), wv = w.View(1, 8);
  auto guarded = Output<float>(3 * 8);
  const MutableTensor yv = guarded.View(3, 8);
  RmsNorm(xv, wv, 1e-6f, yv);  // the valid call, for contrast
  EXPECT_TRUE(guarded.GuardsIntact());
  EXPECT_DEATH(RmsNorm(xv, w.View(1, 7), 1e-6f, yv), "w: shape \\[1, 7\\], expected \\[1, 8\\]");
  EXPECT_DEATH(RmsNorm(x.View(2, 8), wv, 1e-6f, yv), "x: shape \\[2, 8\\]");
  Tensor bf16 = xv;
  bf16.dtype = DType::kBF16;
  EXPECT_DEATH(RmsNorm(bf16, wv, 1e-6f, yv), "x: dtype bf16, expected f32");
  // A view on the other device: refused by name, and on the CPU a CUDA
  // output without a backend says so.
  MutableTensor elsewhere = yv;
  elsewhere.device = device() == Device::kCpu ? Device::kCuda : Device::kCpu;
  EXPECT_DEATH(RmsNorm(xv, wv, 1e-6f, elsewhere),
               "(y: device cuda, but no CUDA backend is active|x: device (cpu|cuda), but the op "
               "runs on the (cuda|cpu))");
  EXPECT_DEATH(L2Norm(xv, 1e-6f, 1.0f, big.View(3, 8, 9)), "y: row stride 9");
  // In place is allowed; a shifted overlap is not.
  RmsNorm(xv, wv, 1e-6f, x.View(3, 8));
  EXPECT_DEATH(RmsNorm(big.View(3, 8), wv, 1e-6f, big.View(4, 8).Rows(1, 3)), "Overlaps");
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(RmsNormTest);
DELTASERVE_INSTANTIATE_DEVICE_TEST(L2NormTest);
DELTASERVE_INSTANTIATE_DEVICE_TEST(NormDeathTest);

}  // namespace
}  // namespace deltaserve::kernels
