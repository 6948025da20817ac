#include "kernels/reference/moe_ref.h"

#include <cmath>
#include <vector>

#include "kernels/reference/activation_ref.h"
#include "kernels/reference/gemm_ref.h"

namespace deltaserve::kernels::ref {

void MoeRoute(const double* logits, const double* bias, int64_t t, int64_t experts, int64_t top_k,
              bool renormalize, double scaling, int32_t* idx, double* weights) {
  std::vector<double> score(experts);
  std::vector<bool> taken(experts);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t e = 0; e < experts; ++e) {
      score[e] = 1.0 / (1.0 + std::exp(-logits[i * experts + e]));
      taken[e] = false;
    }
    // top_k rounds of "highest key not taken yet"; the strict > keeps the
    // lower index on ties.
    double sum = 0.0;
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t best = -1;
      double best_key = 0.0;
      for (int64_t e = 0; e < experts; ++e) {
        if (taken[e]) continue;
        const double key = score[e] + (bias != nullptr ? bias[e] : 0.0);
        if (best < 0 || key > best_key) {
          best = e;
          best_key = key;
        }
      }
      taken[best] = true;
      idx[i * top_k + j] = static_cast<int32_t>(best);
      sum += score[best];
    }
    for (int64_t j = 0; j < top_k; ++j) {
      const double s = score[idx[i * top_k + j]];
      weights[i * top_k + j] = (renormalize ? s / sum : s) * scaling;
    }
  }
}

void MoeExperts(const MoeExpertsArgs& a) {
  std::vector<double> h(2 * a.inter), act(a.inter), y(a.dout);
  for (int64_t i = 0; i < a.t; ++i) {
    double* out = a.out + i * a.dout;
    for (int64_t c = 0; c < a.dout; ++c) out[c] = 0.0;
    for (int64_t j = 0; j < a.top_k; ++j) {
      const MoeExpert& e = a.experts[a.idx[i * a.top_k + j]];
      if (e.w13 == nullptr) continue;  // held by another rank
      Linear(a.z + i * a.din, e.w13, 1, 2 * a.inter, a.din, h.data());
      GatedActivation(h.data(), 1, a.inter, a.act, act.data());
      Linear(act.data(), e.w2, 1, a.dout, a.inter, y.data());
      const double w = a.weights[i * a.top_k + j];
      for (int64_t c = 0; c < a.dout; ++c) out[c] += w * y[c];
    }
  }
}

}  // namespace deltaserve::kernels::ref
