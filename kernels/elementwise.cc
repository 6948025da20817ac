// Entry point of kernels/elementwise.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/elementwise.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {
namespace {

// Exactly the same elements (in place), or none shared.
bool SameOrApart(const Tensor& in, const Tensor& out) {
  return (in.data == out.data && in.RowStride() == out.RowStride()) || !Overlaps(in, out);
}

}  // namespace

void Add(const Tensor& a, const Tensor& b, const MutableTensor& out) {
  const int64_t rows = out.rows, cols = out.cols;
  const Device device = DELTASERVE_OP_DEVICE(out);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, out, DType::kF32, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, a, DType::kF32, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, b, DType::kF32, rows, cols);
  DELTASERVE_CHECK(SameOrApart(a, out));
  DELTASERVE_CHECK(SameOrApart(b, out));
  if (out.empty()) return;
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(Add)
    (a.As<float>(), a.RowStride(), b.As<float>(), b.RowStride(), rows, cols, out.As<float>(),
     out.RowStride(), Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(Add)
  (a.As<float>(), a.RowStride(), b.As<float>(), b.RowStride(), rows, cols, out.As<float>(),
   out.RowStride());
}

void SigmoidGate(const Tensor& x, const Tensor& gate, const MutableTensor& out) {
  const int64_t rows = out.rows, cols = out.cols;
  const Device device = DELTASERVE_OP_DEVICE(out);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, out, DType::kF32, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, x, DType::kF32, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, gate, DType::kF32, rows, cols);
  DELTASERVE_CHECK(SameOrApart(x, out));
  DELTASERVE_CHECK(!Overlaps(gate, out));
  if (out.empty()) return;
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(SigmoidGate)
    (x.As<float>(), x.RowStride(), gate.As<float>(), gate.RowStride(), rows, cols, out.As<float>(),
     out.RowStride(), Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(SigmoidGate)
  (x.As<float>(), x.RowStride(), gate.As<float>(), gate.RowStride(), rows, cols, out.As<float>(),
   out.RowStride());
}

void Sigmoid(const Tensor& x, const MutableTensor& out) {
  const int64_t rows = out.rows, cols = out.cols;
  const Device device = DELTASERVE_OP_DEVICE(out);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, out, DType::kF32, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, x, DType::kF32, rows, cols);
  DELTASERVE_CHECK(SameOrApart(x, out));
  if (out.empty()) return;
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(Sigmoid)
    (x.As<float>(), x.RowStride(), rows, cols, out.As<float>(), out.RowStride(),
     Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(Sigmoid)
  (x.As<float>(), x.RowStride(), rows, cols, out.As<float>(), out.RowStride());
}

}  // namespace deltaserve::kernels
