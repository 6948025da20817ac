// Embedding lookup on the GPU: one block per token (grid x up to 2^31 - 1),
// its threads striding along the row so each warp reads consecutive table
// entries and writes consecutive floats (coalesced). Widening is exact: f32
// copies, bf16 bits shifted into the upper half, an MXFP4 code's value (at
// most 6, two significant bits) times its group's power of two, as the CPU's
// WidenRows computes it (kernels/cpu/gemm_cpu.cc).
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 128;

// The values of the E2M1 codes (kernels/mxfp4.h).
__device__ const float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(s - 127); s = 0 is the subnormal 2^-127 (kernels/mxfp4.h).
__device__ __forceinline__ float E8m0(uint8_t s) {
  return __uint_as_float(s == 0 ? (1u << 22) : static_cast<unsigned>(s) << 23);
}

// out[i, :] = table[tokens[i], :] widened; table rows hold `dim` values.
__global__ void __launch_bounds__(kThreads)
    EmbeddingKernel(const void* __restrict__ table, const uint8_t* __restrict__ scales, DType dtype,
                    int64_t dim, const int32_t* __restrict__ tokens, float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t id = tokens[i];
  float* o = out + i * dim;
  if (dtype == DType::kF32) {
    const float* row = static_cast<const float*>(table) + id * dim;
    for (int64_t c = threadIdx.x; c < dim; c += kThreads) o[c] = row[c];
  } else if (dtype == DType::kBF16) {
    const uint16_t* row = static_cast<const uint16_t*>(table) + id * dim;
    for (int64_t c = threadIdx.x; c < dim; c += kThreads) o[c] = Bf16Bits(row[c]);
  } else {  // kMxfp4: dim / 2 bytes of codes, even column in the low nibble
    const uint8_t* row = static_cast<const uint8_t*>(table) + id * (dim / 2);
    const uint8_t* srow = scales + id * (dim / 32);
    for (int64_t c = threadIdx.x; c < dim; c += kThreads) {
      const uint8_t byte = row[c / 2];
      o[c] = kE2m1Values[c % 2 == 0 ? byte & 15 : byte >> 4] * E8m0(srow[c / 32]);
    }
  }
}

}  // namespace

void Embedding(const void* table, const uint8_t* scales, DType dtype, int64_t dim,
               const int32_t* tokens, int64_t t, float* out, const Stream& stream) {
  if (t == 0 || dim == 0) return;
  DELTASERVE_LAUNCH(EmbeddingKernel, dim3(static_cast<unsigned>(t)), dim3(kThreads), 0, stream,
                    table, scales, dtype, dim, tokens, out);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
