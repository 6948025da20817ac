#include "kernels/reference/embedding_ref.h"

namespace deltaserve::kernels::ref {

void Embedding(const double* table, int64_t vocab, int64_t dim, const int32_t* tokens, int64_t t,
               double* out) {
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t c = 0; c < dim; ++c) out[i * dim + c] = table[tokens[i] * dim + c];
  }
}

}  // namespace deltaserve::kernels::ref
