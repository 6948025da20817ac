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
                        const BatchRows& batch, const float* x, float* out, Communicator* tp) {
  using namespace kernels;
  const int64_t rows = batch.rows(), D = config.hidden_size;
  const int64_t H = config.kda.num_heads, d = config.kda.head_dim;
  const int64_t HD = H * d, width = config.kda.conv_kernel_size;
  const int64_t rank_f = w.f_a.rows();

  // q, k, v projections and their causal convolution (+SiLU), per sequence.
  ScratchFloats qkv(rows * 3 * HD), conv(rows * 3 * HD);
  Linear(x, w.qkv_proj, rows, qkv.data());
  for (int64_t b = 0; b < batch.sequences(); ++b) {
    const int64_t r0 = batch.Begin(b);
    ShortConv(qkv.data() + r0 * 3 * HD, w.qkv_conv.data(), batch.Count(b), 3 * HD, width,
              /*silu=*/true, batch.states[b]->kda[layer].conv.data(), conv.data() + r0 * 3 * HD);
  }
  // Split into [rows, H, d] each; q and k are L2-normalised per head.
  ScratchFloats q(rows * HD), k(rows * HD), v(rows * HD);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = conv.data() + r * 3 * HD;
    std::memcpy(q.data() + r * HD, src, HD * sizeof(float));
    std::memcpy(k.data() + r * HD, src + HD, HD * sizeof(float));
    std::memcpy(v.data() + r * HD, src + 2 * HD, HD * sizeof(float));
  }
  L2Norm(q.data(), rows * H, d, kL2NormEps, 1.0f, q.data());
  L2Norm(k.data(), rows * H, d, kL2NormEps, 1.0f, k.data());

  // Decay gate g [rows, H*d] and beta [rows, H].
  ScratchFloats fa(rows * rank_f), g(rows * HD), beta(rows * H);
  Linear(x, w.f_a, rows, fa.data());
  Linear(fa.data(), w.f_b, rows, g.data());
  if (config.kda.has_lower_bound) {
    KdaGateLowerBound(g.data(), w.dt_bias.data(), w.a_log.data(), rows, H, d,
                      config.kda.gate_lower_bound, g.data());
  } else {
    KdaGateSoftplus(g.data(), w.dt_bias.data(), w.a_log.data(), rows, H, d, g.data());
  }
  Linear(x, w.b_proj, rows, beta.data());
  for (float& b : beta) b = Sigmoid(b);

  // The recurrence, per sequence, carrying its state.
  ScratchFloats o(rows * HD);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t b = 0; b < batch.sequences(); ++b) {
    const int64_t r0 = batch.Begin(b), t = batch.Count(b);
    if (t == 0) continue;
    const KdaShape shape{t, H, H, d, d};
    float* state = batch.states[b]->kda[layer].state.data();
    const int64_t off = r0 * HD;
    if (t == 1) {
      KdaRecurrent(shape, q.data() + off, k.data() + off, v.data() + off, g.data() + off,
                   beta.data() + r0 * H, scale, state, o.data() + off);
    } else {
      KdaChunk(shape, q.data() + off, k.data() + off, v.data() + off, g.data() + off,
               beta.data() + r0 * H, scale, state, o.data() + off);
    }
  }

  // Output: per-head RMSNorm, times sigmoid(gate), then o_proj.
  RmsNorm(o.data(), w.o_norm.data(), rows * H, d, config.rms_norm_eps, o.data());
  ScratchFloats& gate = q;  // q is dead: reuse its storage
  if (config.kda.full_rank_gate) {
    Linear(x, w.g_proj, rows, gate.data());
  } else {
    const int64_t rank_g = w.g_a.rows();
    ScratchFloats ga(rows * rank_g);
    Linear(x, w.g_a, rows, ga.data());
    Linear(ga.data(), w.g_b, rows, gate.data());
  }
  for (int64_t i = 0; i < rows * HD; ++i) o[i] *= Sigmoid(gate[i]);
  Linear(o.data(), w.o_proj, rows, out);
  return TpAllReduce(tp, out, rows * D);
}

}  // namespace deltaserve
