// Entry point of kernels/logsoftmax.h: the contract, then the CPU variant of
// this machine's level.
#include "kernels/logsoftmax.h"

#include <algorithm>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void LogSoftmaxTopK(const LogSoftmaxTopKArgs& args) {
  const int64_t rows = args.logits.rows, vocab = args.logits.cols;
  DELTASERVE_CHECK_STRIDED_VIEW(args.logits, DType::kF32, rows, vocab);
  DELTASERVE_CHECK(rows == 0 || vocab >= 1);
  DELTASERVE_CHECK(args.top_k >= 0);
  const int64_t k = std::min(args.top_k, vocab);
  DELTASERVE_CHECK_VIEW(args.log_z, DType::kF64, rows, 1);
  const bool targets = !args.targets.empty();
  if (targets) {
    DELTASERVE_CHECK_VIEW(args.targets, DType::kI32, rows, 1);
    DELTASERVE_CHECK_VIEW(args.target_logprobs, DType::kF32, rows, 1);
  } else {
    DELTASERVE_CHECK(args.target_logprobs.empty());
  }
  if (k > 0) {
    DELTASERVE_CHECK_VIEW(args.top_ids, DType::kI32, rows, k);
    DELTASERVE_CHECK_VIEW(args.top_logprobs, DType::kF32, rows, k);
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
  DELTASERVE_CHECK_STRIDED_VIEW(x, DType::kF32, x.rows, x.cols);
  if (x.empty()) return -1;
  return DELTASERVE_CPU_DISPATCH(FindNonFinite)(x.As<float>(), x.rows, x.cols, x.RowStride());
}

}  // namespace deltaserve::kernels
