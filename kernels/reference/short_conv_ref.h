// Float64 reference for kernels/short_conv.h.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

// Same contract as kernels::ShortConv, in double.
void ShortConv(const double* x, const double* w, int64_t t, int64_t channels, int64_t width,
               bool silu, double* state, double* y);

}  // namespace deltaserve::kernels::ref
