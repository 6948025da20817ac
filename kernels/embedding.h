// Token embedding lookup. (The LM head is a plain Linear over the vocabulary.)
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// out[i, :] = table[tokens[i], :] as float32, table [vocab, dim] in f32,
// bf16 or mxfp4; tokens: i32 [1, T]; out: f32 [T, dim]. Token ids must be in
// [0, vocab): callers validate request input before it reaches a kernel.
void Embedding(const Tensor& table, const Tensor& tokens, const MutableTensor& out);

}  // namespace deltaserve::kernels
