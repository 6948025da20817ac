// Random bytes from the kernel (getrandom), for what must not be guessed:
// request ids, tokens, unseeded sampling.
#pragma once

#include <cstddef>

#include "absl/status/status.h"

namespace deltaserve {

// Fills `out` with `size` random bytes, retrying interrupted and short
// reads. INTERNAL naming the system's reason when the kernel gives none.
absl::Status FillRandom(void* out, size_t size);

}  // namespace deltaserve
