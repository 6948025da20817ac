#include "kernels/reference/sampling_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace deltaserve::kernels::ref {
namespace {

int32_t Argmax(const double* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

void Renormalise(double* probs, int64_t vocab) {
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += probs[i];
  for (int64_t i = 0; i < vocab; ++i) probs[i] /= sum;
}

}  // namespace

void SamplingDistribution(const double* logits, int64_t vocab, const SamplingParams& params,
                          double* probs) {
  if (params.temperature <= 0.0f) {
    for (int64_t i = 0; i < vocab; ++i) probs[i] = 0.0;
    probs[Argmax(logits, vocab)] = 1.0;
    return;
  }
  const double temperature = params.temperature;
  double zmax = logits[0] / temperature;
  for (int64_t i = 1; i < vocab; ++i) zmax = std::max(zmax, logits[i] / temperature);
  for (int64_t i = 0; i < vocab; ++i) {
    probs[i] = std::exp(logits[i] / temperature - zmax);
  }
  Renormalise(probs, vocab);

  std::vector<int32_t> ids(vocab);
  if (params.top_k > 0 && params.top_k < vocab) {
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(),
                     [logits](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (int64_t r = params.top_k; r < vocab; ++r) probs[ids[r]] = 0.0;
    Renormalise(probs, vocab);
  }

  if (params.top_p < 1.0f) {
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(),
                     [probs](int32_t a, int32_t b) { return probs[a] > probs[b]; });
    const double top_p = params.top_p;
    double cum = 0.0;
    int64_t keep = 0;
    // At least one token, whatever top_p.
    while (keep < vocab && (keep == 0 || cum < top_p)) cum += probs[ids[keep++]];
    for (int64_t r = keep; r < vocab; ++r) probs[ids[r]] = 0.0;
    Renormalise(probs, vocab);
  }
}

int32_t Sample(const double* logits, int64_t vocab, const SamplingParams& params, Rng& rng) {
  if (params.temperature <= 0.0f) return Argmax(logits, vocab);
  std::vector<double> probs(vocab);
  SamplingDistribution(logits, vocab, params, probs.data());
  double total = 0.0;
  for (double p : probs) total += p;
  const double target = rng.Uniform() * total;
  double cum = 0.0;
  int32_t last = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (probs[i] <= 0.0) continue;
    cum += probs[i];
    last = static_cast<int32_t>(i);
    if (target < cum) return last;
  }
  return last;  // target rounded past the last kept token
}

}  // namespace deltaserve::kernels::ref
