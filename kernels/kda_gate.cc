// Entry point of kernels/kda_gate.h: the CPU variant of this machine's level.
#include "kernels/kda_gate.h"

#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void KdaGateLowerBound(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                       int64_t heads, int64_t head_dim, float lower_bound, float* g) {
  DELTASERVE_CPU_DISPATCH(KdaGateLowerBound)
  (graw, dt_bias, a_log, t, heads, head_dim, lower_bound, g);
}

void KdaGateSoftplus(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                     int64_t heads, int64_t head_dim, float* g) {
  DELTASERVE_CPU_DISPATCH(KdaGateSoftplus)(graw, dt_bias, a_log, t, heads, head_dim, g);
}

}  // namespace deltaserve::kernels
