// Float64 reference for kernels/paged_cache.h: where a token lives in the
// pool. What a bf16 pool stores for a value is ref::RoundToBf16, in
// kernels/reference/convert_ref.h.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

// The pool row of token s of a sequence with this page table.
int64_t PagedRow(const int32_t* page_table, int64_t page_tokens, int64_t s);

}  // namespace deltaserve::kernels::ref
