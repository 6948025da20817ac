// Row gather and scatter, each row converted as Convert does
// (kernels/cpu/convert_rows.h). The indices were checked at the entry point.
#include <cstdint>

#include "kernels/cpu/convert_rows.h"
#include "kernels/cpu/ops.h"
#include "kernels/gather.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Below this many elements an OpenMP fork costs more than the copy.
constexpr int64_t kParallelMinElements = int64_t{1} << 16;

}  // namespace

void GatherRows(const void* src, DType src_dtype, int64_t src_stride, const int32_t* rows,
                int64_t n, int64_t cols, void* dst, DType dst_dtype, int64_t dst_stride) {
  const bool parallel = n > 1 && n * cols >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < n; ++i) {
    ConvertRow(RowOf(src, src_dtype, src_stride, rows[i]), src_dtype, cols,
               RowOf(dst, dst_dtype, dst_stride, i), dst_dtype);
  }
}

// Distinct indices (the caller's contract) make the rows' writes disjoint, so
// they may run on several threads.
void ScatterRows(const void* src, DType src_dtype, int64_t src_stride, const int32_t* rows,
                 int64_t n, int64_t cols, void* dst, DType dst_dtype, int64_t dst_stride) {
  const bool parallel = n > 1 && n * cols >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < n; ++i) {
    ConvertRow(RowOf(src, src_dtype, src_stride, i), src_dtype, cols,
               RowOf(dst, dst_dtype, dst_stride, rows[i]), dst_dtype);
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
