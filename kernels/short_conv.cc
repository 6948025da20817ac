// Entry point of kernels/short_conv.h: the CPU variant of this machine's level.
#include "kernels/short_conv.h"

#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void ShortConv(const float* x, const float* w, int64_t t, int64_t channels, int64_t width,
               bool silu, float* state, float* y) {
  DELTASERVE_CPU_DISPATCH(ShortConv)(x, w, t, channels, width, silu, state, y);
}

}  // namespace deltaserve::kernels
