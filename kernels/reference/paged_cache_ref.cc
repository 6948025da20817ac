#include "kernels/reference/paged_cache_ref.h"

namespace deltaserve::kernels::ref {

int64_t PagedRow(const int32_t* page_table, int64_t page_tokens, int64_t s) {
  const int64_t page = s / page_tokens;
  return static_cast<int64_t>(page_table[page]) * page_tokens + (s - page * page_tokens);
}

}  // namespace deltaserve::kernels::ref
