// The scratch pool (kernels/scratch.h): after the first step buffers come
// from one region of the peak in use, as a stack; buffers are aligned and may
// be moved or dropped on another thread; under AddressSanitizer an overrun or
// a read of a dropped buffer is reported.
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
    EXPECT_EQ(first.peak_in_use_bytes,
              size_t{4} * ((1 << 18) + (1 << 17)) + 2 * kScratchRedzoneBytes);
    // The next step: one region of that peak, as a stack.
    ScratchFloats a(1 << 18);
    ScratchFloats c(1 << 17);
    EXPECT_EQ(c.data(), a.data() + (1 << 18) + kScratchRedzoneBytes / 4);
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
      EXPECT_EQ(c.data(), b.data() + 1008 + kScratchRedzoneBytes / 4);  // above b
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

#if DELTASERVE_ASAN
// Without the poisoning, both would go unnoticed: the bytes past a buffer
// are the next buffer's or the region's free part, and a dropped buffer's
// bytes stay mapped.
TEST(ScratchDeathTest, AnOverrunOrAReadOfADroppedBufferIsReportedUnderAsan) {
  // Each on a thread of its own: the first buffer is a separate allocation,
  // the ones after it come from the region made at its size.
  const auto overrun = [] {
    OnFreshThread([] {
      { ScratchFloats warm(1 << 12); }
      ScratchFloats a(1000), b(1000);
      volatile float* p = a.data();
      p[1000] = 1.0f;  // one past the request: rounding slack, then b
    });
  };
  EXPECT_DEATH(overrun(), "use-after-poison");
  const auto into_next = [] {
    OnFreshThread([] {
      { ScratchFloats warm(1 << 12); }
      ScratchFloats a(1024), b(1024);  // a ends on the alignment: the red zone follows
      volatile float* p = a.data();
      p[1024 + 15] = 1.0f;
    });
  };
  EXPECT_DEATH(into_next(), "use-after-poison");
  const auto dropped = [] {
    OnFreshThread([] {
      { ScratchFloats warm(1 << 12); }
      float* stale = nullptr;
      {
        ScratchFloats a(1000);
        stale = a.data();
      }
      volatile float* p = stale;
      static_cast<void>(p[0]);
    });
  };
  EXPECT_DEATH(dropped(), "use-after-poison");
}
#endif

}  // namespace
}  // namespace deltaserve::kernels
