// Float64 reference for kernels/logsoftmax.h, on contiguous [rows, vocab]
// logits.
#pragma once

#include <cstdint>
#include <vector>

namespace deltaserve::kernels::ref {

// log Σ_i exp(x_i) of one row, in long double around its maximum.
double LogSumExp(const double* row, int64_t vocab);

// The ids of one row sorted by logit, highest first, lower id on ties: the
// first k are the top k.
std::vector<int32_t> Ranked(const double* row, int64_t vocab);

// Whether x is NaN or ±inf, element by element: the first such index or -1.
int64_t FindNonFinite(const double* x, int64_t n);

}  // namespace deltaserve::kernels::ref
