// Blocks of a parallel loop shared out so that each thread streams a
// contiguous share of memory and no thread waits while another has blocks
// left. In the level's namespace, as kernels/cpu/dispatch.h requires of
// inline code here.
//
// A decode step's weight-bound loops (the skinny GEMM's blocks of W rows, the
// MoE's blocks of expert rows) read each block once, from memory, in order;
// the hardware prefetchers follow a thread's stream only while it stays
// sequential. A static schedule keeps the streams but lets the threads end
// apart: on a 2-core KVM guest, equal shares of 17 us of the same work ended
// 2.5-4 us apart, and every region waits for its slowest thread. A dynamic
// schedule balances the threads but hands out blocks in turn, so no thread's
// blocks are contiguous; measured 4-7% slower.
// Here thread t works its static share from the front and, done with it,
// takes blocks one at a time from the back of the other shares, so the
// streams stay contiguous until the last few blocks.
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "kernels/check.h"
#include "kernels/cpu/dispatch.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {

// fn(b) for every b in [0, blocks), each exactly once, on the OpenMP team
// when parallel (else in order on the calling thread). Any team size is
// correct: a share whose thread is not in the team is taken from its back.
template <typename F>
void ForEachBlockBalanced(int64_t blocks, bool parallel, F&& fn) {
  DELTASERVE_CHECK(blocks >= 0 && blocks < (int64_t{1} << 31));
  const int shares = parallel && blocks > 1 ? omp_get_max_threads() : 1;
  if (shares == 1) {
    for (int64_t b = 0; b < blocks; ++b) fn(b);
    return;
  }
  // A share's next block from the front (low 32 bits) and its end (high 32
  // bits) in one word, so that taking from either end is one exchange.
  struct alignas(64) Share {
    std::atomic<uint64_t> range;
  };
  std::vector<Share> share(static_cast<size_t>(shares));
  for (int s = 0; s < shares; ++s) {
    const uint64_t b0 = static_cast<uint64_t>(blocks * s / shares);
    const uint64_t b1 = static_cast<uint64_t>(blocks * (s + 1) / shares);
    share[s].range.store(b0 | (b1 << 32), std::memory_order_relaxed);
  }
  // The next block of a share, from its front or its back; -1 when empty.
  const auto take = [&share](int s, bool front) -> int64_t {
    uint64_t range = share[s].range.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t b0 = range & 0xffffffffu, b1 = range >> 32;
      if (b0 >= b1) return -1;
      const uint64_t next = front ? (b0 + 1) | (b1 << 32) : b0 | ((b1 - 1) << 32);
      if (share[s].range.compare_exchange_weak(range, next, std::memory_order_relaxed)) {
        return static_cast<int64_t>(front ? b0 : b1 - 1);
      }
    }
  };
#pragma omp parallel num_threads(shares)
  {
    const int t = omp_get_thread_num();
    for (int64_t b; (b = take(t, true)) >= 0;) fn(b);
    for (int other = 1; other < shares; ++other) {
      const int s = (t + other) % shares;
      for (int64_t b; (b = take(s, false)) >= 0;) fn(b);
    }
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
