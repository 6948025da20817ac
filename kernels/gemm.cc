// Entry point of kernels/gemm.h: the contract, then the CPU variant of this
// machine's level for every dtype (kernels/cpu/gemm_cpu.cc).
#include "kernels/gemm.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/onednn.h"

namespace deltaserve::kernels {

void LinearStrided(const float* x, int64_t ldx, const Tensor& w, int64_t m, float* y, int64_t ldy,
                   bool accumulate) {
  DELTASERVE_CHECK(m >= 0 && w.rows >= 0 && w.cols >= 0 && ldx >= w.cols && ldy >= w.rows);
  DELTASERVE_CHECK(w.device == Device::kCpu);  // the only backend built so far
  DELTASERVE_CHECK(w.dtype != DType::kMxfp4 ||
                   (w.cols % 32 == 0 && (w.scales != nullptr || w.empty())));
  DELTASERVE_CPU_DISPATCH(LinearStrided)(x, ldx, w, m, y, ldy, accumulate);
}

bool Bf16ComputeAvailable() { return onednn::HasBf16Matmul(); }

}  // namespace deltaserve::kernels
