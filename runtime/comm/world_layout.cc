#include "runtime/comm/world_layout.h"

#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/comm/launch_env.h"

namespace deltaserve {

absl::StatusOr<WorldLayout> WorldLayout::Make(int replicas, int pp, int tp) {
  const struct {
    const char* name;
    int value;
  } factors[] = {{"replicas", replicas}, {"pp", pp}, {"tp", tp}};
  for (const auto& factor : factors) {
    if (factor.value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("world layout: ", factor.name, " must be >= 1, got ", factor.value));
    }
  }
  const int64_t world = int64_t{replicas} * pp * tp;
  if (world > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("world layout: replicas=", replicas,
                                                   " x pp=", pp, " x tp=", tp, " = ", world,
                                                   " processes does not fit in an int"));
  }
  return WorldLayout{replicas, pp, tp};
}

std::string WorldLayout::ToString() const {
  return absl::StrCat("replicas=", replicas, " x pp=", pp, " x tp=", tp);
}

absl::Status WorldLayout::CheckWorld(int world_size) const {
  if (world_size == WorldSize()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "layout ", ToString(), " needs ", WorldSize(), " processes, but the MPI world has ",
      world_size, ": start with mpirun -np ", WorldSize()));
}

absl::Status CheckNotSingletonFallback(int world_size) {
  if (world_size != 1) return absl::OkStatus();
  for (const LauncherTaskCount& count : LauncherTaskCounts()) {
    if (count.tasks <= 1) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "the MPI world has 1 process, but ", count.variable, "=", count.tasks,
        " says the launcher started ", count.tasks,
        " tasks: MPI could not reach the launcher and fell back to singletons, so every "
        "task would run as rank 0 of its own world. With Open MPI under Slurm use "
        "`srun --mpi=pmix` (see `srun --mpi=list`) or start the job with mpirun; check "
        "that the MPI library the program runs with is the one it was built against"));
  }
  return absl::OkStatus();
}

}  // namespace deltaserve
