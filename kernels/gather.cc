// Entry point of kernels/gather.h: the contract, every index included, then
// the variant of the destination's device (the CPU's of this machine's
// level, or CUDA's).
#include "kernels/gather.h"

#include <cinttypes>
#include <cstdio>
#include <vector>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {
namespace {

bool Convertible(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; }

// Aborts naming the first index outside [0, limit). On CUDA the indices are
// read back for it (n ints, one wait on the stream).
void CheckIndices(const char* op, Device device, const Tensor& rows, int64_t limit) {
  const int32_t* index = rows.As<int32_t>();
  std::vector<int32_t> host;
  if (device == Device::kCuda && rows.cols > 0) {
    host.resize(static_cast<size_t>(rows.cols));
    Workspace::Of(device).CopyToHost(host.data(), index, sizeof(int32_t) * host.size());
    index = host.data();
  }
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
  const Device device = DELTASERVE_OP_DEVICE(dst);
  DELTASERVE_CHECK(Convertible(src.dtype) && Convertible(dst.dtype));
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, dst, dst.dtype, n, cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, src, src.dtype, src.rows, cols);
  DELTASERVE_CHECK_VIEW_ON(device, rows, DType::kI32, 1, n);
  DELTASERVE_CHECK(!Overlaps(src, dst) && !Overlaps(rows, dst));
  CheckIndices("GatherRows", device, rows, src.rows);
  if (dst.empty()) return;
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(GatherRows)
    (src.data, src.dtype, src.RowStride(), rows.As<int32_t>(), n, cols, dst.data, dst.dtype,
     dst.RowStride(), Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(GatherRows)
  (src.data, src.dtype, src.RowStride(), rows.As<int32_t>(), n, cols, dst.data, dst.dtype,
   dst.RowStride());
}

void ScatterRows(const Tensor& src, const Tensor& rows, const MutableTensor& dst) {
  const int64_t n = src.rows, cols = src.cols;
  const Device device = DELTASERVE_OP_DEVICE(dst);
  DELTASERVE_CHECK(Convertible(src.dtype) && Convertible(dst.dtype));
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, src, src.dtype, n, cols);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, dst, dst.dtype, dst.rows, cols);
  DELTASERVE_CHECK_VIEW_ON(device, rows, DType::kI32, 1, n);
  DELTASERVE_CHECK(!Overlaps(src, dst) && !Overlaps(rows, dst));
  CheckIndices("ScatterRows", device, rows, dst.rows);
  if (src.empty()) return;
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(ScatterRows)
    (src.data, src.dtype, src.RowStride(), rows.As<int32_t>(), n, cols, dst.data, dst.dtype,
     dst.RowStride(), Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(ScatterRows)
  (src.data, src.dtype, src.RowStride(), rows.As<int32_t>(), n, cols, dst.data, dst.dtype,
   dst.RowStride());
}

}  // namespace deltaserve::kernels
