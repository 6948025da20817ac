#include "kernels/short_conv.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/reference/short_conv_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

struct ConvCase {
  int64_t t, channels, width;
  bool silu;
};

std::string Name(const ConvCase& c) {
  return "t=" + std::to_string(c.t) + " channels=" + std::to_string(c.channels) +
         " width=" + std::to_string(c.width) + (c.silu ? " silu" : "");
}

class ShortConvTest : public testing::DeviceTest {};

TEST_P(ShortConvTest, MatchesReference) {
  double worst = 0.0;
  uint64_t seed = 1;
  for (int64_t t : {0, 1, 2, 3, 5, 17, 64, 200}) {
    for (int64_t channels : {1, 3, 64, 65, 130, 1000}) {
      for (int64_t width : {1, 2, 4, 5}) {
        for (bool silu : {false, true}) {
          const ConvCase c{t, channels, width, silu};
          SCOPED_TRACE(Name(c));
          const std::vector<float> x = testing::RandomFloats(t * channels, ++seed, -3, 3);
          const std::vector<float> w = testing::RandomFloats(channels * width, ++seed);
          auto state = Output<float>((width - 1) * channels);  // read and written
          state.Fill(testing::RandomFloats((width - 1) * channels, ++seed, -3, 3));
          std::vector<double> want_state = testing::ToDouble(state.Values());
          std::vector<double> want_y(t * channels);
          kernels::ref::ShortConv(testing::ToDouble(x).data(), testing::ToDouble(w).data(), t,
                                  channels, width, silu, want_state.data(), want_y.data());
          auto out = Output<float>(t * channels);
          auto xd = Input(x), wd = Input(w);
          kernels::ShortConv(xd.View(t, channels), wd.View(channels, width), silu,
                             state.View(width - 1, channels), out.View(t, channels));
          const std::vector<float> y = out.Values();
          // A sum of `width` products, then SiLU's exp and division.
          const double tol = testing::ReductionTolerance(width);
          EXPECT_TRUE(testing::AllClose(y, want_y, tol, tol));
          // The state is copied inputs: exact.
          EXPECT_EQ(testing::ToDouble(state.Values()), want_state);
          EXPECT_TRUE(out.GuardsIntact());
          EXPECT_TRUE(state.GuardsIntact());
          if (t > 0) worst = std::max(worst, testing::RelL2(y, want_y));
        }
      }
    }
  }
  std::printf("ShortConv vs float64 reference: max rel L2 error %.3g\n", worst);
}

// Prefill in one call, prefill in pieces and decode token by token must give
// bitwise the same outputs and final state.
TEST_P(ShortConvTest, PiecesAndDecodeStepsEqualOneShot) {
  for (const ConvCase& c :
       {ConvCase{70, 130, 4, true}, ConvCase{40, 3000, 4, true}, ConvCase{9, 7, 4, false},
        ConvCase{12, 33, 2, true}, ConvCase{5, 16, 1, false}}) {
    SCOPED_TRACE(Name(c));
    const std::vector<float> x = testing::RandomFloats(c.t * c.channels, 11, -3, 3);
    const std::vector<float> w = testing::RandomFloats(c.channels * c.width, 12);
    const std::vector<float> state0 = testing::RandomFloats((c.width - 1) * c.channels, 13, -3, 3);

    auto xd = Input(x), wd = Input(w);
    auto state_one = Output<float>((c.width - 1) * c.channels);
    state_one.Fill(state0);
    auto y_one = Output<float>(c.t * c.channels);
    kernels::ShortConv(xd.View(c.t, c.channels), wd.View(c.channels, c.width), c.silu,
                       state_one.View(c.width - 1, c.channels), y_one.View(c.t, c.channels));
    EXPECT_TRUE(state_one.GuardsIntact());
    EXPECT_TRUE(y_one.GuardsIntact());

    const std::vector<std::vector<int64_t>> cut_sets = {
        {1}, {2, 1, 3}, {c.t / 2}, std::vector<int64_t>(c.t, 1), {0, 3, 0, 4}};
    for (const auto& cuts : cut_sets) {
      auto state = Output<float>((c.width - 1) * c.channels);
      state.Fill(state0);
      auto y = Output<float>(c.t * c.channels);
      int64_t t0 = 0;
      for (size_t p = 0; t0 < c.t; ++p) {
        const int64_t len = p < cuts.size() ? std::min(cuts[p], c.t - t0) : c.t - t0;
        kernels::ShortConv(xd.View(c.t, c.channels).Rows(t0, len), wd.View(c.channels, c.width),
                           c.silu, state.View(c.width - 1, c.channels),
                           y.View(c.t, c.channels).Rows(t0, len));
        t0 += len;
      }
      EXPECT_EQ(y.Values(), y_one.Values()) << "pieces: " << cuts.size();
      EXPECT_EQ(state.Values(), state_one.Values()) << "pieces: " << cuts.size();
      EXPECT_TRUE(y.GuardsIntact());
      EXPECT_TRUE(state.GuardsIntact());
    }
  }
}

// With fewer tokens than the history, the new state keeps part of the old.
TEST_P(ShortConvTest, ShortInputShiftsState) {
  const int64_t channels = 2, width = 4;
  auto state = Output<float>(6);
  state.Fill({1, 10, 2, 20, 3, 30});  // [3, 2], oldest first
  const std::vector<float> x = {4, 40};
  const std::vector<float> w = {0, 0, 0, 1, 1, 1, 1, 1};  // [2, 4]: x[t]; the sum
  auto y = Output<float>(2);
  auto xd = Input(x), wd = Input(w);
  kernels::ShortConv(xd.View(1, channels), wd.View(channels, width), false,
                     state.View(width - 1, channels), y.View(1, channels));
  EXPECT_EQ(y.Values(), (std::vector<float>{4, 10 + 20 + 30 + 40}));
  EXPECT_EQ(state.Values(), (std::vector<float>{2, 20, 3, 30, 4, 40}));
  EXPECT_TRUE(y.GuardsIntact());
  EXPECT_TRUE(state.GuardsIntact());
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(ShortConvTest);

}  // namespace
}  // namespace deltaserve
