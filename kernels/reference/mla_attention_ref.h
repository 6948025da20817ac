// Float64 references for kernels/mla_attention.h: the same arguments with
// double pointers, plain loops and a full (two-pass) softmax per query.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

struct MlaPrefillArgs {
  int64_t t = 0;
  int64_t prefix = 0;
  int64_t heads = 0;
  int64_t nope_dim = 0;
  int64_t rope_dim = 0;
  int64_t v_dim = 0;
  const double* q = nullptr;       // [T, n, P + R]
  const double* kv = nullptr;      // [S, n, P + Vd]
  const double* k_rope = nullptr;  // row s at k_rope + s * k_rope_stride
  int64_t k_rope_stride = 0;
  double scale = 1.0;
  double* o = nullptr;  // [T, n, Vd]
};

void MlaPrefillAttention(const MlaPrefillArgs& args);

struct MlaAbsorbedArgs {
  int64_t t = 0;
  int64_t prefix = 0;
  int64_t heads = 0;
  int64_t latent_dim = 0;
  int64_t rope_dim = 0;
  const double* q_latent = nullptr;  // [T, n, C]
  const double* q_rope = nullptr;    // [T, n, R]
  const double* cache = nullptr;     // [S, C + R]
  double scale = 1.0;
  double* o_latent = nullptr;  // [T, n, C]
};

void MlaAbsorbedAttention(const MlaAbsorbedArgs& args);

}  // namespace deltaserve::kernels::ref
