#include "kernels/reference/short_conv_ref.h"

#include <cmath>
#include <vector>

namespace deltaserve::kernels::ref {

void ShortConv(const double* x, const double* w, int64_t t, int64_t channels, int64_t width,
               bool silu, double* state, double* y) {
  const int64_t history = width - 1;
  // x̃ = [state; x]: [history + t, channels].
  std::vector<double> xt((history + t) * channels);
  for (int64_t i = 0; i < history * channels; ++i) xt[i] = state[i];
  for (int64_t i = 0; i < t * channels; ++i) xt[history * channels + i] = x[i];
  for (int64_t s = 0; s < t; ++s) {
    for (int64_t c = 0; c < channels; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < width; ++j) {
        acc += w[c * width + j] * xt[(s + j) * channels + c];
      }
      y[s * channels + c] = silu ? acc / (1.0 + std::exp(-acc)) : acc;
    }
  }
  for (int64_t r = 0; r < history; ++r) {
    for (int64_t c = 0; c < channels; ++c) {
      state[r * channels + c] = xt[(t + r) * channels + c];
    }
  }
}

}  // namespace deltaserve::kernels::ref
