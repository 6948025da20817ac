// Mixture-of-experts: sigmoid routing with a selection-only bias, and the
// routed expert compute (tokens grouped by expert, one GEMM pair each).
#pragma once

#include <cstdint>

#include "kernels/activation.h"
#include "kernels/tensor.h"

namespace deltaserve::kernels {

// scores = sigmoid(logits), f32 [T, E]; per token pick the top_k <= E experts
// by scores + bias (bias f32 [1, E], or an empty view for none; ties go to the
// lower index), then weights = scores[sel] / sum(scores[sel]) * scaling when
// renormalize, else scores[sel] * scaling. idx (i32) and weights (f32):
// [T, top_k], in selection order.
void MoeRoute(const Tensor& logits, const Tensor& bias, int64_t top_k, bool renormalize,
              float scaling, const MutableTensor& idx, const MutableTensor& weights);

struct MoeExpert {
  Tensor w13;  // [2 * inter, din]: w1 (gate) rows then w3 (up) rows
  Tensor w2;   // [dout, inter]
};

struct MoeExpertsArgs {
  int64_t t = 0, din = 0, inter = 0, dout = 0, top_k = 0, n_experts = 0;
  Tensor z;                            // f32 [T, din]
  const MoeExpert* experts = nullptr;  // [n_experts]
  Tensor idx;                          // i32 [T, top_k], each in [0, n_experts)
  Tensor weights;                      // f32 [T, top_k]
  ActivationParams act;
  MutableTensor out;  // f32 [T, dout], overwritten; overlaps no input
};

// out[t] = sum_j weights[t, j] · w2_e(act(w1_e z[t], w3_e z[t])), e = idx[t, j].
// Expert weights may be of any dtype (K3 publishes them in MXFP4). An
// expert with empty weights is held by another rank (expert parallelism):
// its selections add nothing here, and the ranks' partial sums add up.
void MoeExperts(const MoeExpertsArgs& args);

}  // namespace deltaserve::kernels
