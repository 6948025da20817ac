// MXFP4 (OCP Microscaling Formats v1.0), the layout of K3's routed experts as
// compressed-tensors writes them ("mxfp4-pack-quantized"): a value is an E2M1
// code times its group's E8M0 scale, 32 values to a group along a row.
//   code: bit 3 sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6};
//   scale byte s: 2^(s - 127); s = 255 is NaN (a checkpoint holding one is
//   refused at load, so kernels never see it).
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

inline constexpr int64_t kMxfp4Group = 32;
// The value of each 4-bit E2M1 code.
inline constexpr float kMxfp4Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                           -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline constexpr uint8_t kE8m0Nan = 255;

// The value of a 4-bit code (the low nibble of `code`).
float Mxfp4Code(uint8_t code);
// 2^(s - 127) as float32 (s = 0 is the subnormal 2^-127); NaN for 255.
float E8m0Scale(uint8_t s);

// out[rows, cols] = the float32 values of packed [rows, cols / 2] with
// scales [rows, cols / 32]; cols a multiple of 32. A product past float32's
// range (scales of 2^127 with codes of 4 and 6) is +-inf, as rounding the
// exact value gives. It is the decoder the GEMMs widen MXFP4 weights with
// (kernels/cpu/gemm_cpu.h, WidenRows), at this machine's CPU level; scales
// must not be NaN (255).
void DequantizeMxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols,
                     float* out);

// The index of the first NaN scale byte (255) in scales[count], or -1.
int64_t FindNanScale(const uint8_t* scales, int64_t count);

}  // namespace deltaserve::kernels
