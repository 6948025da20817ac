// KDA's causal depthwise short convolution, for prefill (any T) and one-step
// decode (T = 1), carrying the last width-1 inputs per channel as state.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// y[t, c] = act(sum_j w[c, j] · x̃[t - (width-1) + j, c]), where x̃ is the state
// rows [width-1, channels] (oldest first; zeros for a fresh sequence)
// followed by x[T, channels]. act is SiLU when silu, else identity.
// On return state holds the last width-1 rows of x̃. All f32; w:
// [channels, width] (PyTorch's [channels, 1, width]), width >= 1. y must not
// overlap x or state, nor state x. T may be 0.
void ShortConv(const Tensor& x, const Tensor& w, bool silu, const MutableTensor& state,
               const MutableTensor& y);

}  // namespace deltaserve::kernels
