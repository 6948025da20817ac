// Sampling on the CPU. For a ~160k vocabulary the work is one pass of exps
// over the kept tokens; top-k is an nth_element, and top-p sorts only the
// tokens near and above its cut (a mass histogram finds it), not the whole
// vocabulary.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/sampling.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// The value a logit is ordered and weighed by: NaN counts as -infinity, so
// every comparison below is a strict total order (std::sort and nth_element
// may run out of range under one that is not).
double Key(float logit) {
  return std::isnan(logit) ? -std::numeric_limits<double>::infinity() : logit;
}

// Lowest id among the maxima.
int32_t Argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (Key(logits[i]) > Key(logits[best])) best = i;
  }
  return static_cast<int32_t>(best);
}

// A candidate token: its logit, then its probability.
struct Entry {
  double p;
  int32_t id;
};

// Higher value first, lower id on ties: a strict total order, so every cut
// below is unique.
bool Before(const Entry& a, const Entry& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); }

void Renormalise(std::vector<Entry>& kept) {
  double sum = 0.0;
  for (const Entry& e : kept) sum += e.p;
  for (Entry& e : kept) e.p /= sum;
}

// Exponent and top two mantissa bits of a probability in [0, 1]: monotone in
// p, at most 4093 values, a bucket never spans more than a factor 1.25.
// KeptDistribution's probabilities are in [0, 1] for any input; the clamp
// keeps an index in range even if that ever stopped being so.
constexpr int kBucketShift = 50;
constexpr size_t kBuckets = (size_t{0x3ff} << 2) + 1;
size_t Bucket(double p) {
  return std::min<size_t>(std::bit_cast<uint64_t>(p) >> kBucketShift, kBuckets - 1);
}

// Keeps the smallest prefix of `kept` in Before order whose probabilities sum
// to top_p, in that order. A histogram of probability mass by Bucket finds the
// bucket where the sum reaches top_p in one pass; only the tokens from that
// bucket up are sorted (the nucleus and a little more, not the vocabulary).
// The histogram sums in another order than the walk, so rounding may move
// the exact cut below that bucket: then the rest is sorted and walked too.
void KeepNucleus(std::vector<Entry>& kept, double top_p) {
  std::vector<double> mass(kBuckets, 0.0);
  for (const Entry& e : kept) mass[Bucket(e.p)] += e.p;
  size_t cut = 0;
  double sum = 0.0;
  for (size_t b = kBuckets; b-- > 0;) {
    sum += mass[b];
    if (sum >= top_p) {
      cut = b;
      break;
    }
  }
  const auto head_end = std::partition(kept.begin(), kept.end(),
                                       [cut](const Entry& e) { return Bucket(e.p) >= cut; });
  std::sort(kept.begin(), head_end, Before);
  double cum = 0.0;
  for (auto it = kept.begin(); it != kept.end(); ++it) {
    if (it == head_end) std::sort(head_end, kept.end(), Before);
    cum += it->p;
    if (cum >= top_p) {  // at least one token, whatever top_p
      kept.erase(it + 1, kept.end());
      return;
    }
  }
}

// The tokens SamplingDistribution keeps, in ascending id, with their
// renormalised probabilities.
std::vector<Entry> KeptDistribution(const float* logits, int64_t vocab,
                                    const SamplingParams& params) {
  std::vector<Entry> kept(vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    kept[i] = {Key(logits[i]), static_cast<int32_t>(i)};
  }
  bool id_order = true;
  // top_k: the k highest logits (an nth_element, O(vocab)). The softmax then
  // runs over the kept tokens only: the same renormalised values as a full
  // softmax restricted afterwards.
  if (params.top_k > 0 && params.top_k < vocab) {
    std::nth_element(kept.begin(), kept.begin() + params.top_k, kept.end(), Before);
    kept.resize(params.top_k);
    id_order = false;
  }
  const double temperature = params.temperature;
  double zmax = -std::numeric_limits<double>::infinity();
  for (Entry& e : kept) {
    if (std::isfinite(e.p)) e.p /= temperature;  // inf / inf would be NaN
    zmax = std::max(zmax, e.p);
  }
  // An infinite maximum (every logit -inf or NaN, or some +inf): the tokens
  // at it share the mass, the softmax's limit. Either way the weights are
  // finite, in [0, 1], and at least one is 1, so the sum is >= 1.
  for (Entry& e : kept) e.p = std::isinf(zmax) ? (e.p == zmax ? 1.0 : 0.0) : std::exp(e.p - zmax);
  Renormalise(kept);
  // top_p applies to the top_k-renormalised distribution (as in HF / vLLM).
  if (params.top_p < 1.0f) {
    KeepNucleus(kept, params.top_p);
    Renormalise(kept);
    id_order = false;
  }
  if (!id_order) {
    std::sort(kept.begin(), kept.end(), [](const Entry& a, const Entry& b) { return a.id < b.id; });
  }
  return kept;
}

}  // namespace

void SamplingDistribution(const float* logits, int64_t vocab, const SamplingParams& params,
                          double* probs) {
  std::fill(probs, probs + vocab, 0.0);
  if (!(params.temperature > 0.0f)) {
    probs[Argmax(logits, vocab)] = 1.0;
    return;
  }
  for (const Entry& e : KeptDistribution(logits, vocab, params)) probs[e.id] = e.p;
}

int32_t Sample(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng) {
  if (!(params.temperature > 0.0f)) return Argmax(logits, vocab);
  const std::vector<Entry> kept = KeptDistribution(logits, vocab, params);
  // Inverse CDF over the kept tokens in ascending id; scaling u by the actual
  // total keeps rounding from running past the last token.
  double total = 0.0;
  for (const Entry& e : kept) total += e.p;
  const double target = rng.Uniform() * total;
  double cum = 0.0;
  int32_t last = kept.front().id;
  for (const Entry& e : kept) {
    if (e.p <= 0.0) continue;
    cum += e.p;
    last = e.id;
    if (target < cum) return last;
  }
  return last;
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
