// Elementwise f32 ops on the GPU, one float expression per element as
// kernels/elementwise.h writes it. A 2-D grid: x tiles a row's columns
// (consecutive threads, consecutive addresses: coalesced at any row stride),
// y walks the rows, striding by gridDim.y past 65535. The sigmoids take exp
// from HostExpf (kernels/cuda/host_expf.h), glibc's expf in double, so the
// bits match the CPU variant's std::exp; the add and the division are IEEE.
// In place is safe: each thread reads its element before writing it.
#include "kernels/cuda/compat.h"
#include "kernels/cuda/host_expf.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

enum Op : int { kAdd, kSigmoidGate, kSigmoid };

// out[r, c] = op(a[r, c], b[r, c]); b is unused for kSigmoid.
__global__ void __launch_bounds__(kThreads)
    ElementwiseKernel(int op, const float* a, int64_t lda, const float* b, int64_t ldb,
                      int64_t rows, int64_t cols, float* out, int64_t ldo) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float x = a[r * lda + c];
    float y;
    if (op == kAdd) {
      y = x + b[r * ldb + c];
    } else if (op == kSigmoidGate) {
      y = x * (1.0f / (1.0f + HostExpf(-b[r * ldb + c])));
    } else {
      y = 1.0f / (1.0f + HostExpf(-x));
    }
    out[r * ldo + c] = y;
  }
}

void Launch(int op, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows,
            int64_t cols, float* out, int64_t ldo, const Stream& stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(BlocksFor(cols, kThreads),
                  static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY));
  DELTASERVE_LAUNCH(ElementwiseKernel, grid, dim3(kThreads), 0, stream, op, a, lda, b, ldb, rows,
                    cols, out, ldo);
}

}  // namespace

void Add(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows, int64_t cols,
         float* out, int64_t ldo, const Stream& stream) {
  Launch(kAdd, a, lda, b, ldb, rows, cols, out, ldo, stream);
}

void SigmoidGate(const float* x, int64_t ldx, const float* gate, int64_t ldg, int64_t rows,
                 int64_t cols, float* out, int64_t ldo, const Stream& stream) {
  Launch(kSigmoidGate, x, ldx, gate, ldg, rows, cols, out, ldo, stream);
}

void Sigmoid(const float* x, int64_t ldx, int64_t rows, int64_t cols, float* out, int64_t ldo,
             const Stream& stream) {
  Launch(kSigmoid, x, ldx, nullptr, 0, rows, cols, out, ldo, stream);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
