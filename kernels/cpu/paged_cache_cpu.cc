// CPU kernels for kernels/paged_cache.h: row copies through the page table,
// pages spread over OpenMP threads when a read is long (a prefill chunk's
// keys and values gathered from a long context).
#include <omp.h>

#include <cstring>

#include "kernels/bf16.h"
#include "kernels/cpu/ops.h"
#include "kernels/paged_cache.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Below this many values a parallel region costs more than the copy.
constexpr int64_t kParallelMinValues = int64_t{1} << 18;

int64_t PoolRow(const int32_t* page_table, int64_t page_tokens, int64_t s) {
  return page_table[s / page_tokens] * page_tokens + s % page_tokens;
}

}  // namespace

void PagedCacheWrite(const float* rows, int64_t stride, int64_t n, int64_t width, int64_t begin,
                     const int32_t* page_table, int64_t page_tokens, void* pool, DType dtype) {
  for (int64_t i = 0; i < n; ++i) {
    const float* src = rows + i * stride;
    const int64_t row = PoolRow(page_table, page_tokens, begin + i);
    if (dtype == DType::kBF16) {
      uint16_t* dst = static_cast<uint16_t*>(pool) + row * width;
      for (int64_t c = 0; c < width; ++c) dst[c] = FloatToBf16(src[c]);
    } else {
      std::memcpy(static_cast<float*>(pool) + row * width, src, width * sizeof(float));
    }
  }
}

void PagedCacheRead(const void* pool, DType dtype, const int32_t* page_table, int64_t page_tokens,
                    int64_t begin, int64_t n, int64_t width, float* rows, int64_t stride) {
  const auto read_row = [&](int64_t i) {
    float* dst = rows + i * stride;
    const int64_t row = PoolRow(page_table, page_tokens, begin + i);
    if (dtype == DType::kBF16) {
      const uint16_t* src = static_cast<const uint16_t*>(pool) + row * width;
      for (int64_t c = 0; c < width; ++c) {
        const uint32_t bits = static_cast<uint32_t>(src[c]) << 16;
        std::memcpy(dst + c, &bits, sizeof(float));
      }
    } else {
      std::memcpy(dst, static_cast<const float*>(pool) + row * width, width * sizeof(float));
    }
  };
  if (n * width < kParallelMinValues) {
    for (int64_t i = 0; i < n; ++i) read_row(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) read_row(i);
}

void PagedCacheCopyPage(const void* from, void* to, int64_t bytes) {
  std::memcpy(to, from, static_cast<size_t>(bytes));
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
