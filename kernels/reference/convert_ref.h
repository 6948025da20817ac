// Float64 reference for kernels/convert.h: values, not bits, so the tests
// check the bit-level kernel against arithmetic.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

// The bf16 value nearest x, ties to even: 8 significant bits, exponents
// down to bf16's subnormals (2^-133), inf past the largest finite bf16; NaN
// stays NaN. x is a float value, so every step below is exact in double.
double RoundToBf16(double x);

// dst[i] = src[i] (to_bf16: RoundToBf16(src[i])), i < n.
void Convert(const double* src, int64_t n, bool to_bf16, double* dst);

}  // namespace deltaserve::kernels::ref
