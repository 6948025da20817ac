// Entry point of kernels/norm.h: the CPU variant of this machine's level.
#include "kernels/norm.h"

#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void RmsNorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y) {
  DELTASERVE_CPU_DISPATCH(RmsNorm)(x, w, rows, dim, eps, y);
}

void L2Norm(const float* x, int64_t rows, int64_t dim, float eps, float scale, float* y) {
  DELTASERVE_CPU_DISPATCH(L2Norm)(x, rows, dim, eps, scale, y);
}

}  // namespace deltaserve::kernels
