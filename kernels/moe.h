// Mixture-of-experts: sigmoid routing with a selection-only bias, and the
// routed expert compute (tokens grouped by expert, one GEMM pair each).
#pragma once

#include <cstdint>

#include "kernels/activation.h"
#include "kernels/tensor.h"

namespace deltaserve::kernels {

// scores = sigmoid(logits[T, E]); per token pick the top_k experts by
// scores + bias (bias may be null; ties go to the lower index), then
// weights = scores[sel] / sum(scores[sel]) * scaling when renormalize, else
// scores[sel] * scaling. idx, weights: [T, top_k], in selection order.
void MoeRoute(const float* logits, const float* bias, int64_t t, int64_t experts, int64_t top_k,
              bool renormalize, float scaling, int32_t* idx, float* weights);

struct MoeExpert {
  Tensor w13;  // [2 * inter, din]: w1 (gate) rows then w3 (up) rows
  Tensor w2;   // [dout, inter]
};

struct MoeExpertsArgs {
  int64_t t = 0, din = 0, inter = 0, dout = 0, top_k = 0, n_experts = 0;
  const float* z = nullptr;            // [T, din]
  const MoeExpert* experts = nullptr;  // [n_experts]
  const int32_t* idx = nullptr;        // [T, top_k]
  const float* weights = nullptr;      // [T, top_k]
  ActivationParams act;
  float* out = nullptr;  // [T, dout], overwritten
};

// out[t] = sum_j weights[t, j] · w2_e(act(w1_e z[t], w3_e z[t])), e = idx[t, j].
// Expert weights may be of any dtype (K3 publishes them in MXFP4). An
// expert with empty weights is held by another rank (expert parallelism):
// its selections add nothing here, and the ranks' partial sums add up.
void MoeExperts(const MoeExpertsArgs& args);

}  // namespace deltaserve::kernels
