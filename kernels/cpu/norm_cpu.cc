// Fast float32 RMSNorm and L2Norm: one pass for the sum of squares, one for
// the scaled write, rows spread over OpenMP threads when there are enough.
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/norm.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Below this many elements an OpenMP fork costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

// Sum of squares in double: float squares overflow for |x| > 1.8e19 and a
// long float sum loses digits. Eight independent lanes keep it vectorisable
// (a single accumulator would serialise on the add latency).
double SumSquares(const float* x, int64_t dim) {
  double lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const double v = x[i + l];
      lane[l] += v * v;
    }
  }
  double tail = 0.0;
  for (; i < dim; ++i) {
    const double v = x[i];
    tail += v * v;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) +
         tail;
}

// y = x * s (* w). Safe in place: each element is read before it is written.
void ScaleRow(const float* x, const float* w, int64_t dim, float s, float* y) {
  if (w != nullptr) {
    for (int64_t i = 0; i < dim; ++i) y[i] = x[i] * s * w[i];
  } else {
    for (int64_t i = 0; i < dim; ++i) y[i] = x[i] * s;
  }
}

}  // namespace

void RmsNorm(const float* x, int64_t ldx, const float* w, int64_t rows, int64_t dim, float eps,
             float* y, int64_t ldy) {
  if (rows == 0 || dim == 0) return;
  const bool parallel = rows > 1 && rows * dim >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    const double mean = SumSquares(xr, dim) / static_cast<double>(dim);
    const float s = static_cast<float>(1.0 / std::sqrt(mean + eps));
    ScaleRow(xr, w, dim, s, y + r * ldy);
  }
}

void L2Norm(const float* x, int64_t rows, int64_t dim, float eps, float scale, float* y) {
  if (rows == 0 || dim == 0) return;
  const bool parallel = rows > 1 && rows * dim >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float s = static_cast<float>(scale / std::sqrt(SumSquares(xr, dim) + eps));
    ScaleRow(xr, nullptr, dim, s, y + r * dim);
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
