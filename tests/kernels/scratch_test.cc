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

TEST(ScratchTest, AfterAStepItsBuffersComeFromOneRegionOfItsPeak) {
  OnFreshThread([] {
    {
      ScratchFloats a(1 << 18);  // the first step: separate allocations
      { ScratchFloats b(1 << 16); }
      ScratchFloats c(1 << 17);
    }
    const ScratchStats first = ThisThreadScratchStats();
    EXPECT_EQ(first.in_use_bytes, 0u);
    EXPECT_EQ(first.peak_in_use_bytes, size_t{4} * ((1 << 18) + (1 << 17)));
    // The next step: one region of that peak, as a stack.
    ScratchFloats a(1 << 18);
    ScratchFloats c(1 << 17);
    EXPECT_EQ(c.data(), a.data() + (1 << 18));
    EXPECT_EQ(ThisThreadScratchStats().held_bytes, first.peak_in_use_bytes);
    ScratchFloats over(1 << 10);  // past the region: a separate allocation
    EXPECT_NE(over.data(), c.data() + (1 << 17));
  });
}

TEST(ScratchTest, ABufferDroppedOutOfOrderIsReusedOnceThoseAboveItGo) {
  OnFreshThread([] {
    { ScratchFloats warm(1 << 16); }
    { ScratchFloats grow(1 << 10); }  // the region is made here, at the peak
    float* base = nullptr;
    {
      ScratchFloats a(1000), b(1000);  // 4,000 bytes: 4,032 with rounding
      base = a.data();
      a = ScratchFloats();  // not the top: stays until b goes
      const ScratchFloats c(1000);
      EXPECT_EQ(c.data(), b.data() + 1008);  // above b
    }
    EXPECT_EQ(ThisThreadScratchStats().in_use_bytes, 0u);
    const ScratchFloats again(1000);
    EXPECT_EQ(again.data(), base);
  });
}

TEST(ScratchTest, BuffersAreAligned) {
  for (int64_t n : {1, 3, 17, 1000, 123457}) {
    const ScratchFloats s(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 64, 0u) << n;
    for (float& x : s) x = 7.0f;
  }
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
