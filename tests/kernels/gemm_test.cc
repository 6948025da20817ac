// kernels/gemm.h (OpenBLAS sgemm and the skinny kernel) and SmallGemm of
// kernels/cpu/gemm_cpu.h against the float64 reference.
#include "kernels/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/gemm_cpu.h"
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
              std::vector<float> c(m * ldc, kSentinel);
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = accumulate ? c0[i * n + j] : NAN;
              SmallGemm(m, n, k, alpha, a.data(), a_rs, a_cs, b.data(), ldb, c.data(), ldc,
                        accumulate, lower);
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
  const auto l = RandomFloats((kRows - kDone) * kDone, 4000);  // [8, 16]
  std::vector<float> v = RandomFloats(kRows * kCols, 4001);    // [24, 40]
  const std::vector<float> v0 = v;
  SmallGemm(kRows - kDone, kCols, kDone, -1.0f, l.data(), kDone, 1, v.data(), kCols,
            v.data() + kDone * kCols, kCols, /*accumulate=*/true);
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

}  // namespace
}  // namespace deltaserve::kernels
