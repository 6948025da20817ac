// Float64 reference for kernels/attn_res.h.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

// candidates: n pointers, each [T, D]; out: [T, D].
void AttnResMix(const double* const* candidates, int64_t n, int64_t t, int64_t d,
                const double* norm_w, const double* proj_w, double eps, double* out);

}  // namespace deltaserve::kernels::ref
