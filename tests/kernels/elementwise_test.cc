// kernels/elementwise.h against the float64 reference, and bit for bit
// against the scalar expressions the layers computed before.
#include "kernels/elementwise.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/elementwise_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::AllClose;
using testing::DeviceTest;
using testing::RandomFloats;
using testing::ToDouble;
using testing::WithoutStride;
using testing::WithStride;

// One float addition: within half an ulp of the exact sum, so one epsilon
// relative. The sigmoids: expf (within an ulp), the add and the division,
// each half an ulp, and the product for the gate: 8 epsilons leaves room.
// The absolute part covers the underflow tail, where 1 / (1 + inf) = 0
// against an exact value below 1e-38.
constexpr double kAddRtol = std::numeric_limits<float>::epsilon();
constexpr double kSigmoidRtol = 8 * std::numeric_limits<float>::epsilon();
constexpr double kAtol = 1e-37;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

enum class Op { kAdd, kSigmoidGate, kSigmoid };

// The expressions of kernels/elementwise.h as the layers wrote them.
float Expected(Op op, float a, float b) {
  switch (op) {
    case Op::kAdd:
      return a + b;
    case Op::kSigmoidGate:
      return a * (1.0f / (1.0f + std::exp(-b)));
    case Op::kSigmoid:
      break;
  }
  return 1.0f / (1.0f + std::exp(-a));
}

std::vector<double> Reference(Op op, const std::vector<float>& a, const std::vector<float>& b) {
  const auto da = ToDouble(a), db = ToDouble(b);
  std::vector<double> want(a.size());
  const auto n = static_cast<int64_t>(a.size());
  switch (op) {
    case Op::kAdd:
      ref::Add(da.data(), db.data(), n, want.data());
      break;
    case Op::kSigmoidGate:
      ref::SigmoidGate(da.data(), db.data(), n, want.data());
      break;
    case Op::kSigmoid:
      ref::Sigmoid(da.data(), n, want.data());
      break;
  }
  return want;
}

void RunOp(Op op, const Tensor& a, const Tensor& b, const MutableTensor& out) {
  switch (op) {
    case Op::kAdd:
      return Add(a, b, out);
    case Op::kSigmoidGate:
      return SigmoidGate(a, b, out);
    case Op::kSigmoid:
      return Sigmoid(a, out);
  }
}

const char* Name(Op op) {
  return op == Op::kAdd ? "Add" : op == Op::kSigmoidGate ? "SigmoidGate" : "Sigmoid";
}

class ElementwiseTest : public DeviceTest {};

// Every shape at contiguous and strided layouts of inputs and output; the
// gaps of a strided output must stay unwritten.
TEST_P(ElementwiseTest, MatchesReferenceOverShapes) {
  uint64_t seed = 1;
  for (Op op : {Op::kAdd, Op::kSigmoidGate, Op::kSigmoid}) {
    for (int64_t rows : {0, 1, 2, 5, 33}) {
      for (int64_t cols : {0, 1, 3, 7, 8, 9, 16, 100, 1000}) {
        for (int64_t pad : {0, 3}) {
          SCOPED_TRACE(::testing::Message()
                       << Name(op) << " rows " << rows << " cols " << cols << " pad " << pad);
          const int64_t stride = cols + pad;
          // Wide enough for both tails of the sigmoid.
          const auto a = RandomFloats(rows * cols, ++seed, -40.0f, 40.0f);
          const auto b = RandomFloats(rows * cols, ++seed, -40.0f, 40.0f);
          const auto sa = WithStride(a, rows, cols, stride, kNaN);
          const auto sb = WithStride(b, rows, cols, stride + 1, kNaN);
          auto out = Output<float>(rows * stride);
          auto da = Input(sa), db = Input(sb);
          RunOp(op, da.View(rows, cols, pad ? stride : 0), db.View(rows, cols, stride + 1),
                out.View(rows, cols, pad ? stride : 0));
          const auto values = out.Values();
          const double rtol = op == Op::kAdd ? kAddRtol : kSigmoidRtol;
          EXPECT_TRUE(AllClose(WithoutStride(values, rows, cols, stride), Reference(op, a, b),
                               kAtol, rtol));
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = cols; c < stride; ++c) EXPECT_TRUE(std::isnan(values[r * stride + c]));
          }
          EXPECT_TRUE(out.GuardsIntact());
        }
      }
    }
  }
}

// The same bits as the scalar loops the layers ran, over random values and
// the edges of exp: overflow, underflow, zeros, infinities, NaN.
TEST_P(ElementwiseTest, BitForBitTheScalarExpression) {
  const float big = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> a = RandomFloats(4099, 5, -100.0f, 100.0f);
  std::vector<float> b = RandomFloats(4099, 6, -100.0f, 100.0f);
  const std::vector<float> edges = {0.0f,  -0.0f,  1e-30f, -1e-30f, 88.7f, -88.7f, 89.0f, -89.0f,
                                    104.f, -104.f, big,    -big,    inf,   -inf,   kNaN,  1e-45f};
  for (float e : edges) {
    for (float f : edges) {
      a.push_back(e);
      b.push_back(f);
    }
  }
  const auto n = static_cast<int64_t>(a.size());
  auto da = Input(a), db = Input(b);
  for (Op op : {Op::kAdd, Op::kSigmoidGate, Op::kSigmoid}) {
    auto out = Output<float>(n);
    RunOp(op, da.View(1, n), db.View(1, n), out.View(1, n));
    const auto values = out.Values();
    for (int64_t i = 0; i < n; ++i) {
      const float want = Expected(op, a[i], b[i]);
      uint32_t got_bits, want_bits;
      std::memcpy(&got_bits, &values[i], 4);
      std::memcpy(&want_bits, &want, 4);
      // NaN results compare as NaN: their payload is the hardware's.
      if (std::isnan(want) && std::isnan(values[i])) continue;
      ASSERT_EQ(got_bits, want_bits) << Name(op) << " a " << a[i] << " b " << b[i];
    }
    EXPECT_TRUE(out.GuardsIntact());
  }
}

// The output may be exactly an input; the result is that of a separate one.
TEST_P(ElementwiseTest, InPlace) {
  const int64_t rows = 7, cols = 300, stride = 301;
  const auto a = WithStride(RandomFloats(rows * cols, 11, -8.0f, 8.0f), rows, cols, stride, kNaN);
  const auto b = WithStride(RandomFloats(rows * cols, 12, -8.0f, 8.0f), rows, cols, stride, kNaN);
  auto da = Input(a), db = Input(b);
  const Tensor av = da.View(rows, cols, stride);
  const Tensor bv = db.View(rows, cols, stride);
  for (Op op : {Op::kAdd, Op::kSigmoidGate, Op::kSigmoid}) {
    auto apart = Output<float>(rows * stride);
    RunOp(op, av, bv, apart.View(rows, cols, stride));
    auto in_a = Output<float>(rows * stride);
    in_a.Fill(a);
    const MutableTensor va = in_a.View(rows, cols, stride);
    RunOp(op, va, bv, va);
    EXPECT_EQ(
        0, std::memcmp(in_a.Values().data(), apart.Values().data(), sizeof(float) * rows * stride))
        << Name(op) << " into a";
    EXPECT_TRUE(in_a.GuardsIntact());
    if (op == Op::kAdd) {
      auto in_b = Output<float>(rows * stride);
      in_b.Fill(b);
      const MutableTensor vb = in_b.View(rows, cols, stride);
      Add(av, vb, vb);
      EXPECT_EQ(0, std::memcmp(in_b.Values().data(), apart.Values().data(),
                               sizeof(float) * rows * stride))
          << "Add into b";
      EXPECT_TRUE(in_b.GuardsIntact());
    }
  }
}

// A [rows, cols] f32 view at `data` on `device`.
MutableTensor On(Device device, float* data, int64_t rows, int64_t cols) {
  MutableTensor view = MutableTensor::F32(data, rows, cols);
  view.device = device;
  return view;
}

TEST_P(ElementwiseTest, EmptyIsNoOp) {
  const Device d = device();
  Add(On(d, nullptr, 0, 16), On(d, nullptr, 0, 16), On(d, nullptr, 0, 16));
  SigmoidGate(On(d, nullptr, 4, 0), On(d, nullptr, 4, 0), On(d, nullptr, 4, 0));
  Sigmoid(On(d, nullptr, 0, 0), On(d, nullptr, 0, 0));
}

TEST_P(ElementwiseTest, RefusesPartialOverlap) {
  auto buffer = Input(std::vector<float>(64, 1.0f));
  float* x = buffer.View(1, 64).As<float>();
  const Device d = device();
  // out starts one element into a: neither in place nor apart.
  EXPECT_DEATH(Add(On(d, x, 2, 16), On(d, x + 32, 2, 16), On(d, x + 1, 2, 16)),
               "SameOrApart\\(a, out\\)");
  EXPECT_DEATH(SigmoidGate(On(d, x, 2, 16), On(d, x + 32, 2, 16), On(d, x + 32, 2, 16)),
               "Overlaps\\(gate, out\\)");
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(ElementwiseTest);

}  // namespace
}  // namespace deltaserve::kernels
