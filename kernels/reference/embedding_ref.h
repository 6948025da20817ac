// Float64 reference for kernels/embedding.h.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

// out[i, :] = table[tokens[i], :].
void Embedding(const double* table, int64_t vocab, int64_t dim, const int32_t* tokens, int64_t t,
               double* out);

}  // namespace deltaserve::kernels::ref
