// Entry point of kernels/sampling.h: the generator, the contract, then the
// CPU variant of this machine's level. A row on the CUDA device is copied to
// the host and sampled there by that same variant (and a distribution copied
// back): one row of logits per sequence and step, ~640 KB at K3's vocabulary,
// which the design allows ("with only the rows that need it copied back");
// it keeps the draws bit for bit those of the CPU. No device kernel yet.
#include "kernels/sampling.h"

#include <cstdint>
#include <vector>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {
namespace {

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The row of a device's logits view on the host.
std::vector<float> ToHost(const Tensor& logits) {
  std::vector<float> host(static_cast<size_t>(logits.cols));
  Workspace::Of(logits.device).CopyToHost(host.data(), logits.data, host.size() * sizeof(float));
  return host;
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
  const Device device = DELTASERVE_OP_DEVICE(probs);
  DELTASERVE_CHECK_VIEW_ON(device, logits, DType::kF32, 1, vocab);
  DELTASERVE_CHECK_VIEW_ON(device, probs, DType::kF64, 1, vocab);
  DELTASERVE_CHECK(!Overlaps(logits, probs));
  if (device == Device::kCuda) {
    const std::vector<float> host = ToHost(logits);
    std::vector<double> out(static_cast<size_t>(vocab));
    DELTASERVE_CPU_DISPATCH(SamplingDistribution)(host.data(), vocab, params, out.data());
    // A copy from pageable memory has staged `out` when it returns.
    Workspace::Of(device).CopyFromHost(probs.data, out.data(), out.size() * sizeof(double));
    return;
  }
  DELTASERVE_CPU_DISPATCH(SamplingDistribution)
  (logits.As<float>(), vocab, params, probs.As<double>());
}

int32_t Sample(const Tensor& logits, const SamplingParams& params, Rng& rng) {
  const int64_t vocab = logits.cols;
  DELTASERVE_CHECK(vocab > 0);
  const Device device = DELTASERVE_OP_DEVICE(logits);
  DELTASERVE_CHECK_VIEW_ON(device, logits, DType::kF32, 1, vocab);
  if (device == Device::kCuda) {
    const std::vector<float> host = ToHost(logits);
    return DELTASERVE_CPU_DISPATCH(Sample)(host.data(), vocab, params, rng);
  }
  return DELTASERVE_CPU_DISPATCH(Sample)(logits.As<float>(), vocab, params, rng);
}

}  // namespace deltaserve::kernels
