// Entry point of kernels/norm.h: the contract, then the CPU variant of this
// machine's level.
#include "kernels/norm.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void RmsNorm(const Tensor& x, const Tensor& w, float eps, const MutableTensor& y) {
  const int64_t rows = y.rows, dim = y.cols;
  DELTASERVE_CHECK_STRIDED_VIEW(y, DType::kF32, rows, dim);
  DELTASERVE_CHECK_STRIDED_VIEW(x, DType::kF32, rows, dim);
  if (!w.empty() || w.data != nullptr) DELTASERVE_CHECK_VIEW(w, DType::kF32, 1, dim);
  DELTASERVE_CHECK((x.data == y.data && x.RowStride() == y.RowStride()) || !Overlaps(x, y));
  DELTASERVE_CHECK(!Overlaps(w, y));
  DELTASERVE_CPU_DISPATCH(RmsNorm)
  (x.As<float>(), x.RowStride(), w.empty() ? nullptr : w.As<float>(), rows, dim, eps, y.As<float>(),
   y.RowStride());
}

void L2Norm(const Tensor& x, float eps, float scale, const MutableTensor& y) {
  const int64_t rows = y.rows, dim = y.cols;
  DELTASERVE_CHECK_VIEW(y, DType::kF32, rows, dim);
  DELTASERVE_CHECK_VIEW(x, DType::kF32, rows, dim);
  DELTASERVE_CHECK(x.data == y.data || !Overlaps(x, y));
  DELTASERVE_CPU_DISPATCH(L2Norm)(x.As<float>(), rows, dim, eps, scale, y.As<float>());
}

}  // namespace deltaserve::kernels
