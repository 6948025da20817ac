// Row gather and scatter on the GPU, each element converted as Convert does
// (kernels/cuda/convert_element.h): one block per listed row (grid x up to
// 2^31 - 1), its threads striding along the row so a warp moves consecutive
// elements (coalesced). The entry point checked the indices; a scatter's are
// distinct (the caller's contract), so no two blocks write one row.
#include "kernels/cuda/compat.h"
#include "kernels/cuda/convert_element.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 128;

// gather: dst row i = src row rows[i]; else (scatter) dst row rows[i] =
// src row i.
__global__ void __launch_bounds__(kThreads)
    GatherScatterKernel(bool gather, const void* __restrict__ src, DType src_dtype,
                        int64_t src_stride, const int32_t* __restrict__ rows, int64_t cols,
                        void* __restrict__ dst, DType dst_dtype, int64_t dst_stride) {
  const int64_t i = blockIdx.x;
  const int64_t listed = rows[i];
  const int64_t src_row = gather ? listed : i;
  const int64_t dst_row = gather ? i : listed;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    ConvertElement(src, src_dtype, src_row * src_stride + c, dst, dst_dtype,
                   dst_row * dst_stride + c);
  }
}

void Launch(bool gather, const void* src, DType src_dtype, int64_t src_stride, const int32_t* rows,
            int64_t n, int64_t cols, void* dst, DType dst_dtype, int64_t dst_stride,
            const Stream& stream) {
  if (n == 0 || cols == 0) return;
  DELTASERVE_LAUNCH(GatherScatterKernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream,
                    gather, src, src_dtype, src_stride, rows, cols, dst, dst_dtype, dst_stride);
}

}  // namespace

void GatherRows(const void* src, DType src_dtype, int64_t src_stride, const int32_t* rows,
                int64_t n, int64_t cols, void* dst, DType dst_dtype, int64_t dst_stride,
                const Stream& stream) {
  Launch(true, src, src_dtype, src_stride, rows, n, cols, dst, dst_dtype, dst_stride, stream);
}

void ScatterRows(const void* src, DType src_dtype, int64_t src_stride, const int32_t* rows,
                 int64_t n, int64_t cols, void* dst, DType dst_dtype, int64_t dst_stride,
                 const Stream& stream) {
  Launch(false, src, src_dtype, src_stride, rows, n, cols, dst, dst_dtype, dst_stride, stream);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
