// Dense and MoE FFNs (MODEL.md, "FFN"), including K3's latent MoE where the
// routed experts work in a smaller latent space between a down and an up
// projection, with an RMSNorm on the latent sum.
#include <cstdint>
#include <vector>

#include "kernels/activation.h"
#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/workspace.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/layers.h"

namespace deltaserve {
namespace {

kernels::ActivationParams ActivationOf(const ModelConfig& config) {
  kernels::ActivationParams p;
  p.kind = config.hidden_act == "situ" ? kernels::Activation::kSitu : kernels::Activation::kSilu;
  p.situ_beta = config.situ_beta;
  p.situ_linear_beta = config.situ_linear_beta;
  return p;
}

// out (+)= down(act(gate_up x)).
// The width is this rank's share: down's columns.
void GatedMlp(const Weight& gate_up, const Weight& down, const kernels::ActivationParams& act,
              const kernels::Tensor& x, const kernels::MutableTensor& out, bool accumulate) {
  using namespace kernels;
  const int64_t rows = x.rows, width = down.cols();
  const Temp gu(x.device, kernels::DType::kF32, rows, 2 * width),
      h(x.device, kernels::DType::kF32, rows, width);
  Linear(x, gate_up, gu);
  GatedActivation(gu, act, h);
  Linear(h, down, out, accumulate);
}

}  // namespace

absl::Status TpAllReduce(DataCommunicator* tp, const kernels::MutableTensor& data) {
  if (tp == nullptr || tp->size() == 1) return absl::OkStatus();
  DELTASERVE_CHECK_VIEW_ON(data.device, data, kernels::DType::kF32, data.rows, data.cols);
  return tp->AllReduceSum(data.As<float>(), static_cast<size_t>(data.rows * data.cols),
                          kernels::Workspace::Of(data.device).stream());
}

absl::Status FfnForward(const ModelConfig& config, const FfnWeights& w, const kernels::Tensor& x,
                        const kernels::MutableTensor& out, DataCommunicator* tp) {
  using namespace kernels;
  const Device dev = x.device;
  const int64_t rows = x.rows;
  const ActivationParams act = ActivationOf(config);
  if (!w.moe) {
    GatedMlp(w.gate_up, w.down, act, x, out, /*accumulate=*/false);
    return TpAllReduce(tp, out);
  }
  // Routing is replicated: every rank computes the same selection.
  const int64_t E = config.num_experts, k = config.num_experts_per_token;
  const Temp logits(dev, kernels::DType::kF32, rows, E),
      weights(dev, kernels::DType::kF32, rows, k);
  const Temp idx(dev, kernels::DType::kI32, rows, k);
  // K3's latent MoE: the routed experts take x projected down to z.
  const bool latent = !w.latent_down.empty();
  const int64_t din = latent ? config.routed_expert_hidden_size : config.hidden_size;
  const Temp z(dev, kernels::DType::kF32, latent ? rows : 0, din);
  if (latent) {
    LinearGroup(std::vector<LinearProduct>{{x, w.router, logits}, {x, w.latent_down, z}});
  } else {
    Linear(x, w.router, logits);
  }
  MoeRoute(logits, w.router_bias.view(), k, config.moe_renormalize, config.routed_scaling_factor,
           idx, weights);
  // Experts held by other TP ranks stay empty: their selections add nothing.
  std::vector<MoeExpert> experts(E);
  for (int64_t e = 0; e < E; ++e) {
    if (w.expert_w13[e].empty()) continue;
    experts[e].w13 = w.expert_w13[e];
    experts[e].w2 = w.expert_w2[e];
  }
  const Temp routed(dev, kernels::DType::kF32, latent ? rows : 0, din);
  MoeExpertsArgs args;
  args.t = rows;
  args.din = din;
  args.inter = config.moe_intermediate_size;
  args.dout = din;
  args.top_k = k;
  args.n_experts = E;
  args.z = latent ? Tensor(z) : x;
  args.experts = experts.data();
  args.idx = idx;
  args.weights = weights;
  args.act = act;
  args.out = latent ? routed.view() : out;
  MoeExperts(args);
  const bool has_shared = !w.shared_down.empty();
  if (!latent) {
    // Routed and shared partial sums reduce together.
    if (has_shared) GatedMlp(w.shared_gate_up, w.shared_down, act, x, out, /*accumulate=*/true);
    return TpAllReduce(tp, out);
  }
  // K3 latent MoE: the routed sum is reduced in the latent space, before its
  // RMSNorm (MODEL.md); the up-projection is then the same on every rank.
  DELTASERVE_RETURN_IF_ERROR(TpAllReduce(tp, routed));
  if (!w.latent_norm.empty()) {
    RmsNorm(routed, w.latent_norm.view(), config.rms_norm_eps, routed);
  }
  Linear(routed, w.latent_up, out);
  if (!has_shared) return absl::OkStatus();
  if (tp == nullptr || tp->size() == 1) {
    GatedMlp(w.shared_gate_up, w.shared_down, act, x, out, /*accumulate=*/true);
    return absl::OkStatus();
  }
  const Temp shared(dev, kernels::DType::kF32, rows, config.hidden_size);
  GatedMlp(w.shared_gate_up, w.shared_down, act, x, shared, /*accumulate=*/false);
  DELTASERVE_RETURN_IF_ERROR(TpAllReduce(tp, shared));
  Add(out, shared, out);
  return absl::OkStatus();
}

}  // namespace deltaserve
