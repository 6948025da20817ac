// Float64 reference for kernels/kda_gate.h.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

// Same contracts as the kernels:: versions, in double.
void KdaGateLowerBound(const double* graw, const double* dt_bias, const double* a_log, int64_t t,
                       int64_t heads, int64_t head_dim, double lower_bound, double* g);
void KdaGateSoftplus(const double* graw, const double* dt_bias, const double* a_log, int64_t t,
                     int64_t heads, int64_t head_dim, double* g);

}  // namespace deltaserve::kernels::ref
