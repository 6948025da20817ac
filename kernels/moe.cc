// Entry point of kernels/moe.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/moe.h"

#include <initializer_list>
#include <vector>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

void MoeRoute(const Tensor& logits, const Tensor& bias, int64_t top_k, bool renormalize,
              float scaling, const MutableTensor& idx, const MutableTensor& weights) {
  const int64_t t = logits.rows, experts = logits.cols;
  DELTASERVE_CHECK(top_k >= 0 && top_k <= experts);
  const Device device = DELTASERVE_OP_DEVICE(idx);
  DELTASERVE_CHECK_VIEW_ON(device, logits, DType::kF32, t, experts);
  if (!bias.empty() || bias.data != nullptr) {
    DELTASERVE_CHECK_VIEW_ON(device, bias, DType::kF32, 1, experts);
  }
  DELTASERVE_CHECK_VIEW_ON(device, idx, DType::kI32, t, top_k);
  DELTASERVE_CHECK_VIEW_ON(device, weights, DType::kF32, t, top_k);
  for (const Tensor* in : {&logits, &bias}) {
    DELTASERVE_CHECK(!Overlaps(*in, idx) && !Overlaps(*in, weights));
  }
  DELTASERVE_CHECK(!Overlaps(idx, weights));
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(MoeRoute)
    (logits.As<float>(), bias.empty() ? nullptr : bias.As<float>(), t, experts, top_k, renormalize,
     scaling, idx.As<int32_t>(), weights.As<float>(), Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(MoeRoute)
  (logits.As<float>(), bias.empty() ? nullptr : bias.As<float>(), t, experts, top_k, renormalize,
   scaling, idx.As<int32_t>(), weights.As<float>());
}

void MoeExperts(const MoeExpertsArgs& a) {
  DELTASERVE_CHECK(a.t >= 0 && a.din >= 0 && a.inter >= 0 && a.dout >= 0 && a.top_k >= 0 &&
                   a.n_experts >= 0);
  DELTASERVE_CHECK(a.experts != nullptr || a.n_experts == 0);
  const Device device = DELTASERVE_OP_DEVICE(a.out);
  DELTASERVE_CHECK_VIEW_ON(device, a.z, DType::kF32, a.t, a.din);
  DELTASERVE_CHECK_VIEW_ON(device, a.idx, DType::kI32, a.t, a.top_k);
  DELTASERVE_CHECK_VIEW_ON(device, a.weights, DType::kF32, a.t, a.top_k);
  DELTASERVE_CHECK_VIEW_ON(device, a.out, DType::kF32, a.t, a.dout);
  DELTASERVE_CHECK(!Overlaps(a.z, a.out) && !Overlaps(a.idx, a.out) && !Overlaps(a.weights, a.out));
  // An expert with empty weights is held by another rank; the others have
  // the shapes of the contract.
  for (int64_t e = 0; e < a.n_experts; ++e) {
    const MoeExpert& ex = a.experts[e];
    if (ex.w13.empty()) continue;
    DELTASERVE_CHECK_WEIGHT_ON(device, ex.w13, 2 * a.inter, a.din);
    DELTASERVE_CHECK_WEIGHT_ON(device, ex.w2, a.dout, a.inter);
  }
  if (device == Device::kCuda) {
    // The routing comes to the host, to be checked and to plan the grouping
    // by expert (kernels/cuda/moe_cuda.cu); the copy waits for the stream.
    const int64_t pairs = a.t * a.top_k;
    std::vector<int32_t> idx(static_cast<size_t>(pairs));
    Workspace& workspace = Workspace::Of(device);
    workspace.CopyToHost(idx.data(), a.idx.data, idx.size() * sizeof(int32_t));
    for (int64_t p = 0; p < pairs; ++p) DELTASERVE_CHECK(idx[p] >= 0 && idx[p] < a.n_experts);
    const auto weight = [](const Tensor& w) {
      return cuda::Weight{w.data, w.scales, w.dtype, w.compute, w.rows, w.cols};
    };
    std::vector<cuda::MoeExpertWeights> experts(static_cast<size_t>(a.n_experts));
    for (int64_t e = 0; e < a.n_experts; ++e) {
      experts[e] = {weight(a.experts[e].w13), weight(a.experts[e].w2)};
    }
    cuda::MoeExpertsPtrs p;
    p.t = a.t;
    p.din = a.din;
    p.inter = a.inter;
    p.dout = a.dout;
    p.top_k = a.top_k;
    p.n_experts = a.n_experts;
    p.z = a.z.As<float>();
    p.experts = experts.data();
    p.idx_host = idx.data();
    p.weights = a.weights.As<float>();
    p.situ = a.act.kind == Activation::kSitu;
    p.situ_beta = a.act.situ_beta;
    p.situ_linear_beta = a.act.situ_linear_beta;
    p.out = a.out.As<float>();
    DELTASERVE_CUDA_DISPATCH(MoeExperts)(p, workspace.stream());
    return;
  }
  const int32_t* idx = a.idx.As<int32_t>();
  for (int64_t p = 0; p < a.t * a.top_k; ++p) DELTASERVE_CHECK(idx[p] >= 0 && idx[p] < a.n_experts);
  cpu::MoeExpertsPtrs p;
  p.t = a.t;
  p.din = a.din;
  p.inter = a.inter;
  p.dout = a.dout;
  p.top_k = a.top_k;
  p.n_experts = a.n_experts;
  p.z = a.z.As<float>();
  p.experts = a.experts;
  p.idx = idx;
  p.weights = a.weights.As<float>();
  p.act = a.act;
  p.out = a.out.As<float>();
  DELTASERVE_CPU_DISPATCH(MoeExperts)(p);
}

}  // namespace deltaserve::kernels
