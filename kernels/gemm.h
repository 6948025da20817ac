// Linear layers: y = x · Wᵀ with W stored [out, in] as PyTorch does, in the
// dtype its checkpoint holds (kernels/tensor.h). x and y are float32 and the
// sums are float32: bf16 and MXFP4 weights widen to float32 exactly, so the
// result is the float32 product with the dequantised weights, to summation
// order. How each size and dtype is computed: kernels/cpu/gemm_cpu.cc and,
// on CUDA, kernels/cuda/gemm_cuda.cu.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// y[m, n] = x[m, k] · w[n, k]ᵀ, or y += ... when accumulate, with w
// [n, k] contiguous in f32, bf16 or mxfp4, x f32 [m, k] and y f32 [m, n]. x
// and y may be strided (Tensor::stride), so a GEMM can read or write a column
// block of a wider row. y must not overlap x or w. m == 0 is a no-op.
void Linear(const Tensor& x, const Tensor& w, const MutableTensor& y, bool accumulate = false);

// One product of LinearGroup: y (+)= x · wᵀ, the views as Linear takes them.
struct LinearProduct {
  Tensor x;
  Tensor w;
  MutableTensor y;
  bool accumulate = false;
};

// Linear for each product, with the same results bit for bit, as one piece
// of work: on the CPU, the products of a few rows of x (decode) share one
// parallel region, whose start and end cost a few microseconds each time
// (docs/performance.md), instead of one region each. For products that do
// not depend on each other, such as a layer's projections of one input: no
// product's y may overlap another product's x, w or y. All on one device.
void LinearGroup(std::span<const LinearProduct> products);

// Whether a bf16 weight with compute kBF16 (tensor.h) gets the bf16 matmul on
// this CPU (oneDNN on AVX512-BF16 or AMX); elsewhere it computes in float32.
// On CUDA it always does (above the decode sizes), whatever this says.
bool Bf16ComputeAvailable();

}  // namespace deltaserve::kernels
