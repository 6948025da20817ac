// Entry point of kernels/norm.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/norm.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

void RmsNorm(const Tensor& x, const Tensor& w, float eps, const MutableTensor& y) {
  const int64_t rows = y.rows, dim = y.cols;
  const Device device = DELTASERVE_OP_DEVICE(y);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, y, DType::kF32, rows, dim);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, x, DType::kF32, rows, dim);
  if (!w.empty() || w.data != nullptr) DELTASERVE_CHECK_VIEW_ON(device, w, DType::kF32, 1, dim);
  DELTASERVE_CHECK((x.data == y.data && x.RowStride() == y.RowStride()) || !Overlaps(x, y));
  DELTASERVE_CHECK(!Overlaps(w, y));
  const float* gain = w.empty() ? nullptr : w.As<float>();
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(RmsNorm)
    (x.As<float>(), x.RowStride(), gain, rows, dim, eps, y.As<float>(), y.RowStride(),
     Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(RmsNorm)
  (x.As<float>(), x.RowStride(), gain, rows, dim, eps, y.As<float>(), y.RowStride());
}

void L2Norm(const Tensor& x, float eps, float scale, const MutableTensor& y) {
  const int64_t rows = y.rows, dim = y.cols;
  const Device device = DELTASERVE_OP_DEVICE(y);
  DELTASERVE_CHECK_VIEW_ON(device, y, DType::kF32, rows, dim);
  DELTASERVE_CHECK_VIEW_ON(device, x, DType::kF32, rows, dim);
  DELTASERVE_CHECK(x.data == y.data || !Overlaps(x, y));
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(L2Norm)
    (x.As<float>(), rows, dim, eps, scale, y.As<float>(), Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(L2Norm)(x.As<float>(), rows, dim, eps, scale, y.As<float>());
}

}  // namespace deltaserve::kernels
