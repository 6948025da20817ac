// kernels/paged_cache.h on the GPU: one block per token row, its threads
// striding over the row's values so that both the caller's rows and the pool
// row are read and written coalesced; the page table is looked up once per
// block. A page copy is a flat copy of the page's first rows, in 4-byte words
// where both ends allow it. A page table entry outside the pool (the entry
// point cannot read a table in device memory to refuse it) is never
// dereferenced: its rows are skipped on a write and read back as NaN.
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 128;
constexpr int kCopyThreads = 256;

// The pool row of token s, or -1 where its page lies outside the pool.
__device__ __forceinline__ int64_t PoolRow(const int32_t* __restrict__ page_table,
                                           int64_t page_tokens, int64_t pool_pages, int64_t s) {
  const int64_t page = page_table[s / page_tokens];
  if (page < 0 || page >= pool_pages) return -1;
  return page * page_tokens + s % page_tokens;
}

// rows[i] (f32, stride) -> pool row of token begin + i, f32 or bf16.
__global__ void __launch_bounds__(kThreads)
    PagedWriteKernel(const float* __restrict__ rows, int64_t stride, int64_t width, int64_t begin,
                     const int32_t* __restrict__ page_table, int64_t page_tokens,
                     int64_t pool_pages, void* __restrict__ pool, bool bf16) {
  const int64_t i = blockIdx.x;
  const int64_t row = PoolRow(page_table, page_tokens, pool_pages, begin + i);
  if (row < 0) return;
  const float* src = rows + i * stride;
  if (bf16) {
    uint16_t* dst = static_cast<uint16_t*>(pool) + row * width;
    for (int64_t c = threadIdx.x; c < width; c += kThreads) dst[c] = ToBf16Bits(src[c]);
  } else {
    float* dst = static_cast<float*>(pool) + row * width;
    for (int64_t c = threadIdx.x; c < width; c += kThreads) dst[c] = src[c];
  }
}

// pool row of token begin + i -> rows[i] (f32, stride), widened from bf16.
__global__ void __launch_bounds__(kThreads)
    PagedReadKernel(const void* __restrict__ pool, bool bf16,
                    const int32_t* __restrict__ page_table, int64_t page_tokens, int64_t pool_pages,
                    int64_t begin, int64_t width, float* __restrict__ rows, int64_t stride) {
  const int64_t i = blockIdx.x;
  const int64_t row = PoolRow(page_table, page_tokens, pool_pages, begin + i);
  float* dst = rows + i * stride;
  if (row < 0) {
    for (int64_t c = threadIdx.x; c < width; c += kThreads) dst[c] = __uint_as_float(0x7fc00000u);
  } else if (bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(pool) + row * width;
    for (int64_t c = threadIdx.x; c < width; c += kThreads) dst[c] = Bf16Bits(src[c]);
  } else {
    const float* src = static_cast<const float*>(pool) + row * width;
    for (int64_t c = threadIdx.x; c < width; c += kThreads) dst[c] = src[c];
  }
}

__global__ void __launch_bounds__(kCopyThreads)
    CopyWordsKernel(const uint32_t* __restrict__ from, uint32_t* __restrict__ to, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x;
  if (i < n) to[i] = from[i];
}

__global__ void __launch_bounds__(kCopyThreads)
    CopyHalvesKernel(const uint16_t* __restrict__ from, uint16_t* __restrict__ to, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x;
  if (i < n) to[i] = from[i];
}

}  // namespace

void PagedCacheWrite(const float* rows, int64_t stride, int64_t n, int64_t width, int64_t begin,
                     const int32_t* page_table, int64_t page_tokens, int64_t pool_pages, void* pool,
                     bool bf16, const Stream& stream) {
  if (n == 0 || width == 0) return;
  DELTASERVE_LAUNCH(PagedWriteKernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream,
                    rows, stride, width, begin, page_table, page_tokens, pool_pages, pool, bf16);
}

void PagedCacheRead(const void* pool, bool bf16, const int32_t* page_table, int64_t page_tokens,
                    int64_t pool_pages, int64_t begin, int64_t n, int64_t width, float* rows,
                    int64_t stride, const Stream& stream) {
  if (n == 0 || width == 0) return;
  DELTASERVE_LAUNCH(PagedReadKernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream,
                    pool, bf16, page_table, page_tokens, pool_pages, begin, width, rows, stride);
}

void PagedCacheCopyPage(const void* from, void* to, int64_t bytes, const Stream& stream) {
  if (bytes <= 0) return;
  const bool words = bytes % 4 == 0 && reinterpret_cast<uintptr_t>(from) % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(to) % 4 == 0;
  if (words) {
    const int64_t n = bytes / 4;
    DELTASERVE_LAUNCH(CopyWordsKernel, dim3(BlocksFor(n, kCopyThreads)), dim3(kCopyThreads), 0,
                      stream, static_cast<const uint32_t*>(from), static_cast<uint32_t*>(to), n);
  } else {  // bf16 rows of odd width at an odd page offset: 2-byte aligned
    const int64_t n = bytes / 2;
    DELTASERVE_LAUNCH(CopyHalvesKernel, dim3(BlocksFor(n, kCopyThreads)), dim3(kCopyThreads), 0,
                      stream, static_cast<const uint16_t*>(from), static_cast<uint16_t*>(to), n);
  }
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
