#include "runtime/comm/launch_env.h"

#include <cstdlib>
#include <optional>

#include "absl/strings/numbers.h"
#include "runtime/comm/mpi_runtime.h"

namespace deltaserve {
namespace {

bool IsSet(const char* name) { return std::getenv(name) != nullptr; }

std::optional<int> IntFromEnv(const char* name) {
  const char* value = std::getenv(name);
  int parsed = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &parsed)) return std::nullopt;
  return parsed;
}

bool InSlurmStep() { return IsSet("SLURM_STEP_ID") || IsSet("SLURM_STEPID"); }

}  // namespace

std::vector<LauncherTaskCount> LauncherTaskCounts() {
  std::vector<LauncherTaskCount> counts;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (std::optional<int> tasks = IntFromEnv(name)) counts.push_back({name, *tasks});
  }
  if (InSlurmStep()) {
    for (const char* name : {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}) {
      if (std::optional<int> tasks = IntFromEnv(name)) {
        counts.push_back({name, *tasks});
        break;
      }
    }
  }
  return counts;
}

// Defined here rather than in the MPI files: it must answer the same in a build
// without MPI, where a job started by mpirun should fail loudly ("this build
// has no MPI") instead of running N independent copies of rank 0.
bool LaunchedUnderMpi() {
  // mpirun (Open MPI) and PMIx / PMI launchers (srun --mpi=pmix, MPICH hydra)
  // set these in every process they start, even with one process.
  if (IsSet("OMPI_COMM_WORLD_SIZE") || IsSet("PMIX_RANK") || IsSet("PMI_RANK")) return true;
  // A plain srun step: only a multi-task step makes this a parallel job.
  if (InSlurmStep()) {
    for (const LauncherTaskCount& count : LauncherTaskCounts()) {
      if (count.tasks > 1) return true;
    }
  }
  return false;
}

int LauncherLocalRank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}) {
    if (std::optional<int> rank = IntFromEnv(name); rank && *rank >= 0) return *rank;
  }
  if (InSlurmStep()) {
    if (std::optional<int> rank = IntFromEnv("SLURM_LOCALID"); rank && *rank >= 0) return *rank;
  }
  return -1;
}

}  // namespace deltaserve
