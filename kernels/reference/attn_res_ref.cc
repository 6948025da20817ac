#include "kernels/reference/attn_res_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace deltaserve::kernels::ref {

void AttnResMix(const double* const* candidates, int64_t n, int64_t t, int64_t d,
                const double* norm_w, const double* proj_w, double eps, double* out) {
  std::vector<double> score(n);
  for (int64_t tok = 0; tok < t; ++tok) {
    for (int64_t i = 0; i < n; ++i) {
      const double* v = candidates[i] + tok * d;
      double sq = 0.0, dot = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        sq += v[c] * v[c];
        dot += v[c] * (norm_w[c] * proj_w[c]);
      }
      score[i] = dot / std::sqrt(sq / static_cast<double>(d) + eps);
    }
    const double mx = *std::max_element(score.begin(), score.end());
    double sum = 0.0;
    for (double& s : score) {
      s = std::exp(s - mx);
      sum += s;
    }
    for (int64_t c = 0; c < d; ++c) {
      double acc = 0.0;
      for (int64_t i = 0; i < n; ++i) acc += score[i] / sum * candidates[i][tok * d + c];
      out[tok * d + c] = acc;
    }
  }
}

}  // namespace deltaserve::kernels::ref
