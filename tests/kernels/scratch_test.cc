// The scratch pool (kernels/scratch.h): blocks come back for requests that
// fit them, free bytes stay bounded by the peak in use, buffers are aligned
// and may be moved or dropped on another thread.
#include "kernels/scratch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <utility>

namespace deltaserve::kernels {
namespace {

// Runs `body` on a thread of its own, whose pool starts empty.
template <typename F>
void OnFreshThread(F body) {
  std::thread(body).join();
}

TEST(ScratchTest, AReleasedBlockServesTheNextRequestThatFitsIt) {
  OnFreshThread([] {
    float* first = nullptr;
    {
      ScratchFloats a(1 << 20);
      first = a.data();
      a[0] = 1.0f;
      a[a.size() - 1] = 2.0f;
    }
    const ScratchFloats same(1 << 20);
    EXPECT_EQ(same.data(), first);
    const ScratchFloats smaller((1 << 19) + 1);  // over half: would reuse, but it is taken
    EXPECT_NE(smaller.data(), first);
  });
}

TEST(ScratchTest, ABlockOverTwiceTheRequestIsNotUsed) {
  OnFreshThread([] {
    float* big = nullptr;
    {
      const ScratchFloats a(1 << 20);
      big = a.data();
    }
    const ScratchFloats small(1000);
    EXPECT_NE(small.data(), big);
    const ScratchFloats half(1 << 19);
    EXPECT_EQ(half.data(), big);
  });
}

TEST(ScratchTest, FreeBytesStayWithinThePeakInUse) {
  OnFreshThread([] {
    {
      ScratchFloats a(1 << 18), b(1 << 18);  // 2 MiB in use at once
    }
    for (int64_t n = 1 << 10; n <= (1 << 17); n *= 2) {
      const ScratchFloats each(n);  // a new size each time: none reuses a block
    }
    const ScratchStats stats = ThisThreadScratchStats();
    EXPECT_EQ(stats.in_use_bytes, 0u);
    EXPECT_EQ(stats.peak_in_use_bytes, size_t{2} << 20);
    EXPECT_LE(stats.held_bytes, stats.peak_in_use_bytes);
    EXPECT_GT(stats.held_bytes, 0u);
  });
}

TEST(ScratchTest, BuffersAreAlignedAndZeroedWhenAsked) {
  for (int64_t n : {1, 3, 17, 1000, 123457}) {
    const ScratchFloats s(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 64, 0u) << n;
    for (float& x : s) x = 7.0f;
  }
  const ScratchFloats z = ScratchFloats::Zeroed(123457);
  for (int64_t i = 0; i < z.size(); ++i) ASSERT_EQ(z[i], 0.0f) << i;
  const Scratch<uint16_t> empty(0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0);
}

TEST(ScratchTest, MovedAndCrossThreadBuffersReturnToTheirPool) {
  ScratchFloats a(4096);
  float* data = a.data();
  ScratchFloats b = std::move(a);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(a.data(), nullptr);
  // Made on another thread, which then ends: its pool lives while the buffer does.
  ScratchFloats from_thread;
  std::thread([&] { from_thread = ScratchFloats(1 << 16); }).join();
  for (float& x : from_thread) x = 1.0f;
  from_thread = ScratchFloats();  // back to the ended thread's pool, which then goes
  EXPECT_EQ(from_thread.data(), nullptr);
}

}  // namespace
}  // namespace deltaserve::kernels
