// CPU kernels for kernels/mla_attention.h.
//
// Both forms run one engine. A block of up to kBlockQ query rows is packed
// transposed, [panel][dim][16], so that 16 queries fill the SIMD lanes; key
// and value rows are then read in place from the caller's strided layout and
// broadcast one element at a time (no key packing: per head, the prefill keys
// are two strided pieces, k_nope from kv and the shared k_rope). Keys stream in
// blocks of kBlockK with an online softmax in the log2 domain (the scale and
// log2(e) are folded into the packed queries). Scores, probabilities and the
// output accumulator are all kept transposed, so the softmax bookkeeping is
// per-lane vector work too.
//
// Threading: one task per (query block, key split). Query blocks are ordered
// heaviest first (latest positions) for the dynamic schedule; keys are split
// only when there are too few query blocks to occupy the threads (decode, or
// T=1 with a long prefix), and the partial softmax states are merged after.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/mla_attention.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

constexpr int kLanes = 16;  // queries per panel (two AVX2 registers)
constexpr int kPanels = 4;  // panels per query block
constexpr int kBlockQ = kLanes * kPanels;
constexpr int kBlockK = 64;   // keys per online-softmax step
constexpr int kTileRows = 6;  // broadcast rows per register tile
// Keys a split takes at the least. A decode step (one query block) splits its
// keys among the threads from 2 * kMinSplitKeys keys: below 1024 keys
// (k3-moe-small, two cores) the attention of a decode step ran on the calling
// thread alone, the other waiting, a twentieth of the step.
constexpr int64_t kMinSplitKeys = 128;
// Multiply-adds below which a call runs on the calling thread alone.
constexpr int64_t kMinParallelWork = int64_t{1} << 18;
constexpr float kLog2E = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Where the keys and values of one query block live: key row s is
// [a + s * a_stride (da values) ; b + s * b_stride (db values)], value row s is
// v + s * v_stride (dv values).
// When rows16 is set, the keys are instead bf16 rows of width16 values at
// stride16, widened a block at a time, with the pieces at offsets a16, b16
// and v16 of a row.
struct KeySource {
  const float* a = nullptr;
  int64_t a_stride = 0;
  const float* b = nullptr;
  int64_t b_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const uint16_t* rows16 = nullptr;
  int64_t stride16 = 0, width16 = 0;
  int64_t a16 = 0, b16 = 0, v16 = 0;
  // A paged cache: key s lives in row page_table[s / page_tokens] *
  // page_tokens + s % page_tokens of the pool.
  const int32_t* page_table = nullptr;
  int64_t page_tokens = 0;

  // rows[j] = the pool row of key s0 + j, j < n: one division per block of
  // keys, then a step through the pages.
  void Rows(int64_t s0, int64_t n, int64_t* rows) const {
    if (page_table == nullptr) {
      for (int64_t j = 0; j < n; ++j) rows[j] = s0 + j;
      return;
    }
    int64_t page = s0 / page_tokens, offset = s0 % page_tokens;
    for (int64_t j = 0; j < n; ++j) {
      rows[j] = page_table[page] * page_tokens + offset;
      if (++offset == page_tokens) {
        offset = 0;
        ++page;
      }
    }
  }
};

// One query row: its two key-dimension pieces, where its output goes, and how
// many keys it sees (keys [0, limit)).
struct RowInfo {
  const float* qa = nullptr;
  const float* qb = nullptr;
  float* out = nullptr;
  int64_t limit = 0;
};

struct Dims {
  int64_t da = 0, db = 0, dv = 0;
  int64_t dk() const { return da + db; }
};

#if DELTASERVE_CPU_AVX2

constexpr int kVecs = kLanes / 8;  // AVX2 registers per panel row

// Accumulates acc[r][:] += Σ_d k_r[d] qt[d][:] over d < n, r < MR.
template <int MR>
inline void QkAccumulate(const float* const* k, int64_t n, const float* qt,
                         __m256 (&acc)[MR][kVecs]) {
  for (int64_t d = 0; d < n; ++d, qt += kLanes) {
    __m256 q[kVecs];
    for (int u = 0; u < kVecs; ++u) q[u] = _mm256_loadu_ps(qt + 8 * u);
    for (int r = 0; r < MR; ++r) {
      const __m256 x = _mm256_broadcast_ss(k[r] + d);
      for (int u = 0; u < kVecs; ++u) acc[r][u] = _mm256_fmadd_ps(x, q[u], acc[r][u]);
    }
  }
}

// st[r][:] = Σ_d k_r[d] qt[d][:] over both key pieces, r < MR.
template <int MR>
void QkTile(const float* const* ka, const float* const* kb, const Dims& dims, const float* qt,
            float* st) {
  __m256 acc[MR][kVecs];
  for (int r = 0; r < MR; ++r)
    for (int u = 0; u < kVecs; ++u) acc[r][u] = _mm256_setzero_ps();
  QkAccumulate<MR>(ka, dims.da, qt, acc);
  QkAccumulate<MR>(kb, dims.db, qt + dims.da * kLanes, acc);
  for (int r = 0; r < MR; ++r)
    for (int u = 0; u < kVecs; ++u) _mm256_storeu_ps(st + r * kLanes + 8 * u, acc[r][u]);
}

// ot[c0 + r][:] = alpha[:] * ot[c0 + r][:] + Σ_j v_j[c0 + r] pt[j][:], r < MR.
template <int MR>
void PvTile(const float* const* v, int64_t c0, int64_t nk, const float* pt, const float* alpha,
            float* ot) {
  float* o = ot + c0 * kLanes;
  __m256 acc[MR][kVecs];
  for (int u = 0; u < kVecs; ++u) {
    const __m256 a = _mm256_loadu_ps(alpha + 8 * u);
    for (int r = 0; r < MR; ++r)
      acc[r][u] = _mm256_mul_ps(a, _mm256_loadu_ps(o + r * kLanes + 8 * u));
  }
  for (int64_t j = 0; j < nk; ++j, pt += kLanes) {
    __m256 p[kVecs];
    for (int u = 0; u < kVecs; ++u) p[u] = _mm256_loadu_ps(pt + 8 * u);
    const float* vj = v[j] + c0;
    for (int r = 0; r < MR; ++r) {
      const __m256 x = _mm256_broadcast_ss(vj + r);
      for (int u = 0; u < kVecs; ++u) acc[r][u] = _mm256_fmadd_ps(x, p[u], acc[r][u]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int u = 0; u < kVecs; ++u) _mm256_storeu_ps(o + r * kLanes + 8 * u, acc[r][u]);
}

// Online-softmax step for one panel of scores st [nk][16]: updates the running
// max m and sum l, leaves the rescale factor in alpha and the unnormalised
// probabilities in st. A lane that has seen only masked keys keeps m = -inf
// and contributes zeros (this happens in key splits past its causal limit).
void SoftmaxStep(float* st, int64_t nk, float* m, float* l, float* alpha) {
  for (int h = 0; h < kLanes; h += 8) {
    __m256 mb = _mm256_loadu_ps(st + h);
    for (int64_t j = 1; j < nk; ++j) mb = _mm256_max_ps(mb, _mm256_loadu_ps(st + j * kLanes + h));
    const __m256 m_old = _mm256_loadu_ps(m + h);
    const __m256 m_new = _mm256_max_ps(m_old, mb);
    const __m256 none = _mm256_cmp_ps(m_new, _mm256_set1_ps(kNegInf), _CMP_EQ_OQ);
    const __m256 m_use = _mm256_andnot_ps(none, m_new);  // -inf -> 0
    const __m256 a = simd::Exp2(_mm256_sub_ps(m_old, m_use));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < nk; ++j) {
      float* s = st + j * kLanes + h;
      const __m256 p = simd::Exp2(_mm256_sub_ps(_mm256_loadu_ps(s), m_use));
      _mm256_storeu_ps(s, p);
      sum = _mm256_add_ps(sum, p);
    }
    _mm256_storeu_ps(m + h, m_new);
    _mm256_storeu_ps(l + h, _mm256_fmadd_ps(_mm256_loadu_ps(l + h), a, sum));
    _mm256_storeu_ps(alpha + h, a);
  }
}

#else  // portable scalar versions of the three kernels above

template <int MR>
void QkTile(const float* const* ka, const float* const* kb, const Dims& dims, const float* qt,
            float* st) {
  float acc[MR][kLanes] = {};
  for (int64_t d = 0; d < dims.da; ++d, qt += kLanes)
    for (int r = 0; r < MR; ++r)
      for (int i = 0; i < kLanes; ++i) acc[r][i] += ka[r][d] * qt[i];
  for (int64_t d = 0; d < dims.db; ++d, qt += kLanes)
    for (int r = 0; r < MR; ++r)
      for (int i = 0; i < kLanes; ++i) acc[r][i] += kb[r][d] * qt[i];
  for (int r = 0; r < MR; ++r)
    for (int i = 0; i < kLanes; ++i) st[r * kLanes + i] = acc[r][i];
}

template <int MR>
void PvTile(const float* const* v, int64_t c0, int64_t nk, const float* pt, const float* alpha,
            float* ot) {
  float* o = ot + c0 * kLanes;
  for (int r = 0; r < MR; ++r)
    for (int i = 0; i < kLanes; ++i) o[r * kLanes + i] *= alpha[i];
  for (int64_t j = 0; j < nk; ++j, pt += kLanes)
    for (int r = 0; r < MR; ++r)
      for (int i = 0; i < kLanes; ++i) o[r * kLanes + i] += v[j][c0 + r] * pt[i];
}

void SoftmaxStep(float* st, int64_t nk, float* m, float* l, float* alpha) {
  for (int i = 0; i < kLanes; ++i) {
    float mb = kNegInf;
    for (int64_t j = 0; j < nk; ++j) mb = std::max(mb, st[j * kLanes + i]);
    const float m_new = std::max(m[i], mb);
    const float m_use = m_new == kNegInf ? 0.0f : m_new;
    alpha[i] = std::exp2(m[i] - m_use);
    float sum = 0.0f;
    for (int64_t j = 0; j < nk; ++j) {
      float& s = st[j * kLanes + i];
      s = std::exp2(s - m_use);
      sum += s;
    }
    m[i] = m_new;
    l[i] = l[i] * alpha[i] + sum;
  }
}

#endif  // DELTASERVE_CPU_AVX2

// Per-thread state of one query block: packed queries, scores, output
// accumulator and the running softmax statistics, all [panel][...][16].
struct Workspace {
  explicit Workspace(const Dims& d)
      : qt(kPanels * d.dk() * kLanes),
        st(kPanels * kBlockK * kLanes),
        ot(kPanels * d.dv * kLanes),
        m(kBlockQ),
        l(kBlockQ),
        alpha(kBlockQ),
        limit(kBlockQ) {}
  std::vector<float> qt, st, ot, m, l, alpha;
  std::vector<float> widened;  // [kBlockK, width16]: bf16 keys of one block
  std::vector<int64_t> limit;
  const float* ka[kBlockK];
  const float* kb[kBlockK];
  const float* v[kBlockK];
};

// Loads up to kBlockQ rows (scaled into the log2 domain) and resets the state.
// Returns the number of panels in use.
int LoadQueries(const RowInfo* rows, int nq, const Dims& dims, float scale, Workspace* ws) {
  const int panels = (nq + kLanes - 1) / kLanes;
  const int64_t dk = dims.dk();
  const float qscale = scale * kLog2E;
  std::fill(ws->qt.begin(), ws->qt.begin() + panels * dk * kLanes, 0.0f);
  for (int i = 0; i < nq; ++i) {
    float* dst = ws->qt.data() + (i / kLanes) * dk * kLanes + i % kLanes;
    for (int64_t d = 0; d < dims.da; ++d) dst[d * kLanes] = rows[i].qa[d] * qscale;
    dst += dims.da * kLanes;
    for (int64_t d = 0; d < dims.db; ++d) dst[d * kLanes] = rows[i].qb[d] * qscale;
  }
  // Padding lanes copy the last row's limit so that they never force masking.
  for (int i = 0; i < panels * kLanes; ++i) ws->limit[i] = rows[std::min(i, nq - 1)].limit;
  std::fill(ws->m.begin(), ws->m.end(), kNegInf);
  std::fill(ws->l.begin(), ws->l.end(), 0.0f);
  std::fill(ws->ot.begin(), ws->ot.begin() + panels * dims.dv * kLanes, 0.0f);
  return panels;
}

// Calls tile.operator()<MR>(r) over [0, n) in tiles of kTileRows rows, the
// last one shorter.
template <int MR = kTileRows, typename F>
void ForTiles(int64_t n, F&& tile) {
  if constexpr (MR == kTileRows) {
    int64_t r = 0;
    for (; r + kTileRows <= n; r += kTileRows) tile.template operator()<kTileRows>(r);
    if (r < n)
      ForTiles<kTileRows - 1>(n - r, [&]<int M>(int64_t i) { tile.template operator()<M>(r + i); });
  } else if constexpr (MR > 0) {
    if (n == MR) {
      tile.template operator()<MR>(0);
    } else {
      ForTiles<MR - 1>(n, tile);
    }
  }
}

// Streams keys [k_begin, k_end) through the loaded query block.
void AttendKeys(const KeySource& keys, const Dims& dims, int nq, int panels, int64_t k_begin,
                int64_t k_end, Workspace* ws) {
  int64_t lim_min = ws->limit[0], lim_max = ws->limit[0];
  for (int i = 1; i < nq; ++i) {
    lim_min = std::min(lim_min, ws->limit[i]);
    lim_max = std::max(lim_max, ws->limit[i]);
  }
  k_end = std::min(k_end, lim_max);  // later key blocks are fully masked
  const int64_t dk = dims.dk();
  for (int64_t s0 = k_begin; s0 < k_end; s0 += kBlockK) {
    const int64_t nk = std::min<int64_t>(kBlockK, k_end - s0);
    int64_t rows[kBlockK];
    keys.Rows(s0, nk, rows);
    if (keys.rows16 != nullptr) {
      // Widen the block's bf16 rows (exact) and read them from there.
      const int64_t w = keys.width16;
      ws->widened.resize(static_cast<size_t>(kBlockK * w));
      for (int64_t j = 0; j < nk; ++j) {
        const uint16_t* src = keys.rows16 + rows[j] * keys.stride16;
        float* dst = ws->widened.data() + j * w;
        for (int64_t c = 0; c < w; ++c) {
          const uint32_t bits = static_cast<uint32_t>(src[c]) << 16;
          std::memcpy(dst + c, &bits, sizeof(float));
        }
        ws->ka[j] = dst + keys.a16;
        ws->kb[j] = dst + keys.b16;
        ws->v[j] = dst + keys.v16;
      }
    } else {
      for (int64_t j = 0; j < nk; ++j) {
        ws->ka[j] = keys.a + rows[j] * keys.a_stride;
        ws->kb[j] = keys.b + rows[j] * keys.b_stride;
        ws->v[j] = keys.v + rows[j] * keys.v_stride;
      }
    }
    for (int p = 0; p < panels; ++p) {
      const float* qt = ws->qt.data() + p * dk * kLanes;
      float* st = ws->st.data() + p * kBlockK * kLanes;
      ForTiles(nk, [&]<int MR>(int64_t j) {
        QkTile<MR>(ws->ka + j, ws->kb + j, dims, qt, st + j * kLanes);
      });
    }
    if (s0 + nk > lim_min) {  // the causal diagonal crosses this block
      for (int p = 0; p < panels; ++p) {
        float* st = ws->st.data() + p * kBlockK * kLanes;
        const int64_t* limit = ws->limit.data() + p * kLanes;
        for (int64_t j = 0; j < nk; ++j)
          for (int i = 0; i < kLanes; ++i)
            if (s0 + j >= limit[i]) st[j * kLanes + i] = kNegInf;
      }
    }
    for (int p = 0; p < panels; ++p) {
      float* st = ws->st.data() + p * kBlockK * kLanes;
      float* alpha = ws->alpha.data() + p * kLanes;
      SoftmaxStep(st, nk, ws->m.data() + p * kLanes, ws->l.data() + p * kLanes, alpha);
      float* ot = ws->ot.data() + p * dims.dv * kLanes;
      ForTiles(dims.dv, [&]<int MR>(int64_t c) { PvTile<MR>(ws->v, c, nk, st, alpha, ot); });
    }
  }
}

// A split's partial result for one query block, for the merge.
struct Partial {
  std::vector<float> m, l, ot;
};

// Runs attention for every query block `rows` describes:
//   int64_t NumBlocks() const;
//   int64_t NumKeys() const;   // the largest limit of any row
//   int Block(int64_t b, RowInfo* rows, KeySource* keys) const;  // returns nq
template <typename Rows>
void RunAttention(const Rows& rows, const Dims& dims, float scale) {
  const int64_t nblocks = rows.NumBlocks();
  if (nblocks == 0) return;
  const int64_t threads = omp_get_max_threads();
  int64_t nsplit = 1;
  if (nblocks < 2 * threads) {
    nsplit = std::min((2 * threads + nblocks - 1) / nblocks, rows.NumKeys() / kMinSplitKeys);
    nsplit = std::max<int64_t>(nsplit, 1);
    // The split count up to nsplit whose equal tasks take the threads the
    // least time, rounds of tasks times a task's size (three tasks on two
    // threads take as long as four; two take less); the larger on a tie.
    const auto rounds = [&](int64_t s) { return (nblocks * s + threads - 1) / threads; };
    int64_t best = nsplit;
    for (int64_t s = nsplit - 1; s >= 1; --s) {
      if (rounds(s) * (nblocks * best) < rounds(best) * (nblocks * s)) best = s;
    }
    nsplit = best;
  }
  const int64_t split_len = (rows.NumKeys() + nsplit - 1) / nsplit;  // keys per split
  std::vector<Partial> partials(nsplit > 1 ? nblocks * nsplit : 0);
  // A fork costs microseconds, and far more when other processes hold the
  // cores: small problems (a decode step over a short cache) run inline.
  const bool parallel =
      nblocks * nsplit > 1 &&
      nblocks * kBlockQ * rows.NumKeys() * (dims.dk() + dims.dv) >= kMinParallelWork;

#pragma omp parallel if (parallel)
  {
    Workspace ws(dims);
    RowInfo info[kBlockQ];
    KeySource keys;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < nblocks * nsplit; ++task) {
      const int64_t block = task / nsplit, split = task % nsplit;
      const int nq = rows.Block(block, info, &keys);
      const int panels = LoadQueries(info, nq, dims, scale, &ws);
      AttendKeys(keys, dims, nq, panels, split * split_len, (split + 1) * split_len, &ws);
      if (nsplit == 1) {
        for (int i = 0; i < nq; ++i) {
          const float inv = 1.0f / ws.l[i];
          const float* src = ws.ot.data() + (i / kLanes) * dims.dv * kLanes + i % kLanes;
          for (int64_t c = 0; c < dims.dv; ++c) info[i].out[c] = src[c * kLanes] * inv;
        }
      } else {
        Partial& part = partials[task];
        part.m.assign(ws.m.begin(), ws.m.end());
        part.l.assign(ws.l.begin(), ws.l.end());
        part.ot.assign(ws.ot.begin(), ws.ot.begin() + panels * dims.dv * kLanes);
      }
    }
    if (nsplit > 1) {
      std::vector<float> w(nsplit);
#pragma omp for schedule(static)
      for (int64_t block = 0; block < nblocks; ++block) {
        const int nq = rows.Block(block, info, &keys);
        const Partial* part = partials.data() + block * nsplit;
        for (int i = 0; i < nq; ++i) {
          float mx = kNegInf;
          for (int64_t k = 0; k < nsplit; ++k) mx = std::max(mx, part[k].m[i]);
          float l = 0.0f;
          for (int64_t k = 0; k < nsplit; ++k) {
            w[k] = part[k].m[i] == kNegInf ? 0.0f : std::exp2(part[k].m[i] - mx);
            l += w[k] * part[k].l[i];
          }
          const float inv = 1.0f / l;
          const int64_t base = (i / kLanes) * dims.dv * kLanes + i % kLanes;
          for (int64_t c = 0; c < dims.dv; ++c) {
            float acc = 0.0f;
            for (int64_t k = 0; k < nsplit; ++k) acc += w[k] * part[k].ot[base + c * kLanes];
            info[i].out[c] = acc * inv;
          }
        }
      }
    }
  }
}

// Prefill: a block is (head, 64 consecutive tokens), latest tokens first.
struct PrefillRows {
  const MlaPrefillPtrs& a;
  int64_t t_blocks;
  int64_t NumBlocks() const { return a.heads * t_blocks; }
  int64_t NumKeys() const { return a.prefix + a.t; }
  int Block(int64_t b, RowInfo* rows, KeySource* keys) const {
    const int64_t h = b % a.heads;
    const int64_t t0 = (t_blocks - 1 - b / a.heads) * kBlockQ;
    const int nq = static_cast<int>(std::min<int64_t>(kBlockQ, a.t - t0));
    const int64_t qw = a.nope_dim + a.rope_dim, kvw = a.nope_dim + a.v_dim;
    for (int i = 0; i < nq; ++i) {
      const int64_t t = t0 + i;
      rows[i].qa = a.q + (t * a.heads + h) * qw;
      rows[i].qb = rows[i].qa + a.nope_dim;
      rows[i].out = a.o + (t * a.heads + h) * a.v_dim;
      rows[i].limit = a.prefix + t + 1;
    }
    keys->a = a.kv + h * kvw;
    keys->a_stride = a.heads * kvw;
    keys->b = a.k_rope;
    keys->b_stride = a.rope_dim > 0 ? a.k_rope_stride : 0;
    keys->v = a.kv + h * kvw + a.nope_dim;
    keys->v_stride = a.heads * kvw;
    return nq;
  }
};

// Absorbed: all heads share the latent keys, so a block is 64 consecutive
// (token, head) rows, latest first.
struct AbsorbedRows {
  const MlaAbsorbedPtrs& a;
  int64_t n_rows;
  int64_t NumBlocks() const { return (n_rows + kBlockQ - 1) / kBlockQ; }
  int64_t NumKeys() const { return a.prefix + a.t; }
  int Block(int64_t b, RowInfo* rows, KeySource* keys) const {
    const int64_t r0 = (NumBlocks() - 1 - b) * kBlockQ;
    const int nq = static_cast<int>(std::min<int64_t>(kBlockQ, n_rows - r0));
    for (int i = 0; i < nq; ++i) {
      const int64_t r = r0 + i;  // = t * heads + h
      rows[i].qa = a.q_latent + r * a.latent_dim;
      rows[i].qb = a.q_rope + r * a.rope_dim;
      rows[i].out = a.o_latent + r * a.latent_dim;
      rows[i].limit = a.prefix + r / a.heads + 1;
    }
    const int64_t width = a.latent_dim + a.rope_dim;
    if (a.cache_dtype == DType::kBF16) {
      // c at 0 (keys and values), k_rope at C.
      *keys = {};
      keys->b16 = a.latent_dim;
      keys->rows16 = static_cast<const uint16_t*>(a.cache);
      keys->stride16 = width;
      keys->width16 = width;
    } else {
      const auto* cache = static_cast<const float*>(a.cache);
      *keys = {cache, width, cache + a.latent_dim, width, cache, width};
    }
    keys->page_table = a.page_table;
    keys->page_tokens = a.page_tokens;
    return nq;
  }
};

}  // namespace

void MlaPrefillAttention(const MlaPrefillPtrs& args) {
  if (args.t == 0 || args.heads == 0 || args.v_dim == 0) return;
  const PrefillRows rows{args, (args.t + kBlockQ - 1) / kBlockQ};
  RunAttention(rows, Dims{args.nope_dim, args.rope_dim, args.v_dim}, args.scale);
}

void MlaAbsorbedAttention(const MlaAbsorbedPtrs& args) {
  if (args.t == 0 || args.heads == 0 || args.latent_dim == 0) return;
  const AbsorbedRows rows{args, args.t * args.heads};
  RunAttention(rows, Dims{args.latent_dim, args.rope_dim, args.latent_dim}, args.scale);
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
