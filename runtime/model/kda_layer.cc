// The KDA mixer (MODEL.md, "KDA layer").
#include <cmath>
#include <vector>

#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/kda_gate.h"
#include "kernels/norm.h"
#include "kernels/short_conv.h"
#include "kernels/workspace.h"
#include "runtime/model/layers.h"

namespace deltaserve {
namespace {

// MODEL.md fixes l2norm's epsilon; o_norm takes rms_norm_eps from the config.
constexpr float kL2NormEps = 1e-6f;

}  // namespace

absl::Status KdaForward(const ModelConfig& config, const KdaWeights& w, int64_t layer,
                        const BatchRows& batch, const kernels::Tensor& x,
                        const kernels::MutableTensor& out, DataCommunicator* tp) {
  using namespace kernels;
  const Device dev = x.device;
  const int64_t rows = batch.rows();
  const int64_t H = config.kda.num_heads, d = config.kda.head_dim;
  const int64_t HD = H * d, width = config.kda.conv_kernel_size;
  const int64_t rank_f = w.f_a.rows();

  // The projections of x: q, k and v, the decay gate's first (low-rank) half,
  // beta, and the output gate's first half where it is low-rank, as one group
  // (on the CPU, one parallel region in decode instead of one each).
  const Temp qkv(dev, kernels::DType::kF32, rows, 3 * HD),
      conv(dev, kernels::DType::kF32, rows, 3 * HD);
  const Temp fa(dev, kernels::DType::kF32, rows, rank_f), g(dev, kernels::DType::kF32, rows, HD),
      beta(dev, kernels::DType::kF32, rows, H);
  const bool low_rank_gate = !config.kda.full_rank_gate;
  const Temp ga(dev, kernels::DType::kF32, low_rank_gate ? rows : 0,
                low_rank_gate ? w.g_a.rows() : 0);
  std::vector<LinearProduct> projections = {
      {x, w.qkv_proj, qkv}, {x, w.f_a, fa}, {x, w.b_proj, beta}};
  if (low_rank_gate) projections.push_back({x, w.g_a, ga});
  LinearGroup(projections);

  // The causal convolution of q, k and v (+SiLU), per sequence.
  for (int64_t b = 0; b < batch.sequences(); ++b) {
    const int64_t r0 = batch.Begin(b), t = batch.Count(b);
    ShortConv(qkv.view().Rows(r0, t), w.qkv_conv.view(3 * HD, width), /*silu=*/true,
              batch.states[b]->KdaConv(layer), conv.view().Rows(r0, t));
  }
  // Split into [rows, H, d] each; q and k are L2-normalised per head.
  const Temp q(dev, kernels::DType::kF32, rows, HD), k(dev, kernels::DType::kF32, rows, HD),
      v(dev, kernels::DType::kF32, rows, HD);
  Convert(conv.view().Columns(0, HD), q);
  Convert(conv.view().Columns(HD, HD), k);
  Convert(conv.view().Columns(2 * HD, HD), v);
  L2Norm(q.view().Reshaped(rows * H, d), kL2NormEps, 1.0f, q.view().Reshaped(rows * H, d));
  L2Norm(k.view().Reshaped(rows * H, d), kL2NormEps, 1.0f, k.view().Reshaped(rows * H, d));

  // Decay gate g [rows, H*d] and beta [rows, H].
  Linear(fa, w.f_b, g);
  if (config.kda.has_lower_bound) {
    KdaGateLowerBound(g, w.dt_bias.view(), w.a_log.view(), H, d, config.kda.gate_lower_bound, g);
  } else {
    KdaGateSoftplus(g, w.dt_bias.view(), w.a_log.view(), H, d, g);
  }
  Sigmoid(beta, beta);

  // The recurrence, per sequence, carrying its state.
  const Temp o(dev, kernels::DType::kF32, rows, HD);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t b = 0; b < batch.sequences(); ++b) {
    const int64_t r0 = batch.Begin(b), t = batch.Count(b);
    if (t == 0) continue;
    const KdaShape shape{t, H, H, d, d};
    const MutableTensor state = batch.states[b]->KdaState(layer);
    const auto in = [&](const Temp& a) { return Tensor(a.view().Rows(r0, t)); };
    if (t == 1) {
      KdaRecurrent(shape, in(q), in(k), in(v), in(g), in(beta), scale, state, o.view().Rows(r0, t));
    } else {
      KdaChunk(shape, in(q), in(k), in(v), in(g), in(beta), scale, state, o.view().Rows(r0, t));
    }
  }

  // Output: per-head RMSNorm, times sigmoid(gate), then o_proj.
  RmsNorm(o.view().Reshaped(rows * H, d), w.o_norm.view(), config.rms_norm_eps,
          o.view().Reshaped(rows * H, d));
  const Temp& gate = q;  // q is dead: reuse its storage
  if (low_rank_gate) {
    Linear(ga, w.g_b, gate);
  } else {
    Linear(x, w.g_proj, gate);
  }
  SigmoidGate(o, gate, o);
  Linear(o, w.o_proj, out);
  return TpAllReduce(tp, out);
}

}  // namespace deltaserve
