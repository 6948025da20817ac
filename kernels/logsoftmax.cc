// Entry point of kernels/logsoftmax.h: the contract, then the variant of the
// outputs' device (the CPU's of this machine's level, or CUDA's).
#include "kernels/logsoftmax.h"

#include <algorithm>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

void LogSoftmaxTopK(const LogSoftmaxTopKArgs& args) {
  const int64_t rows = args.logits.rows, vocab = args.logits.cols;
  const Device device = DELTASERVE_OP_DEVICE(args.log_z);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, args.logits, DType::kF32, rows, vocab);
  DELTASERVE_CHECK(rows == 0 || vocab >= 1);
  DELTASERVE_CHECK(args.top_k >= 0);
  const int64_t k = std::min(args.top_k, vocab);
  DELTASERVE_CHECK_VIEW_ON(device, args.log_z, DType::kF64, rows, 1);
  const bool targets = !args.targets.empty();
  if (targets) {
    DELTASERVE_CHECK_VIEW_ON(device, args.targets, DType::kI32, rows, 1);
    DELTASERVE_CHECK_VIEW_ON(device, args.target_logprobs, DType::kF32, rows, 1);
  } else {
    DELTASERVE_CHECK(args.target_logprobs.empty());
  }
  if (k > 0) {
    DELTASERVE_CHECK_VIEW_ON(device, args.top_ids, DType::kI32, rows, k);
    DELTASERVE_CHECK_VIEW_ON(device, args.top_logprobs, DType::kF32, rows, k);
  } else {
    DELTASERVE_CHECK(args.top_ids.empty() && args.top_logprobs.empty());
  }
  const Tensor outputs[] = {args.log_z, args.target_logprobs, args.top_ids, args.top_logprobs};
  for (const Tensor& out : outputs) {
    DELTASERVE_CHECK(!Overlaps(out, args.logits) && !Overlaps(out, args.targets));
    for (const Tensor& other : outputs) {
      DELTASERVE_CHECK(&other == &out || !Overlaps(out, other));
    }
  }
  if (rows == 0) return;
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(LogSoftmaxTopK)
    (args.logits.As<float>(), args.logits.RowStride(), rows, vocab,
     targets ? args.targets.As<int32_t>() : nullptr, k, args.log_z.As<double>(),
     targets ? args.target_logprobs.As<float>() : nullptr,
     k > 0 ? args.top_ids.As<int32_t>() : nullptr, k > 0 ? args.top_logprobs.As<float>() : nullptr,
     Workspace::Of(device).stream());
    return;
  }
  cpu::LogSoftmaxTopKPtrs p;
  p.rows = rows;
  p.vocab = vocab;
  p.logits = args.logits.As<float>();
  p.logits_stride = args.logits.RowStride();
  p.targets = targets ? args.targets.As<int32_t>() : nullptr;
  p.top_k = k;
  p.log_z = args.log_z.As<double>();
  p.target_logprobs = targets ? args.target_logprobs.As<float>() : nullptr;
  p.top_ids = k > 0 ? args.top_ids.As<int32_t>() : nullptr;
  p.top_logprobs = k > 0 ? args.top_logprobs.As<float>() : nullptr;
  DELTASERVE_CPU_DISPATCH(LogSoftmaxTopK)(p);
}

int64_t FindNonFinite(const Tensor& x) {
  const Device device = DELTASERVE_OP_DEVICE(x);
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, x, DType::kF32, x.rows, x.cols);
  if (x.empty()) return -1;
  if (device == Device::kCuda) {
    // One device scalar: rows * cols - the first index, 0 for none.
    Workspace& ws = Workspace::Of(device);
    unsigned long long found = 0;
    void* result = ws.Allocate(sizeof(found));
    ws.CopyFromHost(result, &found, sizeof(found));
    DELTASERVE_CUDA_DISPATCH(FindNonFinite)
    (x.As<float>(), x.rows, x.cols, x.RowStride(), static_cast<unsigned long long*>(result),
     ws.stream());
    ws.CopyToHost(&found, result, sizeof(found));
    ws.Free(result, sizeof(found));
    return found == 0 ? -1 : x.rows * x.cols - static_cast<int64_t>(found);
  }
  return DELTASERVE_CPU_DISPATCH(FindNonFinite)(x.As<float>(), x.rows, x.cols, x.RowStride());
}

}  // namespace deltaserve::kernels
