// Linear on the CPU, for weights of every dtype (kernels/gemm.h).
//
// Many rows (a prefill chunk) go to oneDNN's sgemm, which packs W and runs
// kernels generated for this CPU at run time. A float32 W goes in as it is;
// bf16 weights are widened to float32 a block of rows at a time
// into a scratch panel of 4 MiB, never a whole matrix. The widening
// reads each weight once per call and costs O(n·k) against the GEMM's
// O(m·n·k), under 1% of the time at a chunk's hundreds of rows. MXFP4
// weights, whose panel would be a float32 copy of a whole MoE expert each
// call, have a GEMM of their own at the AVX2 and AVX-512 levels that decodes
// W into its cache-sized tiles (kernels/cpu/mxfp4_gemm_cpu.cc); the generic
// level widens them for sgemm too.
//
// With the opt-in bf16 compute (Tensor::compute), many rows on bf16 weights
// go instead to oneDNN's bf16 matmul, activations rounded to bf16.
//
// A few rows (decode, a batch of decode steps) are bound by reading W, not by
// arithmetic: sgemm would spend more time packing W than multiplying. The
// skinny kernel below streams W once, widening each group of eight weights
// in registers, and multiplies it by up to four rows of x at a time (below
// AVX2, the same sums in scalar code). MXFP4 weights, a quarter of bf16's
// bytes, have a skinny kernel of their own, which looks each code up in a
// table of the 16 E2M1 values already multiplied by its group's scale. Its
// decoding, not its reading, is the limit where a core has much read
// bandwidth: on a 2-core Xeon guest with AVX-512 it decodes W held in cache
// at 85-103% of the machine's read bandwidth (bench/skinny_bench --mxfp4).
#include "kernels/cpu/gemm_cpu.h"

#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>

#include "kernels/check.h"
#include "kernels/cpu/balanced_blocks.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/gemm.h"
#include "kernels/mxfp4.h"
#include "kernels/onednn.h"
#include "kernels/scratch.h"

// 0 or 1: the avx512 level's flags, for the MXFP4 skinny kernel's 16-lane
// path (the only one of this file; every other path runs on 8 lanes there).
#if DELTASERVE_CPU_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__)
#define DELTASERVE_GEMM_AVX512 1
#else
#define DELTASERVE_GEMM_AVX512 0
#endif

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Row blocks of a widened W, in floats (4 MiB): large enough that a
// projection of a small model is one panel, so one widening and one sgemm,
// each one OpenMP region, serve a call; sgemm packs its own cache blocks.
constexpr int64_t kPanelFloats = int64_t{1} << 20;

inline float Bf16Value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// 2^(s - 127), inline for the inner loops (kernels/mxfp4.h has the contract;
// a checkpoint with the NaN scale 255 is refused at load).
inline float Scale(uint8_t s) {
  const uint32_t bits = s == 0 ? (1u << 22) : static_cast<uint32_t>(s) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// Rows of a weight as the skinny kernels read them: its data and (MXFP4)
// scales and their strides, taken from the view once per block of rows (the
// view's out-of-line RowBytes() and ScaleRowBytes() were 2% of a decode step
// when called for every row).
struct WeightRows {
  explicit WeightRows(const Tensor& w)
      : data(static_cast<const uint8_t*>(w.data)),
        scales(w.scales),
        row_bytes(w.RowBytes()),
        scale_row_bytes(w.ScaleRowBytes()),
        cols(w.cols) {}
  const uint8_t* Row(int64_t r) const { return data + r * row_bytes; }
  const uint8_t* Scales(int64_t r) const {
    return scales == nullptr ? nullptr : scales + r * scale_row_bytes;
  }

  const uint8_t* data;
  const uint8_t* scales;
  int64_t row_bytes, scale_row_bytes, cols;
};

#if DELTASERVE_CPU_AVX2
// How far ahead of its reads a skinny kernel prefetches the rows of W, in
// bytes: past the end of a row it reaches the rows after it, which a block of
// rows reads next (prefetches never fault). MXFP4: decoding 16 bytes a group
// takes ~20 instructions, so the reorder window holds only a few cache lines
// of reads in flight, too few to cover memory latency; without prefetches the
// kernel read k3-moe-small's experts at 30% of the read bandwidth, stalled on
// the loads of codes and scales (perf, one core of a Xeon with AVX-512).
// float32 and bf16: the hardware prefetchers alone kept two threads at 75% of
// the read bandwidth on bf16 [1024 x 1024] weights on huge pages
// (bench/skinny_bench, the same Xeon), 96% with this.
constexpr int64_t kSkinnyPrefetchBytes = 2048;

inline void Prefetch(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

// The float32 and bf16 kernels' prefetch of the cache lines that hold
// columns [c, c + 32) of a row, kSkinnyPrefetchBytes ahead.
template <DType D>
inline void PrefetchAhead(const uint8_t* row, int64_t c) {
  constexpr int64_t kBytes = D == DType::kF32 ? 4 : 2;
  for (int64_t b = 0; b < 32 * kBytes; b += 64)
    Prefetch(row + kBytes * c + b + kSkinnyPrefetchBytes);
}
#endif

// Value c of a weight row: data row `row`, scale row `scales` (MXFP4).
template <DType D>
inline float At(const uint8_t* row, const uint8_t* scales, int64_t c) {
  if constexpr (D == DType::kF32) {
    float v;
    std::memcpy(&v, row + 4 * c, sizeof(v));
    return v;
  } else if constexpr (D == DType::kBF16) {
    uint16_t bits;
    std::memcpy(&bits, row + 2 * c, sizeof(bits));
    return Bf16Value(bits);
  } else {
    const uint8_t byte = row[c / 2];
    return kMxfp4Values[c % 2 == 0 ? byte & 15 : byte >> 4] * Scale(scales[c / kMxfp4Group]);
  }
}

#if DELTASERVE_CPU_AVX2
// Eight values of a weight row from column c (a multiple of 8), widened to
// float32 exactly.
template <DType D>
inline __m256 Load8(const uint8_t* row, const uint8_t* scales, int64_t c) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  } else if constexpr (D == DType::kBF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    // Eight codes from four bytes: code i is bits [4i, 4i + 4) of the
    // little-endian word (even column in the low nibble). The magnitude is
    // looked up by the low three bits, the sign bit moved to bit 31.
    int32_t word;
    std::memcpy(&word, row + c / 2, sizeof(word));
    const __m256i codes = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(word), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
        _mm256_set1_epi32(15));
    const __m256 magnitude = _mm256_permutevar8x32_ps(
        _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), codes);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
    const __m256 value = _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign));
    return _mm256_mul_ps(value, _mm256_set1_ps(Scale(scales[c / kMxfp4Group])));
  }
}
#endif

// out[r - r0, :] = row r of w as float32, for r in [r0, r1).
template <DType D>
void WidenRowsOf(const Tensor& w, int64_t r0, int64_t r1, float* out) {
  const WeightRows rows(w);
  const int64_t k = w.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = rows.Row(r);
    const uint8_t* scales = rows.Scales(r);
    float* o = out + (r - r0) * k;
    int64_t c = 0;
#if DELTASERVE_CPU_AVX2
    for (; c + 8 <= k; c += 8) _mm256_storeu_ps(o + c, Load8<D>(row, scales, c));
#endif
    for (; c < k; ++c) o[c] = At<D>(row, scales, c);
  }
}

// Up to this many rows of x, the skinny kernel below beats widening W and
// sgemm, which packs (copies) all of W for a handful of rows. It also sums
// every (row of W, row of x) pair in one order whatever the other rows, so a
// sequence's result does not depend on its place in a decode batch; sgemm's
// order depends on the number of rows.
constexpr int64_t kMaxSkinnyRows = kSkinnyMaxRows;

#if DELTASERVE_CPU_AVX2
// One row r of W against MR <= 2 rows of x, 32 columns a step in four
// independent sums: W is then read as one sequential stream per thread,
// which the hardware prefetchers follow best (interleaving four rows of 2 KiB
// each, bf16 at width 1024, read at a third of the bandwidth), and the four
// sums hide the latency of the multiply-adds (one sum: 7 GB/s on one core of
// a Zen 4; four: 19). Every (row of W, row of x) pair sums in this one order,
// so a sequence's result does not depend on its place in a batch.
template <DType D, int MR>
void SkinnyRow(const float* x, int64_t ldx, const WeightRows& w, int64_t r, float* y, int64_t ldy,
               bool accumulate) {
  const int64_t k = w.cols;
  const uint8_t* row = w.Row(r);
  const uint8_t* scales = w.Scales(r);
  __m256 acc[4][MR];
  for (int u = 0; u < 4; ++u)
    for (int i = 0; i < MR; ++i) acc[u][i] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= k; c += 32) {
    PrefetchAhead<D>(row, c);
    for (int u = 0; u < 4; ++u) {
      const __m256 wv = Load8<D>(row, scales, c + 8 * u);
      for (int i = 0; i < MR; ++i) {
        acc[u][i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * ldx + c + 8 * u), acc[u][i]);
      }
    }
  }
  for (; c + 8 <= k; c += 8) {
    const __m256 wv = Load8<D>(row, scales, c);
    for (int i = 0; i < MR; ++i) {
      acc[0][i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * ldx + c), acc[0][i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    const __m256 sum4 =
        _mm256_add_ps(_mm256_add_ps(acc[0][i], acc[1][i]), _mm256_add_ps(acc[2][i], acc[3][i]));
    float sum = simd::HorizontalSum(sum4);
    // fma spelled out: left to contraction, the compiler fused this loop for
    // one MR and not another at the avx512 level.
    for (int64_t t = c; t < k; ++t) sum = std::fma(x[i * ldx + t], At<D>(row, scales, t), sum);
    float& out = y[i * ldy + r];
    out = accumulate ? out + sum : sum;
  }
}

// SkinnyRow's sums for four rows of x, in two sweeps along row r of W: the
// first runs the sums of columns c and c + 8 (c a multiple of 32), the second
// those of c + 16 and c + 24, eight sums in flight in each. Four rows in
// SkinnyRow's one sweep would need sixteen sums, every AVX2 register. Here one
// W load serves four multiply-adds instead of two (1.25 loads a multiply-add
// instead of 1.5), and four rows of x take one pass over a block of W instead
// of two, the second sweep finding the row in L1. Each sum takes the same
// columns in the same order as in SkinnyRow and they combine the same way, so
// a row's result is SkinnyRow's to the bit, whatever rows it is batched with.
template <DType D>
void SkinnyRow4(const float* x, int64_t ldx, const WeightRows& w, int64_t r, float* y, int64_t ldy,
                bool accumulate) {
  constexpr int kRows = 4;
  const int64_t k = w.cols;
  const uint8_t* row = w.Row(r);
  const uint8_t* scales = w.Scales(r);
  __m256 pair[2][kRows];  // pair[h][i]: acc[2h][i] + acc[2h + 1][i] of SkinnyRow
  for (int h = 0; h < 2; ++h) {
    __m256 acc[2][kRows];
    for (int u = 0; u < 2; ++u)
      for (int i = 0; i < kRows; ++i) acc[u][i] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= k; c += 32) {
      if (h == 0) PrefetchAhead<D>(row, c);
      const __m256 w0 = Load8<D>(row, scales, c + 16 * h);
      const __m256 w1 = Load8<D>(row, scales, c + 16 * h + 8);
      for (int i = 0; i < kRows; ++i) {
        acc[0][i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i * ldx + c + 16 * h), acc[0][i]);
        acc[1][i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i * ldx + c + 16 * h + 8), acc[1][i]);
      }
    }
    if (h == 0) {
      // SkinnyRow's 8-column tail goes into its first sum.
      for (int64_t t = c; t + 8 <= k; t += 8) {
        const __m256 wv = Load8<D>(row, scales, t);
        for (int i = 0; i < kRows; ++i) {
          acc[0][i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * ldx + t), acc[0][i]);
        }
      }
    }
    for (int i = 0; i < kRows; ++i) pair[h][i] = _mm256_add_ps(acc[0][i], acc[1][i]);
  }
  for (int i = 0; i < kRows; ++i) {
    float sum = simd::HorizontalSum(_mm256_add_ps(pair[0][i], pair[1][i]));
    for (int64_t t = k / 8 * 8; t < k; ++t)
      sum = std::fma(x[i * ldx + t], At<D>(row, scales, t), sum);
    float& out = y[i * ldy + r];
    out = accumulate ? out + sum : sum;
  }
}

// MXFP4 rows against MR <= 4 rows of x. A group of 32 codes (16 bytes, one
// scale byte) is decoded once for all MR rows. Row i's operations are the
// same whatever MR is (the rows never mix), so a row's result is bitwise the
// same alone or in a batch.
// v[s][c]: E2M1 value c times the scale 2^(s - 127) (kernels/mxfp4.h), exact
// in float32 (the smallest, 0.5 * 2^-127, a subnormal), infinite past
// float32's range as the dequantised weight is; s = 255, the NaN scale that
// loading refuses, is NaN.
struct ScaledTables {
  alignas(64) float v[256][16];
};

constexpr ScaledTables MakeScaledTables() {
  ScaledTables t{};
  constexpr double kMaxFloat = 3.4028234663852886e38;
  for (int s = 0; s < 256; ++s) {
    double scale = 1.0;  // 2^(s - 127)
    for (int e = s; e < 127; ++e) scale *= 0.5;
    for (int e = 127; e < s; ++e) scale *= 2.0;
    for (int c = 0; c < 16; ++c) {
      const double v = static_cast<double>(kMxfp4Values[c]) * scale;
      if (s == 255) {
        t.v[s][c] = std::bit_cast<float>(0x7fc00000u);
      } else if (v > kMaxFloat || v < -kMaxFloat) {
        t.v[s][c] = std::bit_cast<float>(v > 0 ? 0x7f800000u : 0xff800000u);
      } else {
        t.v[s][c] = static_cast<float>(v);  // exact: a power of two times an E2M1 value
      }
    }
  }
  return t;
}

constexpr ScaledTables kScaledTables = MakeScaledTables();

#if DELTASERVE_GEMM_AVX512
// Sixteen lanes: a group's values are looked up by vpermps, which reads only
// the low four bits of each index lane, in a table of the 16 E2M1 values
// already multiplied by the group's scale (ScaledTables, one row of 16 floats
// for each of the 256 scale bytes, taken straight from memory by vpermps):
// the scale costs a load, not an instruction. That leaves two shifts, two
// lookups and one multiply-add a row per group, against three multiply-adds
// and a broadcast of the scale when the scale was applied to a partial sum:
// on one core of a Xeon with AVX-512 the kernel then went from 11.4 to 13.5
// GB/s of codes and scales held in L2, the two shuffle and multiply-add ports
// being the limit in both. The indices come without byte shuffles, which
// share one port with vpermps (unpacking and widening the bytes first made
// that port the limit, at 60% of the read bandwidth): eight bytes of codes
// are broadcast to every 64-bit lane, and lane L shifted right by 4 * (L / 2),
// so that its low nibble is the code of column 8 * (L % 2) + L / 2 of the 16
// the eight bytes hold. x comes with its columns in that order
// (PermuteForMxfp4), once per product (SkinnyProducts). A row has four
// accumulators (the two halves of even and of odd groups), enough
// independent multiply-adds to cover their latency at one row.
constexpr __mmask16 kAll = 0xffff;

// Columns of x as the kernel reads them: all k.
constexpr int64_t PermutedColumns(int64_t k) { return k; }

// out[i, 16j + L] = x[i, 16j + 8 * (L % 2) + L / 2] for i < m, k columns (a
// multiple of 32); out is [m, k].
inline void PermuteForMxfp4(const float* x, int64_t ldx, int64_t m, int64_t k, float* out) {
  const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < k; c += 16) {
      _mm512_storeu_ps(out + i * k + c,
                       _mm512_maskz_permutexvar_ps(kAll, order, _mm512_loadu_ps(x + i * ldx + c)));
    }
  }
}

template <int MR>
void SkinnyRowMxfp4(const float* x, int64_t ldx, const WeightRows& w, int64_t r, float* y,
                    int64_t ldy, bool accumulate) {
  const int64_t groups = w.cols / kMxfp4Group;
  const uint8_t* row = w.Row(r);
  const uint8_t* scales = w.Scales(r);
  const __m512i shifts =
      _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
  // The 32 values of group g, scaled, in PermuteForMxfp4's column order.
  const auto decode = [&](int64_t g, __m512* w0, __m512* w1) {
    int64_t lo, hi;
    std::memcpy(&lo, row + 16 * g, sizeof(lo));
    std::memcpy(&hi, row + 16 * g + 8, sizeof(hi));
    const __m512 table = _mm512_load_ps(kScaledTables.v[scales[g]]);
    // The zero-masked forms with every lane selected are the same
    // instructions; the plain ones trip GCC 12's -Wmaybe-uninitialized on
    // their internal _mm512_undefined_*().
    *w0 = _mm512_maskz_permutexvar_ps(
        kAll, _mm512_maskz_srlv_epi32(kAll, _mm512_set1_epi64(lo), shifts), table);
    *w1 = _mm512_maskz_permutexvar_ps(
        kAll, _mm512_maskz_srlv_epi32(kAll, _mm512_set1_epi64(hi), shifts), table);
  };
  const auto x16 = [&](int i, int64_t g, int half) {
    return _mm512_loadu_ps(x + i * ldx + kMxfp4Group * g + 16 * half);
  };
  // Named accumulators, not an array indexed by the group's parity: GCC kept
  // such an array in memory, a store and a load on every update.
  __m512 even0[MR], even1[MR], odd0[MR], odd1[MR];
  for (int i = 0; i < MR; ++i) even0[i] = even1[i] = odd0[i] = odd1[i] = _mm512_setzero_ps();
  int64_t g = 0;
  // The scales of the rows ahead: 16 bytes a row at K3's widths.
  Prefetch(scales + 16 * w.scale_row_bytes);
  for (; g + 2 <= groups; g += 2) {
    Prefetch(row + 16 * g + kSkinnyPrefetchBytes);
    __m512 a0, a1, b0, b1;
    decode(g, &a0, &a1);
    decode(g + 1, &b0, &b1);
    for (int i = 0; i < MR; ++i) {
      even0[i] = _mm512_fmadd_ps(a0, x16(i, g, 0), even0[i]);
      even1[i] = _mm512_fmadd_ps(a1, x16(i, g, 1), even1[i]);
      odd0[i] = _mm512_fmadd_ps(b0, x16(i, g + 1, 0), odd0[i]);
      odd1[i] = _mm512_fmadd_ps(b1, x16(i, g + 1, 1), odd1[i]);
    }
  }
  if (g < groups) {
    __m512 a0, a1;
    decode(g, &a0, &a1);
    for (int i = 0; i < MR; ++i) {
      even0[i] = _mm512_fmadd_ps(a0, x16(i, g, 0), even0[i]);
      even1[i] = _mm512_fmadd_ps(a1, x16(i, g, 1), even1[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    const __m512 sum16 =
        _mm512_add_ps(_mm512_add_ps(even0[i], even1[i]), _mm512_add_ps(odd0[i], odd1[i]));
    // Halves through memory: the extract intrinsics trip GCC 12's
    // -Wmaybe-uninitialized as above; once a row, the store costs nothing.
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum16);
    const __m256 sum8 = _mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8));
    const float sum = simd::HorizontalSum(sum8);
    float& out = y[i * ldy + r];
    out = accumulate ? out + sum : sum;
  }
}
#else
// Eight lanes, two groups at a time, one in each 128-bit half. AVX2 has no
// lookup of 32-bit values from 16, but every scaled E2M1 value is a bf16
// (one mantissa bit, float32's exponent range): byte shuffles look up the
// two bytes of its bf16 pattern in two 16-byte tables of the group's scale
// (Bf16Halves), an unpack of the two lookups makes bf16 words, and each
// 32-bit lane of words gives two float32 values, its low word by a shift
// and its high word by a mask. That is 15.5 vector instructions a group at
// one row of x, against 23 when the values were looked up as int8, widened,
// converted and the scale multiplied after (the widening shuffles being the
// limit): on one core of a Xeon running this level, 7.3 GB/s of codes and
// scales held in L2 before, 10.0 after (bench/skinny_bench --mxfp4). x comes
// with its columns in the order the words give (PermuteForMxfp4). A row sums
// a pair of groups in two partial sums, the lanes of even and of odd words,
// each then added to its accumulator: the carried dependence is one add a
// pair.

// The bf16 pattern of kScaledTables.v[s][c] (the upper half of its float32
// bits), b[s][0][c] its high byte and b[s][1][c] its low one.
struct Bf16Halves {
  alignas(32) uint8_t b[256][2][16];
};

constexpr bool AllBf16(const ScaledTables& t) {
  for (const auto& row : t.v)
    for (const float v : row)
      if ((std::bit_cast<uint32_t>(v) & 0xffffu) != 0) return false;
  return true;
}
static_assert(AllBf16(kScaledTables), "a scaled E2M1 value is not a bf16");

constexpr Bf16Halves MakeBf16Halves() {
  Bf16Halves t{};
  for (int s = 0; s < 256; ++s) {
    for (int c = 0; c < 16; ++c) {
      const uint32_t bits = std::bit_cast<uint32_t>(kScaledTables.v[s][c]);
      t.b[s][0][c] = static_cast<uint8_t>(bits >> 24);
      t.b[s][1][c] = static_cast<uint8_t>(bits >> 16);
    }
  }
  return t;
}

constexpr Bf16Halves kBf16Halves = MakeBf16Halves();

// Columns of x as the kernel reads them: k rounded up to whole pairs.
constexpr int64_t PermutedColumns(int64_t k) { return (k + 63) / 64 * 64; }

// out[i, 64p + 8u + L] = x[i, 64p + 32 * (L / 4) + C[u] + 4 * (L % 4)] for
// i < m, C = {0, 2, 16, 18, 1, 3, 17, 19}: vector u of a pair of groups holds
// columns C[u], C[u] + 4, C[u] + 8, C[u] + 12 of the first group, then the
// same of the second (0 for the missing second group of an odd count). out
// has PermutedColumns(k) columns.
inline void PermuteForMxfp4(const float* x, int64_t ldx, int64_t m, int64_t k, float* out) {
  const int64_t kp = PermutedColumns(k);
  // Columns [4r, 4r + 4) of each group's half (c0: 0 or 16) as row r of a
  // 4 x 4 block, both groups' blocks side by side; transposed, column j of
  // the block is columns j, 4 + j, 8 + j, 12 + j: vectors u0 + {0, 4, 1, 5}
  // for j = 0, 1, 2, 3 (u0 = 0 for c0 = 0, 2 for c0 = 16).
  const auto quarter = [](const float* a, const float* b, float* o) {
    const __m256 a0 = _mm256_loadu_ps(a), a1 = _mm256_loadu_ps(a + 8);
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    const __m256 r0 = _mm256_permute2f128_ps(a0, b0, 0x20),
                 r1 = _mm256_permute2f128_ps(a0, b0, 0x31);
    const __m256 r2 = _mm256_permute2f128_ps(a1, b1, 0x20),
                 r3 = _mm256_permute2f128_ps(a1, b1, 0x31);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    _mm256_storeu_ps(o, _mm256_shuffle_ps(t0, t2, 0x44));       // column 0
    _mm256_storeu_ps(o + 32, _mm256_shuffle_ps(t0, t2, 0xee));  // column 1
    _mm256_storeu_ps(o + 8, _mm256_shuffle_ps(t1, t3, 0x44));   // column 2
    _mm256_storeu_ps(o + 40, _mm256_shuffle_ps(t1, t3, 0xee));  // column 3
  };
  alignas(32) static constexpr float kZeros[16] = {};
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * ldx;
    float* oi = out + i * kp;
    for (int64_t c = 0; c < k; c += 64) {
      const bool pair = c + 64 <= k;
      quarter(xi + c, pair ? xi + c + 32 : kZeros, oi + c);
      quarter(xi + c + 16, pair ? xi + c + 48 : kZeros, oi + c + 16);
    }
  }
}

template <int MR>
void SkinnyRowMxfp4(const float* x, int64_t ldx, const WeightRows& w, int64_t r, float* y,
                    int64_t ldy, bool accumulate) {
  const int64_t groups = w.cols / kMxfp4Group;
  const uint8_t* row = w.Row(r);
  const uint8_t* scales = w.Scales(r);
  const __m256i low_nibble = _mm256_set1_epi8(15);
  const __m256i high_words = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  __m256 even[MR], odd[MR];
  for (int i = 0; i < MR; ++i) even[i] = odd[i] = _mm256_setzero_ps();
  // Groups g and g + 1 from codes (their 32 bytes), tables hi and lo (their
  // Bf16Halves rows, one a 128-bit half), against x's columns from 64p.
  const auto pair = [&](__m256i codes, __m256i hi, __m256i lo, int64_t p) {
    const __m256i even_codes = _mm256_and_si256(codes, low_nibble);
    const __m256i odd_codes = _mm256_and_si256(_mm256_srli_epi16(codes, 4), low_nibble);
    const __m256i even_hi = _mm256_shuffle_epi8(hi, even_codes);
    const __m256i even_lo = _mm256_shuffle_epi8(lo, even_codes);
    const __m256i odd_hi = _mm256_shuffle_epi8(hi, odd_codes);
    const __m256i odd_lo = _mm256_shuffle_epi8(lo, odd_codes);
    const __m256i words[4] = {
        _mm256_unpacklo_epi8(even_lo, even_hi), _mm256_unpackhi_epi8(even_lo, even_hi),
        _mm256_unpacklo_epi8(odd_lo, odd_hi), _mm256_unpackhi_epi8(odd_lo, odd_hi)};
    __m256 v[8];
    for (int q = 0; q < 4; ++q) {
      v[2 * q] = _mm256_castsi256_ps(_mm256_slli_epi32(words[q], 16));
      v[2 * q + 1] = _mm256_castsi256_ps(_mm256_and_si256(words[q], high_words));
    }
    for (int i = 0; i < MR; ++i) {
      const float* xi = x + i * ldx + 64 * p;
      __m256 e = _mm256_mul_ps(v[0], _mm256_loadu_ps(xi));
      __m256 o = _mm256_mul_ps(v[1], _mm256_loadu_ps(xi + 8));
      for (int u = 2; u < 8; u += 2) {
        e = _mm256_fmadd_ps(v[u], _mm256_loadu_ps(xi + 8 * u), e);
        o = _mm256_fmadd_ps(v[u + 1], _mm256_loadu_ps(xi + 8 * u + 8), o);
      }
      even[i] = _mm256_add_ps(even[i], e);
      odd[i] = _mm256_add_ps(odd[i], o);
    }
  };
  const auto table = [&](int64_t g, int half) {
    return _mm_load_si128(reinterpret_cast<const __m128i*>(kBf16Halves.b[scales[g]][half]));
  };
  Prefetch(scales + 16 * w.scale_row_bytes);  // the scales of the rows ahead
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    if (g % 4 == 0) Prefetch(row + 16 * g + kSkinnyPrefetchBytes);  // once a cache line
    pair(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * g)),
         _mm256_setr_m128i(table(g, 0), table(g + 1, 0)),
         _mm256_setr_m128i(table(g, 1), table(g + 1, 1)), g / 2);
  }
  if (g < groups) {  // an odd group: codes 0 (the value 0) in the other half
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * g));
    pair(_mm256_setr_m128i(codes, _mm_setzero_si128()), _mm256_broadcastsi128_si256(table(g, 0)),
         _mm256_broadcastsi128_si256(table(g, 1)), g / 2);
  }
  for (int i = 0; i < MR; ++i) {
    const float sum = simd::HorizontalSum(_mm256_add_ps(even[i], odd[i]));
    float& out = y[i * ldy + r];
    out = accumulate ? out + sum : sum;
  }
}
#endif  // DELTASERVE_GEMM_AVX512

#else
// The same sums without vectors: 32 partial sums a pair, the 8-column tail
// into the first 8, then a fixed reduction.
template <DType D, int MR>
void SkinnyRow(const float* x, int64_t ldx, const WeightRows& w, int64_t r, float* y, int64_t ldy,
               bool accumulate) {
  const int64_t k = w.cols;
  const uint8_t* row = w.Row(r);
  const uint8_t* scales = w.Scales(r);
  float acc[MR][32] = {};
  int64_t c = 0;
  for (; c + 32 <= k; c += 32) {
    for (int l = 0; l < 32; ++l) {
      const float wv = At<D>(row, scales, c + l);
      for (int i = 0; i < MR; ++i) acc[i][l] += wv * x[i * ldx + c + l];
    }
  }
  for (; c + 8 <= k; c += 8) {
    for (int l = 0; l < 8; ++l) {
      const float wv = At<D>(row, scales, c + l);
      for (int i = 0; i < MR; ++i) acc[i][l] += wv * x[i * ldx + c + l];
    }
  }
  for (int i = 0; i < MR; ++i) {
    float sum = 0.0f;
    for (int l = 0; l < 32; ++l) sum += acc[i][l];
    for (int64_t t = c; t < k; ++t) sum += x[i * ldx + t] * At<D>(row, scales, t);
    float& out = y[i * ldy + r];
    out = accumulate ? out + sum : sum;
  }
}
#endif  // DELTASERVE_CPU_AVX2

// Rows [i0, i0 + MR) of x against rows [j0, j1) of W.
template <DType D, int MR>
void SkinnyRows(const float* x, int64_t ldx, const Tensor& weight, int64_t j0, int64_t j1, float* y,
                int64_t ldy, bool accumulate) {
  const WeightRows w(weight);
#if DELTASERVE_CPU_AVX2
  if constexpr (D == DType::kMxfp4) {
    for (int64_t j = j0; j < j1; ++j) SkinnyRowMxfp4<MR>(x, ldx, w, j, y, ldy, accumulate);
    return;
  }
  if constexpr (MR == 4) {
    for (int64_t j = j0; j < j1; ++j) SkinnyRow4<D>(x, ldx, w, j, y, ldy, accumulate);
    return;
  }
#endif
  for (int64_t j = j0; j < j1; ++j) SkinnyRow<D, MR>(x, ldx, w, j, y, ldy, accumulate);
}

// Rows of x four at a time (then two, then one) against rows [j0, j1) of W.
template <DType D>
void SkinnyBlockRows(const float* x, int64_t ldx, const Tensor& w, int64_t m, int64_t j0,
                     int64_t j1, float* y, int64_t ldy, bool accumulate) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    SkinnyRows<D, 4>(x + i * ldx, ldx, w, j0, j1, y + i * ldy, ldy, accumulate);
  }
  for (; i + 2 <= m; i += 2) {
    SkinnyRows<D, 2>(x + i * ldx, ldx, w, j0, j1, y + i * ldy, ldy, accumulate);
  }
  if (i < m) SkinnyRows<D, 1>(x + i * ldx, ldx, w, j0, j1, y + i * ldy, ldy, accumulate);
}

// Rows [j0, j1) of product p's W, on the calling thread: x four rows at a
// time (then two, then one) over the block, so that the block is read from
// memory once and from cache for the other rows of x. An MXFP4 product's x
// comes with its columns in the order the decode produces values
// (PermuteForMxfp4, SkinnyProducts).
void SkinnyBlockOf(const LinearPtrs& p, int64_t j0, int64_t j1) {
  const Tensor& w = *p.w;
  if (w.cols == 0) {
    if (!p.accumulate) {
      for (int64_t i = 0; i < p.m; ++i)
        for (int64_t j = j0; j < j1; ++j) p.y[i * p.ldy + j] = 0.0f;
    }
    return;
  }
  switch (w.dtype) {
    case DType::kF32:
      return SkinnyBlockRows<DType::kF32>(p.x, p.ldx, w, p.m, j0, j1, p.y, p.ldy, p.accumulate);
    case DType::kBF16:
      return SkinnyBlockRows<DType::kBF16>(p.x, p.ldx, w, p.m, j0, j1, p.y, p.ldy, p.accumulate);
    case DType::kMxfp4:
      return SkinnyBlockRows<DType::kMxfp4>(p.x, p.ldx, w, p.m, j0, j1, p.y, p.ldy, p.accumulate);
    case DType::kI32:
    case DType::kF64:
      break;  // not weight dtypes: the entry points refuse them
  }
}

// bf16 to nearest, ties to even, a NaN kept a quiet NaN: kernels/bf16.h's
// FloatToBf16, written without branches so that each CPU level's compiler
// vectorises the loop below (the out-of-line scalar call was 8% of a bf16
// compute prefill).
inline uint16_t RoundBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// out[m, k] (contiguous) = bf16 of x's rows (stride ldx).
void RoundRowsToBf16(const float* x, int64_t ldx, int64_t m, int64_t k, uint16_t* out) {
#pragma omp parallel for schedule(static) if (m * k >= (1 << 15))
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * ldx;
    uint16_t* o = out + i * k;
    for (int64_t c = 0; c < k; ++c) o[c] = RoundBf16(row[c]);
  }
}

// y[:, j0 : j0 + nb] (+)= x · wpanelᵀ through oneDNN (row-major sgemm).
void Sgemm(const float* x, int64_t ldx, const float* panel, int64_t m, int64_t nb, int64_t k,
           float* y, int64_t ldy, bool accumulate) {
  const dnnl_status_t status =
      dnnl_sgemm('N', 'T', m, nb, k, 1.0f, x, ldx, panel, k, accumulate ? 1.0f : 0.0f, y, ldy);
  DELTASERVE_CHECK(status == dnnl_success);
}

template <DType D>
void WideLinear(const float* x, int64_t ldx, const Tensor& w, int64_t m, float* y, int64_t ldy,
                bool accumulate) {
  const int64_t n = w.rows, k = w.cols;
  if constexpr (D == DType::kF32) {
    Sgemm(x, ldx, static_cast<const float*>(w.data), m, n, k, y, ldy, accumulate);
  } else {
    const int64_t block = std::min(n, std::max<int64_t>(16, kPanelFloats / k / 16 * 16));
    const ScratchFloats panel(block * k);
    for (int64_t j0 = 0; j0 < n; j0 += block) {
      const int64_t nb = std::min(block, n - j0);
      const int64_t pieces = std::min<int64_t>(nb, omp_get_max_threads());
#pragma omp parallel for schedule(static) if (pieces > 1 && nb * k >= (1 << 15))
      for (int64_t p = 0; p < pieces; ++p) {
        const int64_t r0 = j0 + nb * p / pieces, r1 = j0 + nb * (p + 1) / pieces;
        WidenRowsOf<D>(w, r0, r1, panel.data() + (r0 - j0) * k);
      }
      Sgemm(x, ldx, panel.data(), m, nb, k, y + j0, ldy, accumulate);
    }
  }
}

template <DType D>
void LinearOf(const float* x, int64_t ldx, const Tensor& w, int64_t m, float* y, int64_t ldy,
              bool accumulate) {
  if (m <= kMaxSkinnyRows) {
    const LinearPtrs product{x, ldx, &w, m, y, ldy, accumulate};
    return SkinnyProducts(&product, 1);
  }
#if DELTASERVE_CPU_AVX2
  // MXFP4 decoded inside the GEMM's tiles (kernels/cpu/mxfp4_gemm_cpu.cc).
  if constexpr (D == DType::kMxfp4) return Mxfp4Gemm(x, ldx, w, m, y, ldy, accumulate);
#endif
  // The opt-in bf16 compute (Tensor::compute), where oneDNN has a bf16 matmul
  // for this CPU; else the exact float32 path.
  if (D == DType::kBF16 && w.compute == DType::kBF16 && onednn::HasBf16Matmul()) {
    const Scratch<uint16_t> xb(m * w.cols);
    RoundRowsToBf16(x, ldx, m, w.cols, xb.data());
    if (onednn::Bf16Matmul(xb.data(), static_cast<const uint16_t*>(w.data), m, w.rows, w.cols, y,
                           ldy, accumulate)) {
      return;
    }
  }
  WideLinear<D>(x, ldx, w, m, y, ldy, accumulate);
}

// SmallGemm's register blocks (kernels/cpu/gemm_cpu.h says what it is for).
#if DELTASERVE_CPU_AVX2
constexpr int64_t kMr = 6;  // rows of c per block

// An mr x (8·NV) block of c kept in registers over the whole p loop.
template <int MR, int NV>
void MicroKernel(int64_t k, float alpha, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < k; ++p) {
    __m256 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(b + p * ldb + 8 * v);
    const float* ap = a + p * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(ap + r * a_rs);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) {
        acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
      }
    }
  }
  const __m256 al = _mm256_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + 8 * v;
      _mm256_storeu_ps(cp, accumulate ? _mm256_fmadd_ps(al, acc[r][v], _mm256_loadu_ps(cp))
                                      : _mm256_mul_ps(al, acc[r][v]));
    }
  }
}

template <int NV>
void MicroRows(int64_t mr, int64_t k, float alpha, const float* a, int64_t a_rs, int64_t a_cs,
               const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  switch (mr) {
    case 6:
      return MicroKernel<6, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    case 5:
      return MicroKernel<5, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    case 4:
      return MicroKernel<4, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    case 3:
      return MicroKernel<3, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    case 2:
      return MicroKernel<2, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    default:
      return MicroKernel<1, NV>(k, alpha, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
  }
}

template <int NV>
void ColumnPanel(int64_t m, int64_t k, float alpha, const float* a, int64_t a_rs, int64_t a_cs,
                 const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                 bool lower_a) {
  for (int64_t i0 = 0; i0 < m; i0 += kMr) {
    const int64_t mr = std::min(kMr, m - i0);
    const int64_t k_rows = lower_a ? std::min(k, i0 + mr) : k;
    MicroRows<NV>(mr, k_rows, alpha, a + i0 * a_rs, a_rs, a_cs, b, ldb, c + i0 * ldc, ldc,
                  accumulate);
  }
}
#endif  // DELTASERVE_CPU_AVX2

}  // namespace

void SmallGemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_rs,
               int64_t a_cs, const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
               bool lower_a) {
  int64_t j = 0;
#if DELTASERVE_CPU_AVX2
  // Empty a, b or c may be null, which the panels would offset (UB); the
  // loop below does an empty product right.
  if (m > 0 && k > 0) {
    for (; j + 16 <= n; j += 16) {
      ColumnPanel<2>(m, k, alpha, a, a_rs, a_cs, b + j, ldb, c + j, ldc, accumulate, lower_a);
    }
    for (; j + 8 <= n; j += 8) {
      ColumnPanel<1>(m, k, alpha, a, a_rs, a_cs, b + j, ldb, c + j, ldc, accumulate, lower_a);
    }
  }
#endif
  if (j == n) return;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t k_row = lower_a ? std::min(k, i + 1) : k;
    float* ci = c + i * ldc;
    for (int64_t jj = j; jj < n; ++jj) {
      float sum = 0.0f;
      for (int64_t p = 0; p < k_row; ++p) {
        sum += a[i * a_rs + p * a_cs] * b[p * ldb + jj];
      }
      ci[jj] = accumulate ? ci[jj] + alpha * sum : alpha * sum;
    }
  }
}

void SkinnyProducts(const LinearPtrs* products, int64_t count) {
  // Blocks of 64 KiB of W, which stay in L2 while the rows of x pass over
  // them, and at least one a thread for each W: a matrix of one block (a
  // low-rank projection of 64 KiB) ran on one thread while the others
  // waited, 4% of a k3-moe-small decode step on two cores. first[i] is
  // product i's first block, rows[i] the rows of W in each of its blocks.
  const int64_t threads = omp_get_max_threads();
  const Scratch<int64_t> first(count + 1), rows(count);
  first[0] = 0;
  int64_t work = 0;
  for (int64_t i = 0; i < count; ++i) {
    const LinearPtrs& p = products[i];
    DELTASERVE_CHECK(p.w->device == Device::kCpu && p.m >= 0 && p.m <= kMaxSkinnyRows);
    const int64_t n = p.m == 0 ? 0 : p.w->rows;
    const int64_t cache_rows =
        std::max<int64_t>(4, (64 * 1024 / std::max<int64_t>(p.w->RowBytes(), 1)) / 4 * 4);
    const int64_t per_thread = std::max<int64_t>(4, ((n + threads - 1) / threads + 3) / 4 * 4);
    rows[i] = std::min(cache_rows, per_thread);
    first[i + 1] = first[i] + (n + rows[i] - 1) / rows[i];
    work += n * p.w->cols * p.m;
  }
  // The products as their blocks read them.
  const Scratch<LinearPtrs> ready(count);
  for (int64_t i = 0; i < count; ++i) ready[i] = products[i];
#if DELTASERVE_CPU_AVX2
  // At the vector levels an MXFP4 product's x permuted (PermuteForMxfp4),
  // once for all its blocks.
  const auto permutes = [&](int64_t i) {
    return ready[i].w->dtype == DType::kMxfp4 && first[i + 1] > first[i] && ready[i].w->cols > 0;
  };
  int64_t permuted = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (permutes(i)) permuted += ready[i].m * PermutedColumns(ready[i].w->cols);
  }
  const ScratchFloats xp(permuted);
  float* next = xp.data();
  for (int64_t i = 0; i < count; ++i) {
    if (!permutes(i)) continue;
    LinearPtrs& p = ready[i];
    PermuteForMxfp4(p.x, p.ldx, p.m, p.w->cols, next);
    p.x = next;
    p.ldx = PermutedColumns(p.w->cols);
    next += p.m * p.ldx;
  }
#endif
  ForEachBlockBalanced(first[count], work >= (1 << 15), [&](int64_t b) {
    const int64_t i = std::upper_bound(first.begin(), first.end(), b) - first.begin() - 1;
    const int64_t j0 = (b - first[i]) * rows[i];
    SkinnyBlockOf(ready[i], j0, std::min(ready[i].w->rows, j0 + rows[i]));
  });
}

void WidenRows(const Tensor& w, int64_t r0, int64_t r1, float* out) {
  DELTASERVE_CHECK(w.device == Device::kCpu && r0 >= 0 && r0 <= r1 && r1 <= w.rows);
  switch (w.dtype) {
    case DType::kF32:
      return WidenRowsOf<DType::kF32>(w, r0, r1, out);
    case DType::kBF16:
      return WidenRowsOf<DType::kBF16>(w, r0, r1, out);
    case DType::kMxfp4:
      return WidenRowsOf<DType::kMxfp4>(w, r0, r1, out);
    case DType::kI32:
    case DType::kF64:
      break;  // not weight dtypes: the entry points refuse them
  }
}

void LinearStrided(const float* x, int64_t ldx, const Tensor& w, int64_t m, float* y, int64_t ldy,
                   bool accumulate) {
  const int64_t n = w.rows, k = w.cols;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) y[i * ldy + j] = 0.0f;
    }
    return;
  }
  switch (w.dtype) {
    case DType::kF32:
      return LinearOf<DType::kF32>(x, ldx, w, m, y, ldy, accumulate);
    case DType::kBF16:
      return LinearOf<DType::kBF16>(x, ldx, w, m, y, ldy, accumulate);
    case DType::kMxfp4:
      return LinearOf<DType::kMxfp4>(x, ldx, w, m, y, ldy, accumulate);
    case DType::kI32:
    case DType::kF64:
      break;  // not weight dtypes: the entry points refuse them
  }
}

void LinearGroupStrided(const LinearPtrs* products, int64_t count) {
  // The products of a few rows share one region; the others run as Linear
  // runs them, one after another.
  const Scratch<LinearPtrs> skinny(count);
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) {
    const LinearPtrs& p = products[i];
    if (p.m <= kMaxSkinnyRows) {
      skinny[n++] = p;
    } else {
      LinearStrided(p.x, p.ldx, *p.w, p.m, p.y, p.ldy, p.accumulate);
    }
  }
  SkinnyProducts(skinny.data(), n);
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
