// Gated FFN activations on the GPU, the expressions of the CPU variant
// (kernels/cpu/activation_cpu.cc) per element: a 2-D grid, x tiling a row's
// width so a warp reads 32 consecutive gates and 32 consecutive ups
// (coalesced), y walking the rows past 65535 by striding. exp and tanh are
// the CUDA library's (a few ulp, saturating: tanhf is ±1 and expf inf or 0
// at the tails), so no inf - inf or 0 · inf NaN arises.
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

// gu: [rows, 2 * width] (gate | up); out: [rows, width]. The sigmoid enters
// as a division by 1 + exp(-g): for g < -88 the sigmoid is subnormal and a
// product with it would lose digits, and exp(-g) = inf gives exactly ±0.
__global__ void __launch_bounds__(kThreads)
    GatedActivationKernel(const float* __restrict__ gu, int64_t rows, int64_t width, bool situ,
                          float beta, float lbeta, float* __restrict__ out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= width) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float g = gu[r * 2 * width + c];
    const float u = gu[r * 2 * width + width + c];
    const float act = situ ? beta * tanhf(g / beta) / (1.0f + expf(-g)) * (lbeta * tanhf(u / lbeta))
                           : g / (1.0f + expf(-g)) * u;
    out[r * width + c] = act;
  }
}

}  // namespace

void GatedActivation(const float* gu, int64_t rows, int64_t width, bool situ, float situ_beta,
                     float situ_linear_beta, float* out, const Stream& stream) {
  if (rows == 0 || width == 0) return;
  const dim3 grid(BlocksFor(width, kThreads),
                  static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY));
  DELTASERVE_LAUNCH(GatedActivationKernel, grid, dim3(kThreads), 0, stream, gu, rows, width, situ,
                    situ_beta, situ_linear_beta, out);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
