// Float64 reference for kernels/moe.h: routing, and each token's experts
// computed directly (no grouping).
#pragma once

#include <cstdint>

#include "kernels/activation.h"

namespace deltaserve::kernels::ref {

// Same contract as kernels::MoeRoute, in double.
void MoeRoute(const double* logits, const double* bias, int64_t t, int64_t experts, int64_t top_k,
              bool renormalize, double scaling, int32_t* idx, double* weights);

struct MoeExpert {
  const double* w13 = nullptr;  // [2 * inter, din]: w1 rows then w3 rows
  const double* w2 = nullptr;   // [dout, inter]
};

struct MoeExpertsArgs {
  int64_t t = 0, din = 0, inter = 0, dout = 0, top_k = 0, n_experts = 0;
  const double* z = nullptr;           // [T, din]
  const MoeExpert* experts = nullptr;  // [n_experts]
  const int32_t* idx = nullptr;        // [T, top_k]
  const double* weights = nullptr;     // [T, top_k]
  ActivationParams act;
  double* out = nullptr;  // [T, dout]
};

// out[t] = sum_j weights[t, j] · w2_e(act(w1_e z[t], w3_e z[t])), e = idx[t,
// j].
void MoeExperts(const MoeExpertsArgs& args);

}  // namespace deltaserve::kernels::ref
