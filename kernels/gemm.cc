// Entry point of kernels/gemm.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, kernels/cpu/gemm_cpu.cc,
// or CUDA's, kernels/cuda/gemm_cuda.cu).
#include "kernels/gemm.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/onednn.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

void Linear(const Tensor& x, const Tensor& w, const MutableTensor& y, bool accumulate) {
  const int64_t m = y.rows;
  const Device device = DELTASERVE_OP_DEVICE(y);
  DELTASERVE_CHECK_WEIGHT_ON(device, w, w.rows, w.cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, x, DType::kF32, m, w.cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, y, DType::kF32, m, w.rows);
  DELTASERVE_CHECK(!Overlaps(x, y) && !Overlaps(w, y));
  if (device == Device::kCuda) {
    const cuda::Weight cw{w.data, w.scales, w.dtype, w.compute, w.rows, w.cols};
    DELTASERVE_CUDA_DISPATCH(LinearStrided)
    (x.As<float>(), x.RowStride(), cw, m, y.As<float>(), y.RowStride(), accumulate,
     Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(LinearStrided)
  (x.As<float>(), x.RowStride(), w, m, y.As<float>(), y.RowStride(), accumulate);
}

bool Bf16ComputeAvailable() { return onednn::HasBf16Matmul(); }

}  // namespace deltaserve::kernels
