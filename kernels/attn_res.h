// The Block Attention Residual mix (K3): a per-token softmax over candidate
// block summaries replaces every residual read.
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

// candidates: n pointers, each [T, D] (the bank then the current prefix).
// For each token: q = norm_w * proj_w, score_i = RMSNorm_no_gain(v_i; eps) · q,
// out = sum_i softmax(score)_i v_i (raw values). out: [T, D], must not alias a
// candidate. n >= 1.
void AttnResMix(const float* const* candidates, int64_t n, int64_t t, int64_t d,
                const float* norm_w, const float* proj_w, float eps, float* out);

}  // namespace deltaserve::kernels
