// The SIMT harness itself (kernels/cuda/simt.h): kernels written as the
// kernels/cuda/ sources are, run on the host. A correct block reduction
// matches; the same kernel with a barrier left out, or with an index off by
// one, fails; what would hang or be undefined on the device (a barrier some
// threads never reach, a collective with lanes that exited, a block too
// large) is reported, naming the kernel.
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/compat.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using simt::Launch;

constexpr int kThreads = 64;

// out[b] = the sum of x[b * kThreads, (b + 1) * kThreads): a tree in shared
// memory. `barrier_after_load` false leaves out the barrier between the
// loads and the first step of the tree.
__global__ void BlockSumKernel(const float* x, bool barrier_after_load, float* out) {
  DELTASERVE_SHARED(float, partial, [kThreads]);
  partial[threadIdx.x] = x[blockIdx.x * kThreads + threadIdx.x];
  if (barrier_after_load) __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

// y[i] = 2 x[i] for i < n, with the index off by one when `broken`.
__global__ void DoubleKernel(const float* x, int64_t n, bool broken, float* y) {
  const int64_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[broken ? i + 1 : i] = 2.0f * x[i];
}

// The warp sum by shuffles, in every lane.
__global__ void WarpSumKernel(const int* x, int* out) {
  int v = x[threadIdx.x];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  out[threadIdx.x] = v;
}

class SimtTest : public testing::DeviceTest {
 protected:
  void SetUp() override {
    if (cuda::ActiveBackend() != cuda::Backend::kSim) {
      GTEST_SKIP() << "the harness's own tests run on it: DELTASERVE_CUDA_BACKEND=sim";
    }
  }
};

TEST_P(SimtTest, BlockReductionMatchesAndAMissingBarrierFails) {
  const int blocks = 3;
  const auto x = testing::RandomFloats(blocks * kThreads, 1);
  for (bool barrier : {true, false}) {
    std::vector<float> out(blocks, 0.0f);
    ASSERT_EQ(Launch("BlockSum", blocks, kThreads, 0,
                     [&] { BlockSumKernel(x.data(), barrier, out.data()); }),
              "");
    for (int b = 0; b < blocks; ++b) {
      const double want =
          std::accumulate(x.begin() + b * kThreads, x.begin() + (b + 1) * kThreads, 0.0);
      if (barrier) {
        EXPECT_NEAR(out[b], want, 1e-4) << "block " << b;
      } else {
        // Thread 0 adds partial[32] before thread 32 has stored it: the
        // poisoned shared memory (NaN) comes through.
        EXPECT_FALSE(std::abs(out[b] - want) < 1e-3) << "block " << b << ": " << out[b];
      }
    }
  }
}

// Through DELTASERVE_LAUNCH and the device's own memory, as the ops run: the
// off-by-one writes past the output, which its guard band shows.
TEST_P(SimtTest, AnIndexOffByOneFails) {
  const int64_t n = 100;
  auto x = Input(testing::RandomFloats(n, 2));
  for (bool broken : {false, true}) {
    auto y = Output<float>(n);
    const Stream stream = Workspace::Of(Device::kCuda).stream();
    DELTASERVE_LAUNCH(DoubleKernel, dim3(cuda::BlocksFor(n, 32)), dim3(32), 0, stream,
                      x.View(n, 1).As<float>(), n, broken, y.View(n, 1).As<float>());
    EXPECT_EQ(static_cast<bool>(y.GuardsIntact()), !broken);
  }
}

TEST_P(SimtTest, WarpShufflesFollowCuda) {
  std::vector<int> x(32), out(32, -1);
  std::iota(x.begin(), x.end(), 1);
  ASSERT_EQ(Launch("WarpSum", 1, 32, 0, [&] { WarpSumKernel(x.data(), out.data()); }), "");
  for (int v : out) EXPECT_EQ(v, 32 * 33 / 2);
  // Segments of 8: a source past the segment's end returns the lane's own
  // value; xor may read an earlier segment, up and down stay inside.
  std::vector<int> down(32), up(32), idx(32), ballot(32);
  ASSERT_EQ(Launch("Shuffles", 1, 32, 0,
                   [&] {
                     const int lane = static_cast<int>(threadIdx.x);
                     down[lane] = __shfl_down_sync(0xffffffffu, lane, 3, 8);
                     up[lane] = __shfl_up_sync(0xffffffffu, lane, 3, 8);
                     idx[lane] = __shfl_sync(0xffffffffu, lane, 10, 8);
                     ballot[lane] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
                   }),
            "");
  for (int lane = 0; lane < 32; ++lane) {
    const int base = lane / 8 * 8;
    EXPECT_EQ(down[lane], lane + 3 < base + 8 ? lane + 3 : lane) << lane;
    EXPECT_EQ(up[lane], lane - 3 >= base ? lane - 3 : lane) << lane;
    EXPECT_EQ(idx[lane], base + 2) << lane;
    EXPECT_EQ(static_cast<unsigned>(ballot[lane]), 0x49249249u) << lane;
  }
}

TEST_P(SimtTest, DynamicSharedMemoryIsPerBlockAndPoisoned) {
  std::vector<float> first(4);
  ASSERT_EQ(Launch("Dynamic", 4, 16, 16 * sizeof(float),
                   [&] {
                     DELTASERVE_DYNAMIC_SHARED(float, smem);
                     if (threadIdx.x == 0) first[blockIdx.x] = smem[5];  // nobody wrote it
                     __syncthreads();
                     smem[threadIdx.x] = 1.0f;
                   }),
            "");
  for (float v : first) EXPECT_TRUE(std::isnan(v));
}

TEST_P(SimtTest, WhatWouldHangOnTheDeviceIsReported) {
  // An early return before a barrier.
  std::string error = Launch("EarlyExit", 1, 64, 0, [&] {
    if (threadIdx.x >= 40) return;
    __syncthreads();
  });
  EXPECT_NE(error.find("EarlyExit: __syncthreads() is not reached by block (0, 0, 0) thread (40"),
            std::string::npos)
      << error;
  // A warp collective whose lanes exited.
  error = Launch("ExitedLanes", 1, 32, 0, [&] {
    if (threadIdx.x % 2 == 1) return;
    static_cast<void>(__shfl_xor_sync(0xffffffffu, 1, 1));
  });
  EXPECT_NE(error.find("which has exited"), std::string::npos) << error;
  // Half a warp at a barrier, half in a collective.
  error = Launch("Diverged", 1, 32, 0, [&] {
    if (threadIdx.x < 16) {
      __syncthreads();
    } else {
      __syncwarp();
    }
  });
  EXPECT_FALSE(error.empty());
  EXPECT_NE(Launch("TooBig", 1, 2048, 0, [] {}).find("2048 threads"), std::string::npos);
  EXPECT_NE(Launch("TooMuchShared", 1, 32, 300 * 1024, [] {}).find("dynamic shared"),
            std::string::npos);
  // Through DELTASERVE_LAUNCH a failure reaches the workspace's Synchronize,
  // naming the kernel.
  const Stream stream = Workspace::Of(Device::kCuda).stream();
  DELTASERVE_LAUNCH(BlockSumKernel, dim3(1), dim3(2048), 0, stream, nullptr, true, nullptr);
  const DeviceError sync = Workspace::Of(Device::kCuda).Synchronize();
  EXPECT_EQ(sync.op, "BlockSumKernel");
  EXPECT_NE(sync.message.find("2048 threads"), std::string::npos) << sync.message;
  EXPECT_TRUE(Workspace::Of(Device::kCuda).Synchronize().ok());  // reported once
}

INSTANTIATE_TEST_SUITE_P(, SimtTest, ::testing::Values(Device::kCuda), testing::DeviceTestName);

}  // namespace
}  // namespace deltaserve::kernels
