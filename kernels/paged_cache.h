// The MLA latent cache in pages: a pool of rows [pages * page_tokens, width]
// (f32 or bf16) shared by a rank's sequences, and per sequence a page table
// whose entry p names the pool page that holds the sequence's tokens
// [p * page_tokens, (p + 1) * page_tokens). Token s of a sequence is pool row
// page_table[s / page_tokens] * page_tokens + s % page_tokens
// (kernels/mla_attention.h's absorbed form reads keys through the same map).
// These ops move rows between a sequence's tokens and the pool.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// A sequence's view of a pool: the pool rows, its page table (i32 [1, pages])
// and the page size in tokens (>= 1).
template <bool kWritable>
struct BasicPagedCache {
  BasicTensor<kWritable> pool;  // [pool pages * page_tokens, width], f32 or bf16
  Tensor page_table;            // i32 [1, pages of this sequence]
  int64_t page_tokens = 0;

  // The read-only view of the same cache.
  operator BasicPagedCache<false>() const requires kWritable {
    return BasicPagedCache<false>{pool, page_table, page_tokens};
  }
};
using PagedCache = BasicPagedCache<false>;
using MutablePagedCache = BasicPagedCache<true>;

// Writes rows (f32 [n, width], may be strided) as the sequence's tokens
// [begin, begin + n): copied to an f32 pool, rounded to nearest even for a
// bf16 one (kernels/bf16.h). The page table must cover begin + n tokens;
// rows must not overlap the pool.
void PagedCacheWrite(const Tensor& rows, int64_t begin, const MutablePagedCache& cache);

// Reads the sequence's tokens [begin, begin + rows.rows) into rows (f32
// [n, width], may be strided): copied, or widened exactly from bf16.
void PagedCacheRead(const PagedCache& cache, int64_t begin, const MutableTensor& rows);

// Copies the first `tokens` rows of pool page `from` to pool page `to`
// (distinct pages, tokens <= page_tokens), as stored: a forked sequence's
// own copy of a partly filled page.
void PagedCacheCopyPage(const MutableTensor& pool, int64_t page_tokens, int32_t from, int32_t to,
                        int64_t tokens);

}  // namespace deltaserve::kernels
