// Float64 reference for kernels/paged_cache.h: where a token lives in the
// pool, and what a bf16 pool stores for a value.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

// The pool row of token s of a sequence with this page table.
int64_t PagedRow(const int32_t* page_table, int64_t page_tokens, int64_t s);

// x rounded to bfloat16: 8 significant bits, to nearest with ties to even
// (for x of float32's normal range, as the cache's values are).
double RoundToBf16(double x);

}  // namespace deltaserve::kernels::ref
