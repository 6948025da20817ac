// Products of sizes that come from a file or a request (a config's layers x
// experts x widths, a request's tokens x vocabulary), computed with overflow
// checks and held to a limit, so that a hostile size is refused with a
// message naming the product instead of overflowing or exhausting memory.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/statusor.h"

namespace deltaserve {

struct SizeFactor {
  const char* name;  // the key or quantity, e.g. "num_experts"
  int64_t value;     // >= 0
};

// The product of `factors` when it is at most `limit`; otherwise
// InvalidArgument "<what>: a x b x ... = 4096 x 65536 x ... = N, over the
// limit of L" (or "overflows 64 bits").
absl::StatusOr<int64_t> CheckedProduct(std::initializer_list<SizeFactor> factors, int64_t limit,
                                       const std::string& what);

}  // namespace deltaserve
