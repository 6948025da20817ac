// Entry point of kernels/kda_gate.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/kda_gate.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {
namespace {

// The contract; returns the device the op runs on.
Device CheckGate(const Tensor& graw, const Tensor& dt_bias, const Tensor& a_log, int64_t heads,
                 int64_t head_dim, const MutableTensor& g) {
  const Device device = DELTASERVE_OP_DEVICE(g);
  DELTASERVE_CHECK(heads >= 0 && head_dim >= 0);
  DELTASERVE_CHECK_VIEW_ON(device, g, DType::kF32, g.rows, heads * head_dim);
  DELTASERVE_CHECK_VIEW_ON(device, graw, DType::kF32, g.rows, heads * head_dim);
  DELTASERVE_CHECK_VIEW_ON(device, dt_bias, DType::kF32, 1, heads * head_dim);
  DELTASERVE_CHECK_VIEW_ON(device, a_log, DType::kF32, 1, heads);
  DELTASERVE_CHECK(graw.data == g.data || !Overlaps(graw, g));
  DELTASERVE_CHECK(!Overlaps(dt_bias, g) && !Overlaps(a_log, g));
  return device;
}

}  // namespace

void KdaGateLowerBound(const Tensor& graw, const Tensor& dt_bias, const Tensor& a_log,
                       int64_t heads, int64_t head_dim, float lower_bound, const MutableTensor& g) {
  const Device device = CheckGate(graw, dt_bias, a_log, heads, head_dim, g);
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(KdaGateLowerBound)
    (graw.As<float>(), dt_bias.As<float>(), a_log.As<float>(), g.rows, heads, head_dim, lower_bound,
     g.As<float>(), Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(KdaGateLowerBound)
  (graw.As<float>(), dt_bias.As<float>(), a_log.As<float>(), g.rows, heads, head_dim, lower_bound,
   g.As<float>());
}

void KdaGateSoftplus(const Tensor& graw, const Tensor& dt_bias, const Tensor& a_log, int64_t heads,
                     int64_t head_dim, const MutableTensor& g) {
  const Device device = CheckGate(graw, dt_bias, a_log, heads, head_dim, g);
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(KdaGateSoftplus)
    (graw.As<float>(), dt_bias.As<float>(), a_log.As<float>(), g.rows, heads, head_dim,
     g.As<float>(), Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(KdaGateSoftplus)
  (graw.As<float>(), dt_bias.As<float>(), a_log.As<float>(), g.rows, heads, head_dim,
   g.As<float>());
}

}  // namespace deltaserve::kernels
