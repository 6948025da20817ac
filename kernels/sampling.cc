// Entry point of kernels/sampling.h: the generator, the contract, then the
// CPU variant of this machine's level.
#include "kernels/sampling.h"

#include <cstdint>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {
namespace {

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : s_) s = SplitMix64(seed);
}

Rng Rng::ForPosition(uint64_t seed, int64_t position) {
  uint64_t counter = static_cast<uint64_t>(position);
  return Rng(seed ^ SplitMix64(counter));
}

// xoshiro256** (Blackman and Vigna).
uint64_t Rng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

void SamplingDistribution(const Tensor& logits, const SamplingParams& params,
                          const MutableTensor& probs) {
  const int64_t vocab = logits.cols;
  DELTASERVE_CHECK(vocab > 0);
  DELTASERVE_CHECK_VIEW(logits, DType::kF32, 1, vocab);
  DELTASERVE_CHECK_VIEW(probs, DType::kF64, 1, vocab);
  DELTASERVE_CHECK(!Overlaps(logits, probs));
  DELTASERVE_CPU_DISPATCH(SamplingDistribution)
  (logits.As<float>(), vocab, params, probs.As<double>());
}

int32_t Sample(const Tensor& logits, const SamplingParams& params, Rng& rng) {
  const int64_t vocab = logits.cols;
  DELTASERVE_CHECK(vocab > 0);
  DELTASERVE_CHECK_VIEW(logits, DType::kF32, 1, vocab);
  return DELTASERVE_CPU_DISPATCH(Sample)(logits.As<float>(), vocab, params, rng);
}

}  // namespace deltaserve::kernels
