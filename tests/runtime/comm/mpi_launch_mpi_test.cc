// Launcher-level behaviour that needs a job of its own, checked by starting
// communicator_mpirun_test (no extra executable) with a test filter and an
// environment variable that enables the matching test there:
// - AbortMpi on one rank ends the whole mpirun job quickly, with its code,
//   while the other ranks are blocked in a receive;
// - messages cut into many chunks arrive intact (the chunk limit lowered for
//   one job);
// - the watchdog of communicator_mpirun_test ends a job whose ranks all hang;
// - a process started without mpirun but inside a 4-task Slurm step (the
//   classic `srun` without `--mpi=pmix`) gets an error from InitMpiWorld
//   instead of running as rank 0 of 1.
// Skips when that binary or mpirun is missing.
#include <chrono>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/runtime/comm/comm_test_util.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

using testing::HasText;

// Variables a surrounding launcher may have set; the child must not see them.
constexpr const char* kClearLauncherEnv =
    "env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMIX_RANK -u PMIX_NAMESPACE "
    "-u PMI_RANK -u PMI_SIZE -u SLURM_STEP_ID -u SLURM_STEPID -u SLURM_STEP_NUM_TASKS "
    "-u SLURM_NTASKS -u SLURM_NPROCS ";

std::string MpirunTestBinary() { return testing::BinPath("communicator_mpirun_test"); }

TEST(MpiLaunchTest, AbortMpiEndsTheJobQuickly) {
  const std::string binary = MpirunTestBinary();
  if (!std::filesystem::exists(binary)) GTEST_SKIP() << binary << " is not built";
  std::string output;
  if (testing::RunCommand("command -v mpirun", &output) != 0) GTEST_SKIP() << "no mpirun";
  const auto start = std::chrono::steady_clock::now();
  const int code =
      testing::RunCommand(std::string(kClearLauncherEnv) +
                              "timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 "
                              "-x DELTASERVE_TEST_MPI_ABORT=1 " +
                              binary + " --gtest_filter=MpiAbortTest.AbortEndsTheWholeJob",
                          &output);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // 7 is the code rank 1 passed to AbortMpi; 124 would be timeout's, 3 the
  // test watchdog's (the job hung for 30 s).
  EXPECT_EQ(code, 7) << output;
  EXPECT_LT(seconds, 20.0) << output;
  // (Open MPI's own "MPI_ABORT was invoked" banner is not checked: its help
  // system sometimes fails to print it on a loaded machine.)
}

// Messages over the chunk limit (1 GiB) are cut into several MPI messages.
// With the limit lowered to 4 KiB for the whole job, the communication tests
// cover that path: exact multiples, a last chunk of one byte, many chunks.
TEST(MpiLaunchTest, SmallChunksGiveTheSameResults) {
  const std::string binary = MpirunTestBinary();
  if (!std::filesystem::exists(binary)) GTEST_SKIP() << binary << " is not built";
  std::string output;
  if (testing::RunCommand("command -v mpirun", &output) != 0) GTEST_SKIP() << "no mpirun";
  const int code = testing::RunCommand(
      std::string(kClearLauncherEnv) +
          "timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 "
          "-x DELTASERVE_TEST_MPI_CHUNK_BYTES=4096 " +
          binary +
          " --gtest_filter='MpiPointToPointTest.*:MpiCollectiveTest.*:MpiSplitTest.*:"
          "MpiErrorTest.*'",
      &output);
  EXPECT_EQ(code, 0) << output;
  EXPECT_TRUE(HasText(output, "[  PASSED  ]"));
  EXPECT_FALSE(HasText(output, "FAILED"));
}

TEST(MpiLaunchTest, WatchdogEndsAHungJob) {
  const std::string binary = MpirunTestBinary();
  if (!std::filesystem::exists(binary)) GTEST_SKIP() << binary << " is not built";
  std::string output;
  if (testing::RunCommand("command -v mpirun", &output) != 0) GTEST_SKIP() << "no mpirun";
  const auto start = std::chrono::steady_clock::now();
  const int code = testing::RunCommand(
      std::string(kClearLauncherEnv) +
          "timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 -x DELTASERVE_TEST_HANG=1 "
          "-x DELTASERVE_TEST_WATCHDOG_S=2 " +
          binary + " --gtest_filter=MpiWatchdogTest.HangIsCaught",
      &output);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(code, 0) << output;
  EXPECT_NE(code, 124) << "timeout ended the job, not the watchdog:\n" << output;
  EXPECT_LT(seconds, 20.0) << output;
  EXPECT_TRUE(HasText(output, "MpiWatchdogTest.HangIsCaught still running after 2 s"));
}

TEST(MpiLaunchTest, SingletonFallbackIsAnError) {
  const std::string binary = MpirunTestBinary();
  if (!std::filesystem::exists(binary)) GTEST_SKIP() << binary << " is not built";
  std::string output;
  const int code = testing::RunCommand(
      std::string(kClearLauncherEnv) +
          "SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=4 DELTASERVE_TEST_EXPECT_SINGLETON_FALLBACK=1 "
          "timeout 60 " +
          binary + " --gtest_filter=MpiWorldTest.SingletonFallbackIsRejected",
      &output);
  EXPECT_EQ(code, 0) << output;
  EXPECT_TRUE(HasText(output, "[  PASSED  ] 1 test"));
  EXPECT_FALSE(HasText(output, "SKIPPED"));
}

}  // namespace
}  // namespace deltaserve
