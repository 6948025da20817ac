// Entry point of kernels/elementwise.h: the contract, then the CPU variant of
// this machine's level.
#include "kernels/elementwise.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {
namespace {

// Exactly the same elements (in place), or none shared.
bool SameOrApart(const Tensor& in, const Tensor& out) {
  return (in.data == out.data && in.RowStride() == out.RowStride()) || !Overlaps(in, out);
}

}  // namespace

void Add(const Tensor& a, const Tensor& b, const MutableTensor& out) {
  const int64_t rows = out.rows, cols = out.cols;
  DELTASERVE_CHECK_STRIDED_VIEW(out, DType::kF32, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW(a, DType::kF32, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW(b, DType::kF32, rows, cols);
  DELTASERVE_CHECK(SameOrApart(a, out));
  DELTASERVE_CHECK(SameOrApart(b, out));
  if (out.empty()) return;
  DELTASERVE_CPU_DISPATCH(Add)
  (a.As<float>(), a.RowStride(), b.As<float>(), b.RowStride(), rows, cols, out.As<float>(),
   out.RowStride());
}

void SigmoidGate(const Tensor& x, const Tensor& gate, const MutableTensor& out) {
  const int64_t rows = out.rows, cols = out.cols;
  DELTASERVE_CHECK_STRIDED_VIEW(out, DType::kF32, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW(x, DType::kF32, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW(gate, DType::kF32, rows, cols);
  DELTASERVE_CHECK(SameOrApart(x, out));
  DELTASERVE_CHECK(!Overlaps(gate, out));
  if (out.empty()) return;
  DELTASERVE_CPU_DISPATCH(SigmoidGate)
  (x.As<float>(), x.RowStride(), gate.As<float>(), gate.RowStride(), rows, cols, out.As<float>(),
   out.RowStride());
}

void Sigmoid(const Tensor& x, const MutableTensor& out) {
  const int64_t rows = out.rows, cols = out.cols;
  DELTASERVE_CHECK_STRIDED_VIEW(out, DType::kF32, rows, cols);
  DELTASERVE_CHECK_STRIDED_VIEW(x, DType::kF32, rows, cols);
  DELTASERVE_CHECK(SameOrApart(x, out));
  if (out.empty()) return;
  DELTASERVE_CPU_DISPATCH(Sigmoid)
  (x.As<float>(), x.RowStride(), rows, cols, out.As<float>(), out.RowStride());
}

}  // namespace deltaserve::kernels
