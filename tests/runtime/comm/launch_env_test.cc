#include "runtime/comm/launch_env.h"

#include "gtest/gtest.h"
#include "runtime/comm/mpi_runtime.h"
#include "tests/runtime/comm/comm_test_util.h"

namespace deltaserve {
namespace {

using testing::ScopedEnv;

TEST(LaunchEnvTest, PlainProcessIsNotUnderMpi) {
  ScopedEnv env = ScopedEnv::CleanLauncherEnv();
  EXPECT_FALSE(LaunchedUnderMpi());
  EXPECT_TRUE(LauncherTaskCounts().empty());
}

TEST(LaunchEnvTest, MpiLaunchersAreDetected) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    SCOPED_TRACE(name);
    ScopedEnv env = ScopedEnv::CleanLauncherEnv();
    // Even a one-process mpirun job is an MPI launch.
    env.Set(name, name == std::string("OMPI_COMM_WORLD_SIZE") ? "1" : "0");
    EXPECT_TRUE(LaunchedUnderMpi());
  }
}

TEST(LaunchEnvTest, SlurmStepOfSeveralTasksIsAnMpiLaunch) {
  ScopedEnv env = ScopedEnv::CleanLauncherEnv();
  env.Set("SLURM_STEP_ID", "0");
  env.Set("SLURM_STEP_NUM_TASKS", "1");
  EXPECT_FALSE(LaunchedUnderMpi());  // srun -n 1: one process, no MPI needed
  env.Set("SLURM_STEP_NUM_TASKS", "4");
  EXPECT_TRUE(LaunchedUnderMpi());
}

TEST(LaunchEnvTest, SlurmBatchScriptIsNotAnMpiLaunch) {
  ScopedEnv env = ScopedEnv::CleanLauncherEnv();
  env.Set("SLURM_NTASKS", "4");  // the allocation, no srun step
  EXPECT_FALSE(LaunchedUnderMpi());
  EXPECT_TRUE(LauncherTaskCounts().empty());
}

TEST(LaunchEnvTest, TaskCountsInOrder) {
  ScopedEnv env = ScopedEnv::CleanLauncherEnv();
  env.Set("OMPI_COMM_WORLD_SIZE", "4");
  env.Set("PMI_SIZE", "2");
  env.Set("SLURM_STEPID", "1");
  env.Set("SLURM_NTASKS", "8");
  env.Set("SLURM_NPROCS", "16");  // SLURM_NTASKS wins: one Slurm count
  const std::vector<LauncherTaskCount> counts = LauncherTaskCounts();
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts[0].variable, "OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(counts[0].tasks, 4);
  EXPECT_EQ(counts[1].variable, "PMI_SIZE");
  EXPECT_EQ(counts[1].tasks, 2);
  EXPECT_EQ(counts[2].variable, "SLURM_NTASKS");
  EXPECT_EQ(counts[2].tasks, 8);
}

TEST(LaunchEnvTest, StepTaskCountPreferred) {
  ScopedEnv env = ScopedEnv::CleanLauncherEnv();
  env.Set("SLURM_STEP_ID", "0");
  env.Set("SLURM_NTASKS", "8");
  env.Set("SLURM_STEP_NUM_TASKS", "2");
  const std::vector<LauncherTaskCount> counts = LauncherTaskCounts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].variable, "SLURM_STEP_NUM_TASKS");
  EXPECT_EQ(counts[0].tasks, 2);
}

}  // namespace
}  // namespace deltaserve
