// Entry point of kernels/convert.h: the contract, then the variant of the
// destination's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/convert.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

void Convert(const Tensor& src, const MutableTensor& dst) {
  const int64_t rows = dst.rows, cols = dst.cols;
  const Device device = DELTASERVE_OP_DEVICE(dst);
  DELTASERVE_CHECK(src.dtype == DType::kF32 || src.dtype == DType::kBF16);
  DELTASERVE_CHECK(dst.dtype == DType::kF32 || dst.dtype == DType::kBF16);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, dst, dst.dtype, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, src, src.dtype, rows, cols);
  DELTASERVE_CHECK(!Overlaps(src, dst));
  if (dst.empty()) return;
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(Convert)
    (src.data, src.dtype, src.RowStride(), rows, cols, dst.data, dst.dtype, dst.RowStride(),
     Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(Convert)
  (src.data, src.dtype, src.RowStride(), rows, cols, dst.data, dst.dtype, dst.RowStride());
}

}  // namespace deltaserve::kernels
