#include "runtime/comm/world_layout.h"

#include <set>

#include "gtest/gtest.h"
#include "tests/runtime/comm/comm_test_util.h"

namespace deltaserve {
namespace {

using testing::HasText;

TEST(WorldLayoutTest, DefaultIsOneProcess) {
  const WorldLayout layout;
  EXPECT_EQ(layout.WorldSize(), 1);
  EXPECT_EQ(layout.Rank(0, 0, 0), 0);
  EXPECT_EQ(layout.CoordOf(0), (RankCoord{0, 0, 0}));
}

TEST(WorldLayoutTest, RankFormula) {
  const WorldLayout layout = WorldLayout::Make(2, 3, 4).value();
  EXPECT_EQ(layout.WorldSize(), 24);
  // (replica * pp + stage) * tp + tp_rank
  EXPECT_EQ(layout.Rank(1, 2, 3), (1 * 3 + 2) * 4 + 3);
  EXPECT_EQ(layout.Rank(0, 1, 0), 4);
  EXPECT_EQ(layout.CoordOf(13), (RankCoord{1, 0, 1}));
  EXPECT_EQ(layout.ToString(), "replicas=2 x pp=3 x tp=4");
}

// Every rank of many layouts maps to a coordinate in range and back; every
// coordinate maps to a distinct rank; a TP group is a run of consecutive ranks.
TEST(WorldLayoutTest, RankCoordRoundTrip) {
  for (int replicas = 1; replicas <= 3; ++replicas) {
    for (int pp = 1; pp <= 5; ++pp) {
      for (int tp = 1; tp <= 8; ++tp) {
        SCOPED_TRACE(::testing::Message() << replicas << "x" << pp << "x" << tp);
        const WorldLayout layout = WorldLayout::Make(replicas, pp, tp).value();
        for (int rank = 0; rank < layout.WorldSize(); ++rank) {
          const RankCoord c = layout.CoordOf(rank);
          ASSERT_GE(c.replica, 0);
          ASSERT_LT(c.replica, replicas);
          ASSERT_GE(c.stage, 0);
          ASSERT_LT(c.stage, pp);
          ASSERT_GE(c.tp_rank, 0);
          ASSERT_LT(c.tp_rank, tp);
          ASSERT_EQ(layout.Rank(c.replica, c.stage, c.tp_rank), rank);
        }
        std::set<int> seen;
        for (int r = 0; r < replicas; ++r) {
          for (int s = 0; s < pp; ++s) {
            const int first = layout.Rank(r, s, 0);
            for (int t = 0; t < tp; ++t) {
              const int rank = layout.Rank(r, s, t);
              ASSERT_EQ(rank, first + t);
              ASSERT_EQ(layout.CoordOf(rank), (RankCoord{r, s, t}));
              seen.insert(rank);
            }
          }
        }
        EXPECT_EQ(static_cast<int>(seen.size()), layout.WorldSize());
        EXPECT_EQ(*seen.begin(), 0);
        EXPECT_EQ(*seen.rbegin(), layout.WorldSize() - 1);
      }
    }
  }
}

TEST(WorldLayoutTest, CopyableValue) {
  const WorldLayout a = WorldLayout::Make(2, 2, 1).value();
  WorldLayout b = a;
  EXPECT_EQ(a, b);
  b.tp = 2;
  EXPECT_NE(a, b);
}

TEST(WorldLayoutTest, MakeRejectsBadFactorsByName) {
  struct Case {
    int replicas, pp, tp;
    const char* message;
  } cases[] = {
      {0, 1, 1, "replicas must be >= 1, got 0"}, {1, 0, 1, "pp must be >= 1, got 0"},
      {1, 1, 0, "tp must be >= 1, got 0"},       {-2, 1, 1, "replicas must be >= 1, got -2"},
      {1, 1, -8, "tp must be >= 1, got -8"},
  };
  for (const Case& c : cases) {
    const auto layout = WorldLayout::Make(c.replicas, c.pp, c.tp);
    ASSERT_FALSE(layout.ok());
    EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(HasText(layout.status(), c.message));
  }
}

TEST(WorldLayoutTest, MakeRejectsWorldsBeyondInt) {
  const auto layout = WorldLayout::Make(65536, 65536, 2);
  ASSERT_FALSE(layout.ok());
  EXPECT_TRUE(HasText(layout.status(), "does not fit in an int"));
}

TEST(WorldLayoutTest, CheckWorld) {
  const WorldLayout layout = WorldLayout::Make(1, 2, 2).value();
  EXPECT_TRUE(layout.CheckWorld(4).ok());
  const absl::Status status = layout.CheckWorld(3);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "layout replicas=1 x pp=2 x tp=2 needs 4 processes, but the MPI world has 3: start "
            "with mpirun -np 4");
  EXPECT_FALSE(layout.CheckWorld(8).ok());
}

TEST(SingletonFallbackTest, NoLauncherIsFine) {
  testing::ScopedEnv env = testing::ScopedEnv::CleanLauncherEnv();
  EXPECT_TRUE(CheckNotSingletonFallback(1).ok());
  EXPECT_TRUE(CheckNotSingletonFallback(4).ok());
}

TEST(SingletonFallbackTest, MatchingWorldIsFine) {
  testing::ScopedEnv env = testing::ScopedEnv::CleanLauncherEnv();
  env.Set("OMPI_COMM_WORLD_SIZE", "1");
  EXPECT_TRUE(CheckNotSingletonFallback(1).ok());
  env.Set("OMPI_COMM_WORLD_SIZE", "4");
  EXPECT_TRUE(CheckNotSingletonFallback(4).ok());
}

TEST(SingletonFallbackTest, EachLauncherVariableIsDetected) {
  struct Case {
    std::vector<std::pair<const char*, const char*>> vars;
    const char* named;
  } cases[] = {
      {{{"OMPI_COMM_WORLD_SIZE", "4"}}, "OMPI_COMM_WORLD_SIZE=4"},
      {{{"PMI_SIZE", "8"}}, "PMI_SIZE=8"},
      {{{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}}, "SLURM_STEP_NUM_TASKS=4"},
      {{{"SLURM_STEP_ID", "3"}, {"SLURM_NTASKS", "2"}}, "SLURM_NTASKS=2"},
      {{{"SLURM_STEPID", "0"}, {"SLURM_NPROCS", "16"}}, "SLURM_NPROCS=16"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.named);
    testing::ScopedEnv env = testing::ScopedEnv::CleanLauncherEnv();
    for (const auto& [name, value] : c.vars) env.Set(name, value);
    const absl::Status status = CheckNotSingletonFallback(1);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    const std::string message(status.message());
    EXPECT_TRUE(HasText(message, c.named));
    EXPECT_TRUE(HasText(message, "fell back to singletons"));
    EXPECT_TRUE(HasText(message, "srun --mpi=pmix"));
    EXPECT_TRUE(HasText(message, "mpirun"));
    // Only a world of 1 is a singleton fallback.
    EXPECT_TRUE(CheckNotSingletonFallback(2).ok());
  }
}

// A batch script's SLURM_NTASKS describes the allocation; a process started
// directly from it (no srun step) is not a fallen-back task.
TEST(SingletonFallbackTest, SlurmAllocationWithoutStepIsFine) {
  testing::ScopedEnv env = testing::ScopedEnv::CleanLauncherEnv();
  env.Set("SLURM_NTASKS", "8");
  env.Set("SLURM_NPROCS", "8");
  EXPECT_TRUE(CheckNotSingletonFallback(1).ok());
}

TEST(SingletonFallbackTest, UnparsableValuesAreIgnored) {
  testing::ScopedEnv env = testing::ScopedEnv::CleanLauncherEnv();
  env.Set("OMPI_COMM_WORLD_SIZE", "four");
  env.Set("PMI_SIZE", "");
  EXPECT_TRUE(CheckNotSingletonFallback(1).ok());
}

}  // namespace
}  // namespace deltaserve
