// Entry point of kernels/short_conv.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/short_conv.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

void ShortConv(const Tensor& x, const Tensor& w, bool silu, const MutableTensor& state,
               const MutableTensor& y) {
  const int64_t t = y.rows, channels = y.cols, width = w.cols;
  const Device device = DELTASERVE_OP_DEVICE(y);
  DELTASERVE_CHECK(width >= 1);
  DELTASERVE_CHECK_VIEW_ON(device, y, DType::kF32, t, channels);
  DELTASERVE_CHECK_VIEW_ON(device, x, DType::kF32, t, channels);
  DELTASERVE_CHECK_VIEW_ON(device, w, DType::kF32, channels, width);
  DELTASERVE_CHECK_VIEW_ON(device, state, DType::kF32, width - 1, channels);
  DELTASERVE_CHECK(!Overlaps(x, y) && !Overlaps(state, y) && !Overlaps(x, state));
  DELTASERVE_CHECK(!Overlaps(w, y) && !Overlaps(w, state));
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(ShortConv)
    (x.As<float>(), w.As<float>(), t, channels, width, silu, state.As<float>(), y.As<float>(),
     Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(ShortConv)
  (x.As<float>(), w.As<float>(), t, channels, width, silu, state.As<float>(), y.As<float>());
}

}  // namespace deltaserve::kernels
