// Token embedding lookup. (The LM head is a plain Linear over the vocabulary.)
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

// out[i, :] = table[tokens[i], :]. Token ids must be in [0, vocab): callers
// validate request input before it reaches a kernel.
void Embedding(const float* table, int64_t vocab, int64_t dim, const int32_t* tokens, int64_t t,
               float* out);

}  // namespace deltaserve::kernels
