// GEMM pieces of the CPU backend that other CPU kernels build on, beside the
// public Linear of kernels/gemm.h. Internal to kernels/cpu.
#pragma once

#include <cstdint>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/ops.h"
#include "kernels/tensor.h"

// WidenRows: out[r - r0, :] = row r of w widened to float32 (exact), r in
// [r0, r1).
//
// SmallGemm: c[i, j] = (accumulate ? c[i, j] : 0) + alpha · Σ_p a[i, p] · b[p, j]
// for i < m, j < n, p < k, with a[i, p] at a[i * a_rs + p * a_cs] (either
// layout, so Aᵀ costs nothing) and rows of b and c at strides ldb and ldc.
// lower_a: a is lower triangular with zeros stored above the diagonal, and p
// stops after the last row of each block of rows. c may lie in the same
// array as b as long as the rows read and the rows written are disjoint.
//
// For small products whose operands are already in cache: the ones inside a
// KDA chunk (kernels/cpu/kda_cpu.cc), where each of m, n and k is a head
// dimension or the chunk length (128 or 64 in K3), about 20 calls per chunk
// and head. Six rows of c and 16 columns stay in registers over the
// whole p loop, with no packing. Linear cannot serve these: it computes
// x · wᵀ from a w stored [n, k], while here the right operand is [k, n] (the
// state S, Vn and the decayed key panel, each of which would need a
// transposed copy per call), and it has no alpha, no transposed left operand
// and no triangle. OpenBLAS's cblas_sgemm has all but the triangle, and
// measured slower: KdaChunk at T = 4096, H = 8, K = V = 128, one thread of a
// Zen 4, median CPU time of 10 runs 85.2 ms with this kernel, 87.4 ms with
// cblas_sgemm in its place (OpenBLAS 0.3.21, AVX-512 kernels) and 89.7 ms
// with OpenBLAS's Haswell (AVX2) kernels, what an AVX2-only machine gets.
//
// kSkinnyMaxRows and SkinnyProducts: LinearStrided for each of `count`
// products of at most kSkinnyMaxRows rows of x (decode), in one parallel
// region, each result bitwise LinearStrided's: the rows of every W are cut
// into blocks that stay in L2 while the product's rows of x pass over them,
// shared out among the threads in order. For LinearGroup and the experts of
// a decode step (kernels/cpu/moe_cpu.cc). No product's y may overlap another
// product's x or y.
//
// All of these are declared for every level (kernels/cpu/dispatch.h), so a
// test can select one with DELTASERVE_CPU_DISPATCH.
//
// Mxfp4Gemm: y[i, j] (+)= x[i, :] · w[j, :] for i < m, j < w.rows, with w
// MXFP4 (k = w.cols a positive multiple of 32) and m > 0, x and y strided as
// in LinearStrided: Linear's path for MXFP4 weights above the skinny kernel's
// rows, which decodes W into the GEMM's cache-sized tiles instead of a
// widened float32 copy (kernels/cpu/mxfp4_gemm_cpu.cc). Declared and defined
// at the levels with vectors (avx2, avx512) only: the generic level widens W
// for oneDNN's sgemm.
#define DELTASERVE_GEMM_CPU_DECLARATIONS                                                     \
  inline constexpr int64_t kSkinnyMaxRows = 16;                                              \
  void SkinnyProducts(const LinearPtrs* products, int64_t count);                            \
  void WidenRows(const Tensor& w, int64_t r0, int64_t r1, float* out);                       \
  void SmallGemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_rs, \
                 int64_t a_cs, const float* b, int64_t ldb, float* c, int64_t ldc,           \
                 bool accumulate, bool lower_a = false);

namespace deltaserve::kernels::cpu::generic {
DELTASERVE_GEMM_CPU_DECLARATIONS
}  // namespace deltaserve::kernels::cpu::generic
#define DELTASERVE_GEMM_CPU_VECTOR_DECLARATIONS                                                  \
  void Mxfp4Gemm(const float* x, int64_t ldx, const Tensor& w, int64_t m, float* y, int64_t ldy, \
                 bool accumulate);
namespace deltaserve::kernels::cpu::avx2 {
DELTASERVE_GEMM_CPU_DECLARATIONS
DELTASERVE_GEMM_CPU_VECTOR_DECLARATIONS
}  // namespace deltaserve::kernels::cpu::avx2
namespace deltaserve::kernels::cpu::avx512 {
DELTASERVE_GEMM_CPU_DECLARATIONS
DELTASERVE_GEMM_CPU_VECTOR_DECLARATIONS
}  // namespace deltaserve::kernels::cpu::avx512
