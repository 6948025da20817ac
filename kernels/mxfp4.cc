#include "kernels/mxfp4.h"

#include <cstring>
#include <limits>

#include "kernels/check.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/tensor.h"

namespace deltaserve::kernels {

float Mxfp4Code(uint8_t code) { return kMxfp4Values[code & 15]; }

float E8m0Scale(uint8_t s) {
  if (s == kE8m0Nan) return std::numeric_limits<float>::quiet_NaN();
  // 2^(s - 127): the exponent field itself for s >= 1, the largest subnormal
  // power (2^-127, mantissa bit 22) for s = 0.
  const uint32_t bits = s == 0 ? (1u << 22) : static_cast<uint32_t>(s) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

void DequantizeMxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols,
                     float* out) {
  DELTASERVE_CHECK(rows >= 0 && cols >= 0 && cols % kMxfp4Group == 0);
  // The decoder the GEMMs use, at this machine's CPU level.
  const Tensor w{packed, scales, DType::kMxfp4, Device::kCpu, rows, cols};
  DELTASERVE_CPU_DISPATCH(WidenRows)(w, 0, rows, out);
}

int64_t FindNanScale(const uint8_t* scales, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (scales[i] == kE8m0Nan) return i;
  }
  return -1;
}

}  // namespace deltaserve::kernels
