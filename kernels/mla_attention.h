// MLA attention: the prefill form over materialised per-head keys/values, and
// the absorbed form over the latent cache. Both take T new query tokens at
// absolute positions [prefix, prefix + T) attending causally to key positions
// [0, prefix + t], and use an online (streaming) softmax over key blocks.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

struct MlaPrefillArgs {
  int64_t t = 0;                  // new tokens
  int64_t prefix = 0;             // cached tokens before them; keys S = prefix + t
  int64_t heads = 0;              // n
  int64_t nope_dim = 0;           // P
  int64_t rope_dim = 0;           // R (shared key part, not rotated)
  int64_t v_dim = 0;              // Vd
  const float* q = nullptr;       // [T, n, P + R]
  const float* kv = nullptr;      // [S, n, P + Vd]: kv_b_proj output, k_nope then v per head
  const float* k_rope = nullptr;  // row s at k_rope + s * k_rope_stride, R values
  int64_t k_rope_stride = 0;
  float scale = 1.0f;  // on q·k
  float* o = nullptr;  // [T, n, Vd]
};

void MlaPrefillAttention(const MlaPrefillArgs& args);

struct MlaAbsorbedArgs {
  int64_t t = 0;                    // query tokens (1 for plain decode)
  int64_t prefix = 0;               // cached tokens before them; keys S = prefix + t
  int64_t heads = 0;                // n
  int64_t latent_dim = 0;           // C
  int64_t rope_dim = 0;             // R
  const float* q_latent = nullptr;  // [T, n, C]: W_UKᵀ q_nope per head
  const float* q_rope = nullptr;    // [T, n, R]
  const void* cache = nullptr;      // [S, C + R]: c then k_rope per token, of cache_dtype
  DType cache_dtype = DType::kF32;  // kF32 or kBF16 (widened a block of keys at a time)
  float scale = 1.0f;
  float* o_latent = nullptr;  // [T, n, C]: attention-weighted sum of c
};

void MlaAbsorbedAttention(const MlaAbsorbedArgs& args);

}  // namespace deltaserve::kernels
