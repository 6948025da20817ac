// Entry point of kernels/kda.h: the contract, then the CPU variant of this
// machine's level.
#include "kernels/kda.h"

#include <initializer_list>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {
namespace {

// Both forms share the contract of kernels/kda.h.
void CheckKda(const KdaShape& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
              const Tensor& beta, const MutableTensor& state, const MutableTensor& o) {
  DELTASERVE_CHECK(s.t >= 0 && s.heads > 0 && s.v_heads > 0 && s.k_dim > 0 && s.v_dim > 0);
  DELTASERVE_CHECK(s.v_heads % s.heads == 0);
  DELTASERVE_CHECK_VIEW(q, DType::kF32, s.t, s.heads * s.k_dim);
  DELTASERVE_CHECK_VIEW(k, DType::kF32, s.t, s.heads * s.k_dim);
  DELTASERVE_CHECK_VIEW(v, DType::kF32, s.t, s.v_heads * s.v_dim);
  DELTASERVE_CHECK_VIEW(g, DType::kF32, s.t, s.v_heads * s.k_dim);
  DELTASERVE_CHECK_VIEW(beta, DType::kF32, s.t, s.v_heads);
  DELTASERVE_CHECK_VIEW(state, DType::kF32, s.v_heads, s.k_dim * s.v_dim);
  DELTASERVE_CHECK_VIEW(o, DType::kF32, s.t, s.v_heads * s.v_dim);
  for (const Tensor* in : {&q, &k, &v, &g, &beta}) {
    DELTASERVE_CHECK(!Overlaps(*in, o) && !Overlaps(*in, state));
  }
  DELTASERVE_CHECK(!Overlaps(state, o));
}

}  // namespace

void KdaRecurrent(const KdaShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& beta, float scale, const MutableTensor& state,
                  const MutableTensor& o) {
  CheckKda(shape, q, k, v, g, beta, state, o);
  DELTASERVE_CPU_DISPATCH(KdaRecurrent)
  (shape, q.As<float>(), k.As<float>(), v.As<float>(), g.As<float>(), beta.As<float>(), scale,
   state.As<float>(), o.As<float>());
}

void KdaChunk(const KdaShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& g, const Tensor& beta, float scale, const MutableTensor& state,
              const MutableTensor& o, int64_t chunk_size) {
  CheckKda(shape, q, k, v, g, beta, state, o);
  DELTASERVE_CHECK(chunk_size >= 1);
  DELTASERVE_CPU_DISPATCH(KdaChunk)
  (shape, q.As<float>(), k.As<float>(), v.As<float>(), g.As<float>(), beta.As<float>(), scale,
   state.As<float>(), o.As<float>(), chunk_size);
}

}  // namespace deltaserve::kernels
