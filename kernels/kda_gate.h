// KDA per-channel log-decay g (<= 0) from the raw gate projection, in the two
// forms of MODEL.md. graw: [T, heads * head_dim] without dt_bias;
// dt_bias: [heads * head_dim]; a_log: [heads] (callers pass the first `heads`
// values of the padded tensor). g: [T, heads * head_dim], may equal graw.
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

// K3: g = lower_bound · sigmoid(exp(A_log[h]) · (graw + dt_bias)).
void KdaGateLowerBound(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                       int64_t heads, int64_t head_dim, float lower_bound, float* g);

// Kimi Linear: g = -exp(A_log[h]) · softplus(graw + dt_bias), softplus(z) = z
// for z > 20.
void KdaGateSoftplus(const float* graw, const float* dt_bias, const float* a_log, int64_t t,
                     int64_t heads, int64_t head_dim, float* g);

}  // namespace deltaserve::kernels
