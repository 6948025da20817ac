// The one matrix multiply the CUDA ops call, with cuBLAS's conventions:
// column-major operands, C[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta ·
// C, op(X) = Xᵀ when trans_X, A at lda, B at ldb, C at ldc (C is read only
// when beta != 0, as cuBLAS does). A and B share one element type; C and the
// sums are float32. On the GPU it is cuBLASLt with CUBLAS_COMPUTE_32F (no
// TF32: the ops' float32 contract); on the SIMT harness a host loop with
// double sums, so that the calls around it (the transposes and leading
// dimensions that put a row-major op into column-major terms) are tested
// without a GPU. kernels/cuda/blas_cuda.cu has both.
//
// A row-major y[M, N] = x[M, K] · w[N, K]ᵀ at row strides ldy, ldx is, read
// column-major, yᵀ = w · xᵀ with yᵀ [N, M] at ldy, w as Aᵀ ([K, N] at K) and
// xᵀ as B ([K, M] at ldx): Gemm(true, false, N, M, K, 1, w, K, x, ldx, beta,
// y, ldy).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/ops.h"

namespace deltaserve::kernels::cuda {

enum class BlasType : uint8_t { kF32, kBF16 };  // bf16 as its bits

}  // namespace deltaserve::kernels::cuda

// Returns "" or what cuBLASLt said; the caller reports it (ReportLaunch).
DELTASERVE_CUDA_DECLARE(Gemm,
                        std::string(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                    float alpha, deltaserve::kernels::cuda::BlasType type,
                                    const void* a, int64_t lda, const void* b, int64_t ldb,
                                    float beta, float* c, int64_t ldc,
                                    const deltaserve::kernels::Stream& stream))
