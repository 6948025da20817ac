// Token sampling: greedy, temperature, top-k and top-p (nucleus), seeded and
// reproducible across platforms (own generator, no std distributions). For
// logits on the CUDA device, the row is copied to the host and the CPU
// variant samples it (no device kernel yet; kernels/sampling.cc).
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0 or NaN = greedy (argmax, lowest id on ties)
  int64_t top_k = 0;         // 0 = no limit
  float top_p = 1.0f;        // in (0, 1]; 1 = no limit
};

// splitmix64-seeded xoshiro256**; the same seed gives the same draws anywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  // The generator for the token a sequence samples at `position` (its length
  // before that token): counter-based, so a draw depends on (seed, position)
  // alone and a sequence re-run from its tokens so far (a lost worker's
  // request, re-prefilled on another replica) draws what it would have.
  static Rng ForPosition(uint64_t seed, int64_t position);
  uint64_t Next();
  double Uniform();  // in [0, 1), 53 random bits
 private:
  uint64_t s_[4];
};

// The distribution Sample draws from: softmax(logits / temperature) restricted
// to the top_k highest logits, then to the smallest set of highest
// probabilities whose sum reaches top_p, renormalised. logits: f32
// [1, vocab], vocab >= 1; probs: f64 [1, vocab].
// Greedy (temperature 0) gives a one-hot distribution.
//
// A model's logits should be finite, and the engine refuses rows that are not
// before sampling, but any input gives a distribution and an id in [0, vocab)
// with no access out of range: NaN counts as -infinity, and when the highest
// (scaled) logit is infinite (some +inf, or all -inf) the tokens at that value
// share the mass equally, the softmax's limit.
void SamplingDistribution(const Tensor& logits, const SamplingParams& params,
                          const MutableTensor& probs);

// Draws one token id from SamplingDistribution(...), advancing rng once
// (greedy does not touch rng).
int32_t Sample(const Tensor& logits, const SamplingParams& params, Rng& rng);

}  // namespace deltaserve::kernels
