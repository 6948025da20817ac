// Entry point of kernels/gemm.h: the contract, then the CPU variant of this
// machine's level for every dtype (kernels/cpu/gemm_cpu.cc).
#include "kernels/gemm.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/onednn.h"

namespace deltaserve::kernels {

void Linear(const Tensor& x, const Tensor& w, const MutableTensor& y, bool accumulate) {
  const int64_t m = y.rows;
  DELTASERVE_CHECK_WEIGHT(w, w.rows, w.cols);
  DELTASERVE_CHECK_STRIDED_VIEW(x, DType::kF32, m, w.cols);
  DELTASERVE_CHECK_STRIDED_VIEW(y, DType::kF32, m, w.rows);
  DELTASERVE_CHECK(!Overlaps(x, y) && !Overlaps(w, y));
  DELTASERVE_CPU_DISPATCH(LinearStrided)
  (x.As<float>(), x.RowStride(), w, m, y.As<float>(), y.RowStride(), accumulate);
}

bool Bf16ComputeAvailable() { return onednn::HasBf16Matmul(); }

}  // namespace deltaserve::kernels
