// The CUDA variants of the ops and the memory functions under them, and the
// choice between their two builds: each kernels/cuda/<op>_cuda.cu compiles
// once by nvcc into namespace cuda::gpu (a CUDA build only) and once by the
// host compiler against the SIMT harness into cuda::sim (every build), as
// kernels/cpu/ compiles once per CPU level. An op's entry point
// (kernels/<op>.cc) checks the views, and when they are on Device::kCuda
// calls DELTASERVE_CUDA_DISPATCH(Op)(pointers..., stream), which is the
// variant of the active backend. No CUDA headers here: streams are
// kernels::Stream.
//
// The backend is chosen once per process (ActiveBackend): the GPU when this
// build has CUDA and the runtime sees a device; the harness when the
// environment asks for it with DELTASERVE_CUDA_BACKEND=sim (the cuda-sim
// tests; slow, for checking logic, never for serving). With
// DELTASERVE_CUDA_BACKEND=gpu there is no fallback to the harness.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/device.h"
#include "kernels/stream.h"

namespace deltaserve::kernels::cuda {

enum class Backend : uint8_t { kNone, kGpu, kSim };

// The backend Device::kCuda views run on in this process.
Backend ActiveBackend();
// Why ActiveBackend() is kNone ("" otherwise): no CUDA in this build, what
// the CUDA runtime said, or an unknown DELTASERVE_CUDA_BACKEND.
const std::string& BackendProblem();
const char* BackendName(Backend backend);

// Whether this build has the nvcc-compiled variants.
#if DELTASERVE_KERNELS_CUDA
inline constexpr bool kBuiltWithCuda = true;
#else
inline constexpr bool kBuiltWithCuda = false;
#endif

template <typename F>
F Select(F sim, F gpu) {
  return ActiveBackend() == Backend::kSim ? sim : gpu;
}

// A launch's outcome: "" or the error the runtime (or the harness) gave,
// which the CUDA workspace keeps for its next Synchronize, naming `kernel`.
void ReportLaunch(const char* kernel, const char* error);

}  // namespace deltaserve::kernels::cuda

// DELTASERVE_CUDA_DECLARE(Op, void(const float* x, ..., const Stream& s))
// declares the variant Op of that type in both targets.
#if DELTASERVE_KERNELS_CUDA
#define DELTASERVE_CUDA_DECLARE(op, ...)     \
  namespace deltaserve::kernels::cuda {      \
  using op##Fn = __VA_ARGS__;                \
  }                                          \
  namespace deltaserve::kernels::cuda::sim { \
  op##Fn op;                                 \
  }                                          \
  namespace deltaserve::kernels::cuda::gpu { \
  op##Fn op;                                 \
  }
#define DELTASERVE_CUDA_DISPATCH(op)                                          \
  (::deltaserve::kernels::cuda::Select(&::deltaserve::kernels::cuda::sim::op, \
                                       &::deltaserve::kernels::cuda::gpu::op))
#else
#define DELTASERVE_CUDA_DECLARE(op, ...)     \
  namespace deltaserve::kernels::cuda {      \
  using op##Fn = __VA_ARGS__;                \
  }                                          \
  namespace deltaserve::kernels::cuda::sim { \
  op##Fn op;                                 \
  }
#define DELTASERVE_CUDA_DISPATCH(op) (&::deltaserve::kernels::cuda::sim::op)
#endif

// Device memory and copies (kernels/cuda/runtime_cuda.cu): what the CUDA
// workspace is built on. Each returns "" or the runtime's error. Copies are
// ordered on `stream`; CopyToHost waits for it.
DELTASERVE_CUDA_DECLARE(DeviceCount, int(std::string* error))
DELTASERVE_CUDA_DECLARE(DeviceMalloc, std::string(size_t bytes, void** out))
DELTASERVE_CUDA_DECLARE(DeviceFree, void(void* data))
DELTASERVE_CUDA_DECLARE(CopyToDevice, std::string(void* dst, const void* src, size_t bytes,
                                                  const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(CopyToHost, std::string(void* dst, const void* src, size_t bytes,
                                                const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(StreamSynchronize, std::string(const deltaserve::kernels::Stream& stream))
// Zeros `bytes` at `dst` in the stream's order.
DELTASERVE_CUDA_DECLARE(DeviceZero, std::string(void* dst, size_t bytes,
                                                const deltaserve::kernels::Stream& stream))
// Makes device `ordinal` this process's (before its first allocation), and
// reads its free and total memory.
DELTASERVE_CUDA_DECLARE(SelectDevice, std::string(int ordinal))
DELTASERVE_CUDA_DECLARE(DeviceMemory, std::string(size_t* free_bytes, size_t* total_bytes))

// The ops, one line each; an entry point has checked the views.
DELTASERVE_CUDA_DECLARE(RmsNorm, void(const float* x, int64_t ldx, const float* w, int64_t rows,
                                      int64_t dim, float eps, float* y, int64_t ldy,
                                      const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(L2Norm,
                        void(const float* x, int64_t rows, int64_t dim, float eps, float scale,
                             float* y, const deltaserve::kernels::Stream& stream))

// kernels/paged_cache.h: pools of f32 (bf16 = false) or bf16 rows; pool_pages
// bounds the page table's entries (an entry outside is not dereferenced).
DELTASERVE_CUDA_DECLARE(PagedCacheWrite,
                        void(const float* rows, int64_t stride, int64_t n, int64_t width,
                             int64_t begin, const int32_t* page_table, int64_t page_tokens,
                             int64_t pool_pages, void* pool, bool bf16,
                             const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(PagedCacheRead, void(const void* pool, bool bf16, const int32_t* page_table,
                                             int64_t page_tokens, int64_t pool_pages, int64_t begin,
                                             int64_t n, int64_t width, float* rows, int64_t stride,
                                             const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(PagedCacheCopyPage, void(const void* from, void* to, int64_t bytes,
                                                 const deltaserve::kernels::Stream& stream))

// kernels/mla_attention.h: MlaPrefillArgs and MlaAbsorbedArgs as pointers
// (kernels/cpu/ops.h's structs, C++17-clean), plus the device scratch the key
// splits' partial softmax states need: *PartialFloats(args) floats at
// `partials` (none when it returns 0).
namespace deltaserve::kernels::cuda {
struct MlaPrefillPtrs {
  int64_t t = 0, prefix = 0, heads = 0, nope_dim = 0, rope_dim = 0, v_dim = 0;
  const float* q = nullptr;       // [T, n, P + R]
  const float* kv = nullptr;      // [S, n, P + Vd]
  const float* k_rope = nullptr;  // row s at k_rope + s * k_rope_stride
  int64_t k_rope_stride = 0;
  float scale = 1.0f;
  float* o = nullptr;  // [T, n, Vd]
  float* partials = nullptr;
};
struct MlaAbsorbedPtrs {
  int64_t t = 0, prefix = 0, heads = 0, latent_dim = 0, rope_dim = 0;
  const float* q_latent = nullptr;  // [T, n, C]
  const float* q_rope = nullptr;    // [T, n, R]
  const void* cache = nullptr;      // [S, C + R] f32 or bf16 bits, or a page pool
  bool cache_bf16 = false;
  // Paged (page_table set): key s is cache row page_table[s / page_tokens] *
  // page_tokens + s % page_tokens.
  const int32_t* page_table = nullptr;
  int64_t page_tokens = 0;
  float scale = 1.0f;
  float* o_latent = nullptr;  // [T, n, C]
  float* partials = nullptr;
};
}  // namespace deltaserve::kernels::cuda
DELTASERVE_CUDA_DECLARE(MlaPrefillPartialFloats,
                        int64_t(const deltaserve::kernels::cuda::MlaPrefillPtrs& args))
DELTASERVE_CUDA_DECLARE(MlaPrefillAttention,
                        void(const deltaserve::kernels::cuda::MlaPrefillPtrs& args,
                             const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(MlaAbsorbedPartialFloats,
                        int64_t(const deltaserve::kernels::cuda::MlaAbsorbedPtrs& args))
DELTASERVE_CUDA_DECLARE(MlaAbsorbedAttention,
                        void(const deltaserve::kernels::cuda::MlaAbsorbedPtrs& args,
                             const deltaserve::kernels::Stream& stream))

// kernels/logsoftmax.h: the pointers of LogSoftmaxTopKPtrs (top_k already
// min(top_k, vocab); absent outputs null). FindNonFinite leaves in the
// device scalar *result, zeroed by the caller, rows * cols - i for the first
// non-finite index i, or 0 when all are finite.
DELTASERVE_CUDA_DECLARE(LogSoftmaxTopK,
                        void(const float* logits, int64_t logits_stride, int64_t rows,
                             int64_t vocab, const int32_t* targets, int64_t top_k, double* log_z,
                             float* target_logprobs, int32_t* top_ids, float* top_logprobs,
                             const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(FindNonFinite,
                        void(const float* x, int64_t rows, int64_t cols, int64_t stride,
                             unsigned long long* result, const deltaserve::kernels::Stream& stream))

// kernels/moe.h: MoeRoute (logits [t, experts], bias [experts] or null, idx
// and weights [t, top_k]).
DELTASERVE_CUDA_DECLARE(MoeRoute,
                        void(const float* logits, const float* bias, int64_t t, int64_t experts,
                             int64_t top_k, bool renormalize, float scaling, int32_t* idx,
                             float* weights, const deltaserve::kernels::Stream& stream))

// kernels/attn_res.h: AttnResMix; `candidates` is a DEVICE array of n device
// pointers, each to f32 [t, d].
DELTASERVE_CUDA_DECLARE(AttnResMix,
                        void(const float* const* candidates, int64_t n, int64_t t, int64_t d,
                             const float* norm_w, const float* proj_w, float eps, float* out,
                             const deltaserve::kernels::Stream& stream))

// kernels/gemm.h (kernels/cuda/gemm_cuda.cu). A weight as the CUDA side sees
// it: Tensor's fields for a contiguous [rows, cols] weight of f32, bf16 or
// mxfp4 (scales for mxfp4 only), and its compute precision (tensor.h).
namespace deltaserve::kernels::cuda {
struct Weight {
  const void* data = nullptr;
  const uint8_t* scales = nullptr;
  DType dtype = DType::kF32;
  DType compute = DType::kF32;
  int64_t rows = 0, cols = 0;
};
// Device memory for an op's temporaries, from the CUDA workspace
// (kernels/workspace.h, which nvcc cannot include): kernels/cuda/backend.cc.
// Blocks are reused in the order of the workspace's one stream, so a block
// freed right after the launches that use it is safe.
void* WorkspaceAllocate(size_t bytes);
void WorkspaceFree(void* data, size_t bytes);
}  // namespace deltaserve::kernels::cuda
DELTASERVE_CUDA_DECLARE(LinearStrided, void(const float* x, int64_t ldx,
                                            const deltaserve::kernels::cuda::Weight& w, int64_t m,
                                            float* y, int64_t ldy, bool accumulate,
                                            const deltaserve::kernels::Stream& stream))

// kernels/moe.h (kernels/cuda/moe_cuda.cu). MoeExpertsArgs with the views as
// pointers: the experts' weights and `idx_host` (the routing, which the entry
// point copied to the host to check it) in host memory, z, weights and out on
// the device.
namespace deltaserve::kernels::cuda {
struct MoeExpertWeights {
  Weight w13;  // [2 * inter, din]; empty: the expert is held by another rank
  Weight w2;   // [dout, inter]
};
struct MoeExpertsPtrs {
  int64_t t = 0, din = 0, inter = 0, dout = 0, top_k = 0, n_experts = 0;
  const float* z = nullptr;                   // [T, din]
  const MoeExpertWeights* experts = nullptr;  // [n_experts], host
  const int32_t* idx_host = nullptr;          // [T, top_k], host
  const float* weights = nullptr;             // [T, top_k]
  bool situ = false;                          // SiTU, else SiLU (kernels/activation.h)
  float situ_beta = 4.0f, situ_linear_beta = 25.0f;
  float* out = nullptr;  // [T, dout]
};
}  // namespace deltaserve::kernels::cuda
DELTASERVE_CUDA_DECLARE(MoeExperts, void(const deltaserve::kernels::cuda::MoeExpertsPtrs& args,
                                         const deltaserve::kernels::Stream& stream))

// kernels/cuda/kda_cuda.cu: kernels/kda.h's two forms, the KdaShape given
// as t, heads, v_heads, k_dim, v_dim. KdaChunk needs a device scratch of
// KdaChunkScratchBytes(...) bytes (0 when t = 0).
DELTASERVE_CUDA_DECLARE(KdaRecurrent,
                        void(int64_t t, int64_t heads, int64_t v_heads, int64_t k_dim,
                             int64_t v_dim, const float* q, const float* k, const float* v,
                             const float* g, const float* beta, float scale, float* state, float* o,
                             const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(KdaChunkScratchBytes, size_t(int64_t t, int64_t v_heads, int64_t k_dim,
                                                     int64_t v_dim, int64_t chunk_size))
DELTASERVE_CUDA_DECLARE(KdaChunk, void(int64_t t, int64_t heads, int64_t v_heads, int64_t k_dim,
                                       int64_t v_dim, const float* q, const float* k,
                                       const float* v, const float* g, const float* beta,
                                       float scale, float* state, float* o, int64_t chunk_size,
                                       void* scratch, const deltaserve::kernels::Stream& stream))

// kernels/cuda/elementwise_cuda.cu
DELTASERVE_CUDA_DECLARE(Add, void(const float* a, int64_t lda, const float* b, int64_t ldb,
                                  int64_t rows, int64_t cols, float* out, int64_t ldo,
                                  const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(SigmoidGate, void(const float* x, int64_t ldx, const float* gate,
                                          int64_t ldg, int64_t rows, int64_t cols, float* out,
                                          int64_t ldo, const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(Sigmoid,
                        void(const float* x, int64_t ldx, int64_t rows, int64_t cols, float* out,
                             int64_t ldo, const deltaserve::kernels::Stream& stream))

// kernels/cuda/activation_cuda.cu: situ selects SiTU (with its two betas)
// over SiLU, as ActivationParams::kind does.
DELTASERVE_CUDA_DECLARE(GatedActivation,
                        void(const float* gu, int64_t rows, int64_t width, bool situ,
                             float situ_beta, float situ_linear_beta, float* out,
                             const deltaserve::kernels::Stream& stream))

// kernels/cuda/kda_gate_cuda.cu
DELTASERVE_CUDA_DECLARE(KdaGateLowerBound,
                        void(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                             int64_t heads, int64_t head_dim, float lower_bound, float* g,
                             const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(KdaGateSoftplus,
                        void(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                             int64_t heads, int64_t head_dim, float* g,
                             const deltaserve::kernels::Stream& stream))

// kernels/cuda/short_conv_cuda.cu
DELTASERVE_CUDA_DECLARE(ShortConv, void(const float* x, const float* w, int64_t t, int64_t channels,
                                        int64_t width, bool silu, float* state, float* y,
                                        const deltaserve::kernels::Stream& stream))

// kernels/cuda/embedding_cuda.cu: table [vocab, dim] of `dtype` (f32, bf16
// or mxfp4 with its scales [vocab, dim / 32]), contiguous; ids checked.
DELTASERVE_CUDA_DECLARE(Embedding,
                        void(const void* table, const uint8_t* scales,
                             deltaserve::kernels::DType dtype, int64_t dim, const int32_t* tokens,
                             int64_t t, float* out, const deltaserve::kernels::Stream& stream))

// kernels/cuda/convert_cuda.cu: f32 or bf16 on either side, strides in
// elements.
DELTASERVE_CUDA_DECLARE(Convert, void(const void* src, deltaserve::kernels::DType src_dtype,
                                      int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                                      deltaserve::kernels::DType dst_dtype, int64_t dst_stride,
                                      const deltaserve::kernels::Stream& stream))

// kernels/cuda/gather_cuda.cu: as Convert, rows through an index list the
// entry point has checked.
DELTASERVE_CUDA_DECLARE(GatherRows,
                        void(const void* src, deltaserve::kernels::DType src_dtype,
                             int64_t src_stride, const int32_t* rows, int64_t n, int64_t cols,
                             void* dst, deltaserve::kernels::DType dst_dtype, int64_t dst_stride,
                             const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(ScatterRows,
                        void(const void* src, deltaserve::kernels::DType src_dtype,
                             int64_t src_stride, const int32_t* rows, int64_t n, int64_t cols,
                             void* dst, deltaserve::kernels::DType dst_dtype, int64_t dst_stride,
                             const deltaserve::kernels::Stream& stream))

// kernels/cuda/read_sum_cuda.cu: *sum (a device scalar the caller zeroed) +=
// the n floats at x, a kernel that does nothing but read them once: the
// benchmarks' measure of the device's read bandwidth (bench/model_bench.cc).
DELTASERVE_CUDA_DECLARE(ReadSum, void(const float* x, int64_t n, float* sum,
                                      const deltaserve::kernels::Stream& stream))
