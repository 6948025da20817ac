// The gated MLA mixer (MODEL.md, "Gated MLA layer"). A long piece of new
// tokens materialises per-head keys and values from the latent cache; a
// decode token, or a short chunk after a long prefix, uses the absorbed form,
// attending over the cached latents directly (whichever costs less).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/mla_attention.h"
#include "kernels/norm.h"
#include "kernels/paged_cache.h"
#include "kernels/workspace.h"
#include "runtime/model/layers.h"
#include "runtime/model/state_pool.h"

namespace deltaserve {
namespace {

// The latent norms q_a_layernorm and kv_a_layernorm use a fixed epsilon, not
// rms_norm_eps (MODEL.md, "Gated MLA layer"): RMSNorm's default, which the
// upstream modeling code keeps for these two.
constexpr float kLatentNormEps = 1e-6f;

struct MlaDims {
  int64_t n, P, R, Vd, C;
  int64_t QkDim() const { return P + R; }
  int64_t CacheWidth() const { return C + R; }
};

// Cached rows gathered from the pages at a time when keys and values are
// materialised: the copy stays a block, not the whole cache beside the keys
// and values made from it (which are larger: n (P + Vd) values a row).
constexpr int64_t kGatherRows = 16 * kCachePageTokens;

// o [t, n, Vd] for t >= 2 new tokens after `prefix` cached ones: keys and
// values from every cached row (kv_b over the latent part, a block of rows
// gathered from the pages and widened from bf16 at a time), then causal
// attention of the new queries q [t, n, P + R].
void AttendPrefill(const MlaWeights& w, const MlaDims& m, int64_t prefix, const kernels::Tensor& q,
                   const kernels::PagedCache& cache, float scale, const kernels::MutableTensor& o) {
  using namespace kernels;
  const Device dev = q.device;
  const int64_t S = prefix + q.rows;
  const Temp kv(dev, kernels::DType::kF32, S, m.n * (m.P + m.Vd)),
      k_rope(dev, kernels::DType::kF32, S, m.R);
  {
    const Temp block(dev, kernels::DType::kF32, std::min(S, kGatherRows), m.CacheWidth());
    for (int64_t s0 = 0; s0 < S; s0 += kGatherRows) {
      const int64_t n = std::min(kGatherRows, S - s0);
      const MutableTensor rows = block.view().Rows(0, n);
      PagedCacheRead(cache, s0, rows);
      Linear(rows.Columns(0, m.C), w.kv_b, kv.view().Rows(s0, n));
      Convert(rows.Columns(m.C, m.R), k_rope.view().Rows(s0, n));
    }
  }
  MlaPrefillArgs args;
  args.t = q.rows;
  args.prefix = prefix;
  args.heads = m.n;
  args.nope_dim = m.P;
  args.rope_dim = m.R;
  args.v_dim = m.Vd;
  args.q = q;
  args.kv = kv;
  args.k_rope = k_rope;
  args.scale = scale;
  args.o = o;
  MlaPrefillAttention(args);
}

// The absorbed form: q_latent_h = W_UK_hᵀ q_nope_h, attention over the cached
// [c | kr] in place, o_h = W_UV_h o_latent_h. q [t, n, P + R], o [t, n, Vd].
void AttendAbsorbed(const MlaWeights& w, const MlaDims& m, int64_t prefix, const kernels::Tensor& q,
                    const kernels::PagedCache& cache, float scale,
                    const kernels::MutableTensor& o) {
  using namespace kernels;
  const int64_t t = q.rows;
  const Device dev = q.device;
  const Temp q_latent(dev, kernels::DType::kF32, t, m.n * m.C),
      q_rope(dev, kernels::DType::kF32, t, m.n * m.R);
  const Temp o_latent(dev, kernels::DType::kF32, t, m.n * m.C);
  // Each head's product, all heads as one group (so below).
  std::vector<LinearProduct> heads;
  for (int64_t h = 0; h < m.n; ++h) {
    heads.push_back({q.Columns(h * m.QkDim(), m.P), w.w_uk_t.tensor().Rows(h * m.C, m.C),
                     q_latent.view().Columns(h * m.C, m.C)});
  }
  LinearGroup(heads);
  // q_rope [t * n, R]: the last R values of each head's query.
  Convert(q.Reshaped(t * m.n, m.QkDim()).Columns(m.P, m.R), q_rope.view().Reshaped(t * m.n, m.R));
  MlaAbsorbedArgs args;
  args.t = t;
  args.prefix = prefix;
  args.heads = m.n;
  args.latent_dim = m.C;
  args.rope_dim = m.R;
  args.q_latent = q_latent;
  args.q_rope = q_rope;
  args.cache = cache.pool;
  args.page_table = cache.page_table;
  args.page_tokens = cache.page_tokens;
  args.scale = scale;
  args.o_latent = o_latent;
  MlaAbsorbedAttention(args);
  heads.clear();
  for (int64_t h = 0; h < m.n; ++h) {
    const Tensor w_uv = w.kv_b.tensor().Rows(h * (m.P + m.Vd) + m.P, m.Vd);  // [Vd, C]
    heads.push_back({o_latent.view().Columns(h * m.C, m.C), w_uv, o.Columns(h * m.Vd, m.Vd)});
  }
  LinearGroup(heads);
}

// Which form costs fewer multiply-adds for t new tokens after `prefix`:
// materialising keys and values means kv_b over all prefix + t cached rows,
// then (P + R + Vd) per query-key pair; the absorbed form maps each query
// into the latent space and back, then spends (2C + R) per pair. A decode
// token, and a short chunk after a long prefix, are cheaper absorbed.
bool AbsorbedIsCheaper(const MlaDims& m, int64_t prefix, int64_t t) {
  const double pairs = static_cast<double>(t) * (static_cast<double>(prefix) + (t + 1) / 2.0);
  const double materialised =
      static_cast<double>(prefix + t) * (m.P + m.Vd) * m.C + pairs * (m.P + m.R + m.Vd);
  const double absorbed = static_cast<double>(t) * (m.P + m.Vd) * m.C + pairs * (2 * m.C + m.R);
  return t == 1 || absorbed < materialised;
}

}  // namespace

absl::Status MlaForward(const ModelConfig& config, const MlaWeights& w, int64_t layer,
                        const BatchRows& batch, const kernels::Tensor& x,
                        const kernels::MutableTensor& out, DataCommunicator* tp) {
  using namespace kernels;
  const MlaDims m{config.num_attention_heads, config.qk_nope_head_dim, config.qk_rope_head_dim,
                  config.v_head_dim, config.kv_lora_rank};
  const Device dev = x.device;
  const int64_t rows = batch.rows();

  // Queries [rows, n, P + R] (through the q-LoRA latent qa where there is
  // one), and new cache rows [rows, C + R]: normalised latent c, then the
  // shared key part. The projections of x as one group.
  const bool q_lora = config.q_lora_rank > 0;
  const Temp q(dev, kernels::DType::kF32, rows, m.n * m.QkDim());
  const Temp qa(dev, kernels::DType::kF32, q_lora ? rows : 0, config.q_lora_rank);
  const Temp ckr(dev, kernels::DType::kF32, rows, m.CacheWidth());
  LinearGroup(std::vector<LinearProduct>{
      q_lora ? LinearProduct{x, w.q_a, qa} : LinearProduct{x, w.q_proj, q}, {x, w.kv_a, ckr}});
  if (q_lora) {
    RmsNorm(qa, w.q_a_norm.view(), kLatentNormEps, qa);
    Linear(qa, w.q_b, q);
  }
  RmsNorm(ckr.view().Columns(0, m.C), w.kv_a_norm.view(), kLatentNormEps,
          ckr.view().Columns(0, m.C));

  const Temp o(dev, kernels::DType::kF32, rows, m.n * m.Vd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.QkDim()));
  for (int64_t b = 0; b < batch.sequences(); ++b) {
    const int64_t r0 = batch.Begin(b), t = batch.Count(b);
    if (t == 0) continue;
    SequenceState& state = *batch.states[b];
    const MutablePagedCache cache = state.MlaCache(layer);
    const int64_t prefix = state.length;  // the tokens cached before this chunk
    const Tensor qb = q.view().Rows(r0, t);
    const MutableTensor ob = o.view().Rows(r0, t);
    // The new rows go in as stored (bf16: rounded to nearest even) before
    // they are read back, so this chunk's own queries see the rounded keys
    // too and chunking does not change what a token attends to.
    PagedCacheWrite(ckr.view().Rows(r0, t), prefix, cache);
    if (AbsorbedIsCheaper(m, prefix, t)) {
      AttendAbsorbed(w, m, prefix, qb, cache, scale, ob);
    } else {
      AttendPrefill(w, m, prefix, qb, cache, scale, ob);
    }
  }

  if (config.mla_output_gate) {
    const Temp gate(dev, kernels::DType::kF32, rows, m.n * m.Vd);
    Linear(x, w.g_proj, gate);
    SigmoidGate(o, gate, o);
  }
  Linear(o, w.o_proj, out);
  return TpAllReduce(tp, out);
}

}  // namespace deltaserve
