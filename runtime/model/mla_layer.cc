// The gated MLA mixer (MODEL.md, "Gated MLA layer"). A long piece of new
// tokens materialises per-head keys and values from the latent cache; a
// decode token, or a short chunk after a long prefix, uses the absorbed form,
// attending over the cached latents directly (whichever costs less).
#include <cmath>
#include <cstring>

#include "kernels/bf16.h"
#include "kernels/gemm.h"
#include "kernels/mla_attention.h"
#include "kernels/norm.h"
#include "kernels/scratch.h"
#include "runtime/model/layers.h"

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

// o [t, n, Vd] for t >= 2 new tokens: kv_b over the whole cache, then causal
// attention of the new queries.
void AttendPrefill(const MlaWeights& w, const MlaDims& m, int64_t prefix, int64_t t, const float* q,
                   const float* cache, float scale, float* o) {
  const int64_t S = prefix + t;
  kernels::ScratchFloats kv(S * m.n * (m.P + m.Vd));
  kernels::Linear(kernels::Tensor::F32(cache, S, m.C, m.CacheWidth()), w.kv_b,
                  kernels::MutableTensor::F32(kv.data(), S, m.n * (m.P + m.Vd)));
  kernels::MlaPrefillArgs args;
  args.t = t;
  args.prefix = prefix;
  args.heads = m.n;
  args.nope_dim = m.P;
  args.rope_dim = m.R;
  args.v_dim = m.Vd;
  args.q = kernels::Tensor::F32(q, t, m.n * m.QkDim());
  args.kv = kernels::Tensor::F32(kv.data(), S, m.n * (m.P + m.Vd));
  args.k_rope = kernels::Tensor::F32(cache + m.C, S, m.R, m.CacheWidth());
  args.scale = scale;
  args.o = kernels::MutableTensor::F32(o, t, m.n * m.Vd);
  kernels::MlaPrefillAttention(args);
}

// The absorbed form: q_latent_h = W_UK_hᵀ q_nope_h, attention over the cached
// [c | kr], o_h = W_UV_h o_latent_h.
void AttendAbsorbed(const MlaWeights& w, const MlaDims& m, int64_t prefix, int64_t t,
                    const float* q, const void* cache, kernels::DType cache_dtype, float scale,
                    float* o) {
  kernels::ScratchFloats q_latent(t * m.n * m.C), q_rope(t * m.n * m.R);
  kernels::ScratchFloats o_latent(t * m.n * m.C);
  for (int64_t h = 0; h < m.n; ++h) {
    kernels::Linear(kernels::Tensor::F32(q + h * m.QkDim(), t, m.P, m.n * m.QkDim()),
                    w.w_uk_t.tensor().Rows(h * m.C, m.C),
                    kernels::MutableTensor::F32(q_latent.data() + h * m.C, t, m.C, m.n * m.C));
  }
  for (int64_t i = 0; i < t; ++i)
    for (int64_t h = 0; h < m.n; ++h)
      std::memcpy(q_rope.data() + (i * m.n + h) * m.R, q + (i * m.n + h) * m.QkDim() + m.P,
                  m.R * sizeof(float));
  kernels::MlaAbsorbedArgs args;
  args.t = t;
  args.prefix = prefix;
  args.heads = m.n;
  args.latent_dim = m.C;
  args.rope_dim = m.R;
  args.q_latent = kernels::Tensor::F32(q_latent.data(), t, m.n * m.C);
  args.q_rope = kernels::Tensor::F32(q_rope.data(), t, m.n * m.R);
  args.cache = kernels::Tensor{cache,      nullptr,       cache_dtype, kernels::Device::kCpu,
                               prefix + t, m.CacheWidth()};
  args.scale = scale;
  args.o_latent = kernels::MutableTensor::F32(o_latent.data(), t, m.n * m.C);
  kernels::MlaAbsorbedAttention(args);
  for (int64_t h = 0; h < m.n; ++h) {
    const kernels::Tensor w_uv = w.kv_b.tensor().Rows(h * (m.P + m.Vd) + m.P, m.Vd);  // [Vd, C]
    kernels::Linear(kernels::Tensor::F32(o_latent.data() + h * m.C, t, m.C, m.n * m.C), w_uv,
                    kernels::MutableTensor::F32(o + h * m.Vd, t, m.Vd, m.n * m.Vd));
  }
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
                        const BatchRows& batch, const float* x, float* out, DataCommunicator* tp) {
  using namespace kernels;
  const MlaDims m{config.num_attention_heads, config.qk_nope_head_dim, config.qk_rope_head_dim,
                  config.v_head_dim, config.kv_lora_rank};
  const int64_t rows = batch.rows(), D = config.hidden_size;

  // Queries [rows, n, P + R].
  ScratchFloats q(rows * m.n * m.QkDim());
  if (config.q_lora_rank > 0) {
    const int64_t ql = config.q_lora_rank;
    ScratchFloats qa(rows * ql);
    Linear(Tensor::F32(x, rows, D), w.q_a, MutableTensor::F32(qa.data(), rows, ql));
    RmsNorm(Tensor::F32(qa.data(), rows, ql), Tensor::F32(w.q_a_norm.data(), 1, ql), kLatentNormEps,
            MutableTensor::F32(qa.data(), rows, ql));
    Linear(Tensor::F32(qa.data(), rows, ql), w.q_b,
           MutableTensor::F32(q.data(), rows, m.n * m.QkDim()));
  } else {
    Linear(Tensor::F32(x, rows, D), w.q_proj, MutableTensor::F32(q.data(), rows, m.n * m.QkDim()));
  }
  // New cache rows [rows, C + R]: normalised latent c, then the shared key part.
  ScratchFloats ckr(rows * m.CacheWidth());
  Linear(Tensor::F32(x, rows, D), w.kv_a, MutableTensor::F32(ckr.data(), rows, m.CacheWidth()));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = ckr.data() + r * m.CacheWidth();
    RmsNorm(Tensor::F32(row, 1, m.C), Tensor::F32(w.kv_a_norm.data(), 1, m.C), kLatentNormEps,
            MutableTensor::F32(row, 1, m.C));
  }

  ScratchFloats o(rows * m.n * m.Vd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.QkDim()));
  for (int64_t b = 0; b < batch.sequences(); ++b) {
    const int64_t r0 = batch.Begin(b), t = batch.Count(b);
    if (t == 0) continue;
    MlaLayerState& state = batch.states[b]->mla[layer];
    const float* rows_b = ckr.data() + r0 * m.CacheWidth();
    const float* qb = q.data() + r0 * m.n * m.QkDim();
    float* ob = o.data() + r0 * m.n * m.Vd;
    if (batch.states[b]->cache_dtype == kernels::DType::kBF16) {
      // The new rows rounded to bf16 (to nearest even), then read back as
      // they are stored: this chunk's own queries see the rounded keys too,
      // so chunking does not change what a token attends to.
      std::vector<uint16_t>& cache = state.cache_bf16;
      const int64_t prefix = static_cast<int64_t>(cache.size()) / m.CacheWidth();
      for (int64_t i = 0; i < t * m.CacheWidth(); ++i)
        cache.push_back(kernels::FloatToBf16(rows_b[i]));
      if (AbsorbedIsCheaper(m, prefix, t)) {
        AttendAbsorbed(w, m, prefix, t, qb, cache.data(), kernels::DType::kBF16, scale, ob);
      } else {
        ScratchFloats wide(static_cast<int64_t>(cache.size()));
        for (size_t i = 0; i < cache.size(); ++i) wide[i] = kernels::Bf16ToFloat(cache[i]);
        AttendPrefill(w, m, prefix, t, qb, wide.data(), scale, ob);
      }
      continue;
    }
    std::vector<float>& cache = state.cache;
    const int64_t prefix = static_cast<int64_t>(cache.size()) / m.CacheWidth();
    cache.insert(cache.end(), rows_b, rows_b + t * m.CacheWidth());
    if (AbsorbedIsCheaper(m, prefix, t)) {
      AttendAbsorbed(w, m, prefix, t, qb, cache.data(), kernels::DType::kF32, scale, ob);
    } else {
      AttendPrefill(w, m, prefix, t, qb, cache.data(), scale, ob);
    }
  }

  if (config.mla_output_gate) {
    ScratchFloats gate(rows * m.n * m.Vd);
    Linear(Tensor::F32(x, rows, D), w.g_proj, MutableTensor::F32(gate.data(), rows, m.n * m.Vd));
    for (int64_t i = 0; i < o.size(); ++i) o[i] *= Sigmoid(gate[i]);
  }
  Linear(Tensor::F32(o.data(), rows, m.n * m.Vd), w.o_proj, MutableTensor::F32(out, rows, D));
  return TpAllReduce(tp, out, rows * D, kernels::Stream::Cpu());
}

}  // namespace deltaserve
