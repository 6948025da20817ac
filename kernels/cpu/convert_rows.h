// One row converted between f32 and bf16, shared by the CPU variants of
// kernels/convert.h and kernels/gather.h. In the level's namespace, as
// kernels/cpu/dispatch.h requires of inline code here, and written as plain
// integer loops the compiler vectorises; the bits are those of kernels/bf16.h
// (the tests compare them bit for bit).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/dispatch.h"
#include "kernels/tensor.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {

inline int64_t ElementBytes(DType dtype) { return dtype == DType::kBF16 ? 2 : 4; }

// FloatToBf16: to nearest, ties to even; a NaN keeps its top bits, quietened.
inline void NarrowRow(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + i, sizeof(bits));
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t nan = (bits >> 16) | 0x40u;
    dst[i] = static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

// Bf16ToFloat: exact, the bf16 bits as the top half.
inline void WidenRow(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
}

// n elements from src (of src_dtype) to dst (of dst_dtype), f32 or bf16 each.
inline void ConvertRow(const void* src, DType src_dtype, int64_t n, void* dst, DType dst_dtype) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(n * ElementBytes(src_dtype)));
  } else if (src_dtype == DType::kF32) {
    NarrowRow(static_cast<const float*>(src), n, static_cast<uint16_t*>(dst));
  } else {
    WidenRow(static_cast<const uint16_t*>(src), n, static_cast<float*>(dst));
  }
}

// Row r of a view at `stride` elements of `dtype` per row.
inline const void* RowOf(const void* base, DType dtype, int64_t stride, int64_t r) {
  return static_cast<const uint8_t*>(base) + r * stride * ElementBytes(dtype);
}
inline void* RowOf(void* base, DType dtype, int64_t stride, int64_t r) {
  return static_cast<uint8_t*>(base) + r * stride * ElementBytes(dtype);
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
