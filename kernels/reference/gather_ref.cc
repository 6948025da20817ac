#include "kernels/reference/gather_ref.h"

#include "kernels/reference/convert_ref.h"

namespace deltaserve::kernels::ref {

void GatherRows(const double* src, const int32_t* rows, int64_t n, int64_t cols, bool to_bf16,
                double* dst) {
  for (int64_t i = 0; i < n; ++i) Convert(src + rows[i] * cols, cols, to_bf16, dst + i * cols);
}

void ScatterRows(const double* src, const int32_t* rows, int64_t n, int64_t cols, bool to_bf16,
                 double* dst) {
  for (int64_t i = 0; i < n; ++i) Convert(src + i * cols, cols, to_bf16, dst + rows[i] * cols);
}

}  // namespace deltaserve::kernels::ref
