// f32 / bf16 copies of [rows, cols] views on the GPU: a 2-D grid, x tiling a
// row's columns (a warp reads and writes consecutive elements: coalesced at
// any row stride), y walking the rows past 65535 by striding; each element
// converted by ConvertElement (kernels/cuda/convert_element.h), bit for bit
// as the CPU variant.
#include "kernels/cuda/compat.h"
#include "kernels/cuda/convert_element.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

__global__ void __launch_bounds__(kThreads)
    ConvertKernel(const void* __restrict__ src, DType src_dtype, int64_t src_stride, int64_t rows,
                  int64_t cols, void* __restrict__ dst, DType dst_dtype, int64_t dst_stride) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    ConvertElement(src, src_dtype, r * src_stride + c, dst, dst_dtype, r * dst_stride + c);
  }
}

}  // namespace

void Convert(const void* src, DType src_dtype, int64_t src_stride, int64_t rows, int64_t cols,
             void* dst, DType dst_dtype, int64_t dst_stride, const Stream& stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(BlocksFor(cols, kThreads),
                  static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY));
  DELTASERVE_LAUNCH(ConvertKernel, grid, dim3(kThreads), 0, stream, src, src_dtype, src_stride,
                    rows, cols, dst, dst_dtype, dst_stride);
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
