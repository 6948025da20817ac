// Entry point of kernels/embedding.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/embedding.h"

#include <vector>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

void Embedding(const Tensor& table, const Tensor& tokens, const MutableTensor& out) {
  const int64_t t = out.rows;
  const Device device = DELTASERVE_OP_DEVICE(out);
  DELTASERVE_CHECK_WEIGHT_ON(device, table, table.rows, table.cols);
  DELTASERVE_CHECK_VIEW_ON(device, tokens, DType::kI32, 1, t);
  DELTASERVE_CHECK_VIEW_ON(device, out, DType::kF32, t, table.cols);
  DELTASERVE_CHECK(!Overlaps(table, out) && !Overlaps(tokens, out));
  // An id outside the table would read foreign memory: the callers' validation
  // is the contract, this check the last line (one compare per row). On CUDA
  // the ids are read back for it (T ints, one wait on the stream).
  const int32_t* ids = tokens.As<int32_t>();
  std::vector<int32_t> host_ids;
  if (device == Device::kCuda && t > 0) {
    host_ids.resize(static_cast<size_t>(t));
    Workspace::Of(device).CopyToHost(host_ids.data(), ids, sizeof(int32_t) * host_ids.size());
  }
  const int32_t* check = device == Device::kCuda ? host_ids.data() : ids;
  for (int64_t i = 0; i < t; ++i) DELTASERVE_CHECK(check[i] >= 0 && check[i] < table.rows);
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(Embedding)
    (table.data, table.scales, table.dtype, table.cols, ids, t, out.As<float>(),
     Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(Embedding)(table, ids, t, out.As<float>());
}

}  // namespace deltaserve::kernels
