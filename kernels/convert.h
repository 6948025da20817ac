// Copies between f32 and bf16 views of one shape: the splits of a fused
// projection into its parts (a column block of wider rows, Tensor::Columns),
// the narrowing of rows into a bf16 cache and their widening back.
#pragma once

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// dst[r, c] = src[r, c] for src and dst [rows, cols], each at its own row
// stride (RowStride() >= cols). The dtypes are f32 or bf16 on either side:
// f32 -> f32 and bf16 -> bf16 copy the bits, f32 -> bf16 rounds to nearest,
// ties to even, a NaN staying a quiet NaN (kernels/bf16.h FloatToBf16),
// bf16 -> f32 is exact (Bf16ToFloat). src and dst must not overlap.
void Convert(const Tensor& src, const MutableTensor& dst);

}  // namespace deltaserve::kernels
