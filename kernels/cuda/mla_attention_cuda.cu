// kernels/mla_attention.h on the GPU: both forms run one flash-attention
// style kernel. A block takes a tile of kBlockQ query rows (one head's tokens
// for the prefill form; consecutive (token, head) rows for the absorbed form,
// whose heads share the latent keys) and one split of the keys, and streams
// key tiles of kBlockK rows through shared memory (gathered through the page
// table, widened from bf16) with an online softmax in the log2 domain: never a
// [T, S] score matrix. When the query tiles alone cannot fill the GPU (decode,
// short chunks over long caches), the keys are split across blocks (grid y)
// and a second kernel merges the splits' (max, sum, acc).
#include "kernels/cuda/compat.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 128;
// Tiles start at 32 query rows x 32 keys and are halved until they fit 96 KiB
// of shared memory, so that two blocks share an SM (228 KiB on sm_90): the
// real prefill dims (P + R = 192, Vd = 128) keep 32 x 32, the absorbed ones
// (C + R = 576, C = 512) get 16 rows x 8 keys.
constexpr int kMaxTile = 32;
constexpr int kMinKeyTile = 8;
constexpr size_t kSharedBudget = 96 * 1024;
// Blocks that fill an H100/H200 (132 SMs, two blocks each), and the fewest
// keys a split is worth a partial state for.
constexpr int64_t kTargetBlocks = 264;
constexpr int64_t kMinSplitKeys = 256;
constexpr float kLog2E = 1.4426950408889634f;

// One call of either form, as the kernel sees it. Query row i of head z
// (z = blockIdx.z; always 0 for the absorbed form) has the key parts
// qa + z * qa_z + i * qa_row (da values) and qb + z * qb_z + i * qb_row (db
// values), sees keys [0, prefix + i / rows_per_token + 1), and writes dv
// values at out + z * out_z + i * out_row. Key s, at cache row r(s) (s, or
// through the page table), is ka + z * ka_z + r * ka_row (da values) then
// kb + r * kb_row (db values); its value is v + z * v_z + r * v_row, or, with
// v_in_k, the first dv values of the key itself.
struct Engine {
  int64_t rows = 0, rows_per_token = 1, prefix = 0, da = 0, db = 0, dv = 0;
  const float* qa = nullptr;
  int64_t qa_z = 0, qa_row = 0;
  const float* qb = nullptr;
  int64_t qb_z = 0, qb_row = 0;
  float* out = nullptr;
  int64_t out_z = 0, out_row = 0;
  const void* ka = nullptr;  // f32, or bf16 bits with bf16
  int64_t ka_z = 0, ka_row = 0;
  const void* kb = nullptr;
  int64_t kb_row = 0;
  const void* v = nullptr;
  int64_t v_z = 0, v_row = 0;
  bool bf16 = false, v_in_k = false;
  const int32_t* page_table = nullptr;
  int64_t page_tokens = 0;
  float scale = 1.0f;
  // Tiles and key splits.
  int block_q = kMaxTile, block_k = kMaxTile;
  int64_t splits = 1, split_len = 0, heads_z = 1;
  // With splits > 1: per split and row (z * rows + i), m and l, then acc [dv].
  float* partial_m = nullptr;
  float* partial_l = nullptr;
  float* partial_acc = nullptr;
};

// Row strides in shared memory: odd, so that threads reading a column of
// consecutive rows hit distinct banks.
__host__ __device__ inline int64_t Padded(int64_t n) { return n | 1; }

struct SharedLayout {
  int64_t q, k, v, s, o, stats, bytes;
};
__host__ __device__ inline SharedLayout Layout(const Engine& e, int block_q, int block_k) {
  const int64_t dk = e.da + e.db;
  SharedLayout l;
  l.q = 0;
  l.k = l.q + block_q * dk;
  l.v = l.k + block_k * Padded(dk);
  l.s = l.v + (e.v_in_k ? 0 : block_k * Padded(e.dv));
  l.o = l.s + block_q * block_k;
  l.stats = l.o + block_q * e.dv;  // m, l, alpha [block_q] each
  const int64_t floats = l.stats + 3 * block_q;
  l.bytes = floats * 4 + block_k * 8;  // + the key tile's cache rows (int64)
  return l;
}

__device__ __forceinline__ float Load(const void* p, int64_t i, bool bf16) {
  return bf16 ? Bf16Bits(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

__global__ void __launch_bounds__(kThreads) MlaAttentionKernel(Engine e) {
  DELTASERVE_DYNAMIC_SHARED(float, smem);
  // In-tile indices are 32-bit: a tile fits in shared memory, and 64-bit
  // division costs many instructions on the GPU.
  const int bq = e.block_q, bk = e.block_k;
  const SharedLayout lay = Layout(e, bq, bk);
  const int da = static_cast<int>(e.da), dv = static_cast<int>(e.dv);
  const int dk = static_cast<int>(e.da + e.db), ldk = static_cast<int>(Padded(dk));
  float* q_s = smem + lay.q;  // [bq][dk], scaled into the log2 domain
  float* k_s = smem + lay.k;  // [bk][ldk]
  float* v_s = e.v_in_k ? k_s : smem + lay.v;
  const int ldv = e.v_in_k ? ldk : static_cast<int>(Padded(dv));
  float* s_s = smem + lay.s;  // [bq][bk] scores, then probabilities
  float* o_s = smem + lay.o;  // [bq][dv] unnormalised output
  float* m_s = smem + lay.stats;
  float* l_s = m_s + bq;
  float* alpha_s = l_s + bq;
  int64_t* row_s = reinterpret_cast<int64_t*>(smem + lay.stats + 3 * bq);

  const int64_t z = blockIdx.z, split = blockIdx.y;
  const int64_t tiles = (e.rows + bq - 1) / bq;
  const int64_t i0 = (tiles - 1 - blockIdx.x) * bq;  // latest rows first: the longest
  const int nq = static_cast<int>(e.rows - i0 < bq ? e.rows - i0 : bq);
  const int tid = threadIdx.x;
  const float qscale = e.scale * kLog2E;

  for (int x = tid; x < nq * dk; x += kThreads) {
    const int i = x / dk, d = x % dk;
    const float val = d < da ? e.qa[z * e.qa_z + (i0 + i) * e.qa_row + d]
                             : e.qb[z * e.qb_z + (i0 + i) * e.qb_row + d - da];
    q_s[x] = val * qscale;
  }
  for (int x = tid; x < nq * dv; x += kThreads) o_s[x] = 0.0f;
  for (int i = tid; i < nq; i += kThreads) {
    m_s[i] = -INFINITY;
    l_s[i] = 0.0f;
  }
  // Keys [k_begin, k_end) of this split that some row of the tile sees.
  const int64_t limit_first = e.prefix + i0 / e.rows_per_token + 1;
  const int64_t limit_last = e.prefix + (i0 + nq - 1) / e.rows_per_token + 1;
  const int64_t k_begin = split * e.split_len;
  int64_t k_end = k_begin + e.split_len;
  if (k_end > limit_last) k_end = limit_last;

  for (int64_t k0 = k_begin; k0 < k_end; k0 += bk) {
    const int nk = static_cast<int>(k_end - k0 < bk ? k_end - k0 : bk);
    __syncthreads();  // the previous tile's keys and probabilities are used up
    for (int j = tid; j < nk; j += kThreads) {
      const int64_t s = k0 + j;
      row_s[j] = e.page_table == nullptr
                     ? s
                     : e.page_table[s / e.page_tokens] * e.page_tokens + s % e.page_tokens;
    }
    __syncthreads();
    for (int x = tid; x < nk * dk; x += kThreads) {
      const int j = x / dk, d = x % dk;
      const int64_t r = row_s[j];
      k_s[j * ldk + d] = d < da ? Load(e.ka, z * e.ka_z + r * e.ka_row + d, e.bf16)
                                : Load(e.kb, r * e.kb_row + d - da, e.bf16);
    }
    if (!e.v_in_k) {
      for (int x = tid; x < nk * dv; x += kThreads) {
        const int j = x / dv, c = x % dv;
        v_s[j * ldv + c] = Load(e.v, z * e.v_z + row_s[j] * e.v_row + c, e.bf16);
      }
    }
    __syncthreads();
    const bool diagonal = k0 + nk > limit_first;  // some rows mask some keys
    for (int x = tid; x < nq * nk; x += kThreads) {
      const int i = x / nk, j = x % nk;
      float dot = 0.0f;
      const float* qi = q_s + i * dk;
      const float* kj = k_s + j * ldk;
      for (int d = 0; d < dk; ++d) dot = fmaf(qi[d], kj[d], dot);
      if (diagonal && k0 + j >= e.prefix + (i0 + i) / e.rows_per_token + 1) dot = -INFINITY;
      s_s[i * bk + j] = dot;
    }
    __syncthreads();
    for (int i = tid; i < nq; i += kThreads) {
      float* si = s_s + i * bk;
      float mb = -INFINITY;
      for (int j = 0; j < nk; ++j) mb = fmaxf(mb, si[j]);
      const float m_new = fmaxf(m_s[i], mb);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet
      const float alpha = exp2f(m_s[i] - m_use);
      float sum = 0.0f;
      for (int j = 0; j < nk; ++j) {
        const float p = exp2f(si[j] - m_use);
        si[j] = p;
        sum += p;
      }
      m_s[i] = m_new;
      l_s[i] = l_s[i] * alpha + sum;
      alpha_s[i] = alpha;
    }
    __syncthreads();
    for (int x = tid; x < nq * dv; x += kThreads) {
      const int i = x / dv, c = x % dv;
      const float* pi = s_s + i * bk;
      float acc = o_s[x] * alpha_s[i];
      for (int j = 0; j < nk; ++j) acc = fmaf(pi[j], v_s[j * ldv + c], acc);
      o_s[x] = acc;
    }
  }
  __syncthreads();
  const int64_t row0 = z * e.rows + i0;  // of all heads' rows
  if (e.splits == 1) {
    for (int x = tid; x < nq * dv; x += kThreads) {
      const int i = x / dv, c = x % dv;
      e.out[z * e.out_z + (i0 + i) * e.out_row + c] = o_s[x] / l_s[i];
    }
    return;
  }
  const int64_t all_rows = e.heads_z * e.rows;
  for (int i = tid; i < nq; i += kThreads) {
    e.partial_m[split * all_rows + row0 + i] = m_s[i];
    e.partial_l[split * all_rows + row0 + i] = l_s[i];
  }
  for (int x = tid; x < nq * dv; x += kThreads) {
    e.partial_acc[(split * all_rows + row0) * e.dv + x] = o_s[x];
  }
}

// One block per row of all heads: out = Σ_k w_k acc_k / Σ_k w_k l_k with
// w_k = 2^(m_k - max m); a split no key of the row reached has m_k = -inf.
__global__ void __launch_bounds__(kThreads) MlaMergeKernel(Engine e) {
  const int64_t all_rows = e.heads_z * e.rows;
  const int64_t row = blockIdx.x, z = row / e.rows, i = row % e.rows;
  float mx = -INFINITY;
  for (int64_t k = 0; k < e.splits; ++k) mx = fmaxf(mx, e.partial_m[k * all_rows + row]);
  float l = 0.0f;
  for (int64_t k = 0; k < e.splits; ++k) {
    const float m = e.partial_m[k * all_rows + row];
    if (m != -INFINITY) l += exp2f(m - mx) * e.partial_l[k * all_rows + row];
  }
  const float inv = 1.0f / l;
  float* out = e.out + z * e.out_z + i * e.out_row;
  for (int64_t c = threadIdx.x; c < e.dv; c += kThreads) {
    float acc = 0.0f;
    for (int64_t k = 0; k < e.splits; ++k) {
      const float m = e.partial_m[k * all_rows + row];
      if (m != -INFINITY) acc += exp2f(m - mx) * e.partial_acc[(k * all_rows + row) * e.dv + c];
    }
    out[c] = acc * inv;
  }
}

// Tiles and splits for `e` (its shapes set): the key tile halved down to
// kMinKeyTile first (more query rows per block read the keys fewer times),
// then the query tile, then the key tile again, until the shared memory
// fits; keys split when the query tiles leave the GPU idle, in whole key
// tiles.
void Plan(Engine* e, int64_t keys) {
  int bq = kMaxTile, bk = kMaxTile;
  while (static_cast<size_t>(Layout(*e, bq, bk).bytes) > kSharedBudget && (bq > 1 || bk > 1)) {
    if (bk > kMinKeyTile) {
      bk /= 2;
    } else if (bq > 1) {
      bq /= 2;
    } else {
      bk /= 2;
    }
  }
  e->block_q = bq;
  e->block_k = bk;
  const int64_t blocks = (e->rows + bq - 1) / bq * e->heads_z;
  int64_t splits = 1;
  if (blocks > 0 && blocks < kTargetBlocks) {
    splits = (kTargetBlocks + blocks - 1) / blocks;
    const int64_t most = (keys + kMinSplitKeys - 1) / kMinSplitKeys;
    if (splits > most) splits = most;
    if (splits > 65535) splits = 65535;
    if (splits < 1) splits = 1;
  }
  int64_t len = (keys + splits - 1) / splits;
  len = (len + bk - 1) / bk * bk;
  e->split_len = len > 0 ? len : bk;
  e->splits = keys > 0 ? (keys + e->split_len - 1) / e->split_len : 1;
}

Engine PrefillEngine(const MlaPrefillPtrs& a) {
  Engine e;
  const int64_t qw = a.nope_dim + a.rope_dim, kvw = a.nope_dim + a.v_dim;
  e.rows = a.t;
  e.prefix = a.prefix;
  e.da = a.nope_dim;
  e.db = a.rope_dim;
  e.dv = a.v_dim;
  e.qa = a.q;
  e.qa_z = qw;
  e.qa_row = a.heads * qw;
  e.qb = a.q + a.nope_dim;
  e.qb_z = qw;
  e.qb_row = a.heads * qw;
  e.out = a.o;
  e.out_z = a.v_dim;
  e.out_row = a.heads * a.v_dim;
  e.ka = a.kv;
  e.ka_z = kvw;
  e.ka_row = a.heads * kvw;
  e.kb = a.k_rope;
  e.kb_row = a.k_rope_stride;
  e.v = a.kv + a.nope_dim;
  e.v_z = kvw;
  e.v_row = a.heads * kvw;
  e.scale = a.scale;
  e.heads_z = a.heads;
  Plan(&e, a.prefix + a.t);
  return e;
}

Engine AbsorbedEngine(const MlaAbsorbedPtrs& a) {
  Engine e;
  const int64_t width = a.latent_dim + a.rope_dim;
  e.rows = a.t * a.heads;
  e.rows_per_token = a.heads > 0 ? a.heads : 1;
  e.prefix = a.prefix;
  e.da = a.latent_dim;
  e.db = a.rope_dim;
  e.dv = a.latent_dim;
  e.qa = a.q_latent;
  e.qa_row = a.latent_dim;
  e.qb = a.q_rope;
  e.qb_row = a.rope_dim;
  e.out = a.o_latent;
  e.out_row = a.latent_dim;
  e.bf16 = a.cache_bf16;
  e.ka = a.cache;
  e.ka_row = width;
  e.kb = e.bf16 ? static_cast<const void*>(static_cast<const uint16_t*>(a.cache) + a.latent_dim)
                : static_cast<const void*>(static_cast<const float*>(a.cache) + a.latent_dim);
  e.kb_row = width;
  e.v_in_k = true;  // the value is c, the key's first C values
  e.page_table = a.page_table;
  e.page_tokens = a.page_tokens;
  e.scale = a.scale;
  e.heads_z = 1;
  Plan(&e, a.prefix + a.t);
  return e;
}

int64_t PartialFloats(const Engine& e) {
  return e.splits > 1 ? e.splits * e.heads_z * e.rows * (e.dv + 2) : 0;
}

void Run(Engine e, float* partials, const Stream& stream) {
  if (e.splits > 1) {
    const int64_t n = e.splits * e.heads_z * e.rows;
    e.partial_m = partials;
    e.partial_l = partials + n;
    e.partial_acc = partials + 2 * n;
  }
  const dim3 grid(BlocksFor(e.rows, e.block_q), static_cast<unsigned>(e.splits),
                  static_cast<unsigned>(e.heads_z));
  const size_t shared = static_cast<size_t>(Layout(e, e.block_q, e.block_k).bytes);
  if (shared > 48 * 1024) DELTASERVE_ALLOW_DYNAMIC_SHARED(MlaAttentionKernel, shared);
  DELTASERVE_LAUNCH(MlaAttentionKernel, grid, dim3(kThreads), shared, stream, e);
  if (e.splits > 1) {
    DELTASERVE_LAUNCH(MlaMergeKernel, dim3(static_cast<unsigned>(e.heads_z * e.rows)),
                      dim3(kThreads), 0, stream, e);
  }
}

}  // namespace

int64_t MlaPrefillPartialFloats(const MlaPrefillPtrs& args) {
  if (args.t == 0 || args.heads == 0 || args.v_dim == 0) return 0;
  return PartialFloats(PrefillEngine(args));
}

void MlaPrefillAttention(const MlaPrefillPtrs& args, const Stream& stream) {
  if (args.t == 0 || args.heads == 0 || args.v_dim == 0) return;
  Run(PrefillEngine(args), args.partials, stream);
}

int64_t MlaAbsorbedPartialFloats(const MlaAbsorbedPtrs& args) {
  if (args.t == 0 || args.heads == 0 || args.latent_dim == 0) return 0;
  return PartialFloats(AbsorbedEngine(args));
}

void MlaAbsorbedAttention(const MlaAbsorbedPtrs& args, const Stream& stream) {
  if (args.t == 0 || args.heads == 0 || args.latent_dim == 0) return;
  Run(AbsorbedEngine(args), args.partials, stream);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
