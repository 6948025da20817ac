#include "kernels/reference/activation_ref.h"

#include <cmath>

namespace deltaserve::kernels::ref {
namespace {

double Sigmoid(double x) {
  // exp(-x) overflows to inf for x < -709, giving the right limit 0.
  return 1.0 / (1.0 + std::exp(-x));
}

double Act(double g, double u, const ActivationParams& p) {
  if (p.kind == Activation::kSilu) return g * Sigmoid(g) * u;
  const double beta = p.situ_beta;
  const double lbeta = p.situ_linear_beta;
  return beta * std::tanh(g / beta) * Sigmoid(g) * lbeta * std::tanh(u / lbeta);
}

}  // namespace

void GatedActivation(const double* gu, int64_t rows, int64_t width, const ActivationParams& params,
                     double* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const double g = gu[r * 2 * width + c];
      const double u = gu[r * 2 * width + width + c];
      out[r * width + c] = Act(g, u, params);
    }
  }
}

}  // namespace deltaserve::kernels::ref
