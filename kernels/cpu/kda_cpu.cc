// Fast float32 KDA: the token-by-token recurrence (decode, and the reference
// point for speed) and the chunkwise form (prefill). Both thread over value
// heads: heads are independent and each owns its [K, V] state.
//
// The chunkwise form turns the per-token O(K·V) state reads and writes into
// small matrix products over a chunk of n <= 64 tokens, done by the register-
// blocked SmallGemm of kernels/cpu/gemm_cpu.h. Every decay factor is exp of a
// difference Γ_a - Γ_b <= 0 of in-chunk cumulative log-decays, computed in
// double before rounding so that the cancellation of two large sums (they
// reach -10^4 under strong decay) does not cost accuracy. The O(n²K) decay
// products of L and Aqk factor through an intermediate point m between the
// two tokens: exp(Γ_i - Γ_j) = exp(Γ_i - Γ_m) · exp(Γ_m - Γ_j), both
// exponents <= 0 (Γ is non-increasing), which makes the blocks below the
// diagonal plain matrix products; inside a block of kSub tokens the factors
// are products of the per-token exp(g), as in the recurrence. A product of
// factors <= 1 can only underflow where the exact value is below float's
// range anyway.
//
// Work per token and head is about 3·K·V (Wᵀ-, Q- and state products) plus
// n·(K + V) multiply-adds, the same count as the recurrence's four passes
// over S; the chunked form wins by running them as register-blocked products
// at a large fraction of peak instead of streaming S through L2 per token.
#include <algorithm>
#include <vector>

#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/kda.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Rows of a chunk handled together when building L and Aqk and in the blocked
// forward substitution.
constexpr int64_t kSub = 8;
// Below this many state multiply-adds an OpenMP fork costs more than the work.
constexpr int64_t kParallelMinWork = int64_t{1} << 16;

// out[c] = exp(x[c]); out may be x.
void ExpRow(const float* x, int64_t len, float* out) { simd::Map(len, out, simd::Exp, x); }

// out[c] = exp((float)(a[c] - b[c])), a <= b.
void ExpDiff(const double* a, const double* b, int64_t len, float* out) {
  for (int64_t c = 0; c < len; ++c) out[c] = static_cast<float>(a[c] - b[c]);
  ExpRow(out, len, out);
}

float Dot(const float* a, const float* b, int64_t len) {
  float sum = 0.0f;
  int64_t c = 0;
#if DELTASERVE_CPU_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; c + 8 <= len; c += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c), acc);
  }
  sum = simd::HorizontalSum(acc);
#endif
  for (; c < len; ++c) sum += a[c] * b[c];
  return sum;
}

// One more step of a decayed key inside a block: run = run · exp(g_i), then
// Σ_c k_i run and Σ_c q_i run. Starting from run = k_j this walks
// exp(Γ_i - Γ_j) = Π exp(g) over the few tokens j < i of a block by
// products, as the recurrence itself does, instead of one exponential per
// pair and channel.
void DecayDot(float* run, const float* decay, const float* ki, const float* qi, int64_t kd,
              float* l, float* aq) {
  float sl = 0.0f, sq = 0.0f;
  int64_t c = 0;
#if DELTASERVE_CPU_AVX2
  __m256 al = _mm256_setzero_ps(), aqv = _mm256_setzero_ps();
  for (; c + 8 <= kd; c += 8) {
    const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(run + c), _mm256_loadu_ps(decay + c));
    _mm256_storeu_ps(run + c, r);
    al = _mm256_fmadd_ps(_mm256_loadu_ps(ki + c), r, al);
    aqv = _mm256_fmadd_ps(_mm256_loadu_ps(qi + c), r, aqv);
  }
  sl = simd::HorizontalSum(al);
  sq = simd::HorizontalSum(aqv);
#endif
  for (; c < kd; ++c) {
    run[c] *= decay[c];
    sl += ki[c] * run[c];
    sq += qi[c] * run[c];
  }
  *l = sl;
  *aq = sq;
}

// Per-thread scratch for one value head's chunk of up to n tokens.
struct ChunkScratch {
  ChunkScratch(int64_t n, int64_t kd, int64_t vd)
      : gamma((n + 1) * kd),
        kc(n * kd),
        qs(n * kd),
        beta(n),
        decay(n * kd),
        kw(n * kd),
        qw(n * kd),
        kn(n * kd),
        e(kd),
        run(kd),
        lmat(n * n),
        aqk(n * n),
        kr(n * kd),
        klq(kd * 2 * kSub),
        blk(n * 2 * kSub),
        vn(n * vd) {}

  std::vector<double> gamma;  // [n + 1, K]: row 0 is Γ_{-1} = 0, row i+1 Γ_i
  std::vector<float> kc;      // [n, K] k
  std::vector<float> qs;      // [n, K] scale·q
  std::vector<float> beta;    // [n]
  std::vector<float> decay;   // [n, K] exp(g_i)
  std::vector<float> kw;      // [n, K] beta_i k_i exp(Γ_i)
  std::vector<float> qw;      // [n, K] scale q_i exp(Γ_i)
  std::vector<float> kn;      // [n, K] k_i exp(Γ_last - Γ_i)
  std::vector<float> e;       // [K] decay factors of one row
  std::vector<float> run;     // [K] k_j exp(Γ_i - Γ_j) inside a block
  std::vector<float> lmat;    // [n, n] strictly lower L
  std::vector<float> aqk;     // [n, n] lower Aqk, zeros above the diagonal
  std::vector<float> kr;      // [n, K] k_j exp(Γ_m - Γ_j), j <= m
  std::vector<float> klq;     // [K, 2·kSub] (beta_i k_i | q_i) exp(Γ_i - Γ_m)
  std::vector<float> blk;     // [n, 2·kSub] kr · klq
  std::vector<float> vn;      // [n, V] right-hand side, then Vn
};

// One chunk of n tokens starting at t0 for value head j (q/k head h); s is
// the head's state [K, V], updated in place.
void ChunkStep(const KdaShape& shape, int64_t h, int64_t j, int64_t t0, int64_t n, const float* q,
               const float* k, const float* v, const float* g, const float* beta, float scale,
               float* s, float* o, ChunkScratch& w) {
  const int64_t hk = shape.heads, hv = shape.v_heads;
  const int64_t kd = shape.k_dim, vd = shape.v_dim;
  double* gam = w.gamma.data() + kd;  // gam[i * kd + c] = Γ_i[c], i >= -1
  float* kc = w.kc.data();
  float* qs = w.qs.data();
  float* bt = w.beta.data();
  float* e = w.e.data();

  // Gather the head's rows; Γ is accumulated in double (see the file
  // comment).
  for (int64_t i = 0; i < n; ++i) {
    const float* __restrict ki = k + ((t0 + i) * hk + h) * kd;
    const float* __restrict qi = q + ((t0 + i) * hk + h) * kd;
    const float* __restrict gi = g + ((t0 + i) * hv + j) * kd;
    float* __restrict kci = kc + i * kd;
    float* __restrict qsi = qs + i * kd;
    const double* __restrict prev = gam + (i - 1) * kd;
    double* __restrict cur = gam + i * kd;
    for (int64_t c = 0; c < kd; ++c) kci[c] = ki[c];
    for (int64_t c = 0; c < kd; ++c) qsi[c] = scale * qi[c];
    for (int64_t c = 0; c < kd; ++c) cur[c] = prev[c] + static_cast<double>(gi[c]);
    ExpRow(gi, kd, w.decay.data() + i * kd);
    bt[i] = beta[(t0 + i) * hv + j];
  }

  // Operands decayed to the chunk start and to the chunk end.
  const double* last = gam + (n - 1) * kd;
  for (int64_t i = 0; i < n; ++i) {
    const float* ki = kc + i * kd;
    const float* qi = qs + i * kd;
    ExpDiff(gam + i * kd, gam - kd, kd, e);  // exp(Γ_i)
    float* kwi = w.kw.data() + i * kd;
    float* qwi = w.qw.data() + i * kd;
    for (int64_t c = 0; c < kd; ++c) {
      kwi[c] = bt[i] * ki[c] * e[c];
      qwi[c] = qi[c] * e[c];
    }
    ExpDiff(last, gam + i * kd, kd, e);  // exp(Γ_last - Γ_i)
    float* kni = w.kn.data() + i * kd;
    for (int64_t c = 0; c < kd; ++c) kni[c] = ki[c] * e[c];
  }

  // L[i, j] = beta_i Σ_c k_i k_j exp(Γ_i - Γ_j) (j < i) and
  // Aqk[i, j] = Σ_c q_i k_j exp(Γ_i - Γ_j) (j <= i), by blocks of kSub rows.
  float* lmat = w.lmat.data();
  float* aqk = w.aqk.data();
  std::fill(lmat, lmat + n * n, 0.0f);
  std::fill(aqk, aqk + n * n, 0.0f);
  constexpr int64_t kCols = 2 * kSub;
  float* kr = w.kr.data();
  for (int64_t i0 = 0; i0 < n; i0 += kSub) {
    const int64_t i1 = std::min(i0 + kSub, n);
    if (i0 > 0) {
      // Columns j < i0 through m = i0 - 1: one product of [i0, K]·[K, 2·kSub].
      // kr rows j < i0 - kSub hold k_j exp(Γ_{m'} - Γ_j) for the previous
      // m' = m - kSub: one more factor exp(Γ_m - Γ_m') <= 1 moves them on.
      const double* gm = gam + (i0 - 1) * kd;
      const int64_t fresh = i0 - kSub;
      if (fresh > 0) {
        ExpDiff(gm, gm - kSub * kd, kd, e);
        for (int64_t jj = 0; jj < fresh; ++jj) {
          float* __restrict row = kr + jj * kd;
          for (int64_t c = 0; c < kd; ++c) row[c] *= e[c];
        }
      }
      for (int64_t jj = fresh; jj < i0; ++jj) {
        ExpDiff(gm, gam + jj * kd, kd, e);  // exp(Γ_m - Γ_j)
        float* __restrict row = kr + jj * kd;
        const float* __restrict kj = kc + jj * kd;
        for (int64_t c = 0; c < kd; ++c) row[c] = kj[c] * e[c];
      }
      float* klq = w.klq.data();
      std::fill(klq, klq + kd * kCols, 0.0f);
      for (int64_t i = i0; i < i1; ++i) {
        ExpDiff(gam + i * kd, gm, kd, e);  // exp(Γ_i - Γ_m)
        for (int64_t c = 0; c < kd; ++c) {
          klq[c * kCols + (i - i0)] = bt[i] * kc[i * kd + c] * e[c];
          klq[c * kCols + kSub + (i - i0)] = qs[i * kd + c] * e[c];
        }
      }
      float* blk = w.blk.data();
      SmallGemm(i0, kCols, kd, 1.0f, kr, kd, 1, klq, kCols, blk, kCols, false);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t jj = 0; jj < i0; ++jj) {
          lmat[i * n + jj] = blk[jj * kCols + (i - i0)];
          aqk[i * n + jj] = blk[jj * kCols + kSub + (i - i0)];
        }
      }
    }
    // The diagonal block, by products of per-token decays.
    float* run = w.run.data();
    for (int64_t jj = i0; jj < i1; ++jj) {
      aqk[jj * n + jj] = Dot(qs + jj * kd, kc + jj * kd, kd);
      std::copy(kc + jj * kd, kc + (jj + 1) * kd, run);
      for (int64_t i = jj + 1; i < i1; ++i) {
        float l, aq;
        DecayDot(run, w.decay.data() + i * kd, kc + i * kd, qs + i * kd, kd, &l, &aq);
        lmat[i * n + jj] = bt[i] * l;
        aqk[i * n + jj] = aq;
      }
    }
  }

  // (I + L) Vn = beta·V - (beta·K·exp(Γ)) S: the rows of U - W S at once.
  float* vn = w.vn.data();
  for (int64_t i = 0; i < n; ++i) {
    const float* vi = v + ((t0 + i) * hv + j) * vd;
    for (int64_t c = 0; c < vd; ++c) vn[i * vd + c] = bt[i] * vi[c];
  }
  SmallGemm(n, vd, kd, -1.0f, w.kw.data(), kd, 1, s, vd, vn, vd, true);
  // Blocked forward substitution: earlier blocks by one product, then the
  // few rows inside the block one after the other.
  for (int64_t i0 = 0; i0 < n; i0 += kSub) {
    const int64_t i1 = std::min(i0 + kSub, n);
    if (i0 > 0) {
      SmallGemm(i1 - i0, vd, i0, -1.0f, lmat + i0 * n, n, 1, vn, vd, vn + i0 * vd, vd, true);
    }
    for (int64_t i = i0 + 1; i < i1; ++i) {
      float* __restrict vi = vn + i * vd;
      for (int64_t jj = i0; jj < i; ++jj) {
        const float l = lmat[i * n + jj];
        const float* __restrict vj = vn + jj * vd;
        for (int64_t c = 0; c < vd; ++c) vi[c] -= l * vj[c];
      }
    }
  }

  // O = (scale·Q·exp(Γ)) S + Aqk Vn, written straight into o.
  float* oc = o + (t0 * hv + j) * vd;
  const int64_t ldo = hv * vd;
  SmallGemm(n, vd, kd, 1.0f, w.qw.data(), kd, 1, s, vd, oc, ldo, false);
  SmallGemm(n, vd, n, 1.0f, aqk, n, 1, vn, vd, oc, ldo, true, /*lower_a=*/true);

  // S' = exp(Γ_last) S + (K·exp(Γ_last - Γ))ᵀ Vn.
  ExpDiff(last, gam - kd, kd, e);
  for (int64_t c = 0; c < kd; ++c) {
    float* __restrict row = s + c * vd;
    const float d = e[c];
    for (int64_t x = 0; x < vd; ++x) row[x] *= d;
  }
  SmallGemm(kd, vd, n, 1.0f, w.kn.data(), 1, kd, vn, vd, s, vd, true);
}

}  // namespace

void KdaRecurrent(const KdaShape& shape, const float* q, const float* k, const float* v,
                  const float* g, const float* beta, float scale, float* state, float* o) {
  const int64_t hk = shape.heads, hv = shape.v_heads;
  const int64_t kd = shape.k_dim, vd = shape.v_dim;
  const int64_t group = hv / hk;
  if (shape.t == 0) return;
  const bool parallel = hv > 1 && shape.t * hv * kd * vd >= kParallelMinWork;
#pragma omp parallel if (parallel)
  {
    std::vector<float> decay(kd), u(vd);
#pragma omp for schedule(static)
    for (int64_t j = 0; j < hv; ++j) {
      const int64_t h = j / group;
      float* s = state + j * kd * vd;  // [K, V]
      for (int64_t t = 0; t < shape.t; ++t) {
        const float* kt = k + (t * hk + h) * kd;
        const float* qt = q + (t * hk + h) * kd;
        const float* vt = v + (t * hv + j) * vd;
        const float b = beta[t * hv + j];
        float* __restrict ot = o + (t * hv + j) * vd;
        float* __restrict ut = u.data();
        ExpRow(g + (t * hv + j) * kd, kd, decay.data());
        // Decay and read in one pass: u = v - (diag(exp g) S)ᵀ k.
        for (int64_t x = 0; x < vd; ++x) ut[x] = vt[x];
        for (int64_t c = 0; c < kd; ++c) {
          float* __restrict row = s + c * vd;
          const float d = decay[c], kc = kt[c];
          for (int64_t x = 0; x < vd; ++x) {
            const float sx = row[x] * d;
            row[x] = sx;
            ut[x] -= kc * sx;
          }
        }
        for (int64_t x = 0; x < vd; ++x) ut[x] *= b;
        // Write and read in one pass: S += k (beta u)ᵀ; o = Sᵀ (scale q).
        for (int64_t x = 0; x < vd; ++x) ot[x] = 0.0f;
        for (int64_t c = 0; c < kd; ++c) {
          float* __restrict row = s + c * vd;
          const float kc = kt[c], qc = scale * qt[c];
          for (int64_t x = 0; x < vd; ++x) {
            const float sx = row[x] + kc * ut[x];
            row[x] = sx;
            ot[x] += qc * sx;
          }
        }
      }
    }
  }
}

void KdaChunk(const KdaShape& shape, const float* q, const float* k, const float* v, const float* g,
              const float* beta, float scale, float* state, float* o, int64_t chunk_size) {
  if (shape.t == 0) return;
  const int64_t hv = shape.v_heads, group = hv / shape.heads;
  const int64_t kd = shape.k_dim, vd = shape.v_dim;
  const int64_t n_max = std::min(chunk_size, shape.t);
  const bool parallel = hv > 1 && shape.t * hv * kd * vd >= kParallelMinWork;
#pragma omp parallel if (parallel)
  {
    ChunkScratch scratch(n_max, kd, vd);
    // Head by head, with no barrier between chunks. (All heads of a chunk
    // together reads the inputs more contiguously, measured ~5% faster on
    // one thread at K=V=128, but a barrier per chunk stalls badly when the
    // cores are shared.)
#pragma omp for schedule(static)
    for (int64_t j = 0; j < hv; ++j) {
      for (int64_t t0 = 0; t0 < shape.t; t0 += n_max) {
        const int64_t n = std::min(n_max, shape.t - t0);
        ChunkStep(shape, j / group, j, t0, n, q, k, v, g, beta, scale, state + j * kd * vd, o,
                  scratch);
      }
    }
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
