// Entry point of kernels/short_conv.h: the contract, then the CPU variant of
// this machine's level.
#include "kernels/short_conv.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void ShortConv(const Tensor& x, const Tensor& w, bool silu, const MutableTensor& state,
               const MutableTensor& y) {
  const int64_t t = y.rows, channels = y.cols, width = w.cols;
  DELTASERVE_CHECK(width >= 1);
  DELTASERVE_CHECK_VIEW(y, DType::kF32, t, channels);
  DELTASERVE_CHECK_VIEW(x, DType::kF32, t, channels);
  DELTASERVE_CHECK_VIEW(w, DType::kF32, channels, width);
  DELTASERVE_CHECK_VIEW(state, DType::kF32, width - 1, channels);
  DELTASERVE_CHECK(!Overlaps(x, y) && !Overlaps(state, y) && !Overlaps(x, state));
  DELTASERVE_CHECK(!Overlaps(w, y) && !Overlaps(w, state));
  DELTASERVE_CPU_DISPATCH(ShortConv)
  (x.As<float>(), w.As<float>(), t, channels, width, silu, state.As<float>(), y.As<float>());
}

}  // namespace deltaserve::kernels
