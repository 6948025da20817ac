// Entry point of kernels/paged_cache.h: the contract, then the variant of the
// pool's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/paged_cache.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {
namespace {

// The pool and the page table, on `device`, hold the tokens [begin, end) of a
// sequence: every page they fall in names a page of the pool. A page table in
// CUDA memory is not read here (that would wait for the device); the CUDA
// kernels do not dereference an entry outside the pool.
template <bool kWritable>
void CheckCovers(Device device, const BasicPagedCache<kWritable>& cache, int64_t width,
                 int64_t begin, int64_t end) {
  DELTASERVE_CHECK(cache.page_tokens >= 1);
  DELTASERVE_CHECK(cache.pool.dtype == DType::kF32 || cache.pool.dtype == DType::kBF16);
  DELTASERVE_CHECK(cache.pool.rows % cache.page_tokens == 0);
  DELTASERVE_CHECK_VIEW_ON(device, cache.pool, cache.pool.dtype, cache.pool.rows, width);
  DELTASERVE_CHECK(begin >= 0 && end >= begin);
  const int64_t pages = (end + cache.page_tokens - 1) / cache.page_tokens;
  DELTASERVE_CHECK(cache.page_table.cols >= pages);
  DELTASERVE_CHECK_VIEW_ON(device, cache.page_table, DType::kI32, 1, cache.page_table.cols);
  if (device != Device::kCpu) return;
  const int64_t pool_pages = cache.pool.rows / cache.page_tokens;
  for (int64_t p = begin / cache.page_tokens; p < pages; ++p) {
    const int32_t page = cache.page_table.template As<int32_t>()[p];
    DELTASERVE_CHECK(page >= 0 && page < pool_pages);
  }
}

}  // namespace

void PagedCacheWrite(const Tensor& rows, int64_t begin, const MutablePagedCache& cache) {
  const int64_t n = rows.rows, width = rows.cols;
  const Device device = DELTASERVE_OP_DEVICE(cache.pool);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, rows, DType::kF32, n, width);
  CheckCovers(device, cache, width, begin, begin + n);
  DELTASERVE_CHECK(!Overlaps(rows, cache.pool));
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(PagedCacheWrite)
    (rows.As<float>(), rows.RowStride(), n, width, begin, cache.page_table.As<int32_t>(),
     cache.page_tokens, cache.pool.rows / cache.page_tokens, cache.pool.data,
     cache.pool.dtype == DType::kBF16, Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(PagedCacheWrite)
  (rows.As<float>(), rows.RowStride(), n, width, begin, cache.page_table.As<int32_t>(),
   cache.page_tokens, cache.pool.data, cache.pool.dtype);
}

void PagedCacheRead(const PagedCache& cache, int64_t begin, const MutableTensor& rows) {
  const int64_t n = rows.rows, width = rows.cols;
  const Device device = DELTASERVE_OP_DEVICE(rows);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, rows, DType::kF32, n, width);
  CheckCovers(device, cache, width, begin, begin + n);
  DELTASERVE_CHECK(!Overlaps(rows, cache.pool));
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(PagedCacheRead)
    (cache.pool.data, cache.pool.dtype == DType::kBF16, cache.page_table.As<int32_t>(),
     cache.page_tokens, cache.pool.rows / cache.page_tokens, begin, n, width, rows.As<float>(),
     rows.RowStride(), Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(PagedCacheRead)
  (cache.pool.data, cache.pool.dtype, cache.page_table.As<int32_t>(), cache.page_tokens, begin, n,
   width, rows.As<float>(), rows.RowStride());
}

void PagedCacheCopyPage(const MutableTensor& pool, int64_t page_tokens, int32_t from, int32_t to,
                        int64_t tokens) {
  DELTASERVE_CHECK(page_tokens >= 1 && pool.rows % page_tokens == 0);
  DELTASERVE_CHECK(pool.dtype == DType::kF32 || pool.dtype == DType::kBF16);
  const Device device = DELTASERVE_OP_DEVICE(pool);
  DELTASERVE_CHECK_VIEW_ON(device, pool, pool.dtype, pool.rows, pool.cols);
  const int64_t pool_pages = pool.rows / page_tokens;
  DELTASERVE_CHECK(from >= 0 && from < pool_pages && to >= 0 && to < pool_pages && from != to);
  DELTASERVE_CHECK(tokens >= 0 && tokens <= page_tokens);
  const int64_t row_bytes = pool.RowBytes();
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(PagedCacheCopyPage)
    (static_cast<char*>(pool.data) + from * page_tokens * row_bytes,
     static_cast<char*>(pool.data) + to * page_tokens * row_bytes, tokens * row_bytes,
     Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(PagedCacheCopyPage)
  (static_cast<char*>(pool.data) + from * page_tokens * row_bytes,
   static_cast<char*>(pool.data) + to * page_tokens * row_bytes, tokens * row_bytes);
}

}  // namespace deltaserve::kernels
