// Entry point of kernels/activation.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/activation.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

void GatedActivation(const Tensor& gu, const ActivationParams& params, const MutableTensor& out) {
  const int64_t rows = out.rows, width = out.cols;
  const Device device = DELTASERVE_OP_DEVICE(out);
  DELTASERVE_CHECK_VIEW_ON(device, out, DType::kF32, rows, width);
  DELTASERVE_CHECK_VIEW_ON(device, gu, DType::kF32, rows, 2 * width);
  DELTASERVE_CHECK(!Overlaps(gu, out));
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(GatedActivation)
    (gu.As<float>(), rows, width, params.kind == Activation::kSitu, params.situ_beta,
     params.situ_linear_beta, out.As<float>(), Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(GatedActivation)(gu.As<float>(), rows, width, params, out.As<float>());
}

}  // namespace deltaserve::kernels
