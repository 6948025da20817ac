// Row normalisations: RMSNorm (optionally without gain) and L2 normalisation.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// x, y: f32 [rows, dim]. y may be x itself (in place) but overlap nothing else.

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * w, w f32 [1, dim] or an
// empty view (no gain). x and y may be strided (a column block of wider rows,
// as the latent part of MLA's [c | kr] rows); in place they share the stride.
void RmsNorm(const Tensor& x, const Tensor& w, float eps, const MutableTensor& y);

// y[r, :] = x[r, :] / sqrt(sum(x[r, :]²) + eps) * scale.
void L2Norm(const Tensor& x, float eps, float scale, const MutableTensor& y);

}  // namespace deltaserve::kernels
