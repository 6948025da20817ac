// kernels/cpu/balanced_blocks.h: every block runs exactly once whatever the
// team, in order when serial, and a thread held up in its share does not hold
// up the share's other blocks.
#include "kernels/cpu/balanced_blocks.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// How many times each block ran.
std::vector<int> Runs(int64_t blocks, bool parallel) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(blocks));
  ForEachBlockBalanced(blocks, parallel, [&](int64_t b) { runs[b].fetch_add(1); });
  std::vector<int> out;
  for (const auto& r : runs) out.push_back(r.load());
  return out;
}

class TeamSize {
 public:
  explicit TeamSize(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~TeamSize() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

TEST(BalancedBlocksTest, EveryBlockRunsOnceForEveryTeamSize) {
  for (const int threads : {1, 2, 3, 4, 7}) {
    const TeamSize team(threads);
    for (const int64_t blocks : {0, 1, 2, 3, 5, 8, 63, 1000}) {
      EXPECT_EQ(Runs(blocks, true), std::vector<int>(blocks, 1))
          << blocks << " blocks, " << threads << " threads";
    }
  }
}

TEST(BalancedBlocksTest, InsideAnotherRegionTheLoneThreadRunsEveryShare) {
  const TeamSize team(2);
  std::vector<std::vector<int>> runs(2);
#pragma omp parallel num_threads(2)
  runs[omp_get_thread_num()] = Runs(37, true);  // nested: a team of one, two shares
  for (const auto& r : runs) {
    if (!r.empty()) {
      EXPECT_EQ(r, std::vector<int>(37, 1));
    }
  }
}

TEST(BalancedBlocksTest, SerialRunsTheBlocksInOrderOnTheCallingThread) {
  const TeamSize team(4);
  std::vector<int64_t> order;
  ForEachBlockBalanced(9, false, [&](int64_t b) {
    EXPECT_EQ(omp_get_thread_num(), 0);
    order.push_back(b);
  });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
}

// The thread whose share holds block 0 waits in it until the last block of
// that share has run; only another thread can run it. Without taking from
// the back of a share this never ends, and the wait gives up after 30 s.
TEST(BalancedBlocksTest, AThreadHeldInItsShareDoesNotHoldUpTheRestOfIt) {
  const TeamSize team(2);
  constexpr int64_t kBlocks = 16;  // shares [0, 8) and [8, 16)
  std::atomic<bool> last_of_share_ran{false};
  std::atomic<int> runs{0};
  bool waited_out = false;
  ForEachBlockBalanced(kBlocks, true, [&](int64_t b) {
    runs.fetch_add(1);
    if (b == kBlocks / 2 - 1) last_of_share_ran.store(true);
    if (b != 0) return;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!last_of_share_ran.load()) {
      if (std::chrono::steady_clock::now() > give_up) {
        waited_out = true;
        return;
      }
      std::this_thread::yield();
    }
  });
  EXPECT_FALSE(waited_out);
  EXPECT_EQ(runs.load(), kBlocks);
}

}  // namespace
}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
