// Float64 reference for kernels/elementwise.h, on contiguous [rows * cols]
// arrays (the tests lay strided views out themselves).
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

void Add(const double* a, const double* b, int64_t n, double* out);
void SigmoidGate(const double* x, const double* gate, int64_t n, double* out);
void Sigmoid(const double* x, int64_t n, double* out);

}  // namespace deltaserve::kernels::ref
