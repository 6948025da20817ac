#include "kernels/reference/elementwise_ref.h"

#include <cmath>

namespace deltaserve::kernels::ref {
namespace {

// exp(-x) overflows to inf for x < -709, giving the right limit 0.
double SigmoidOf(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

void Add(const double* a, const double* b, int64_t n, double* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void SigmoidGate(const double* x, const double* gate, int64_t n, double* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * SigmoidOf(gate[i]);
}

void Sigmoid(const double* x, int64_t n, double* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = SigmoidOf(x[i]);
}

}  // namespace deltaserve::kernels::ref
