// Fast float32 short convolution. Channels are independent, so the work is
// split into blocks of channels, one per OpenMP iteration; inside a block the
// loops run over contiguous channels and vectorise. Every output element is
// computed by the same operations in the same order whatever T is, so prefill
// in one call, in pieces or token by token gives bitwise the same result.
#include <algorithm>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/short_conv.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

constexpr int64_t kChannelBlock = 64;
// Below this many multiply-adds an OpenMP fork costs more than the work.
constexpr int64_t kParallelMinWork = int64_t{1} << 15;

// x·sigmoid(x) = x·num / (1 + e) with e = exp(-|x|) <= 1 (num = 1 for
// x >= 0, else e), so nothing overflows.
inline simd::Vf SiluLanes(simd::Vf x) {
  const simd::Vf e = simd::Exp(x < 0.0f ? x : -x);  // exp(-|x|)
  const simd::Vf num = x >= 0.0f ? simd::Splat(1.0f) : e;
  return x * (num / (1.0f + e));
}

void ConvBlock(const float* x, const float* w, int64_t t, int64_t channels, int64_t width,
               bool silu, int64_t c0, int64_t nc, float* state, float* y) {
  const int64_t history = width - 1;
  // Weights transposed to [width, nc] so the channel loop is contiguous.
  float wt[kChannelBlock * 8];
  std::vector<float> wt_heap;
  float* wtp = wt;
  if (width > 8) {
    wt_heap.resize(width * kChannelBlock);
    wtp = wt_heap.data();
  }
  for (int64_t j = 0; j < width; ++j) {
    for (int64_t c = 0; c < nc; ++c) wtp[j * nc + c] = w[(c0 + c) * width + j];
  }
  float acc[kChannelBlock];
  for (int64_t s = 0; s < t; ++s) {
    std::fill(acc, acc + nc, 0.0f);
    for (int64_t j = 0; j < width; ++j) {
      // Row s + j of x̃ = [state; x].
      const int64_t row = s + j;
      const float* src =
          row < history ? state + row * channels + c0 : x + (row - history) * channels + c0;
      const float* wj = wtp + j * nc;
      for (int64_t c = 0; c < nc; ++c) acc[c] += wj[c] * src[c];
    }
    float* ys = y + s * channels + c0;
    if (silu) {
      simd::Map(nc, ys, SiluLanes, acc);
    } else {
      for (int64_t c = 0; c < nc; ++c) ys[c] = acc[c];
    }
  }
  // New state row r is x̃ row t + r >= r: ascending r reads old rows that
  // are not yet overwritten.
  for (int64_t r = 0; r < history && t > 0; ++r) {
    const int64_t row = t + r;
    const float* src =
        row < history ? state + row * channels + c0 : x + (row - history) * channels + c0;
    float* dst = state + r * channels + c0;
    for (int64_t c = 0; c < nc; ++c) dst[c] = src[c];
  }
}

}  // namespace

void ShortConv(const float* x, const float* w, int64_t t, int64_t channels, int64_t width,
               bool silu, float* state, float* y) {
  if (t == 0 || channels == 0) return;
  const int64_t blocks = (channels + kChannelBlock - 1) / kChannelBlock;
  const bool parallel = t * channels * width >= kParallelMinWork && blocks > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kChannelBlock;
    const int64_t nc = std::min(kChannelBlock, channels - c0);
    ConvBlock(x, w, t, channels, width, silu, c0, nc, state, y);
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
