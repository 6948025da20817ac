// f32 / bf16 copies of [rows, cols] views, row by row (kernels/cpu/convert_rows.h).
#include <cstdint>

#include "kernels/convert.h"
#include "kernels/cpu/convert_rows.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Below this many elements an OpenMP fork costs more than the copy.
constexpr int64_t kParallelMinElements = int64_t{1} << 16;

}  // namespace

void Convert(const void* src, DType src_dtype, int64_t src_stride, int64_t rows, int64_t cols,
             void* dst, DType dst_dtype, int64_t dst_stride) {
  const bool parallel = rows > 1 && rows * cols >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    ConvertRow(RowOf(src, src_dtype, src_stride, r), src_dtype, cols,
               RowOf(dst, dst_dtype, dst_stride, r), dst_dtype);
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
