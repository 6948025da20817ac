// kernels/gemm.h (OpenBLAS sgemm) against the float64 reference.
#include "kernels/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/gemm_ref.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::AllClose;
using testing::NaNs;
using testing::RandomFloats;
using testing::ReductionTolerance;
using testing::ToDouble;

// 1 and 2 take the sgemv path, 3 to 16 the skinny kernel (4-row tiles and
// the 1-3 rows left over; 4-row blocks of W and the rows left over; k in
// 8-lane steps and a tail), 17 and up sgemm.
constexpr int64_t kSizes[] = {0, 1, 2, 3, 5, 8, 13, 16, 17, 64, 129};

// Inputs in [-1, 1): each product is ~1/3 and partial sums grow like sqrt(k),
// so the absolute error is ReductionTolerance(k) times that sqrt(k) scale.
double Atol(int64_t k) {
  return ReductionTolerance(k) * std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)));
}

std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                              int64_t n, int64_t k) {
  std::vector<double> y(m * n);
  ref::Linear(ToDouble(x).data(), ToDouble(w).data(), m, n, k, y.data());
  return y;
}

TEST(LinearTest, MatchesReference) {
  uint64_t seed = 1;
  for (int64_t m : kSizes) {
    for (int64_t n : kSizes) {
      for (int64_t k : kSizes) {
        SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k);
        const auto x = RandomFloats(m * k, ++seed);
        const auto w = RandomFloats(n * k, ++seed);
        auto y = NaNs(m * n);  // k == 0 must still write zeros
        Linear(x.data(), w.data(), m, n, k, y.data());
        EXPECT_TRUE(AllClose(y, Reference(x, w, m, n, k), Atol(k), ReductionTolerance(k)));
      }
    }
  }
}

TEST(LinearTest, Accumulates) {
  uint64_t seed = 1000;
  for (int64_t m : {1, 2, 3, 7, 16, 17, 64}) {
    for (int64_t n : {1, 3, 129}) {
      for (int64_t k : {0, 1, 17, 129}) {
        SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k);
        const auto x = RandomFloats(m * k, ++seed);
        const auto w = RandomFloats(n * k, ++seed);
        auto y = RandomFloats(m * n, ++seed);
        auto want = Reference(x, w, m, n, k);
        for (int64_t i = 0; i < m * n; ++i) want[i] += y[i];
        Linear(x.data(), w.data(), m, n, k, y.data(), /*accumulate=*/true);
        EXPECT_TRUE(AllClose(y, want, Atol(k) + ReductionTolerance(1), ReductionTolerance(k)));
      }
    }
  }
}

// Column blocks of wider rows: reads x with row stride ldx, writes y with row
// stride ldy, and leaves the other columns of y alone.
TEST(LinearStridedTest, MatchesReferenceAndKeepsOtherColumns) {
  uint64_t seed = 2000;
  constexpr float kSentinel = 12345.0f;
  for (int64_t m : kSizes) {
    for (int64_t n : kSizes) {
      for (int64_t k : kSizes) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << "m " << m << " n " << n << " k " << k << " accumulate " << accumulate);
          const int64_t ldx = k + 3, ldy = n + 5,
                        col = 2;                          // y block at column 2
          const auto xw = RandomFloats(m * ldx, ++seed);  // [m, ldx]
          const auto w = RandomFloats(n * k, ++seed);
          std::vector<float> x(m * k);  // the dense [m, k] view of xw
          for (int64_t i = 0; i < m; ++i)
            for (int64_t c = 0; c < k; ++c) x[i * k + c] = xw[i * ldx + c];
          std::vector<float> yw(m * ldy, kSentinel);
          const auto y0 = RandomFloats(m * n, ++seed);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              yw[i * ldy + col + j] = accumulate ? y0[i * n + j] : NAN;
            }
          }
          LinearStrided(xw.data(), ldx, w.data(), m, n, k, yw.data() + col, ldy, accumulate);
          auto want = Reference(x, w, m, n, k);
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

}  // namespace
}  // namespace deltaserve::kernels
