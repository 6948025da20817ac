// Entry point of kernels/embedding.h: the contract, then the CPU variant of
// this machine's level.
#include "kernels/embedding.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void Embedding(const Tensor& table, const Tensor& tokens, const MutableTensor& out) {
  const int64_t t = out.rows;
  DELTASERVE_CHECK_WEIGHT(table, table.rows, table.cols);
  DELTASERVE_CHECK_VIEW(tokens, DType::kI32, 1, t);
  DELTASERVE_CHECK_VIEW(out, DType::kF32, t, table.cols);
  DELTASERVE_CHECK(!Overlaps(table, out) && !Overlaps(tokens, out));
  // An id outside the table would read foreign memory: the callers' validation
  // is the contract, this check the last line (one compare per row).
  const int32_t* ids = tokens.As<int32_t>();
  for (int64_t i = 0; i < t; ++i) DELTASERVE_CHECK(ids[i] >= 0 && ids[i] < table.rows);
  DELTASERVE_CPU_DISPATCH(Embedding)(table, ids, t, out.As<float>());
}

}  // namespace deltaserve::kernels
