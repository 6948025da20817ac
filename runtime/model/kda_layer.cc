// The KDA mixer (MODEL.md, "KDA layer").
#include <cmath>
#include <cstring>

#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/kda_gate.h"
#include "kernels/norm.h"
#include "kernels/scratch.h"
#include "kernels/short_conv.h"
#include "runtime/model/layers.h"

namespace deltaserve {
namespace {

// MODEL.md fixes l2norm's epsilon; o_norm takes rms_norm_eps from the config.
constexpr float kL2NormEps = 1e-6f;

}  // namespace

absl::Status KdaForward(const ModelConfig& config, const KdaWeights& w, int64_t layer,
                        const BatchRows& batch, const float* x, float* out, DataCommunicator* tp) {
  using namespace kernels;
  const int64_t rows = batch.rows(), D = config.hidden_size;
  const int64_t H = config.kda.num_heads, d = config.kda.head_dim;
  const int64_t HD = H * d, width = config.kda.conv_kernel_size;
  const int64_t rank_f = w.f_a.rows();

  // q, k, v projections and their causal convolution (+SiLU), per sequence.
  ScratchFloats qkv(rows * 3 * HD), conv(rows * 3 * HD);
  Linear(Tensor::F32(x, rows, D), w.qkv_proj, MutableTensor::F32(qkv.data(), rows, 3 * HD));
  for (int64_t b = 0; b < batch.sequences(); ++b) {
    const int64_t r0 = batch.Begin(b);
    const int64_t t = batch.Count(b);
    ShortConv(Tensor::F32(qkv.data() + r0 * 3 * HD, t, 3 * HD),
              Tensor::F32(w.qkv_conv.data(), 3 * HD, width),
              /*silu=*/true,
              MutableTensor::F32(batch.states[b]->kda[layer].conv.data(), width - 1, 3 * HD),
              MutableTensor::F32(conv.data() + r0 * 3 * HD, t, 3 * HD));
  }
  // Split into [rows, H, d] each; q and k are L2-normalised per head.
  ScratchFloats q(rows * HD), k(rows * HD), v(rows * HD);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = conv.data() + r * 3 * HD;
    std::memcpy(q.data() + r * HD, src, HD * sizeof(float));
    std::memcpy(k.data() + r * HD, src + HD, HD * sizeof(float));
    std::memcpy(v.data() + r * HD, src + 2 * HD, HD * sizeof(float));
  }
  L2Norm(Tensor::F32(q.data(), rows * H, d), kL2NormEps, 1.0f,
         MutableTensor::F32(q.data(), rows * H, d));
  L2Norm(Tensor::F32(k.data(), rows * H, d), kL2NormEps, 1.0f,
         MutableTensor::F32(k.data(), rows * H, d));

  // Decay gate g [rows, H*d] and beta [rows, H].
  ScratchFloats fa(rows * rank_f), g(rows * HD), beta(rows * H);
  Linear(Tensor::F32(x, rows, D), w.f_a, MutableTensor::F32(fa.data(), rows, rank_f));
  Linear(Tensor::F32(fa.data(), rows, rank_f), w.f_b, MutableTensor::F32(g.data(), rows, HD));
  if (config.kda.has_lower_bound) {
    KdaGateLowerBound(Tensor::F32(g.data(), rows, HD), Tensor::F32(w.dt_bias.data(), 1, HD),
                      Tensor::F32(w.a_log.data(), 1, H), H, d, config.kda.gate_lower_bound,
                      MutableTensor::F32(g.data(), rows, HD));
  } else {
    KdaGateSoftplus(Tensor::F32(g.data(), rows, HD), Tensor::F32(w.dt_bias.data(), 1, HD),
                    Tensor::F32(w.a_log.data(), 1, H), H, d,
                    MutableTensor::F32(g.data(), rows, HD));
  }
  Linear(Tensor::F32(x, rows, D), w.b_proj, MutableTensor::F32(beta.data(), rows, H));
  for (float& b : beta) b = Sigmoid(b);

  // The recurrence, per sequence, carrying its state.
  ScratchFloats o(rows * HD);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t b = 0; b < batch.sequences(); ++b) {
    const int64_t r0 = batch.Begin(b), t = batch.Count(b);
    if (t == 0) continue;
    const KdaShape shape{t, H, H, d, d};
    const MutableTensor state =
        MutableTensor::F32(batch.states[b]->kda[layer].state.data(), H, d * d);
    const int64_t off = r0 * HD;
    const Tensor qs = Tensor::F32(q.data() + off, t, HD), ks = Tensor::F32(k.data() + off, t, HD);
    const Tensor vs = Tensor::F32(v.data() + off, t, HD), gs = Tensor::F32(g.data() + off, t, HD);
    const Tensor betas = Tensor::F32(beta.data() + r0 * H, t, H);
    const MutableTensor os = MutableTensor::F32(o.data() + off, t, HD);
    if (t == 1) {
      KdaRecurrent(shape, qs, ks, vs, gs, betas, scale, state, os);
    } else {
      KdaChunk(shape, qs, ks, vs, gs, betas, scale, state, os);
    }
  }

  // Output: per-head RMSNorm, times sigmoid(gate), then o_proj.
  RmsNorm(Tensor::F32(o.data(), rows * H, d), Tensor::F32(w.o_norm.data(), 1, d),
          config.rms_norm_eps, MutableTensor::F32(o.data(), rows * H, d));
  ScratchFloats& gate = q;  // q is dead: reuse its storage
  if (config.kda.full_rank_gate) {
    Linear(Tensor::F32(x, rows, D), w.g_proj, MutableTensor::F32(gate.data(), rows, HD));
  } else {
    const int64_t rank_g = w.g_a.rows();
    ScratchFloats ga(rows * rank_g);
    Linear(Tensor::F32(x, rows, D), w.g_a, MutableTensor::F32(ga.data(), rows, rank_g));
    Linear(Tensor::F32(ga.data(), rows, rank_g), w.g_b, MutableTensor::F32(gate.data(), rows, HD));
  }
  for (int64_t i = 0; i < rows * HD; ++i) o[i] *= Sigmoid(gate[i]);
  Linear(Tensor::F32(o.data(), rows, HD), w.o_proj, MutableTensor::F32(out, rows, D));
  return TpAllReduce(tp, out, rows * D, kernels::Stream::Cpu());
}

}  // namespace deltaserve
