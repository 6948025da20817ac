// kernels/workspace.h: buffers from the device's caching allocator, reused by
// size class and bounded; temporaries from the scratch stack; the sync
// point's error report.
#include "kernels/workspace.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/device_test_util.h"

namespace deltaserve::kernels {
namespace {

class WorkspaceTest : public testing::DeviceTest {};

TEST_P(WorkspaceTest, AFreedBufferServesTheNextOfItsSizeClass) {
  Workspace& ws = Workspace::Of(GetParam());
  const void* first;
  {
    const Buffer a(GetParam(), DType::kF32, 100, 1000);  // 400,000 bytes
    first = a.view().data;
    EXPECT_EQ(a.bytes(), 400000u);
    EXPECT_EQ(a.view().rows, 100);
    EXPECT_EQ(a.view().cols, 1000);
    EXPECT_EQ(a.view().device, GetParam());
  }
  const Workspace::Stats before = ws.stats();
  // 99 rows instead of 100: the same size class (classes are 2^16 wide here).
  const Buffer b(GetParam(), DType::kF32, 99, 1000);
  EXPECT_EQ(b.view().data, first);
  EXPECT_EQ(ws.stats().reuses, before.reuses + 1);
  EXPECT_EQ(ws.stats().allocations, before.allocations);
}

TEST_P(WorkspaceTest, BuffersMoveAndGiveTheirBytesBack) {
  Workspace& ws = Workspace::Of(GetParam());
  const size_t in_use = ws.stats().in_use_bytes;
  {
    Buffer a(GetParam(), DType::kBF16, 3, 5);
    EXPECT_GT(ws.stats().in_use_bytes, in_use);
    Buffer b = std::move(a);
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(b.bytes(), 30u);
    a = std::move(b);
    EXPECT_EQ(a.rows(), 3);
  }
  EXPECT_EQ(ws.stats().in_use_bytes, in_use);
  // An empty buffer holds nothing.
  const Buffer none(GetParam(), DType::kF32, 0, 7);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(ws.stats().in_use_bytes, in_use);
}

TEST_P(WorkspaceTest, TempsAreViewsOfTheScratchStack) {
  const ScratchStats before = ThisThreadScratchStats();
  {
    const Temp t(GetParam(), DType::kF32, 4, 8);
    const MutableTensor v = t;
    EXPECT_EQ(v.rows, 4);
    EXPECT_EQ(v.cols, 8);
    EXPECT_NE(v.data, nullptr);
    EXPECT_GE(ThisThreadScratchStats().in_use_bytes, before.in_use_bytes + 128);
  }
  EXPECT_EQ(ThisThreadScratchStats().in_use_bytes, before.in_use_bytes);
}

TEST_P(WorkspaceTest, SynchronizeReturnsTheFirstReportedErrorOnce) {
  Workspace& ws = Workspace::Of(GetParam());
  EXPECT_TRUE(ws.Synchronize().ok());
  ws.ReportError("KdaChunk", "illegal address");
  ws.ReportError("Linear", "a later failure");
  const DeviceError error = ws.Synchronize();
  EXPECT_EQ(error.op, "KdaChunk");
  EXPECT_EQ(error.message, "illegal address");
  EXPECT_TRUE(ws.Synchronize().ok());
}

DELTASERVE_INSTANTIATE_CPU_TEST(WorkspaceTest);

}  // namespace
}  // namespace deltaserve::kernels
