#include "kernels/reference/convert_ref.h"

#include <algorithm>
#include <cmath>

namespace deltaserve::kernels::ref {

double RoundToBf16(double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  // |x| in [2^e, 2^(e+1)) has bf16 spacing 2^(e - 7); below the smallest
  // normal (2^-126) the spacing stays that of the subnormals, 2^-133.
  const int e = std::max(std::ilogb(x), -126);
  const double ulp = std::ldexp(1.0, e - 7);
  const double r = std::nearbyint(x / ulp) * ulp;  // the default mode: to nearest, ties to even
  if (std::abs(r) >= std::ldexp(1.0, 128)) return std::copysign(HUGE_VAL, x);
  return r;
}

void Convert(const double* src, int64_t n, bool to_bf16, double* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16 ? RoundToBf16(src[i]) : src[i];
}

}  // namespace deltaserve::kernels::ref
