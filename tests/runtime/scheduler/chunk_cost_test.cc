#include "runtime/scheduler/chunk_cost.h"

#include "runtime/model/presets.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

ModelConfig K3Small() {
  auto config = PresetConfig("k3-small");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

TEST(ChunkCostTest, ChunksShrinkAsThePrefixGrowsAndKeepTheBudget) {
  const ChunkCostModel model(K3Small());
  const double budget = model.Cost(512, 0);
  EXPECT_EQ(model.ChunkFor(0, budget, 1 << 20), 512);
  int64_t last = 512;
  for (int64_t prefix : {1000, 10000, 100000, 1000000}) {
    const int64_t chunk = model.ChunkFor(prefix, budget, 1 << 20);
    EXPECT_LT(chunk, last) << "prefix " << prefix;
    EXPECT_LE(model.Cost(chunk, prefix), budget);
    EXPECT_GT(model.Cost(chunk + 1, prefix), budget);
    last = chunk;
  }
  EXPECT_EQ(model.ChunkFor(0, budget, 100), 100);      // the rest of a prompt
  EXPECT_EQ(model.ChunkFor(1 << 30, budget, 100), 1);  // always progress
}

TEST(ChunkCostTest, FitsTheStepTimesItIsShown) {
  ChunkCostModel model(K3Small(), 5e11);  // a prior ten times off
  const double a = 2e-5, b = 3e-9;        // the "machine"
  for (int i = 0; i < 500; ++i) {
    const std::vector<StepPiece> pieces = {{1 + (i * 37) % 512, (i * 7919) % 200000},
                                           {1, (i * 104729) % 50000}};
    double seconds = 0;
    for (const auto& p : pieces) {
      seconds += a * p.tokens + b * p.tokens * (p.prefix + (p.tokens + 1) / 2.0);
    }
    model.Observe(pieces, seconds);
  }
  EXPECT_NEAR(model.a(), a, 0.05 * a);
  EXPECT_NEAR(model.b(), b, 0.05 * b);
  // Garbage is ignored.
  model.Observe({{10, 0}}, -1);
  model.Observe({{0, 0}}, 1);
  EXPECT_NEAR(model.a(), a, 0.05 * a);
}

}  // namespace
}  // namespace deltaserve
