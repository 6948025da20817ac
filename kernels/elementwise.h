// Elementwise f32 ops the layers apply between GEMMs: residual adds and
// sigmoid gates. Each element is the one float expression written below, in
// that order, so the result is the same bits as the scalar loop it replaces
// (no vector approximation of exp).
//
// Every view is f32 [rows, cols] of one shape, each at its own row stride
// (RowStride() >= cols). The output may be exactly an input named below (the
// same data and stride: in place); no other overlap is allowed.
#pragma once

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// out[i] = a[i] + b[i]. out may be a or b.
void Add(const Tensor& a, const Tensor& b, const MutableTensor& out);

// out[i] = x[i] * (1.0f / (1.0f + std::exp(-gate[i]))). out may be x.
void SigmoidGate(const Tensor& x, const Tensor& gate, const MutableTensor& out);

// out[i] = 1.0f / (1.0f + std::exp(-x[i])). out may be x.
void Sigmoid(const Tensor& x, const MutableTensor& out);

}  // namespace deltaserve::kernels
