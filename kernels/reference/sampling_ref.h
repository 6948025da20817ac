// Float64 reference for kernels/sampling.h: the same distribution built the
// plain way (full softmax, full sorts).
#pragma once

#include <cstdint>

#include "kernels/sampling.h"

namespace deltaserve::kernels::ref {

// softmax(logits / temperature) over the whole vocabulary; keep the top_k
// highest logits (ties: lower id) and renormalise; keep the smallest prefix of
// that, sorted by probability descending (ties: lower id), whose sum reaches
// top_p, and renormalise. Temperature <= 0 or NaN: one-hot at the argmax
// (lowest id). Non-finite logits as kernels/sampling.h says: NaN is -infinity,
// and an infinite maximum shares the mass among the tokens at it.
void SamplingDistribution(const double* logits, int64_t vocab, const SamplingParams& params,
                          double* probs);

// Greedy: argmax without touching rng. Else one rng.Uniform() u and the first
// id, in ascending id order, whose cumulative probability exceeds u·total.
int32_t Sample(const double* logits, int64_t vocab, const SamplingParams& params, Rng& rng);

}  // namespace deltaserve::kernels::ref
