// bfloat16 and float32, the one definition of the conversion (checkpoints,
// the bf16 MLA cache, activations rounded for bf16 matmuls). Out of line, at
// the baseline CPU level: CPU-level kernel code widens bf16 in its own
// vector code (kernels/cpu/dispatch.h says why it keeps its own helpers).
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

// Exact: a bf16 value is the top half of a float32.
float Bf16ToFloat(uint16_t bits);
// To nearest, ties to even; a NaN stays a (quiet) NaN.
uint16_t FloatToBf16(float value);

}  // namespace deltaserve::kernels
