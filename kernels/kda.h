// The KDA (Kimi Delta Attention) recurrence, in its token-by-token form and in
// the chunkwise form used for prefill. Both carry the float32 state in and out
// and agree to rounding. Per value head j (q/k head j / (v_heads / heads)):
//   S = diag(exp(g_t)) S;  u = v_t - Sᵀk_t;  S += beta_t k_t uᵀ;  o_t = Sᵀ(scale·q_t)
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

struct KdaShape {
  int64_t t = 0;        // tokens
  int64_t heads = 0;    // q/k heads H
  int64_t v_heads = 0;  // value heads HV, a multiple of H
  int64_t k_dim = 0;    // K
  int64_t v_dim = 0;    // V
};

// All f32, as 2-D views ([T, H, K] is [T, H * K]). heads, v_heads, k_dim and
// v_dim >= 1, v_heads a multiple of heads; T >= 0.
// q, k: [T, H, K], already L2-normalised (q unscaled; scale is applied here).
// v: [T, HV, V]. g: [T, HV, K] log-decay, <= 0, any magnitude. beta: [T, HV].
// state: [HV, K, V] in/out. o: [T, HV, V]. state and o overlap nothing.
void KdaRecurrent(const KdaShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& beta, float scale, const MutableTensor& state,
                  const MutableTensor& o);

// Same contract, computed in chunks of chunk_size >= 1 tokens with the
// safe-exponent form of MODEL.md (only differences <= 0 are exponentiated),
// any T.
void KdaChunk(const KdaShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& g, const Tensor& beta, float scale, const MutableTensor& state,
              const MutableTensor& o, int64_t chunk_size = 64);

}  // namespace deltaserve::kernels
