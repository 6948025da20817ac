#include "kernels/reference/paged_cache_ref.h"

#include <cmath>

namespace deltaserve::kernels::ref {

int64_t PagedRow(const int32_t* page_table, int64_t page_tokens, int64_t s) {
  const int64_t page = s / page_tokens;
  return static_cast<int64_t>(page_table[page]) * page_tokens + (s - page * page_tokens);
}

double RoundToBf16(double x) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  int exponent = 0;
  const double mantissa = std::frexp(x, &exponent);  // |mantissa| in [0.5, 1)
  // nearbyint rounds to nearest, ties to even, in the default rounding mode.
  return std::ldexp(std::nearbyint(std::ldexp(mantissa, 8)), exponent - 8);
}

}  // namespace deltaserve::kernels::ref
