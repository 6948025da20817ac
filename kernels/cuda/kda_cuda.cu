// KDA on the GPU (kernels/kda.h), the same float32 arithmetic as
// kernels/cpu/kda_cpu.cc. Both forms keep each value head's [K, V] state as
// a block of (value head, tile of 32 V columns): lane x of every warp owns
// column x, the warps share out the K rows (warp w rows w, w + warps, ...),
// and each thread keeps its rows of the state in registers from the first
// token to the last; a reduction over K is a per-thread sum over its rows,
// then a sum over the warps through shared memory.
//
// KdaRecurrent: one launch; per token the block stages k, scale·q and
// exp(g) in shared memory, then makes the recurrence's two passes over its
// registers (decay and read Sᵀk; write k uᵀ and read Sᵀq).
//
// KdaChunk, the chunkwise form of MODEL.md (flash-linear-attention's
// chunk_kda: Vn = (I+L)^-1 (beta·V - beta·K·exp(Γ) S) is its U - W S, solved
// here against the right-hand side as the CPU does), in the safe-exponent
// form (only differences Γ_a - Γ_b <= 0 are exponentiated; Γ in double, as
// on the CPU); two launches per segment of tokens:
//   - intra: a block per (chunk, value head) builds Γ, the decayed operands
//     beta·k·exp(Γ), scale·q·exp(Γ), k·exp(Γ_last - Γ), exp(Γ_last), and
//     the strictly lower L and the lower Aqk, a thread per entry;
//   - state: a block per (value head, V tile) walks the chunks in order, by
//     blocks of 8 rows: the block's share of beta·K·exp(Γ) S + L Vn (earlier
//     rows) and of Q·exp(Γ) S, reduced over the warps; the forward
//     substitution inside the block by one warp; O = Q·exp(Γ)·S + Aqk Vn;
//     after the chunk S = exp(Γ_last) S + (k·exp(Γ_last - Γ))ᵀ Vn.
// The operands live in a global scratch (KdaChunkScratchBytes) sized for
// one segment, a whole number of chunks bounded by kScratchBudget; a longer
// input is run segment by segment, the state carried in place.
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kLanes = 32;    // V columns per block: one per lane
constexpr int kRegRows = 32;  // state rows a thread keeps in registers
constexpr int kMaxWarps = 8;  // K up to kRegRows * kMaxWarps in registers
constexpr int kSubRows = 8;   // chunk rows reduced together in the state pass
constexpr int kIntraThreads = 256;
// Chunks longer than this are computed as chunks of this many tokens (the
// same result to rounding): L and Aqk grow as chunk², and beyond it the
// chunk buys no more matrix-product shape.
constexpr int64_t kMaxChunk = 256;
// Bytes of scratch one segment of the chunked form may use.
constexpr int64_t kScratchBudget = int64_t{128} << 20;

// Warps of a state block: enough for K rows at kRegRows a thread, at most
// kMaxWarps (further rows stay in global memory, see ForOwnRows).
int StateWarps(int64_t kd) {
  const int64_t w = (kd + kRegRows - 1) / kRegRows;
  return static_cast<int>(w < 1 ? 1 : (w > kMaxWarps ? kMaxWarps : w));
}

// Calls f(s, c) for every state row c this thread owns (w, w + nw, ...):
// the first kRegRows in registers, any further ones (K > kRegRows·nw) in
// place in the global state column `col` [K] at stride vd, which only an
// active lane (a column < V) touches.
template <typename F>
__device__ __forceinline__ void ForOwnRows(float (&reg)[kRegRows], float* col, int64_t vd, int w,
                                           int nw, int64_t kd, bool active, F&& f) {
  DELTASERVE_UNROLL
  for (int i = 0; i < kRegRows; ++i) {
    const int64_t c = w + static_cast<int64_t>(i) * nw;
    if (c < kd) f(reg[i], c);
  }
  if (!active) return;
  for (int64_t c = w + static_cast<int64_t>(kRegRows) * nw; c < kd; c += nw) f(col[c * vd], c);
}

__device__ __forceinline__ void LoadRows(float (&reg)[kRegRows], const float* col, int64_t vd,
                                         int w, int nw, int64_t kd, bool active) {
  DELTASERVE_UNROLL
  for (int i = 0; i < kRegRows; ++i) {
    const int64_t c = w + static_cast<int64_t>(i) * nw;
    reg[i] = active && c < kd ? col[c * vd] : 0.0f;
  }
}

__device__ __forceinline__ void StoreRows(const float (&reg)[kRegRows], float* col, int64_t vd,
                                          int w, int nw, int64_t kd, bool active) {
  if (!active) return;
  DELTASERVE_UNROLL
  for (int i = 0; i < kRegRows; ++i) {
    const int64_t c = w + static_cast<int64_t>(i) * nw;
    if (c < kd) col[c * vd] = reg[i];
  }
}

// ---------------------------------------------------------------------------
// The recurrence. grid (HV, V tiles), block nw warps; dynamic shared
// [3, K]: k_t, scale·q_t, exp(g_t).
__global__ void __launch_bounds__(kMaxWarps* kLanes)
    KdaRecurrentKernel(int64_t t_len, int64_t hk, int64_t hv, int64_t kd, int64_t vd,
                       const float* __restrict__ q, const float* __restrict__ k,
                       const float* __restrict__ v, const float* __restrict__ g,
                       const float* __restrict__ beta, float scale, float* __restrict__ state,
                       float* __restrict__ o) {
  DELTASERVE_DYNAMIC_SHARED(float, tok);
  DELTASERVE_SHARED(float, red_u, [kMaxWarps][kLanes]);
  DELTASERVE_SHARED(float, red_o, [kMaxWarps][kLanes]);
  const int64_t j = blockIdx.x, h = j / (hv / hk);
  const int lane = threadIdx.x % kLanes, w = threadIdx.x / kLanes, nw = blockDim.x / kLanes;
  const int64_t x = static_cast<int64_t>(blockIdx.y) * kLanes + lane;
  const bool active = x < vd;
  float* col = state + j * kd * vd + x;
  float* kt = tok;
  float* qt = tok + kd;
  float* dt = tok + 2 * kd;
  float reg[kRegRows];
  LoadRows(reg, col, vd, w, nw, kd, active);
  for (int64_t t = 0; t < t_len; ++t) {
    // One buffer suffices: every thread read the last token's values before
    // the barrier ahead of its o (below), which precedes these writes.
    for (int64_t c = threadIdx.x; c < kd; c += blockDim.x) {
      kt[c] = k[(t * hk + h) * kd + c];
      qt[c] = scale * q[(t * hk + h) * kd + c];
      dt[c] = expf(g[(t * hv + j) * kd + c]);
    }
    __syncthreads();
    // Decay and read: u = beta (v - (diag(exp g) S)ᵀ k).
    float part = 0.0f;
    ForOwnRows(reg, col, vd, w, nw, kd, active, [&](float& s, int64_t c) {
      s *= dt[c];
      part += kt[c] * s;
    });
    red_u[w][lane] = part;
    __syncthreads();
    float u = 0.0f;
    for (int ww = 0; ww < nw; ++ww) u += red_u[ww][lane];
    u = active ? beta[t * hv + j] * (v[(t * hv + j) * vd + x] - u) : 0.0f;
    // Write and read: S += k uᵀ; o = Sᵀ (scale q).
    part = 0.0f;
    ForOwnRows(reg, col, vd, w, nw, kd, active, [&](float& s, int64_t c) {
      s += kt[c] * u;
      part += qt[c] * s;
    });
    red_o[w][lane] = part;
    __syncthreads();
    if (w == 0 && active) {
      float sum = 0.0f;
      for (int ww = 0; ww < nw; ++ww) sum += red_o[ww][lane];
      o[(t * hv + j) * vd + x] = sum;
    }
  }
  StoreRows(reg, col, vd, w, nw, kd, active);
}

// ---------------------------------------------------------------------------
// The chunked form's scratch for one segment of `cap` tokens (a whole
// number of chunks of n_max) and all value heads; rows are segment tokens.
struct ChunkScratch {
  double* gam;   // [HV, cap, K] Γ_i within its chunk
  float* kw;     // [HV, cap, K] beta·k·exp(Γ)
  float* qw;     // [HV, cap, K] scale·q·exp(Γ)
  float* kn;     // [HV, cap, K] k·exp(Γ_last - Γ)
  float* u;      // [HV, cap, V] beta·v, then Vn
  float* lmat;   // [HV, cap, n_max] strictly lower L of each chunk
  float* aqk;    // [HV, cap, n_max] lower Aqk of each chunk
  float* elast;  // [HV, cap / n_max, K] exp(Γ_last)
};

struct ChunkPlan {
  int64_t n_max = 0;  // tokens per chunk
  int64_t cap = 0;    // tokens per segment
  size_t bytes = 0;
};

size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

ChunkPlan PlanChunks(int64_t t, int64_t hv, int64_t kd, int64_t vd, int64_t chunk_size) {
  ChunkPlan p;
  if (t == 0) return p;
  p.n_max = chunk_size < t ? chunk_size : t;
  if (p.n_max > kMaxChunk) p.n_max = kMaxChunk;
  const int64_t per_token = hv * (8 * kd + 3 * 4 * kd + 4 * vd + 2 * 4 * p.n_max) + hv * 4 * kd;
  int64_t chunks = kScratchBudget / (per_token * p.n_max);
  const int64_t needed = (t + p.n_max - 1) / p.n_max;
  if (chunks < 1) chunks = 1;
  if (chunks > needed) chunks = needed;
  p.cap = chunks * p.n_max;
  const size_t rows = static_cast<size_t>(hv * p.cap);
  p.bytes = AlignUp(rows * kd * 8) + 3 * AlignUp(rows * kd * 4) + AlignUp(rows * vd * 4) +
            2 * AlignUp(rows * p.n_max * 4) + AlignUp(static_cast<size_t>(hv * chunks * kd * 4));
  return p;
}

ChunkScratch CarveScratch(const ChunkPlan& p, int64_t hv, int64_t kd, int64_t vd, void* base) {
  const size_t rows = static_cast<size_t>(hv * p.cap);
  char* at = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* here = at;
    at += AlignUp(bytes);
    return here;
  };
  ChunkScratch s;
  s.gam = reinterpret_cast<double*>(take(rows * kd * 8));
  s.kw = reinterpret_cast<float*>(take(rows * kd * 4));
  s.qw = reinterpret_cast<float*>(take(rows * kd * 4));
  s.kn = reinterpret_cast<float*>(take(rows * kd * 4));
  s.u = reinterpret_cast<float*>(take(rows * vd * 4));
  s.lmat = reinterpret_cast<float*>(take(rows * p.n_max * 4));
  s.aqk = reinterpret_cast<float*>(take(rows * p.n_max * 4));
  s.elast = reinterpret_cast<float*>(take(static_cast<size_t>(hv * (p.cap / p.n_max) * kd * 4)));
  return s;
}

// grid (chunks of the segment, HV), kIntraThreads. t0: the segment's first
// token; len: its tokens.
__global__ void __launch_bounds__(kIntraThreads)
    KdaChunkIntraKernel(int64_t t0, int64_t len, int64_t cap, int64_t n_max, int64_t hk, int64_t hv,
                        int64_t kd, int64_t vd, const float* __restrict__ q,
                        const float* __restrict__ k, const float* __restrict__ v,
                        const float* __restrict__ g, const float* __restrict__ beta, float scale,
                        ChunkScratch w) {
  const int64_t ch = blockIdx.x, j = blockIdx.y, h = j / (hv / hk);
  const int64_t i0 = ch * n_max;  // the chunk's first row in the segment
  const int64_t n = len - i0 < n_max ? len - i0 : n_max;
  const int64_t tg = t0 + i0;  // its first token
  const int64_t r0 = j * cap + i0;
  const int tid = threadIdx.x;

  // Γ per channel, accumulated in double (kernels/cpu/kda_cpu.cc says why),
  // and the operands decayed to the chunk's start and end.
  for (int64_t c = tid; c < kd; c += blockDim.x) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      acc += static_cast<double>(g[((tg + i) * hv + j) * kd + c]);
      w.gam[(r0 + i) * kd + c] = acc;
    }
    const double last = acc;
    w.elast[(j * (cap / n_max) + ch) * kd + c] = expf(static_cast<float>(last));
    for (int64_t i = 0; i < n; ++i) {
      const double gi = w.gam[(r0 + i) * kd + c];
      const float kc = k[((tg + i) * hk + h) * kd + c];
      const float e = expf(static_cast<float>(gi));
      w.kw[(r0 + i) * kd + c] = beta[(tg + i) * hv + j] * kc * e;
      w.qw[(r0 + i) * kd + c] = scale * q[((tg + i) * hk + h) * kd + c] * e;
      w.kn[(r0 + i) * kd + c] = kc * expf(static_cast<float>(last - gi));
    }
  }
  for (int64_t e = tid; e < n * vd; e += blockDim.x) {
    const int64_t i = e / vd, x = e % vd;
    w.u[(r0 + i) * vd + x] = beta[(tg + i) * hv + j] * v[((tg + i) * hv + j) * vd + x];
  }
  __syncthreads();

  // L[i, jj] = beta_i Σ_c k_i k_jj exp(Γ_i - Γ_jj) (jj < i) and
  // Aqk[i, jj] = Σ_c scale q_i k_jj exp(Γ_i - Γ_jj) (jj <= i): a thread
  // each, neighbours on neighbouring jj of one i (k_i, q_i, Γ_i broadcast).
  for (int64_t p = tid; p < n * n; p += blockDim.x) {
    const int64_t i = p / n, jj = p % n;
    if (jj > i) continue;
    const float* ki = k + ((tg + i) * hk + h) * kd;
    const float* qi = q + ((tg + i) * hk + h) * kd;
    const float* kj = k + ((tg + jj) * hk + h) * kd;
    const double* gi = w.gam + (r0 + i) * kd;
    const double* gj = w.gam + (r0 + jj) * kd;
    float l = 0.0f, a = 0.0f;
    for (int64_t c = 0; c < kd; ++c) {
      const float d = jj == i ? 1.0f : expf(static_cast<float>(gi[c] - gj[c]));
      const float kd_c = kj[c] * d;
      l += ki[c] * kd_c;
      a += qi[c] * kd_c;
    }
    w.lmat[(r0 + i) * n_max + jj] = jj < i ? beta[(tg + i) * hv + j] * l : 0.0f;
    w.aqk[(r0 + i) * n_max + jj] = scale * a;
  }
}

// grid (HV, V tiles), block nw warps: the chunks of the segment in order.
__global__ void __launch_bounds__(kMaxWarps* kLanes)
    KdaChunkStateKernel(int64_t t0, int64_t len, int64_t cap, int64_t n_max, int64_t hv, int64_t kd,
                        int64_t vd, ChunkScratch w, float* __restrict__ state,
                        float* __restrict__ o) {
  DELTASERVE_SHARED(float, red, [2][kMaxWarps][kSubRows][kLanes]);
  DELTASERVE_SHARED(float, oq, [kSubRows][kLanes]);
  const int64_t j = blockIdx.x;
  const int lane = threadIdx.x % kLanes, wp = threadIdx.x / kLanes, nw = blockDim.x / kLanes;
  const int64_t x = static_cast<int64_t>(blockIdx.y) * kLanes + lane;
  const bool active = x < vd;
  float* col = state + j * kd * vd + x;
  float reg[kRegRows];
  LoadRows(reg, col, vd, wp, nw, kd, active);
  const int64_t chunks = (len + n_max - 1) / n_max;
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t i0 = ch * n_max;
    const int64_t n = len - i0 < n_max ? len - i0 : n_max;
    const int64_t r0 = j * cap + i0, tg = t0 + i0;
    const float* kw = w.kw + r0 * kd;
    const float* qw = w.qw + r0 * kd;
    const float* kn = w.kn + r0 * kd;
    const float* lmat = w.lmat + r0 * n_max;
    const float* aqk = w.aqk + r0 * n_max;
    const float* el = w.elast + (j * (cap / n_max) + ch) * kd;
    float* vn = w.u + r0 * vd + x;  // beta·v, overwritten by Vn, column x
    for (int64_t b0 = 0; b0 < n; b0 += kSubRows) {
      const int m = static_cast<int>(n - b0 < kSubRows ? n - b0 : kSubRows);
      // Per-thread shares of (beta·k·exp(Γ) S + L Vn)[i, x] over its state
      // rows and its earlier chunk rows (j = wp, wp + nw, ... < b0), and of
      // (Q·exp(Γ) S)[i, x].
      float pw[kSubRows], pq[kSubRows];
      DELTASERVE_UNROLL
      for (int ii = 0; ii < kSubRows; ++ii) pw[ii] = pq[ii] = 0.0f;
      ForOwnRows(reg, col, vd, wp, nw, kd, active, [&](float& s, int64_t c) {
        DELTASERVE_UNROLL
        for (int ii = 0; ii < kSubRows; ++ii) {
          if (ii < m) {
            pw[ii] += kw[(b0 + ii) * kd + c] * s;
            pq[ii] += qw[(b0 + ii) * kd + c] * s;
          }
        }
      });
      if (active) {
        for (int64_t jj = wp; jj < b0; jj += nw) {
          const float vj = vn[jj * vd];
          DELTASERVE_UNROLL
          for (int ii = 0; ii < kSubRows; ++ii) {
            if (ii < m) pw[ii] += lmat[(b0 + ii) * n_max + jj] * vj;
          }
        }
      }
      DELTASERVE_UNROLL
      for (int ii = 0; ii < kSubRows; ++ii) {
        red[0][wp][ii][lane] = pw[ii];
        red[1][wp][ii][lane] = pq[ii];
      }
      __syncthreads();
      // The rows of this block one after the other (each needs the ones
      // before it): Vn_i = beta v_i - (beta k exp(Γ) S)_i - Σ_{j<i} L_ij Vn_j.
      if (wp == 0) {
        for (int ii = 0; ii < m; ++ii) {
          const int64_t i = b0 + ii;
          float sw = 0.0f, sq = 0.0f;
          for (int ww = 0; ww < nw; ++ww) {
            sw += red[0][ww][ii][lane];
            sq += red[1][ww][ii][lane];
          }
          oq[ii][lane] = sq;
          if (!active) continue;
          float acc = vn[i * vd] - sw;
          for (int64_t jj = b0; jj < i; ++jj) acc -= lmat[i * n_max + jj] * vn[jj * vd];
          vn[i * vd] = acc;
        }
      }
      __syncthreads();
      // O = Q·exp(Γ)·S + Aqk Vn for these rows: Vn up to them is complete.
      for (int ii = wp; ii < m; ii += nw) {
        if (!active) continue;
        const int64_t i = b0 + ii;
        float acc = oq[ii][lane];
        for (int64_t jj = 0; jj <= i; ++jj) acc += aqk[i * n_max + jj] * vn[jj * vd];
        o[((tg + i) * hv + j) * vd + x] = acc;
      }
      // The next rows' writes of red and oq follow a barrier that every
      // reader here reaches after it is done.
    }
    // S = exp(Γ_last) S + (k·exp(Γ_last - Γ))ᵀ Vn; Vn is complete (barrier
    // above), and only this thread's own column is read.
    if (active) {
      ForOwnRows(reg, col, vd, wp, nw, kd, active, [&](float& s, int64_t c) {
        float acc = el[c] * s;
        for (int64_t i = 0; i < n; ++i) acc += kn[i * kd + c] * vn[i * vd];
        s = acc;
      });
    }
    // The next chunk's reads of Vn are of its own rows; its writes of red
    // and oq come after the barrier every thread reached above.
    __syncthreads();
  }
  StoreRows(reg, col, vd, wp, nw, kd, active);
}

}  // namespace

void KdaRecurrent(int64_t t, int64_t heads, int64_t v_heads, int64_t k_dim, int64_t v_dim,
                  const float* q, const float* k, const float* v, const float* g, const float* beta,
                  float scale, float* state, float* o, const Stream& stream) {
  if (t == 0) return;
  const int nw = StateWarps(k_dim);
  const dim3 grid(static_cast<unsigned>(v_heads), BlocksFor(v_dim, kLanes));
  DELTASERVE_LAUNCH(KdaRecurrentKernel, grid, dim3(nw * kLanes),
                    static_cast<size_t>(3 * k_dim) * sizeof(float), stream, t, heads, v_heads,
                    k_dim, v_dim, q, k, v, g, beta, scale, state, o);
}

size_t KdaChunkScratchBytes(int64_t t, int64_t v_heads, int64_t k_dim, int64_t v_dim,
                            int64_t chunk_size) {
  return PlanChunks(t, v_heads, k_dim, v_dim, chunk_size).bytes;
}

void KdaChunk(int64_t t, int64_t heads, int64_t v_heads, int64_t k_dim, int64_t v_dim,
              const float* q, const float* k, const float* v, const float* g, const float* beta,
              float scale, float* state, float* o, int64_t chunk_size, void* scratch,
              const Stream& stream) {
  if (t == 0) return;
  const ChunkPlan plan = PlanChunks(t, v_heads, k_dim, v_dim, chunk_size);
  const ChunkScratch w = CarveScratch(plan, v_heads, k_dim, v_dim, scratch);
  const int nw = StateWarps(k_dim);
  for (int64_t t0 = 0; t0 < t; t0 += plan.cap) {
    const int64_t len = t - t0 < plan.cap ? t - t0 : plan.cap;
    const dim3 intra_grid(BlocksFor(len, plan.n_max), static_cast<unsigned>(v_heads));
    DELTASERVE_LAUNCH(KdaChunkIntraKernel, intra_grid, dim3(kIntraThreads), 0, stream, t0, len,
                      plan.cap, plan.n_max, heads, v_heads, k_dim, v_dim, q, k, v, g, beta, scale,
                      w);
    const dim3 state_grid(static_cast<unsigned>(v_heads), BlocksFor(v_dim, kLanes));
    DELTASERVE_LAUNCH(KdaChunkStateKernel, state_grid, dim3(nw * kLanes), 0, stream, t0, len,
                      plan.cap, plan.n_max, v_heads, k_dim, v_dim, w, state, o);
  }
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
