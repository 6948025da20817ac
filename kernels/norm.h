// Row normalisations: RMSNorm (optionally without gain) and L2 normalisation.
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * w, for rows r < rows.
// w may be null (no gain). y may equal x (in place); no other overlap.
void RmsNorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y);

// y[r, :] = x[r, :] / sqrt(sum(x[r, :]²) + eps) * scale. y may equal x.
void L2Norm(const float* x, int64_t rows, int64_t dim, float eps, float scale, float* y);

}  // namespace deltaserve::kernels
