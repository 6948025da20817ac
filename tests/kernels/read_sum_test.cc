// ReadSum (kernels/cuda/ops.h), the benchmarks' read-bandwidth kernel: it
// must read every float once and add their sum to *sum. CUDA only (it has no
// CPU variant): on the SIMT harness (cuda-sim) and on a GPU (gpu).
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"
#include "tests/kernels/device_test_util.h"

namespace deltaserve::kernels {
namespace {

class ReadSumTest : public testing::DeviceTestWithParam<int64_t> {};

// Zeros and ones, so that every partial sum and the total are exact in
// float whatever the order (below 2^24), and the result is compared exactly:
// a float read twice or not at all changes it. Sizes: a single float, a
// ragged tail, and more than one full stride of the grid (1056 blocks of
// 256 threads, 4 floats each), so threads loop.
TEST_P(ReadSumTest, AddsTheSumOfEveryFloatOnce) {
  const int64_t n = Param();
  std::vector<float> x(static_cast<size_t>(n));
  double want = 0.5;  // what *sum held before
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(i)] = static_cast<float>((i * 7 / 3) % 2);
    want += x[static_cast<size_t>(i)];
  }
  auto input = Input<float>(x);
  auto sum = Output<float>(1);
  sum.Fill({0.5f});
  Workspace& ws = Workspace::Of(device());
  DELTASERVE_CUDA_DISPATCH(ReadSum)
  (input.View(1, n).As<float>(), n, sum.View(1, 1).As<float>(), ws.stream());
  const DeviceError error = ws.Synchronize();
  ASSERT_TRUE(error.ok()) << error.op << ": " << error.message;
  EXPECT_EQ(sum.Values()[0], static_cast<float>(want));
  EXPECT_TRUE(sum.GuardsIntact());
  EXPECT_TRUE(input.GuardsIntact());
}

DELTASERVE_INSTANTIATE_TEST_WITH_PARAM_ON(ReadSumTest, std::vector<Device>{Device::kCuda},
                                          ::testing::Values(int64_t{1}, int64_t{5}, int64_t{1023},
                                                            int64_t{4099},
                                                            int64_t{3 * 1056 * 256 * 4 + 77}),
                                          [](int64_t n) { return "n" + std::to_string(n); });

}  // namespace
}  // namespace deltaserve::kernels
