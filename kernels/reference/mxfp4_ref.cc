#include "kernels/reference/mxfp4_ref.h"

#include <cmath>
#include <limits>

namespace deltaserve::kernels::ref {

double Mxfp4CodeRef(uint8_t code) {
  const int sign = (code >> 3) & 1, exponent = (code >> 1) & 3, mantissa = code & 1;
  const double magnitude = exponent == 0 ? 0.5 * mantissa  // subnormal: m * 2^(1 - bias) / 2
                                         : std::ldexp(1.0 + 0.5 * mantissa, exponent - 1);
  return sign ? -magnitude : magnitude;
}

double E8m0ScaleRef(uint8_t s) {
  if (s == 255) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, static_cast<int>(s) - 127);
}

std::vector<double> DequantizeMxfp4Ref(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                                       int64_t cols) {
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = packed[r * (cols / 2) + c / 2];
      const uint8_t code = c % 2 == 0 ? byte & 15 : byte >> 4;
      out[r * cols + c] = Mxfp4CodeRef(code) * E8m0ScaleRef(scales[r * (cols / 32) + c / 32]);
    }
  }
  return out;
}

}  // namespace deltaserve::kernels::ref
