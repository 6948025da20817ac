// tests/kernels/device_test_util.h: guard bands catch a write just outside
// a buffer, on either side, and leave the body as the kernel wrote it, on
// each device.
#include "tests/kernels/device_test_util.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"

namespace deltaserve::kernels {
namespace {

using testing::DeviceTest;
using testing::GuardedBuffer;

class GuardedBufferTest : public DeviceTest {};

TEST_P(GuardedBufferTest, FreshBufferIsPoisonedAndIntact) {
  auto f = Output<float>(10);
  for (float v : f.Values()) EXPECT_TRUE(std::isnan(v));
  EXPECT_TRUE(f.GuardsIntact());
  auto h = Output<uint16_t>(3);
  for (uint16_t v : h.Values()) EXPECT_EQ(v, 0x7fc0);
  auto i = Output<int32_t>(3);
  for (int32_t v : i.Values()) EXPECT_EQ(v, INT32_MIN);
  auto d = Output<double>(3);
  for (double v : d.Values()) EXPECT_TRUE(std::isnan(v));
  EXPECT_TRUE(h.GuardsIntact() && i.GuardsIntact() && d.GuardsIntact());
}

TEST_P(GuardedBufferTest, WritesInsideKeepTheGuards) {
  auto f = Output<float>(7);
  const MutableTensor v = f.View(7, 1);
  EXPECT_EQ(v.device, device());
  EXPECT_EQ(v.dtype, DType::kF32);
  for (int64_t k = 0; k < 7; ++k) f.data()[k] = static_cast<float>(k);
  f.Upload();
  EXPECT_TRUE(f.GuardsIntact());
  EXPECT_EQ(f.Values()[6], 6.0f);
}

TEST_P(GuardedBufferTest, CatchesOnePastTheEnd) {
  auto f = Output<float>(16);
  f.data()[16] = 0.0f;
  f.Upload();
  const ::testing::AssertionResult intact = f.GuardsIntact();
  EXPECT_FALSE(intact);
  EXPECT_NE(std::string(intact.message()).find("1 past the end"), std::string::npos)
      << intact.message();
}

TEST_P(GuardedBufferTest, CatchesOneBeforeTheStart) {
  auto f = Output<float>(16);
  f.data()[-1] = 1.0f;
  f.Upload();
  const ::testing::AssertionResult intact = f.GuardsIntact();
  EXPECT_FALSE(intact);
  EXPECT_NE(std::string(intact.message()).find("1 before the start"), std::string::npos)
      << intact.message();
}

TEST_P(GuardedBufferTest, CatchesFarWritesAndOtherTypes) {
  auto i = Output<int32_t>(5);
  i.data()[5 + GuardedBuffer<int32_t>::kGuard - 1] = 0;  // the last guard element
  i.Upload();
  EXPECT_FALSE(i.GuardsIntact());
  auto h = Output<uint16_t>(5);
  h.data()[-GuardedBuffer<uint16_t>::kGuard] = 0x7fc0;  // the first, with a NaN
  h.Upload();
  EXPECT_FALSE(h.GuardsIntact());
  auto d = Output<double>(0);  // an empty body: the two bands touch
  d.data()[0] = 0.0;
  d.Upload();
  EXPECT_FALSE(d.GuardsIntact());
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(GuardedBufferTest);

}  // namespace
}  // namespace deltaserve::kernels
