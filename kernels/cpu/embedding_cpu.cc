// Embedding lookup: one row copy per token.
#include <cstring>

#include "kernels/check.h"
#include "kernels/embedding.h"

namespace deltaserve::kernels {
namespace {

// Below this many elements an OpenMP fork costs more than the copies.
constexpr int64_t kParallelMinElements = int64_t{1} << 16;

}  // namespace

void Embedding(const float* table, int64_t vocab, int64_t dim, const int32_t* tokens, int64_t t,
               float* out) {
  DELTASERVE_CHECK(vocab >= 0 && dim >= 0 && t >= 0);
  if (t == 0 || dim == 0) return;
  // An id outside the table would read foreign memory: the callers' validation
  // is the contract, this check the last line (one compare per row).
  for (int64_t i = 0; i < t; ++i) {
    DELTASERVE_CHECK(tokens[i] >= 0 && tokens[i] < vocab);
  }
  const bool parallel = t > 1 && t * dim >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < t; ++i) {
    std::memcpy(out + i * dim, table + static_cast<int64_t>(tokens[i]) * dim,
                static_cast<size_t>(dim) * sizeof(float));
  }
}

}  // namespace deltaserve::kernels
