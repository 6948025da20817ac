// Entry point of kernels/gemm.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, kernels/cpu/gemm_cpu.cc,
// or CUDA's, kernels/cuda/gemm_cuda.cu).
#include "kernels/gemm.h"

#include <vector>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/onednn.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

namespace {

// Checks one product's views against Linear's contract; returns its device.
Device CheckLinear(const Tensor& x, const Tensor& w, const MutableTensor& y) {
  const int64_t m = y.rows;
  const Device device = DELTASERVE_OP_DEVICE(y);
  DELTASERVE_CHECK_WEIGHT_ON(device, w, w.rows, w.cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, x, DType::kF32, m, w.cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, y, DType::kF32, m, w.rows);
  DELTASERVE_CHECK(!Overlaps(x, y) && !Overlaps(w, y));
  return device;
}

void LinearOn(Device device, const Tensor& x, const Tensor& w, const MutableTensor& y,
              bool accumulate) {
  if (device == Device::kCuda) {
    const cuda::Weight cw{w.data, w.scales, w.dtype, w.compute, w.rows, w.cols};
    DELTASERVE_CUDA_DISPATCH(LinearStrided)
    (x.As<float>(), x.RowStride(), cw, y.rows, y.As<float>(), y.RowStride(), accumulate,
     Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(LinearStrided)
  (x.As<float>(), x.RowStride(), w, y.rows, y.As<float>(), y.RowStride(), accumulate);
}

}  // namespace

void Linear(const Tensor& x, const Tensor& w, const MutableTensor& y, bool accumulate) {
  LinearOn(CheckLinear(x, w, y), x, w, y, accumulate);
}

void LinearGroup(std::span<const LinearProduct> products) {
  if (products.empty()) return;
  const Device device = CheckLinear(products[0].x, products[0].w, products[0].y);
  for (size_t i = 1; i < products.size(); ++i) {
    const LinearProduct& p = products[i];
    DELTASERVE_CHECK(CheckLinear(p.x, p.w, p.y) == device);
  }
  for (size_t i = 0; i < products.size(); ++i) {
    for (size_t j = 0; j < products.size(); ++j) {
      if (i == j) continue;
      const MutableTensor& y = products[i].y;
      DELTASERVE_CHECK(!Overlaps(products[j].x, y) && !Overlaps(products[j].w, y) &&
                       !Overlaps(products[j].y, y));
    }
  }
  if (device == Device::kCuda) {
    // One stream runs the products in turn; each kernel fills the device.
    for (const LinearProduct& p : products) LinearOn(device, p.x, p.w, p.y, p.accumulate);
    return;
  }
  std::vector<cpu::LinearPtrs> ptrs;
  ptrs.reserve(products.size());
  for (const LinearProduct& p : products) {
    ptrs.push_back({p.x.As<float>(), p.x.RowStride(), &p.w, p.y.rows, p.y.As<float>(),
                    p.y.RowStride(), p.accumulate});
  }
  DELTASERVE_CPU_DISPATCH(LinearGroupStrided)(ptrs.data(), static_cast<int64_t>(ptrs.size()));
}

bool Bf16ComputeAvailable() { return onednn::HasBf16Matmul(); }

}  // namespace deltaserve::kernels
