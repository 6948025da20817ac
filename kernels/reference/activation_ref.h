// Float64 reference for kernels/activation.h.
#pragma once

#include <cstdint>

#include "kernels/activation.h"

namespace deltaserve::kernels::ref {

// gu: [rows, 2 * width] (gate columns, then up columns); out: [rows, width].
void GatedActivation(const double* gu, int64_t rows, int64_t width, const ActivationParams& params,
                     double* out);

}  // namespace deltaserve::kernels::ref
