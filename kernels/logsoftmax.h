// Log-softmax statistics of logit rows, what scoring and sampling report:
// each row's log-partition log_z, the log-prob of a target id, the top-k ids
// with their log-probs, and the check for non-finite logits that comes first.
// The arithmetic is that of the scalar code these replace
// (runtime/engine/step_executor.cc), to the bit:
//   max = the largest logit (as double); sum = Σ_i exp(logit_i - max) in
//   double, in id order; log_z = max + log(sum);
//   log-prob of id = static_cast<float>(logit_id - log_z).
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// Rows of V logits. top_k' = min(top_k, V) below.
struct LogSoftmaxTopKArgs {
  Tensor logits;  // f32 [rows, V], V >= 1 when rows > 0; row stride >= V
  // I32 [rows, 1], or empty for none. A target outside [0, V) (a position
  // with nothing to score) gets log-prob 0.0f.
  Tensor targets;
  int64_t top_k = 0;              // >= 0
  MutableTensor log_z;            // f64 [rows, 1]
  MutableTensor target_logprobs;  // f32 [rows, 1]; empty exactly when targets is
  // The top_k' most likely ids of each row, highest logit first, the lower id
  // first among equal logits, and their log-probs. Both may be empty views
  // when top_k' = 0. The ids' order assumes no NaN logit (FindNonFinite
  // first): with one, the ids are valid but their choice is unspecified.
  MutableTensor top_ids;       // i32 [rows, top_k']
  MutableTensor top_logprobs;  // f32 [rows, top_k']
};

// No output may overlap the inputs or another output.
void LogSoftmaxTopK(const LogSoftmaxTopKArgs& args);

// The row-major index (r * cols + c) of the first NaN or ±inf of f32
// [rows, cols] x (any row stride >= cols), or -1 when all are finite.
int64_t FindNonFinite(const Tensor& x);

}  // namespace deltaserve::kernels
