// What the environment says about the launcher that started this process:
// mpirun (Open MPI), a PMI launcher (MPICH hydra, Intel MPI) or a Slurm step.
// Reads environment variables only; needs no MPI.
#pragma once

#include <string>
#include <vector>

namespace deltaserve {

struct LauncherTaskCount {
  std::string variable;  // e.g. "OMPI_COMM_WORLD_SIZE"
  int tasks = 0;
};

// Every variable that states how many tasks the launcher started, in the order
// OMPI_COMM_WORLD_SIZE, PMI_SIZE, then the Slurm step's count
// (SLURM_STEP_NUM_TASKS, else SLURM_NTASKS, else SLURM_NPROCS). Slurm counts
// are only taken inside an srun step (SLURM_STEP_ID / SLURM_STEPID set): a
// batch script's SLURM_NTASKS describes the allocation, not this process's
// launch. Unparsable values are skipped.
std::vector<LauncherTaskCount> LauncherTaskCounts();

// This process's rank among the tasks the launcher started on its node:
// OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID (MPICH, Intel MPI), or inside
// an srun step SLURM_LOCALID; -1 when none says (a process on its own).
int LauncherLocalRank();

}  // namespace deltaserve
