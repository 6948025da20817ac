// Entry point of kernels/attn_res.h: the contract, then the CPU variant of
// this machine's level.
#include "kernels/attn_res.h"

#include <vector>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void AttnResMix(const Tensor* candidates, int64_t n, const Tensor& norm_w, const Tensor& proj_w,
                float eps, const MutableTensor& out) {
  const int64_t t = out.rows, d = out.cols;
  DELTASERVE_CHECK(candidates != nullptr && n >= 1);
  DELTASERVE_CHECK_VIEW(out, DType::kF32, t, d);
  DELTASERVE_CHECK_VIEW(norm_w, DType::kF32, 1, d);
  DELTASERVE_CHECK_VIEW(proj_w, DType::kF32, 1, d);
  std::vector<const float*> rows(n);  // n is the block count: a few dozen at most
  for (int64_t i = 0; i < n; ++i) {
    DELTASERVE_CHECK_VIEW(candidates[i], DType::kF32, t, d);
    DELTASERVE_CHECK(!Overlaps(candidates[i], out));
    rows[i] = candidates[i].As<float>();
  }
  DELTASERVE_CPU_DISPATCH(AttnResMix)
  (rows.data(), n, t, d, norm_w.As<float>(), proj_w.As<float>(), eps, out.As<float>());
}

}  // namespace deltaserve::kernels
