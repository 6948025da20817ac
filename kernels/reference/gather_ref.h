// Float64 reference for kernels/gather.h, rows converted as
// kernels/reference/convert_ref.h does.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

// dst row i = src row rows[i], rows of `cols` contiguous values.
void GatherRows(const double* src, const int32_t* rows, int64_t n, int64_t cols, bool to_bf16,
                double* dst);
// dst row rows[i] = src row i; other rows of dst untouched.
void ScatterRows(const double* src, const int32_t* rows, int64_t n, int64_t cols, bool to_bf16,
                 double* dst);

}  // namespace deltaserve::kernels::ref
