// Entry point of kernels/attn_res.h: the CPU variant of this machine's level.
#include "kernels/attn_res.h"

#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void AttnResMix(const float* const* candidates, int64_t n, int64_t t, int64_t d,
                const float* norm_w, const float* proj_w, float eps, float* out) {
  DELTASERVE_CPU_DISPATCH(AttnResMix)(candidates, n, t, d, norm_w, proj_w, eps, out);
}

}  // namespace deltaserve::kernels
