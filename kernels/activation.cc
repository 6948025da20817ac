// Entry point of kernels/activation.h: the contract, then the CPU variant of
// this machine's level.
#include "kernels/activation.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void GatedActivation(const Tensor& gu, const ActivationParams& params, const MutableTensor& out) {
  const int64_t rows = out.rows, width = out.cols;
  DELTASERVE_CHECK_VIEW(out, DType::kF32, rows, width);
  DELTASERVE_CHECK_VIEW(gu, DType::kF32, rows, 2 * width);
  DELTASERVE_CHECK(!Overlaps(gu, out));
  DELTASERVE_CPU_DISPATCH(GatedActivation)(gu.As<float>(), rows, width, params, out.As<float>());
}

}  // namespace deltaserve::kernels
