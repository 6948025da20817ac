#include "kernels/cpu/gemm_cpu.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "kernels/check.h"
#include "kernels/cpu/simd.h"
#include "kernels/gemm.h"

namespace deltaserve::kernels {
namespace {

// Up to this many rows, one sgemv per row beats sgemm's packing of W.
constexpr int64_t kMaxGemvRows = 2;

#if DELTASERVE_CPU_AVX2
// From here up to this many rows (a batch of decode steps), the skinny kernel
// below beats sgemm, which packs (copies) all of W for a handful of rows.
constexpr int64_t kMaxSkinnyRows = 16;

// y[i, j] (+)= x[i, :] . w[j, :] for RW rows j0.. of W and MR rows i0.. of x:
// RW x MR dot products along k, 8 lanes at a time, each W row read once from
// memory for all MR rows of x.
template <int RW, int MR>
void SkinnyTile(const float* x, int64_t ldx, const float* w, int64_t k, float* y, int64_t ldy,
                bool accumulate) {
  __m256 acc[RW][MR];
  for (int r = 0; r < RW; ++r)
    for (int i = 0; i < MR; ++i) acc[r][i] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= k; c += 8) {
    __m256 xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = _mm256_loadu_ps(x + i * ldx + c);
    for (int r = 0; r < RW; ++r) {
      const __m256 wv = _mm256_loadu_ps(w + r * k + c);
      for (int i = 0; i < MR; ++i) acc[r][i] = _mm256_fmadd_ps(wv, xv[i], acc[r][i]);
    }
  }
  for (int r = 0; r < RW; ++r) {
    for (int i = 0; i < MR; ++i) {
      float sum = simd::HorizontalSum(acc[r][i]);
      for (int64_t t = c; t < k; ++t) sum += x[i * ldx + t] * w[r * k + t];
      float& out = y[i * ldy + r];
      out = accumulate ? out + sum : sum;
    }
  }
}

// Rows [i0, i0 + MR) of x against rows [j0, j1) of W.
template <int MR>
void SkinnyRows(const float* x, int64_t ldx, const float* w, int64_t j0, int64_t j1, int64_t k,
                float* y, int64_t ldy, bool accumulate) {
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    SkinnyTile<4, MR>(x, ldx, w + j * k, k, y + j, ldy, accumulate);
  }
  for (; j < j1; ++j) SkinnyTile<1, MR>(x, ldx, w + j * k, k, y + j, ldy, accumulate);
}

// 3..kMaxSkinnyRows rows: threads split W's rows; each thread takes x four
// rows at a time over its block of W, so W streams from memory once and the
// block is reused from cache for the other rows of x.
void SkinnyLinear(const float* x, int64_t ldx, const float* w, int64_t m, int64_t n, int64_t k,
                  float* y, int64_t ldy, bool accumulate) {
  // Blocks of W rows small enough to stay in L2 while x's rows pass over them.
  const int64_t block = std::max<int64_t>(4, (64 * 1024 / (4 * std::max<int64_t>(k, 1))) / 4 * 4);
  const int64_t blocks = (n + block - 1) / block;
#pragma omp parallel for schedule(static) if (blocks > 1 && n * k * m >= (1 << 16))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t j0 = b * block, j1 = std::min(n, j0 + block);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      SkinnyRows<4>(x + i * ldx, ldx, w, j0, j1, k, y + i * ldy, ldy, accumulate);
    }
    const int64_t rest = m - i;
    const float* xr = x + i * ldx;
    float* yr = y + i * ldy;
    if (rest == 3) SkinnyRows<3>(xr, ldx, w, j0, j1, k, yr, ldy, accumulate);
    if (rest == 2) SkinnyRows<2>(xr, ldx, w, j0, j1, k, yr, ldy, accumulate);
    if (rest == 1) SkinnyRows<1>(xr, ldx, w, j0, j1, k, yr, ldy, accumulate);
  }
}
#else
constexpr int64_t kMaxSkinnyRows = 0;  // no AVX2/FMA: sgemm for every size
#endif

// SmallGemm's register blocks (kernels/cpu/gemm_cpu.h says what it is for).
#if DELTASERVE_CPU_AVX2
constexpr int64_t kMr = 6;  // rows of c per block

// An mr x (8·NV) block of c kept in registers over the whole p loop.
template <int MR, int NV>
void MicroKernel(int64_t k, float alpha, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < k; ++p) {
    __m256 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(b + p * ldb + 8 * v);
    const float* ap = a + p * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(ap + r * a_rs);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) {
        acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
      }
    }
  }
  const __m256 al = _mm256_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + 8 * v;
      _mm256_storeu_ps(cp, accumulate ? _mm256_fmadd_ps(al, acc[r][v], _mm256_loadu_ps(cp))
                                      : _mm256_mul_ps(al, acc[r][v]));
    }
  }
}

template <int NV>
void MicroRows(int64_t mr, int64_t k, float alpha, const float* a, int64_t a_rs, int64_t a_cs,
               const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  switch (mr) {
    case 6:
      return MicroKernel<6, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    case 5:
      return MicroKernel<5, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    case 4:
      return MicroKernel<4, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    case 3:
      return MicroKernel<3, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    case 2:
      return MicroKernel<2, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    default:
      return MicroKernel<1, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
  }
}

template <int NV>
void ColumnPanel(int64_t m, int64_t k, float alpha, const float* a, int64_t a_rs, int64_t a_cs,
                 const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                 bool lower_a) {
  for (int64_t i0 = 0; i0 < m; i0 += kMr) {
    const int64_t mr = std::min(kMr, m - i0);
    const int64_t k_rows = lower_a ? std::min(k, i0 + mr) : k;
    MicroRows<NV>(mr, k_rows, alpha, a + i0 * a_rs, a_rs, a_cs, b, ldb, c + i0 * ldc, ldc,
                  accumulate);
  }
}
#endif  // DELTASERVE_CPU_AVX2

}  // namespace

void SmallGemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_rs,
               int64_t a_cs, const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
               bool lower_a) {
  int64_t j = 0;
#if DELTASERVE_CPU_AVX2
  for (; j + 16 <= n; j += 16) {
    ColumnPanel<2>(m, k, alpha, a, a_rs, a_cs, b + j, ldb, c + j, ldc, accumulate, lower_a);
  }
  for (; j + 8 <= n; j += 8) {
    ColumnPanel<1>(m, k, alpha, a, a_rs, a_cs, b + j, ldb, c + j, ldc, accumulate, lower_a);
  }
#endif
  if (j == n) return;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t k_row = lower_a ? std::min(k, i + 1) : k;
    float* ci = c + i * ldc;
    for (int64_t jj = j; jj < n; ++jj) {
      float sum = 0.0f;
      for (int64_t p = 0; p < k_row; ++p) {
        sum += a[i * a_rs + p * a_cs] * b[p * ldb + jj];
      }
      ci[jj] = accumulate ? ci[jj] + alpha * sum : alpha * sum;
    }
  }
}

void LinearStrided(const float* x, int64_t ldx, const float* w, int64_t m, int64_t n, int64_t k,
                   float* y, int64_t ldy, bool accumulate) {
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
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, w,
                  static_cast<int>(k), x + i * ldx, 1, accumulate ? 1.0f : 0.0f, y + i * ldy, 1);
    }
    return;
  }
#if DELTASERVE_CPU_AVX2
  if (m <= kMaxSkinnyRows) {
    SkinnyLinear(x, ldx, w, m, n, k, y, ldy, accumulate);
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x, static_cast<int>(ldx), w, static_cast<int>(k),
              accumulate ? 1.0f : 0.0f, y, static_cast<int>(ldy));
}

void Linear(const float* x, const float* w, int64_t m, int64_t n, int64_t k, float* y,
            bool accumulate) {
  LinearStrided(x, k, w, m, n, k, y, n, accumulate);
}

}  // namespace deltaserve::kernels
