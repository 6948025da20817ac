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
//       group of kNr rows of W transposed so that a vector holds kNr
//       consecutive output columns at one k index (zeros past W's last row);
//       for each group of kNr rows (its kKc x kNr floats stay in L1),
//         for each kMr rows of x,
//           kMr x kNr sums in registers over the block's kKc columns, each
//           step one broadcast of x per row and kNr / lanes loads of Bp.
//
// Each weight is decoded once per call, O(n·k) against the O(m·n·k) of the
// products, and the decoded tile is reused by all m rows; no copy of W larger
// than a panel (128 KiB) exists. The values decoded are the exact
// dequantised weights (a code times a power of two), and each output is a
// float32 sum of their products with x, so the results match the float64
// reference to float32 summation error, as sgemm's do (any order of the sums
// is allowed for these rows: unlike the skinny kernel's decode rows, a
// prefill row's result may depend on the chunk it is in).
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

// The 16 values of row `row` (its codes and scales) from column c, a multiple
// of 16, in column order. Lane L's code is nibble L % 2 of byte L / 2: the
// bytes are doubled, widened to 32 bits and shifted by 0 or 4; vpermps looks
// the value up by the low four bits of each lane. The zero-masked forms with
// every lane selected are the plain instructions; the plain intrinsics trip
// GCC 12's -Wmaybe-uninitialized on their internal _mm512_undefined_*().
inline V Decode(const uint8_t* row, const uint8_t* scales, int64_t c) {
  const __m512 table = _mm512_loadu_ps(kMxfp4Values);
  const __m512i shifts = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c / 2));
  const __m512i codes = _mm512_maskz_srlv_epi32(
      kAll, _mm512_maskz_cvtepu8_epi32(kAll, _mm_unpacklo_epi8(bytes, bytes)), shifts);
  return _mm512_mul_ps(_mm512_maskz_permutexvar_ps(kAll, codes, table),
                       _mm512_set1_ps(Scale(scales[c / kMxfp4Group])));
}

// r[i][l] <-> r[l][i]: four stages, stage b exchanging the lanes and rows
// whose bit b differ (two vpermt2ps a pair of rows), 64 shuffles for 256
// values.
struct TransposeIndex {
  int32_t lo[16], hi[16];
};

constexpr TransposeIndex MakeTransposeIndex(int b) {
  TransposeIndex t{};
  for (int l = 0; l < 16; ++l) {
    t.lo[l] = (l & b) != 0 ? 16 + l - b : l;
    t.hi[l] = (l & b) != 0 ? 16 + l : l + b;
  }
  return t;
}

template <int B>
inline void TransposeStage(V r[16]) {
  static constexpr TransposeIndex kIndex = MakeTransposeIndex(B);
  const __m512i lo = _mm512_loadu_si512(kIndex.lo), hi = _mm512_loadu_si512(kIndex.hi);
  for (int i = 0; i < 16; ++i) {
    if ((i & B) != 0) continue;
    const V a = r[i], b = r[i + B];
    r[i] = _mm512_permutex2var_ps(a, lo, b);
    r[i + B] = _mm512_permutex2var_ps(a, hi, b);
  }
}

inline void Transpose(V r[kLanes]) {
  TransposeStage<8>(r);
  TransposeStage<4>(r);
  TransposeStage<2>(r);
  TransposeStage<1>(r);
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
#endif  // DELTASERVE_MXFP4_GEMM_AVX512

// Bp[g][p][c] = W[j0 + g·kNr + c, p0 + p] for p < kc, c < kNr and the groups
// g covering nb rows; 0 for rows past j0 + nb. kLanes rows and kLanes
// columns at a time: decoded along W's rows, transposed in registers, stored
// as kLanes vectors of consecutive output columns.
void Pack(const Tensor& w, int64_t j0, int64_t nb, int64_t p0, int64_t kc, float* bp) {
  const uint8_t* data = static_cast<const uint8_t*>(w.data);
  const int64_t groups = (nb + kNr - 1) / kNr;
  for (int64_t g = 0; g < groups; ++g) {
    float* out = bp + g * kc * kNr;
    for (int64_t c0 = 0; c0 < kNr; c0 += kLanes) {
      const int64_t rows = std::clamp<int64_t>(nb - g * kNr - c0, 0, kLanes);
      const int64_t r0 = j0 + g * kNr + c0;
      for (int64_t p = 0; p < kc; p += kLanes) {
        V v[kLanes];
        for (int64_t i = 0; i < kLanes; ++i) {
          v[i] = i < rows ? Decode(data + (r0 + i) * w.RowBytes(),
                                   w.scales + (r0 + i) * w.ScaleRowBytes(), p0 + p)
                          : Zero();
        }
        Transpose(v);
        for (int64_t l = 0; l < kLanes; ++l) Store(out + (p + l) * kNr + c0, v[l]);
      }
    }
  }
}

// y[i, c] (+)= Σ_p x[i, p] · bp[p][c] for i < MR, p < kc, c < cols <= kNr;
// `add` adds to y, else overwrites it.
template <int MR>
void MicroKernel(int64_t kc, const float* x, int64_t ldx, const float* bp, float* y, int64_t ldy,
                 int64_t cols, bool add) {
  V acc[MR][kNv];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < kNv; ++v) acc[i][v] = Zero();
  for (int64_t p = 0; p < kc; ++p) {
    V b[kNv];
    for (int v = 0; v < kNv; ++v) b[v] = Load(bp + p * kNr + v * kLanes);
    for (int i = 0; i < MR; ++i) {
      const V a = Broadcast(x + i * ldx + p);
      for (int v = 0; v < kNv; ++v) acc[i][v] = Fma(a, b[v], acc[i][v]);
    }
  }
  if (cols == kNr) {
    for (int i = 0; i < MR; ++i) {
      for (int v = 0; v < kNv; ++v) {
        float* out = y + i * ldy + v * kLanes;
        Store(out, add ? Add(Load(out), acc[i][v]) : acc[i][v]);
      }
    }
    return;
  }
  // The last group of a W whose rows are not a multiple of kNr.
  alignas(64) float sums[kNr];
  for (int i = 0; i < MR; ++i) {
    for (int v = 0; v < kNv; ++v) Store(sums + v * kLanes, acc[i][v]);
    float* out = y + i * ldy;
    for (int64_t c = 0; c < cols; ++c) out[c] = add ? out[c] + sums[c] : sums[c];
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
          for (int64_t i0 = 0; i0 < m; i0 += kMr) {
            MicroRows(std::min<int64_t>(kMr, m - i0), kc, x + i0 * ldx + p0, ldx, group,
                      y + i0 * ldy + j0 + c0, ldy, cols, add);
          }
        }
      }
    }
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA

#endif  // DELTASERVE_CPU_AVX2
