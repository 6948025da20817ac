// MXFP4 weights against many rows of x (a prefill chunk, a MoE expert's
// tokens in prefill): y (+)= x · Wᵀ, dequantised inside the GEMM's own tiles.
//
// The float32 sgemm path that bf16 weights take widens blocks of W into a
// 4 MiB float32 panel and hands it to oneDNN, which packs it once more: for a
// MoE expert (k3-moe-small: gate|up [1024 x 512], down [512 x 512]) that panel
// is a full float32 copy of the expert, written and read back through the
// caches on every call. Here W is decoded straight into the packed layout a
// register-blocked microkernel reads, one cache-sized tile at a time:
//
//   for each panel of kNc rows of W (the threads share the panels),
//     for each block of kKc columns of k,
//       decode W[panel, block] into Bp, [kNc / kNr][kKc][kNr] floats: each
//       group of kNr rows of W transposed, so that its kNr output columns at
//       one k index are contiguous (zeros past W's last row);
//       for each group of kNr rows (its kKc x kNr floats stay in L1),
//         for each kMr rows of x,
//           kMr x kNr sums in registers over the block's kKc columns, each
//           step one broadcast of x per row and kNr / lanes loads of Bp.
//
// Each weight is decoded once per call, O(n·k) against the O(m·n·k) of the
// products, and the decoded tile is reused by all m rows; no copy of W larger
// than a panel (128 KiB at AVX-512, 256 at AVX2) exists. The values decoded
// are the exact dequantised weights (a code times a power of two), and each
// output is a float32 sum of their products with x, so the results match the
// float64 reference to float32 summation error, as sgemm's do. Each output
// sums its k products in one order (kKc at a time, in order), whatever m, the
// other rows and the number of threads.
//
// Measured on a Xeon with AVX-512 (2 cores, shared), [1024 x 512] MXFP4, best
// of many calls: one core 159, 201 and 193 GFLOP/s at 32, 128 and 512 rows,
// against 196 for oneDNN's sgemm on 2048^3; two cores 310, 385 and 377,
// against ~375. Transposing decoded floats rather than codes (PackRows) gave
// one core 117, 181 and 183.
//
// The levels with vectors only (AVX2 and AVX-512; kernels/cpu/gemm_cpu.h);
// the generic level keeps the widened panels and oneDNN's sgemm, which runs
// its own kernels for the CPU whatever level this library was built for.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/check.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/simd.h"
#include "kernels/mxfp4.h"
#include "kernels/scratch.h"

#if DELTASERVE_CPU_AVX2

// 0 or 1: the avx512 level's flags, for the 16-lane path.
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define DELTASERVE_MXFP4_GEMM_AVX512 1
#else
#define DELTASERVE_MXFP4_GEMM_AVX512 0
#endif

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// The tile shapes. A microkernel keeps kMr x kNv vectors of sums (24) and
// kNv vectors of Bp in registers: AVX-512 has 32, AVX2 16 (12 sums, 2 of Bp,
// one broadcast). Per k index it does kMr·kNv multiply-adds against kNv
// loads and kMr broadcasts, within the two loads a cycle of the cores that
// run two multiply-adds a cycle. kKc is chosen so that a group's kKc x kNr
// floats of Bp take 32 KiB (AVX-512) or 16 KiB (AVX2) of L1; kNc so that a
// panel (128 or 256 KiB) and the rows of x a block reads (m x kKc floats,
// 256 KiB at 512 rows) stay in L2 while the groups pass over them.
#if DELTASERVE_MXFP4_GEMM_AVX512
constexpr int kLanes = 16;
constexpr int kNv = 4;
constexpr int64_t kKc = 128;
#else
constexpr int kLanes = 8;
constexpr int kNv = 2;
constexpr int64_t kKc = 256;
#endif
constexpr int kMr = 6;
constexpr int kNr = kNv * kLanes;  // output columns of a microkernel: 64 or 16
constexpr int64_t kNc = 256;       // rows of W in a panel, a multiple of kNr
static_assert(kKc % kMxfp4Group == 0 && kNc % kNr == 0);
// The 16-lane PackRows holds a row's block of codes in one 64-byte register.
static_assert(kLanes != 16 || kKc == 128);

// 2^(s - 127) (kernels/mxfp4.h; a NaN scale is refused at load).
inline float Scale(uint8_t s) {
  const uint32_t bits = s == 0 ? (1u << 22) : static_cast<uint32_t>(s) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

#if DELTASERVE_MXFP4_GEMM_AVX512
using V = __m512;
constexpr __mmask16 kAll = 0xffff;

inline V Zero() { return _mm512_setzero_ps(); }
inline V Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V Broadcast(const float* p) { return _mm512_set1_ps(*p); }
inline V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V Add(V a, V b) { return _mm512_add_ps(a, b); }

// W's rows r < rows <= 16 (the others zero), columns [0, kc) with kc <= 128
// a multiple of 32, into out[p * kNr + r]: codes and scales of row r at
// codes + r * row_bytes and scales + r * scale_row_bytes. Transposing after
// decoding took 64 two-source shuffles per 16 x 16 floats, on the one port
// that also decodes (vpermps) and widens: the tiles' decode was then a third
// of a 32-row product's time (one core). Here the codes are transposed as
// bytes instead, a row's 128 columns being one 64-byte register: 64 unpacks
// for all 16 x 128 values, each 128-bit lane transposing its 16 x 16 bytes.
// Register d[b] then holds, in lane L, byte b of group L of every row: the
// codes of columns 32L + 2b (low nibble) and 32L + 2b + 1 (high), widened to
// one row a 32-bit lane and looked up by vpermps, which reads the low four
// bits of each index.
void PackRows(const uint8_t* codes, const uint8_t* scales, int64_t row_bytes,
              int64_t scale_row_bytes, int64_t rows, int64_t kc, float* out) {
  const int64_t groups = kc / kMxfp4Group;
  const __mmask64 bytes = groups == 4 ? ~__mmask64{0} : (__mmask64{1} << (kc / 2)) - 1;
  __m512i a[16], b[16];
  for (int i = 0; i < 16; ++i) {
    a[i] =
        i < rows ? _mm512_maskz_loadu_epi8(bytes, codes + i * row_bytes) : _mm512_setzero_si512();
  }
  // a[i]: bytes of row i. Interleave bytes of row pairs, then 16-bit units of
  // pairs of pairs, then 32 and 64: b[2i + h] holds columns 8h.. of rows
  // 2i, 2i + 1; a[4i + q] columns 4q.. of rows 4i..4i + 3; b[2q + s] of the
  // first and b[8 + 2q + s] of the second eight rows, columns 4q + 2s and
  // the next; a[c] column c of all sixteen.
  for (int i = 0; i < 8; ++i) {
    b[2 * i] = _mm512_unpacklo_epi8(a[2 * i], a[2 * i + 1]);
    b[2 * i + 1] = _mm512_unpackhi_epi8(a[2 * i], a[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    for (int h = 0; h < 2; ++h) {
      a[4 * i + 2 * h] = _mm512_unpacklo_epi16(b[4 * i + h], b[4 * i + 2 + h]);
      a[4 * i + 2 * h + 1] = _mm512_unpackhi_epi16(b[4 * i + h], b[4 * i + 2 + h]);
    }
  }
  for (int half = 0; half < 2; ++half) {
    for (int q = 0; q < 4; ++q) {
      const __m512i lo = a[8 * half + q], hi = a[8 * half + 4 + q];
      b[8 * half + 2 * q] = _mm512_maskz_unpacklo_epi32(kAll, lo, hi);
      b[8 * half + 2 * q + 1] = _mm512_maskz_unpackhi_epi32(kAll, lo, hi);
    }
  }
  for (int c = 0; c < 8; ++c) {
    a[2 * c] = _mm512_maskz_unpacklo_epi64(0xff, b[c], b[8 + c]);
    a[2 * c + 1] = _mm512_maskz_unpackhi_epi64(0xff, b[c], b[8 + c]);
  }
  // Each group's scale for every row (0 for the rows past `rows`).
  alignas(64) float scale[4][16] = {};
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < rows; ++i) scale[g][i] = Scale(scales[i * scale_row_bytes + g]);
  const __m512 table = _mm512_loadu_ps(kMxfp4Values);
  for (int64_t g = 0; g < groups; ++g) {
    const __m512 s = _mm512_load_ps(scale[g]);
    for (int c = 0; c < 16; ++c) {
      __m128i lane;
      switch (g) {  // the lane index of vextracti32x4 is an immediate
        case 0:
          lane = _mm512_maskz_extracti32x4_epi32(0xf, a[c], 0);
          break;
        case 1:
          lane = _mm512_maskz_extracti32x4_epi32(0xf, a[c], 1);
          break;
        case 2:
          lane = _mm512_maskz_extracti32x4_epi32(0xf, a[c], 2);
          break;
        default:
          lane = _mm512_maskz_extracti32x4_epi32(0xf, a[c], 3);
          break;
      }
      // The zero-masked forms with every lane selected are the plain
      // instructions; the plain intrinsics trip GCC 12's
      // -Wmaybe-uninitialized on their internal _mm512_undefined_*().
      const __m512i wide = _mm512_maskz_cvtepu8_epi32(kAll, lane);
      const __m512 even = _mm512_maskz_permutexvar_ps(kAll, wide, table);
      const __m512 odd =
          _mm512_maskz_permutexvar_ps(kAll, _mm512_maskz_srli_epi32(kAll, wide, 4), table);
      float* o = out + (kMxfp4Group * g + 2 * c) * kNr;
      _mm512_storeu_ps(o, _mm512_mul_ps(even, s));
      _mm512_storeu_ps(o + kNr, _mm512_mul_ps(odd, s));
    }
  }
}
#else
using V = __m256;

inline V Zero() { return _mm256_setzero_ps(); }
inline V Load(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V Broadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V Add(V a, V b) { return _mm256_add_ps(a, b); }

// The 8 values of row `row` from column c, a multiple of 8: code i is bits
// [4i, 4i + 4) of the little-endian word; the magnitude is looked up by its
// low three bits and the sign bit moved to bit 31.
inline V Decode(const uint8_t* row, const uint8_t* scales, int64_t c) {
  int32_t word;
  std::memcpy(&word, row + c / 2, sizeof(word));
  const __m256i codes = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(word), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
      _mm256_set1_epi32(15));
  const __m256 magnitude = _mm256_permutevar8x32_ps(
      _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), codes);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
  return _mm256_mul_ps(_mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign)),
                       _mm256_set1_ps(Scale(scales[c / kMxfp4Group])));
}

// r[i][l] <-> r[l][i] for 8 x 8: pairs of rows interleaved, then pairs of
// pairs, then the 128-bit halves exchanged (24 shuffles for 64 values).
inline void Transpose(V r[kLanes]) {
  V t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// W's rows r < rows <= 8 (the others zero), columns [0, kc), into
// out[p * kNr + r]: decoded along the rows eight columns at a time and
// transposed in registers.
void PackRows(const uint8_t* codes, const uint8_t* scales, int64_t row_bytes,
              int64_t scale_row_bytes, int64_t rows, int64_t kc, float* out) {
  for (int64_t p = 0; p < kc; p += kLanes) {
    V v[kLanes];
    for (int64_t i = 0; i < kLanes; ++i) {
      v[i] = i < rows ? Decode(codes + i * row_bytes, scales + i * scale_row_bytes, p) : Zero();
    }
    Transpose(v);
    for (int64_t l = 0; l < kLanes; ++l) Store(out + (p + l) * kNr, v[l]);
  }
}
#endif  // DELTASERVE_MXFP4_GEMM_AVX512

// Bp[g][p][c] = W[j0 + g·kNr + c, p0 + p] for p < kc, c < kNr and the groups
// g covering nb rows; 0 for rows past j0 + nb. kLanes rows at a time.
void Pack(const Tensor& w, int64_t j0, int64_t nb, int64_t p0, int64_t kc, float* bp) {
  const int64_t row_bytes = w.RowBytes(), scale_row_bytes = w.ScaleRowBytes();
  const uint8_t* codes = static_cast<const uint8_t*>(w.data) + p0 / 2;
  const uint8_t* scales = w.scales + p0 / kMxfp4Group;
  const int64_t groups = (nb + kNr - 1) / kNr;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t c0 = 0; c0 < kNr; c0 += kLanes) {
      const int64_t r0 = j0 + g * kNr + c0;
      PackRows(codes + r0 * row_bytes, scales + r0 * scale_row_bytes, row_bytes, scale_row_bytes,
               std::clamp<int64_t>(nb - g * kNr - c0, 0, kLanes), kc, bp + g * kc * kNr + c0);
    }
  }
}

// y[i, c] (+)= Σ_p x[i, p] · bp[p][c] for i < MR, p < kc, c < cols <= kNr;
// `add` adds to y, else overwrites it. Every loop over i and v is unrolled,
// so that acc is registers only: with the edge's stores in a loop of its own
// over i, GCC kept acc in memory at the AVX2 level, storing all twelve sums
// on every step of p (one core at 75 GFLOP/s against oneDNN's AVX2 sgemm's
// 114).
template <int MR>
void MicroKernel(int64_t kc, const float* x, int64_t ldx, const float* bp, float* y, int64_t ldy,
                 int64_t cols, bool add) {
  V acc[MR][kNv];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) acc[i][v] = Zero();
  }
  for (int64_t p = 0; p < kc; ++p) {
    V b[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) b[v] = Load(bp + p * kNr + v * kLanes);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const V a = Broadcast(x + i * ldx + p);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[i][v] = Fma(a, b[v], acc[i][v]);
    }
  }
  // A full tile goes straight to y; the last group of a W whose rows are not
  // a multiple of kNr through `tile`, then its first `cols` columns.
  alignas(64) float tile[MR][kNr];
  const bool full = cols == kNr;
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) {
      float* out = full ? y + i * ldy + v * kLanes : tile[i] + v * kLanes;
      Store(out, full && add ? Add(Load(out), acc[i][v]) : acc[i][v]);
    }
  }
  if (full) return;
  for (int i = 0; i < MR; ++i) {
    float* out = y + i * ldy;
    for (int64_t c = 0; c < cols; ++c) out[c] = add ? out[c] + tile[i][c] : tile[i][c];
  }
}

// MicroKernel for the mr <= kMr rows of x left at a tile's edge.
void MicroRows(int64_t mr, int64_t kc, const float* x, int64_t ldx, const float* bp, float* y,
               int64_t ldy, int64_t cols, bool add) {
  switch (mr) {
    case 6:
      return MicroKernel<6>(kc, x, ldx, bp, y, ldy, cols, add);
    case 5:
      return MicroKernel<5>(kc, x, ldx, bp, y, ldy, cols, add);
    case 4:
      return MicroKernel<4>(kc, x, ldx, bp, y, ldy, cols, add);
    case 3:
      return MicroKernel<3>(kc, x, ldx, bp, y, ldy, cols, add);
    case 2:
      return MicroKernel<2>(kc, x, ldx, bp, y, ldy, cols, add);
    default:
      return MicroKernel<1>(kc, x, ldx, bp, y, ldy, cols, add);
  }
}
static_assert(kMr == 6, "MicroRows has a case per row count up to kMr");

}  // namespace

void Mxfp4Gemm(const float* x, int64_t ldx, const Tensor& w, int64_t m, float* y, int64_t ldy,
               bool accumulate) {
  const int64_t n = w.rows, k = w.cols;
  DELTASERVE_CHECK(w.dtype == DType::kMxfp4 && w.device == Device::kCpu && m > 0 && n > 0 &&
                   k > 0 && k % kMxfp4Group == 0);
  // Panels of kNc rows, or fewer where that leaves threads without one (a
  // [512 x 512] down projection on two threads: two panels of 256 rows).
  const int64_t threads = omp_get_max_threads();
  const int64_t per_thread = (n + threads - 1) / threads;
  const int64_t nc = std::clamp<int64_t>((per_thread + kNr - 1) / kNr * kNr, kNr, kNc);
  const int64_t panels = (n + nc - 1) / nc;
  // x's rows in ceil(m / kMr) tiles of as even a size as they go: 32 rows
  // (a 512-token prefill's expert) as 6, 5, 5, 6, 5, 5 rather than five of 6
  // and one of 2, which does a third of the multiply-adds a load of a full
  // tile does.
  const int64_t tiles = (m + kMr - 1) / kMr;
#pragma omp parallel if (panels > 1 && m * n * k >= (int64_t{1} << 20))
  {
    const ScratchFloats bp(nc * std::min(k, kKc));  // the thread's Bp
#pragma omp for schedule(static)
    for (int64_t q = 0; q < panels; ++q) {
      const int64_t j0 = q * nc, nb = std::min(nc, n - j0);
      for (int64_t p0 = 0; p0 < k; p0 += kKc) {
        const int64_t kc = std::min(kKc, k - p0);
        Pack(w, j0, nb, p0, kc, bp.data());
        // Blocks after the first add to what the first wrote.
        const bool add = accumulate || p0 > 0;
        for (int64_t c0 = 0; c0 < nb; c0 += kNr) {
          const float* group = bp.data() + c0 * kc;  // [kc][kNr]
          const int64_t cols = std::min<int64_t>(kNr, nb - c0);
          for (int64_t t = 0; t < tiles; ++t) {
            const int64_t i0 = m * t / tiles, i1 = m * (t + 1) / tiles;
            MicroRows(i1 - i0, kc, x + i0 * ldx + p0, ldx, group, y + i0 * ldy + j0 + c0, ldy, cols,
                      add);
          }
        }
      }
    }
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA

#endif  // DELTASERVE_CPU_AVX2
