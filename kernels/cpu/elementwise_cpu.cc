// Elementwise f32 ops, one scalar expression per element as
// kernels/elementwise.h writes it: the layers' loops they replace computed
// exactly that, and a vector exp (kernels/cpu/simd.h) would change bits. The
// compiler vectorises the add; the sigmoids call the library's expf.
//
// In place is allowed, so the pointers are not restrict; each element is read
// before it is written.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/ops.h"
#include "kernels/elementwise.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Below this many elements an OpenMP fork costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

bool Parallel(int64_t rows, int64_t cols) {
  return rows > 1 && rows * cols >= kParallelMinElements;
}

}  // namespace

void Add(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows, int64_t cols,
         float* out, int64_t ldo) {
#pragma omp parallel for schedule(static) if (Parallel(rows, cols))
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * lda;  // [cols]
    const float* br = b + r * ldb;  // [cols]
    float* o = out + r * ldo;       // [cols]
    for (int64_t c = 0; c < cols; ++c) o[c] = ar[c] + br[c];
  }
}

void SigmoidGate(const float* x, int64_t ldx, const float* gate, int64_t ldg, int64_t rows,
                 int64_t cols, float* out, int64_t ldo) {
#pragma omp parallel for schedule(static) if (Parallel(rows, cols))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;     // [cols]
    const float* gr = gate + r * ldg;  // [cols]
    float* o = out + r * ldo;          // [cols]
    for (int64_t c = 0; c < cols; ++c) o[c] = xr[c] * (1.0f / (1.0f + std::exp(-gr[c])));
  }
}

void Sigmoid(const float* x, int64_t ldx, int64_t rows, int64_t cols, float* out, int64_t ldo) {
#pragma omp parallel for schedule(static) if (Parallel(rows, cols))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;  // [cols]
    float* o = out + r * ldo;       // [cols]
    for (int64_t c = 0; c < cols; ++c) o[c] = 1.0f / (1.0f + std::exp(-xr[c]));
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
