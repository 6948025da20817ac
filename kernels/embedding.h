// Token embedding lookup. (The LM head is a plain Linear over the vocabulary.)
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// out[i, :] = table[tokens[i], :] as float32, table [vocab, dim] in any
// dtype. Token ids must be in [0, vocab): callers validate request input
// before it reaches a kernel.
void Embedding(const Tensor& table, const int32_t* tokens, int64_t t, float* out);

}  // namespace deltaserve::kernels
