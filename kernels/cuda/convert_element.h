// One element converted between f32 and bf16 on the GPU, as
// kernels/cpu/convert_rows.h converts a row: same dtype copies the bits,
// f32 -> bf16 rounds to nearest, ties to even, a NaN quietened
// (ToBf16Bits), bf16 -> f32 is exact. Shared by convert_cuda.cu and
// gather_cuda.cu; include after compat.h.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

// dst[i] (of dst_dtype) = src[j] (of src_dtype).
__device__ __forceinline__ void ConvertElement(const void* src, DType src_dtype, int64_t j,
                                               void* dst, DType dst_dtype, int64_t i) {
  if (src_dtype == DType::kBF16) {
    const uint16_t bits = static_cast<const uint16_t*>(src)[j];
    if (dst_dtype == DType::kBF16) {
      static_cast<uint16_t*>(dst)[i] = bits;
    } else {
      static_cast<float*>(dst)[i] = Bf16Bits(bits);
    }
  } else {
    // The f32 as bits: a copy keeps a NaN's payload untouched.
    const unsigned bits = static_cast<const unsigned*>(src)[j];
    if (dst_dtype == DType::kBF16) {
      static_cast<uint16_t*>(dst)[i] = ToBf16Bits(__uint_as_float(bits));
    } else {
      static_cast<unsigned*>(dst)[i] = bits;
    }
  }
}

}  // namespace
}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
