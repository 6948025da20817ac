// The Block Attention Residual mix (K3): a per-token softmax over candidate
// block summaries replaces every residual read.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// candidates: n >= 1 views, each f32 [T, D] (the bank then the current
// prefix). For each token: q = norm_w * proj_w, score_i =
// RMSNorm_no_gain(v_i; eps) · q, out = sum_i softmax(score)_i v_i (raw
// values). norm_w, proj_w: f32 [1, D]. out: f32 [T, D], must not overlap a
// candidate.
void AttnResMix(const Tensor* candidates, int64_t n, const Tensor& norm_w, const Tensor& proj_w,
                float eps, const MutableTensor& out);

}  // namespace deltaserve::kernels
