// Gated FFN activations act(g, u): SiLU(g)·u (SwiGLU, Kimi Linear) and SiTU
// (K3): 4·tanh(g/4)·sigmoid(g) · 25·tanh(u/25), with the two betas from config.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

enum class Activation { kSilu, kSitu };

struct ActivationParams {
  Activation kind = Activation::kSilu;
  float situ_beta = 4.0f;          // activation_situ_beta
  float situ_linear_beta = 25.0f;  // activation_situ_linear_beta
};

// gu: f32 [rows, 2 * width], gate in columns [0, width) and up in
// [width, 2*width) (one fused GEMM of gate_proj and up_proj). out: f32
// [rows, width]; must not overlap gu.
void GatedActivation(const Tensor& gu, const ActivationParams& params, const MutableTensor& out);

}  // namespace deltaserve::kernels
