// Dense and MoE FFNs (MODEL.md, "FFN"), including K3's latent MoE where the
// routed experts work in a smaller latent space between a down and an up
// projection, with an RMSNorm on the latent sum.
#include <cstdint>
#include <vector>

#include "kernels/activation.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/scratch.h"
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
void GatedMlp(const Weight& gate_up, const Weight& down, int64_t rows,
              const kernels::ActivationParams& act, const float* x, float* out, bool accumulate) {
  const int64_t width = down.cols();
  kernels::ScratchFloats gu(rows * 2 * width), h(rows * width);
  kernels::Linear(kernels::Tensor::F32(x, rows, gate_up.cols()), gate_up,
                  kernels::MutableTensor::F32(gu.data(), rows, 2 * width));
  kernels::GatedActivation(kernels::Tensor::F32(gu.data(), rows, 2 * width), act,
                           kernels::MutableTensor::F32(h.data(), rows, width));
  kernels::Linear(kernels::Tensor::F32(h.data(), rows, width), down,
                  kernels::MutableTensor::F32(out, rows, down.rows()), accumulate);
}

}  // namespace

absl::Status TpAllReduce(DataCommunicator* tp, float* data, int64_t count,
                         const kernels::Stream& stream) {
  if (tp == nullptr || tp->size() == 1) return absl::OkStatus();
  return tp->AllReduceSum(data, static_cast<size_t>(count), stream);
}

absl::Status FfnForward(const ModelConfig& config, const FfnWeights& w, int64_t rows,
                        const float* x, float* out, DataCommunicator* tp) {
  const int64_t D = config.hidden_size;
  const kernels::ActivationParams act = ActivationOf(config);
  if (!w.moe) {
    GatedMlp(w.gate_up, w.down, rows, act, x, out, /*accumulate=*/false);
    return TpAllReduce(tp, out, rows * D, kernels::Stream::Cpu());
  }
  // Routing is replicated: every rank computes the same selection.
  const int64_t E = config.num_experts, k = config.num_experts_per_token;
  kernels::ScratchFloats logits(rows * E), weights(rows * k);
  kernels::Scratch<int32_t> idx(rows * k);
  kernels::Linear(kernels::Tensor::F32(x, rows, D), w.router,
                  kernels::MutableTensor::F32(logits.data(), rows, E));
  kernels::MoeRoute(kernels::Tensor::F32(logits.data(), rows, E),
                    kernels::Tensor::F32(w.router_bias.data(), w.router_bias.empty() ? 0 : 1, E), k,
                    config.moe_renormalize, config.routed_scaling_factor,
                    kernels::MutableTensor::I32(idx.data(), rows, k),
                    kernels::MutableTensor::F32(weights.data(), rows, k));

  const bool latent = !w.latent_down.empty();
  const int64_t din = latent ? config.routed_expert_hidden_size : D;
  kernels::ScratchFloats z(latent ? rows * din : 0);
  if (latent) {
    kernels::Linear(kernels::Tensor::F32(x, rows, D), w.latent_down,
                    kernels::MutableTensor::F32(z.data(), rows, din));
  }
  // Experts held by other TP ranks stay empty: their selections add nothing.
  std::vector<kernels::MoeExpert> experts(E);
  for (int64_t e = 0; e < E; ++e) {
    if (w.expert_w13[e].empty()) continue;
    experts[e].w13 = w.expert_w13[e];
    experts[e].w2 = w.expert_w2[e];
  }
  kernels::ScratchFloats routed(latent ? rows * din : 0);
  kernels::MoeExpertsArgs args;
  args.t = rows;
  args.din = din;
  args.inter = config.moe_intermediate_size;
  args.dout = din;
  args.top_k = k;
  args.n_experts = E;
  args.z = kernels::Tensor::F32(latent ? z.data() : x, rows, din);
  args.experts = experts.data();
  args.idx = kernels::Tensor::I32(idx.data(), rows, k);
  args.weights = kernels::Tensor::F32(weights.data(), rows, k);
  args.act = act;
  args.out = kernels::MutableTensor::F32(latent ? routed.data() : out, rows, din);
  kernels::MoeExperts(args);
  const bool has_shared = !w.shared_down.empty();
  if (!latent) {
    // Routed and shared partial sums reduce together.
    if (has_shared) {
      GatedMlp(w.shared_gate_up, w.shared_down, rows, act, x, out, /*accumulate=*/true);
    }
    return TpAllReduce(tp, out, rows * D, kernels::Stream::Cpu());
  }
  // K3 latent MoE: the routed sum is reduced in the latent space, before its
  // RMSNorm (MODEL.md); the up-projection is then the same on every rank.
  DELTASERVE_RETURN_IF_ERROR(TpAllReduce(tp, routed.data(), rows * din, kernels::Stream::Cpu()));
  if (!w.latent_norm.empty()) {
    kernels::RmsNorm(kernels::Tensor::F32(routed.data(), rows, din),
                     kernels::Tensor::F32(w.latent_norm.data(), 1, din), config.rms_norm_eps,
                     kernels::MutableTensor::F32(routed.data(), rows, din));
  }
  kernels::Linear(kernels::Tensor::F32(routed.data(), rows, din), w.latent_up,
                  kernels::MutableTensor::F32(out, rows, D));
  if (!has_shared) return absl::OkStatus();
  if (tp == nullptr || tp->size() == 1) {
    GatedMlp(w.shared_gate_up, w.shared_down, rows, act, x, out, /*accumulate=*/true);
    return absl::OkStatus();
  }
  kernels::ScratchFloats shared(rows * D);
  GatedMlp(w.shared_gate_up, w.shared_down, rows, act, x, shared.data(), /*accumulate=*/false);
  DELTASERVE_RETURN_IF_ERROR(TpAllReduce(tp, shared.data(), rows * D, kernels::Stream::Cpu()));
  for (int64_t i = 0; i < rows * D; ++i) out[i] += shared[i];
  return absl::OkStatus();
}

}  // namespace deltaserve
