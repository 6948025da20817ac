// Entry point of kernels/convert.h: the contract, then the CPU variant of
// this machine's level.
#include "kernels/convert.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void Convert(const Tensor& src, const MutableTensor& dst) {
  const int64_t rows = dst.rows, cols = dst.cols;
  DELTASERVE_CHECK(src.dtype == DType::kF32 || src.dtype == DType::kBF16);
  DELTASERVE_CHECK(dst.dtype == DType::kF32 || dst.dtype == DType::kBF16);
  DELTASERVE_CHECK_STRIDED_VIEW(dst, dst.dtype, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW(src, src.dtype, rows, cols);
  DELTASERVE_CHECK(!Overlaps(src, dst));
  if (dst.empty()) return;
  DELTASERVE_CPU_DISPATCH(Convert)
  (src.data, src.dtype, src.RowStride(), rows, cols, dst.data, dst.dtype, dst.RowStride());
}

}  // namespace deltaserve::kernels
