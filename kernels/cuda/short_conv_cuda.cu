// KDA's causal depthwise short convolution on the GPU. Two launches: the
// convolution, a 2-D grid of (channel tiles of kThreads) x (token chunks of
// kChunk), each thread one channel over its chunk's tokens, with its block's
// weights staged in shared memory as [width, kThreads] (conflict-free) and
// x̃ = [state; x] read coalesced across channels; then the state update, one
// thread per channel shifting its column in ascending rows, which runs after
// every read of the old state. Each output is the same sum in the same order
// whatever T is, so prefill in pieces or token by token gives the same bits.
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kChunk = 32;  // tokens per block: reuse of staged weights
constexpr unsigned kMaxGridY = 65535;

// x·sigmoid(x) = x·num / (1 + e) with e = exp(-|x|) <= 1 (num = 1 for
// x >= 0, else e), so nothing overflows.
__device__ __forceinline__ float Silu(float x) {
  const float e = expf(x < 0.0f ? x : -x);
  const float num = x >= 0.0f ? 1.0f : e;
  return x * (num / (1.0f + e));
}

// x: [t, channels]; w: [channels, width]; state: [width-1, channels];
// y: [t, channels].
__global__ void __launch_bounds__(kThreads)
    ShortConvKernel(const float* __restrict__ x, const float* __restrict__ w, int64_t t,
                    int64_t channels, int64_t width, bool silu, const float* __restrict__ state,
                    float* __restrict__ y) {
  DELTASERVE_DYNAMIC_SHARED(float, wt);  // [width, kThreads]
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kThreads;
  const int64_t c = c0 + threadIdx.x;
  // Stage the tile's weights, reading w in its own order (coalesced).
  for (int64_t i = threadIdx.x; i < kThreads * width; i += kThreads) {
    const int64_t cc = i / width, j = i % width;
    wt[j * kThreads + cc] = c0 + cc < channels ? w[(c0 + cc) * width + j] : 0.0f;
  }
  __syncthreads();
  if (c >= channels) return;
  const int64_t history = width - 1;
  for (int64_t s0 = blockIdx.y * kChunk; s0 < t; s0 += static_cast<int64_t>(gridDim.y) * kChunk) {
    const int64_t s1 = s0 + kChunk < t ? s0 + kChunk : t;
    for (int64_t s = s0; s < s1; ++s) {
      float acc = 0.0f;
      for (int64_t j = 0; j < width; ++j) {
        const int64_t row = s + j;  // of x̃ = [state; x]
        const float v =
            row < history ? state[row * channels + c] : x[(row - history) * channels + c];
        acc += wt[j * kThreads + threadIdx.x] * v;
      }
      y[s * channels + c] = silu ? Silu(acc) : acc;
    }
  }
}

// state row r becomes x̃ row t + r >= r: ascending r reads old rows this
// thread has not yet overwritten.
__global__ void __launch_bounds__(kThreads)
    ShortConvStateKernel(const float* __restrict__ x, int64_t t, int64_t channels, int64_t history,
                         float* __restrict__ state) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= channels) return;
  for (int64_t r = 0; r < history; ++r) {
    const int64_t row = t + r;
    state[r * channels + c] =
        row < history ? state[row * channels + c] : x[(row - history) * channels + c];
  }
}

}  // namespace

void ShortConv(const float* x, const float* w, int64_t t, int64_t channels, int64_t width,
               bool silu, float* state, float* y, const Stream& stream) {
  if (t == 0 || channels == 0) return;
  const int64_t chunks = (t + kChunk - 1) / kChunk;
  const dim3 grid(BlocksFor(channels, kThreads),
                  static_cast<unsigned>(chunks < kMaxGridY ? chunks : kMaxGridY));
  const size_t shared = sizeof(float) * kThreads * static_cast<size_t>(width);
  DELTASERVE_LAUNCH(ShortConvKernel, grid, dim3(kThreads), shared, stream, x, w, t, channels, width,
                    silu, state, y);
  if (width > 1) {
    DELTASERVE_LAUNCH(ShortConvStateKernel, dim3(BlocksFor(channels, kThreads)), dim3(kThreads), 0,
                      stream, x, t, channels, width - 1, state);
  }
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
