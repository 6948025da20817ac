// LogSoftmaxTopK on the GPU: one block per row. The block takes the row's
// max; then, as kernels/logsoftmax.h asks for the bits of a double sum in id
// order, warps 1.. compute chunks of exp terms (double) into shared memory
// while one lane of warp 0 adds the previous chunk in order (a dependent
// chain of V adds, ~0.5 ms at V = 160k; rows run side by side). The top-k is
// a radix select (4 passes of 8-bit histograms in shared memory) of the k-th
// key, keys above it and the lowest ids equal to it as candidates (parked in
// the row's top_logprobs), each ranked by counting the candidates before it.
// FindNonFinite: a flat grid of tiles, the first hit by an atomic max.
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// exp terms per chunk of the ordered sum; two chunks in flight (16 KiB).
constexpr int kChunk = 1024;
constexpr int kRadixBins = 256;

// The float's order as an unsigned key (larger float, larger key), -0 as +0
// (the CPU's == ties them); NaNs land at the ends, so the order stays total.
__device__ __forceinline__ unsigned OrderedKey(float x) {
  unsigned bits = __float_as_uint(x);
  if (x == 0.0f) bits = 0u;
  return (bits & 0x80000000u) != 0u ? ~bits : (bits | 0x80000000u);
}

__device__ float BlockMax(float v) {
  DELTASERVE_SHARED(float, partial, [kWarps]);
  DELTASERVE_SHARED(float, total, );
  for (int offset = 16; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = partial[0];
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, partial[w]);
    total = m;
  }
  __syncthreads();
  return total;
}

// Σ_i exp(row[i] - max) in double, added in id order, on every thread.
__device__ double OrderedExpSum(const float* __restrict__ row, int64_t vocab, double max) {
  DELTASERVE_SHARED(double, terms, [2][kChunk]);
  DELTASERVE_SHARED(double, total, );
  const int64_t chunks = (vocab + kChunk - 1) / kChunk;
  double sum = 0;
  // Step c: warps 1.. fill chunk c while lane 0 of warp 0 adds chunk c - 1.
  for (int64_t c = 0; c <= chunks; ++c) {
    if (threadIdx.x >= 32 && c < chunks) {
      const int64_t base = c * kChunk;
      const int n = static_cast<int>(vocab - base < kChunk ? vocab - base : kChunk);
      for (int i = threadIdx.x - 32; i < n; i += kThreads - 32) {
        terms[c & 1][i] = exp(static_cast<double>(row[base + i]) - max);
      }
    } else if (threadIdx.x == 0 && c > 0) {
      const int64_t base = (c - 1) * kChunk;
      const int n = static_cast<int>(vocab - base < kChunk ? vocab - base : kChunk);
      const double* t = terms[(c - 1) & 1];
      for (int i = 0; i < n; ++i) sum += t[i];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) total = sum;
  __syncthreads();
  return total;
}

// The ids of the row's k largest (key, lower id first) into cand[0, k), in
// no particular order.
__device__ void SelectTopK(const float* __restrict__ row, int64_t vocab, int64_t k,
                           int32_t* __restrict__ cand) {
  DELTASERVE_SHARED(unsigned, hist, [kRadixBins]);
  DELTASERVE_SHARED(unsigned, chosen_prefix, );
  DELTASERVE_SHARED(long long, chosen_remaining, );
  DELTASERVE_SHARED(int, warp_count, [kWarps]);
  DELTASERVE_SHARED(int, above_count, );
  // The k-th largest key, 8 bits a pass from the top: `remaining` is how many
  // of the keys with this prefix are still to take.
  unsigned prefix = 0, mask = 0;
  long long remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kRadixBins; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const unsigned key = OrderedKey(row[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      long long above = 0;
      int d = kRadixBins - 1;
      for (; d > 0; --d) {
        if (above + hist[d] >= remaining) break;
        above += hist[d];
      }
      chosen_prefix = prefix | (static_cast<unsigned>(d) << shift);
      chosen_remaining = remaining - above;
      above_count = 0;
    }
    __syncthreads();
    prefix = chosen_prefix;
    remaining = chosen_remaining;
    mask |= 0xffu << shift;
  }
  // Every key above the threshold, then the `remaining` lowest ids equal
  // to it, found in id order a tile at a time.
  const unsigned threshold = prefix;
  const long long above = k - remaining;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    if (OrderedKey(row[i]) > threshold) cand[atomicAdd(&above_count, 1)] = static_cast<int32_t>(i);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  long long taken = 0;
  for (int64_t base = 0; base < vocab && taken < remaining; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const int flag = i < vocab && OrderedKey(row[i]) == threshold ? 1 : 0;
    int before = flag;  // inclusive prefix count within the warp
    for (int offset = 1; offset < 32; offset *= 2) {
      const int other = __shfl_up_sync(0xffffffffu, before, offset);
      if (lane >= offset) before += other;
    }
    if (lane == 31) warp_count[warp] = before;
    __syncthreads();
    long long pos = taken + before - flag, tile = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) pos += warp_count[w];
      tile += warp_count[w];
    }
    if (flag != 0 && pos < remaining) cand[above + pos] = static_cast<int32_t>(i);
    taken += tile;
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads)
    LogSoftmaxTopKKernel(const float* __restrict__ logits, int64_t logits_stride, int64_t vocab,
                         const int32_t* __restrict__ targets, int64_t k, double* __restrict__ log_z,
                         float* __restrict__ target_logprobs, int32_t* __restrict__ top_ids,
                         float* __restrict__ top_logprobs) {
  DELTASERVE_SHARED(unsigned, tile_key, [kThreads]);
  DELTASERVE_SHARED(int32_t, tile_id, [kThreads]);
  const int64_t r = blockIdx.x;
  const float* row = logits + r * logits_stride;  // [vocab]
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, row[i]);
  const double max = BlockMax(m);
  const double z = max + log(OrderedExpSum(row, vocab, max));
  if (threadIdx.x == 0) {
    log_z[r] = z;
    if (targets != nullptr) {
      const int32_t t = targets[r];
      target_logprobs[r] = t < 0 || t >= vocab ? 0.0f : static_cast<float>(row[t] - z);
    }
  }
  if (k == 0) return;
  int32_t* ids = top_ids + r * k;  // [k]
  float* logprobs = top_logprobs + r * k;
  // The candidates wait in the row's logprobs, which are written last.
  int32_t* cand = reinterpret_cast<int32_t*>(logprobs);
  SelectTopK(row, vocab, k, cand);
  __syncthreads();
  // A candidate's place: how many candidates come before it (distinct
  // (key, id) pairs, so the places are 0..k-1 once each).
  for (int64_t i0 = 0; i0 < k; i0 += kThreads) {
    const int64_t i = i0 + threadIdx.x;
    const bool mine = i < k;
    const int32_t id = mine ? cand[i] : 0;
    const unsigned key = mine ? OrderedKey(row[id]) : 0u;
    int64_t place = 0;
    for (int64_t j0 = 0; j0 < k; j0 += kThreads) {
      __syncthreads();
      if (j0 + threadIdx.x < k) {
        const int32_t other = cand[j0 + threadIdx.x];
        tile_id[threadIdx.x] = other;
        tile_key[threadIdx.x] = OrderedKey(row[other]);
      }
      __syncthreads();
      const int n = static_cast<int>(k - j0 < kThreads ? k - j0 : kThreads);
      for (int t = 0; t < n; ++t) {
        place += tile_key[t] > key || (tile_key[t] == key && tile_id[t] < id) ? 1 : 0;
      }
    }
    if (mine) ids[place] = id;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < k; i += kThreads) {
    logprobs[i] = static_cast<float>(row[ids[i]] - z);
  }
}

// Elements each thread checks per tile, a row's columns in tiles.
constexpr int kScanPerThread = 8;
constexpr int64_t kScanTile = int64_t{kThreads} * kScanPerThread;

__global__ void __launch_bounds__(kThreads)
    FindNonFiniteKernel(const float* __restrict__ x, int64_t cols, int64_t stride,
                        int64_t tiles_per_row, unsigned long long total,
                        unsigned long long* result) {
  const int64_t r = blockIdx.x / tiles_per_row;
  const int64_t c0 = (blockIdx.x % tiles_per_row) * kScanTile;
  const float* row = x + r * stride;  // [cols]
  for (int j = 0; j < kScanPerThread; ++j) {
    const int64_t c = c0 + j * kThreads + threadIdx.x;  // coalesced
    if (c >= cols) break;
    if ((__float_as_uint(row[c]) & 0x7f800000u) == 0x7f800000u) {
      atomicMax(result, total - static_cast<unsigned long long>(r * cols + c));
      break;  // later columns of this thread come after it
    }
  }
}

}  // namespace

void LogSoftmaxTopK(const float* logits, int64_t logits_stride, int64_t rows, int64_t vocab,
                    const int32_t* targets, int64_t top_k, double* log_z, float* target_logprobs,
                    int32_t* top_ids, float* top_logprobs, const Stream& stream) {
  if (rows == 0) return;
  DELTASERVE_LAUNCH(LogSoftmaxTopKKernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0,
                    stream, logits, logits_stride, vocab, targets, top_k, log_z, target_logprobs,
                    top_ids, top_logprobs);
}

void FindNonFinite(const float* x, int64_t rows, int64_t cols, int64_t stride,
                   unsigned long long* result, const Stream& stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t tiles_per_row = (cols + kScanTile - 1) / kScanTile;
  DELTASERVE_LAUNCH(FindNonFiniteKernel, dim3(static_cast<unsigned>(rows * tiles_per_row)),
                    dim3(kThreads), 0, stream, x, cols, stride, tiles_per_row,
                    static_cast<unsigned long long>(rows * cols), result);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
