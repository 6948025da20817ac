// Entry point of kernels/moe.h: the CPU variant of this machine's level.
#include "kernels/moe.h"

#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void MoeRoute(const float* logits, const float* bias, int64_t t, int64_t experts, int64_t top_k,
              bool renormalize, float scaling, int32_t* idx, float* weights) {
  DELTASERVE_CPU_DISPATCH(MoeRoute)
  (logits, bias, t, experts, top_k, renormalize, scaling, idx, weights);
}

void MoeExperts(const MoeExpertsArgs& args) { DELTASERVE_CPU_DISPATCH(MoeExperts)(args); }

}  // namespace deltaserve::kernels
