// Entry point of kernels/gather.h: the contract, every index included, then
// the CPU variant of this machine's level.
#include "kernels/gather.h"

#include <cinttypes>
#include <cstdio>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {
namespace {

bool Convertible(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; }

// Aborts naming the first index outside [0, limit).
void CheckIndices(const char* op, const Tensor& rows, int64_t limit) {
  const int32_t* index = rows.As<int32_t>();
  for (int64_t i = 0; i < rows.cols; ++i) {
    if (index[i] < 0 || index[i] >= limit) {
      std::fprintf(stderr, "%s: rows[%" PRId64 "] = %" PRId32 " is outside [0, %" PRId64 ")\n", op,
                   i, index[i], limit);
    }
    DELTASERVE_CHECK(index[i] >= 0 && index[i] < limit);
  }
}

}  // namespace

void GatherRows(const Tensor& src, const Tensor& rows, const MutableTensor& dst) {
  const int64_t n = dst.rows, cols = dst.cols;
  DELTASERVE_CHECK(Convertible(src.dtype) && Convertible(dst.dtype));
  DELTASERVE_CHECK_STRIDED_VIEW(dst, dst.dtype, n, cols);
  DELTASERVE_CHECK_STRIDED_VIEW(src, src.dtype, src.rows, cols);
  DELTASERVE_CHECK_VIEW(rows, DType::kI32, 1, n);
  DELTASERVE_CHECK(!Overlaps(src, dst) && !Overlaps(rows, dst));
  CheckIndices("GatherRows", rows, src.rows);
  if (dst.empty()) return;
  DELTASERVE_CPU_DISPATCH(GatherRows)
  (src.data, src.dtype, src.RowStride(), rows.As<int32_t>(), n, cols, dst.data, dst.dtype,
   dst.RowStride());
}

void ScatterRows(const Tensor& src, const Tensor& rows, const MutableTensor& dst) {
  const int64_t n = src.rows, cols = src.cols;
  DELTASERVE_CHECK(Convertible(src.dtype) && Convertible(dst.dtype));
  DELTASERVE_CHECK_STRIDED_VIEW(src, src.dtype, n, cols);
  DELTASERVE_CHECK_STRIDED_VIEW(dst, dst.dtype, dst.rows, cols);
  DELTASERVE_CHECK_VIEW(rows, DType::kI32, 1, n);
  DELTASERVE_CHECK(!Overlaps(src, dst) && !Overlaps(rows, dst));
  CheckIndices("ScatterRows", rows, dst.rows);
  if (src.empty()) return;
  DELTASERVE_CPU_DISPATCH(ScatterRows)
  (src.data, src.dtype, src.RowStride(), rows.As<int32_t>(), n, cols, dst.data, dst.dtype,
   dst.RowStride());
}

}  // namespace deltaserve::kernels
