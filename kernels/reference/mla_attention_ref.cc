#include "kernels/reference/mla_attention_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace deltaserve::kernels::ref {
namespace {

// In place: p[0..n) = softmax(p[0..n)).
void Softmax(std::vector<double>& p) {
  double mx = p[0];
  for (double x : p) mx = std::max(mx, x);
  double sum = 0.0;
  for (double& x : p) {
    x = std::exp(x - mx);
    sum += x;
  }
  for (double& x : p) x /= sum;
}

}  // namespace

void MlaPrefillAttention(const MlaPrefillArgs& a) {
  const int64_t n = a.heads, P = a.nope_dim, R = a.rope_dim, Vd = a.v_dim;
  for (int64_t t = 0; t < a.t; ++t) {
    const int64_t keys = a.prefix + t + 1;  // query t sees keys s <= prefix + t
    for (int64_t h = 0; h < n; ++h) {
      const double* q = a.q + (t * n + h) * (P + R);
      std::vector<double> p(keys);
      for (int64_t s = 0; s < keys; ++s) {
        const double* k_nope = a.kv + (s * n + h) * (P + Vd);
        const double* k_rope = a.k_rope + s * a.k_rope_stride;
        double dot = 0.0;
        for (int64_t d = 0; d < P; ++d) dot += q[d] * k_nope[d];
        for (int64_t d = 0; d < R; ++d) dot += q[P + d] * k_rope[d];
        p[s] = a.scale * dot;
      }
      Softmax(p);
      double* o = a.o + (t * n + h) * Vd;
      for (int64_t c = 0; c < Vd; ++c) {
        double acc = 0.0;
        for (int64_t s = 0; s < keys; ++s) acc += p[s] * a.kv[(s * n + h) * (P + Vd) + P + c];
        o[c] = acc;
      }
    }
  }
}

void MlaAbsorbedAttention(const MlaAbsorbedArgs& a) {
  const int64_t n = a.heads, C = a.latent_dim, R = a.rope_dim;
  for (int64_t t = 0; t < a.t; ++t) {
    const int64_t keys = a.prefix + t + 1;
    for (int64_t h = 0; h < n; ++h) {
      const double* ql = a.q_latent + (t * n + h) * C;
      const double* qr = a.q_rope + (t * n + h) * R;
      std::vector<double> p(keys);
      for (int64_t s = 0; s < keys; ++s) {
        const double* c = a.cache + s * (C + R);
        double dot = 0.0;
        for (int64_t d = 0; d < C; ++d) dot += ql[d] * c[d];
        for (int64_t d = 0; d < R; ++d) dot += qr[d] * c[C + d];
        p[s] = a.scale * dot;
      }
      Softmax(p);
      double* o = a.o_latent + (t * n + h) * C;
      for (int64_t d = 0; d < C; ++d) {
        double acc = 0.0;
        for (int64_t s = 0; s < keys; ++s) acc += p[s] * a.cache[s * (C + R) + d];
        o[d] = acc;
      }
    }
  }
}

}  // namespace deltaserve::kernels::ref
