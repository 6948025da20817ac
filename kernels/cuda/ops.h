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

// The ops, one line each; an entry point has checked the views.
DELTASERVE_CUDA_DECLARE(RmsNorm, void(const float* x, int64_t ldx, const float* w, int64_t rows,
                                      int64_t dim, float eps, float* y, int64_t ldy,
                                      const deltaserve::kernels::Stream& stream))
DELTASERVE_CUDA_DECLARE(L2Norm,
                        void(const float* x, int64_t rows, int64_t dim, float eps, float scale,
                             float* y, const deltaserve::kernels::Stream& stream))

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
