// Entry point of kernels/activation.h: the CPU variant of this machine's level.
#include "kernels/activation.h"

#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void GatedActivation(const float* gu, int64_t rows, int64_t width, const ActivationParams& params,
                     float* out) {
  DELTASERVE_CPU_DISPATCH(GatedActivation)(gu, rows, width, params, out);
}

}  // namespace deltaserve::kernels
