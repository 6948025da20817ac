// Entry point of kernels/kda_gate.h: the contract, then the CPU variant of
// this machine's level.
#include "kernels/kda_gate.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {
namespace {

void CheckGate(const Tensor& graw, const Tensor& dt_bias, const Tensor& a_log, int64_t heads,
               int64_t head_dim, const MutableTensor& g) {
  DELTASERVE_CHECK(heads >= 0 && head_dim >= 0);
  DELTASERVE_CHECK_VIEW(g, DType::kF32, g.rows, heads * head_dim);
  DELTASERVE_CHECK_VIEW(graw, DType::kF32, g.rows, heads * head_dim);
  DELTASERVE_CHECK_VIEW(dt_bias, DType::kF32, 1, heads * head_dim);
  DELTASERVE_CHECK_VIEW(a_log, DType::kF32, 1, heads);
  DELTASERVE_CHECK(graw.data == g.data || !Overlaps(graw, g));
  DELTASERVE_CHECK(!Overlaps(dt_bias, g) && !Overlaps(a_log, g));
}

}  // namespace

void KdaGateLowerBound(const Tensor& graw, const Tensor& dt_bias, const Tensor& a_log,
                       int64_t heads, int64_t head_dim, float lower_bound, const MutableTensor& g) {
  CheckGate(graw, dt_bias, a_log, heads, head_dim, g);
  DELTASERVE_CPU_DISPATCH(KdaGateLowerBound)
  (graw.As<float>(), dt_bias.As<float>(), a_log.As<float>(), g.rows, heads, head_dim, lower_bound,
   g.As<float>());
}

void KdaGateSoftplus(const Tensor& graw, const Tensor& dt_bias, const Tensor& a_log, int64_t heads,
                     int64_t head_dim, const MutableTensor& g) {
  CheckGate(graw, dt_bias, a_log, heads, head_dim, g);
  DELTASERVE_CPU_DISPATCH(KdaGateSoftplus)
  (graw.As<float>(), dt_bias.As<float>(), a_log.As<float>(), g.rows, heads, head_dim,
   g.As<float>());
}

}  // namespace deltaserve::kernels
