// What the benchmark programs measure a machine's memory by (model_bench,
// moe_bench): the seconds between two clock readings, and the read bandwidth
// that their "of read bandwidth" figures divide by.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/workspace.h"

namespace deltaserve::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The best of five threaded sums over 512 MiB, in bytes per second: the read
// bandwidth the "of read bandwidth" figures divide by. huge_pages: over memory
// on transparent huge pages (kernels::HugePageRegion, as the CPU weights are
// held), else over 4 KiB pages, where on a virtual machine the address
// translations can cost almost half of it.
inline double ReadBandwidth(bool huge_pages = true) {
  const size_t n = size_t{1} << 27;  // 512 MiB of floats
  std::shared_ptr<uint8_t> region = kernels::HugePageRegion(n * sizeof(float));
  if (region == nullptr) return 0;
  if (!huge_pages) ::madvise(region.get(), n * sizeof(float), MADV_NOHUGEPAGE);
  float* const a = reinterpret_cast<float*>(region.get());
  std::fill(a, a + n, 1.0f);
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp parallel for reduction(+ : s0, s1, s2, s3)
    for (size_t i = 0; i < n; i += 4) {
      s0 += a[i];
      s1 += a[i + 1];
      s2 += a[i + 2];
      s3 += a[i + 3];
    }
    sink = s0 + s1 + s2 + s3;
    best = std::max(best, n * sizeof(float) / Seconds(t0, Clock::now()));
  }
  (void)sink;
  return best;
}

// Reads a cache line of every 64 bytes of [data, data + bytes) on all
// threads, untimed: memory a benchmark has just written and is about to time
// reads of. On the KVM guest of docs/performance.md the first pass of reads
// over freshly written weights ran at 60-70% of the rate of every pass after
// it (k3-moe-small's experts in bench/moe_bench, bf16 and MXFP4 alike), and
// a pass like this one, 0.08 s for 1.2 GB, took that away: what follows then
// times the steady state a serving process reaches.
inline void ReadOnce(const uint8_t* data, size_t bytes) {
  uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum)
  for (size_t i = 0; i < bytes; i += 64) sum += data[i];
  volatile uint64_t sink = sum;
  (void)sink;
}

}  // namespace deltaserve::bench
