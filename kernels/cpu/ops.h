// The CPU variants of every op (kernels/cpu/dispatch.h): one declaration per
// op and level, each with its own raw signature. The entry point has checked
// the contract (kernels/<op>.h) on the views before it calls one, so a variant
// trusts its pointers and sizes. Weights keep their Tensor view: the GEMMs
// dispatch on its dtype inside.
#pragma once

#include <cstdint>

#include "kernels/activation.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/kda.h"
#include "kernels/logsoftmax.h"
#include "kernels/moe.h"
#include "kernels/sampling.h"
#include "kernels/tensor.h"

namespace deltaserve::kernels::cpu {

// One product of LinearGroup (kernels/gemm.h) with its views as pointers:
// y[m, w.rows] (+)= x[m, w.cols] · wᵀ, the rows of x and y at strides ldx and
// ldy.
struct LinearPtrs {
  const float* x = nullptr;
  int64_t ldx = 0;
  const Tensor* w = nullptr;
  int64_t m = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;
};

// MlaPrefillArgs with the views as pointers.
struct MlaPrefillPtrs {
  int64_t t = 0, prefix = 0, heads = 0, nope_dim = 0, rope_dim = 0, v_dim = 0;
  const float* q = nullptr;       // [T, n, P + R]
  const float* kv = nullptr;      // [S, n, P + Vd]
  const float* k_rope = nullptr;  // row s at k_rope + s * k_rope_stride
  int64_t k_rope_stride = 0;
  float scale = 1.0f;
  float* o = nullptr;  // [T, n, Vd]
};

// MlaAbsorbedArgs with the views as pointers.
struct MlaAbsorbedPtrs {
  int64_t t = 0, prefix = 0, heads = 0, latent_dim = 0, rope_dim = 0;
  const float* q_latent = nullptr;  // [T, n, C]
  const float* q_rope = nullptr;    // [T, n, R]
  const void* cache = nullptr;      // [S, C + R] of cache_dtype, or a page pool
  DType cache_dtype = DType::kF32;  // kF32 or kBF16
  // Paged (page_table set): key s is cache row page_table[s / page_tokens] *
  // page_tokens + s % page_tokens.
  const int32_t* page_table = nullptr;
  int64_t page_tokens = 0;
  float scale = 1.0f;
  float* o_latent = nullptr;  // [T, n, C]
};

// MoeExpertsArgs with the activation views as pointers.
struct MoeExpertsPtrs {
  int64_t t = 0, din = 0, inter = 0, dout = 0, top_k = 0, n_experts = 0;
  const float* z = nullptr;            // [T, din]
  const MoeExpert* experts = nullptr;  // [n_experts]
  const int32_t* idx = nullptr;        // [T, top_k]
  const float* weights = nullptr;      // [T, top_k]
  ActivationParams act;
  float* out = nullptr;  // [T, dout]
};

// LogSoftmaxTopKArgs with the views as pointers; an absent output is null.
struct LogSoftmaxTopKPtrs {
  int64_t rows = 0, vocab = 0, top_k = 0;  // top_k: already min(top_k, vocab)
  const float* logits = nullptr;           // row r at logits + r * logits_stride
  int64_t logits_stride = 0;
  const int32_t* targets = nullptr;  // [rows] or null
  double* log_z = nullptr;           // [rows]
  float* target_logprobs = nullptr;  // [rows] or null
  int32_t* top_ids = nullptr;        // [rows, top_k] or null
  float* top_logprobs = nullptr;     // [rows, top_k] or null
};

}  // namespace deltaserve::kernels::cpu

DELTASERVE_CPU_DECLARE(GatedActivation, void(const float* gu, int64_t rows, int64_t width,
                                             const ActivationParams& params, float* out))
DELTASERVE_CPU_DECLARE(Add, void(const float* a, int64_t lda, const float* b, int64_t ldb,
                                 int64_t rows, int64_t cols, float* out, int64_t ldo))
DELTASERVE_CPU_DECLARE(SigmoidGate,
                       void(const float* x, int64_t ldx, const float* gate, int64_t ldg,
                            int64_t rows, int64_t cols, float* out, int64_t ldo))
DELTASERVE_CPU_DECLARE(Sigmoid, void(const float* x, int64_t ldx, int64_t rows, int64_t cols,
                                     float* out, int64_t ldo))
DELTASERVE_CPU_DECLARE(Convert,
                       void(const void* src, DType src_dtype, int64_t src_stride, int64_t rows,
                            int64_t cols, void* dst, DType dst_dtype, int64_t dst_stride))
DELTASERVE_CPU_DECLARE(GatherRows, void(const void* src, DType src_dtype, int64_t src_stride,
                                        const int32_t* rows, int64_t n, int64_t cols, void* dst,
                                        DType dst_dtype, int64_t dst_stride))
DELTASERVE_CPU_DECLARE(ScatterRows, void(const void* src, DType src_dtype, int64_t src_stride,
                                         const int32_t* rows, int64_t n, int64_t cols, void* dst,
                                         DType dst_dtype, int64_t dst_stride))
DELTASERVE_CPU_DECLARE(AttnResMix,
                       void(const float* const* candidates, int64_t n, int64_t t, int64_t d,
                            const float* norm_w, const float* proj_w, float eps, float* out))
DELTASERVE_CPU_DECLARE(Embedding,
                       void(const Tensor& table, const int32_t* tokens, int64_t t, float* out))
DELTASERVE_CPU_DECLARE(LinearStrided, void(const float* x, int64_t ldx, const Tensor& w, int64_t m,
                                           float* y, int64_t ldy, bool accumulate))
DELTASERVE_CPU_DECLARE(LinearGroupStrided, void(const LinearPtrs* products, int64_t count))
DELTASERVE_CPU_DECLARE(KdaRecurrent,
                       void(const KdaShape& shape, const float* q, const float* k, const float* v,
                            const float* g, const float* beta, float scale, float* state, float* o))
DELTASERVE_CPU_DECLARE(KdaChunk, void(const KdaShape& shape, const float* q, const float* k,
                                      const float* v, const float* g, const float* beta,
                                      float scale, float* state, float* o, int64_t chunk_size))
DELTASERVE_CPU_DECLARE(KdaGateLowerBound,
                       void(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                            int64_t heads, int64_t head_dim, float lower_bound, float* g))
DELTASERVE_CPU_DECLARE(KdaGateSoftplus,
                       void(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                            int64_t heads, int64_t head_dim, float* g))
DELTASERVE_CPU_DECLARE(LogSoftmaxTopK, void(const LogSoftmaxTopKPtrs& args))
DELTASERVE_CPU_DECLARE(FindNonFinite,
                       int64_t(const float* x, int64_t rows, int64_t cols, int64_t stride))
DELTASERVE_CPU_DECLARE(MlaPrefillAttention, void(const MlaPrefillPtrs& args))
DELTASERVE_CPU_DECLARE(MlaAbsorbedAttention, void(const MlaAbsorbedPtrs& args))
DELTASERVE_CPU_DECLARE(PagedCacheWrite,
                       void(const float* rows, int64_t stride, int64_t n, int64_t width,
                            int64_t begin, const int32_t* page_table, int64_t page_tokens,
                            void* pool, DType dtype))
DELTASERVE_CPU_DECLARE(PagedCacheRead,
                       void(const void* pool, DType dtype, const int32_t* page_table,
                            int64_t page_tokens, int64_t begin, int64_t n, int64_t width,
                            float* rows, int64_t stride))
DELTASERVE_CPU_DECLARE(PagedCacheCopyPage, void(const void* from, void* to, int64_t bytes))
DELTASERVE_CPU_DECLARE(MoeRoute, void(const float* logits, const float* bias, int64_t t,
                                      int64_t experts, int64_t top_k, bool renormalize,
                                      float scaling, int32_t* idx, float* weights))
DELTASERVE_CPU_DECLARE(MoeExperts, void(const MoeExpertsPtrs& args))
DELTASERVE_CPU_DECLARE(RmsNorm, void(const float* x, int64_t ldx, const float* w, int64_t rows,
                                     int64_t dim, float eps, float* y, int64_t ldy))
DELTASERVE_CPU_DECLARE(L2Norm, void(const float* x, int64_t rows, int64_t dim, float eps,
                                    float scale, float* y))
DELTASERVE_CPU_DECLARE(SamplingDistribution, void(const float* logits, int64_t vocab,
                                                  const SamplingParams& params, double* probs))
DELTASERVE_CPU_DECLARE(Sample, int32_t(const float* logits, int64_t vocab,
                                       const SamplingParams& params, Rng& rng))
DELTASERVE_CPU_DECLARE(ShortConv, void(const float* x, const float* w, int64_t t, int64_t channels,
                                       int64_t width, bool silu, float* state, float* y))
