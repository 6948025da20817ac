// The shape of a worker job (DESIGN.md, Processes and Parallelism):
// replicas x pipeline stages x tensor-parallel ranks, and the mapping between
// an MPI rank and its place in that grid. rank = (replica * pp + stage) * tp +
// tp_rank, so the ranks of one TP group are consecutive (and sit in one node
// when the launcher fills nodes in rank order).
//
// A plain copyable value type with no MPI in it; the checks against the world
// the launcher actually started take the world size as a number.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace deltaserve {

struct RankCoord {
  int replica = 0;
  int stage = 0;
  int tp_rank = 0;

  friend bool operator==(const RankCoord&, const RankCoord&) = default;
};

struct WorldLayout {
  int replicas = 1;
  int pp = 1;
  int tp = 1;

  // Each factor must be >= 1 and the product must fit in an int; the error
  // names the bad value.
  static absl::StatusOr<WorldLayout> Make(int replicas, int pp, int tp);

  int WorldSize() const { return replicas * pp * tp; }

  // Preconditions: 0 <= replica < replicas, 0 <= stage < pp,
  // 0 <= tp_rank < tp (and 0 <= rank < WorldSize() for CoordOf).
  int Rank(int replica, int stage, int tp_rank) const {
    return (replica * pp + stage) * tp + tp_rank;
  }
  RankCoord CoordOf(int rank) const {
    return RankCoord{rank / (pp * tp), (rank / tp) % pp, rank % tp};
  }

  // "replicas=1 x pp=2 x tp=2", for messages.
  std::string ToString() const;

  // OK when the MPI world has exactly WorldSize() processes; otherwise an
  // error saying how many processes to start.
  absl::Status CheckWorld(int world_size) const;

  friend bool operator==(const WorldLayout&, const WorldLayout&) = default;
};

// Catches the classic misconfiguration where the launcher started N tasks but
// MPI could not reach it (e.g. Open MPI under `srun` without `--mpi=pmix`), so
// every task initialized as a singleton world and would run as rank 0 of 1.
// When `world_size` is 1 and the environment says the launcher started more
// tasks (OMPI_COMM_WORLD_SIZE, PMI_SIZE, or inside an srun step
// SLURM_STEP_NUM_TASKS / SLURM_NTASKS / SLURM_NPROCS), returns
// FailedPrecondition explaining this; OK otherwise.
absl::Status CheckNotSingletonFallback(int world_size);

}  // namespace deltaserve
