#include "kernels/reference/sampling_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace deltaserve::kernels::ref {
namespace {

// NaN orders and weighs as -infinity.
std::vector<double> Keys(const double* logits, int64_t vocab) {
  std::vector<double> keys(logits, logits + vocab);
  for (double& k : keys) {
    if (std::isnan(k)) k = -std::numeric_limits<double>::infinity();
  }
  return keys;
}

int32_t Argmax(const double* logits, int64_t vocab) {
  const std::vector<double> keys = Keys(logits, vocab);
  return static_cast<int32_t>(std::max_element(keys.begin(), keys.end()) - keys.begin());
}

void Renormalise(double* probs, int64_t vocab) {
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += probs[i];
  for (int64_t i = 0; i < vocab; ++i) probs[i] /= sum;
}

}  // namespace

void SamplingDistribution(const double* logits, int64_t vocab, const SamplingParams& params,
                          double* probs) {
  if (!(params.temperature > 0.0f)) {
    for (int64_t i = 0; i < vocab; ++i) probs[i] = 0.0;
    probs[Argmax(logits, vocab)] = 1.0;
    return;
  }
  const std::vector<double> keys = Keys(logits, vocab);
  const double temperature = params.temperature;
  std::vector<double> z(vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    z[i] = std::isinf(keys[i]) ? keys[i] : keys[i] / temperature;
  }
  const double zmax = *std::max_element(z.begin(), z.end());
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isinf(zmax)) {
      probs[i] = z[i] == zmax ? 1.0 : 0.0;  // the limit of the softmax
    } else {
      probs[i] = std::exp(z[i] - zmax);
    }
  }
  Renormalise(probs, vocab);

  std::vector<int32_t> ids(vocab);
  if (params.top_k > 0 && params.top_k < vocab) {
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(),
                     [&keys](int32_t a, int32_t b) { return keys[a] > keys[b]; });
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
  if (!(params.temperature > 0.0f)) return Argmax(logits, vocab);
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
