// MLA attention: the prefill form over materialised per-head keys/values, and
// the absorbed form over the latent cache. Both take T new query tokens at
// absolute positions [prefix, prefix + T) attending causally to key positions
// [0, prefix + t], and use an online (streaming) softmax over key blocks.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// Every view f32 and contiguous unless said; sizes >= 0. o overlaps no input.
struct MlaPrefillArgs {
  int64_t t = 0;         // new tokens
  int64_t prefix = 0;    // cached tokens before them; keys S = prefix + t
  int64_t heads = 0;     // n
  int64_t nope_dim = 0;  // P
  int64_t rope_dim = 0;  // R (shared key part, not rotated)
  int64_t v_dim = 0;     // Vd
  Tensor q;              // [T, n, P + R]
  Tensor kv;             // [S, n, P + Vd]: kv_b_proj output, k_nope then v per head
  Tensor k_rope;         // [S, R], may be strided (a column block of the cache)
  float scale = 1.0f;    // on q·k
  MutableTensor o;       // [T, n, Vd]
};

void MlaPrefillAttention(const MlaPrefillArgs& args);

// Every view contiguous; sizes >= 0. o_latent overlaps no input.
struct MlaAbsorbedArgs {
  int64_t t = 0;           // query tokens (1 for plain decode)
  int64_t prefix = 0;      // cached tokens before them; keys S = prefix + t
  int64_t heads = 0;       // n
  int64_t latent_dim = 0;  // C
  int64_t rope_dim = 0;    // R
  Tensor q_latent;         // f32 [T, n, C]: W_UKᵀ q_nope per head
  Tensor q_rope;           // f32 [T, n, R]
  Tensor cache;            // [S, C + R]: c then k_rope per token, f32 or bf16
                           // (bf16 is widened a block of keys at a time);
                           // with page_tokens > 0, a page pool instead (below)
  float scale = 1.0f;
  MutableTensor o_latent;  // f32 [T, n, C]: attention-weighted sum of c
  // A paged cache (page_tokens > 0): `cache` is a pool of pages, [pages *
  // page_tokens, C + R], and key s is its row page_table[s / page_tokens] *
  // page_tokens + s % page_tokens. page_table: i32 [1, ceil(S / page_tokens)],
  // each entry a page of the pool.
  Tensor page_table;
  int64_t page_tokens = 0;
};

void MlaAbsorbedAttention(const MlaAbsorbedArgs& args);

}  // namespace deltaserve::kernels
