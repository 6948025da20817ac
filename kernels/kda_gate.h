// KDA per-channel log-decay g (<= 0) from the raw gate projection, in the two
// forms of MODEL.md, all f32. graw: [T, heads * head_dim] without dt_bias;
// dt_bias: [1, heads * head_dim]; a_log: [1, heads] (callers pass the first
// `heads` values of the padded tensor). g: [T, heads * head_dim], may be graw
// itself (in place) but overlap nothing else.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// K3: g = lower_bound · sigmoid(exp(A_log[h]) · (graw + dt_bias)).
void KdaGateLowerBound(const Tensor& graw, const Tensor& dt_bias, const Tensor& a_log,
                       int64_t heads, int64_t head_dim, float lower_bound, const MutableTensor& g);

// Kimi Linear: g = -exp(A_log[h]) · softplus(graw + dt_bias), softplus(z) = z
// for z > 20.
void KdaGateSoftplus(const Tensor& graw, const Tensor& dt_bias, const Tensor& a_log, int64_t heads,
                     int64_t head_dim, const MutableTensor& g);

}  // namespace deltaserve::kernels
