#include <cblas.h>

#include "kernels/check.h"
#include "kernels/gemm.h"

namespace deltaserve::kernels {
namespace {

// Up to this many rows, one sgemv per row beats sgemm's packing of W.
constexpr int64_t kMaxGemvRows = 2;

}  // namespace

void LinearStrided(const float* x, int64_t ldx, const float* w, int64_t m,
                   int64_t n, int64_t k, float* y, int64_t ldy,
                   bool accumulate) {
  DELTASERVE_CHECK(m >= 0 && n >= 0 && k >= 0 && ldx >= k && ldy >= n);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) y[i * ldy + j] = 0.0f;
    }
    return;
  }
  if (m <= kMaxGemvRows) {
    // Decode-sized: sgemm would pack (copy) all of W for one or two rows of
    // x; sgemv streams W once per row, which is what bounds this case.
    for (int64_t i = 0; i < m; ++i) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n),
                  static_cast<int>(k), 1.0f, w, static_cast<int>(k), x + i * ldx,
                  1, accumulate ? 1.0f : 0.0f, y + i * ldy, 1);
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.0f, x,
              static_cast<int>(ldx), w, static_cast<int>(k),
              accumulate ? 1.0f : 0.0f, y, static_cast<int>(ldy));
}

void Linear(const float* x, const float* w, int64_t m, int64_t n, int64_t k,
            float* y, bool accumulate) {
  LinearStrided(x, k, w, m, n, k, y, n, accumulate);
}

}  // namespace deltaserve::kernels
