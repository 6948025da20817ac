// The communicators of one rank of a worker job, built from the deployment's
// layout (DESIGN.md, Processes and Parallelism) in one place:
// - control: the host world (mpi, or single for one process). Steps from the
//   replica's leader, results and reports back to it (runtime/engine/
//   replica.h). Ranked as the world, by WorldLayout::Rank.
// - stage: the data communicator between this rank and the same TP rank of
//   the previous and next stage of its replica, ranked by stage (size pp).
//   Activation packets (runtime/engine/stage_runner.h).
// - tp: the data communicator of this stage's TP group, ranked by TP rank
//   (size tp). The layers' reductions (runtime/model/layers.h).
// The data communicators have message spaces of their own, so no data
// message ever matches a control one.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/data_communicator.h"
#include "runtime/comm/world_layout.h"

namespace deltaserve {

struct RankCommunicators {
  std::unique_ptr<Communicator> control;
  std::unique_ptr<DataCommunicator> stage;
  std::unique_ptr<DataCommunicator> tp;
};

// Collective over `control` (every rank calls it with the same layout and
// device): checks that the world has layout.WorldSize() ranks, then makes the
// stage and TP groups by splitting it. `device` is where the data path runs:
// kCpu builds them over the host communicator (mpi or single); kCuda over
// NCCL for groups of GPUs, else (one rank, or the SIMT harness) over the
// host communicator with device buffers staged through host memory
// (staged_data_communicator.h); kCuda without a CUDA backend is
// FailedPrecondition saying why. Returns `control` as the control
// communicator.
absl::StatusOr<RankCommunicators> MakeRankCommunicators(
    const WorldLayout& layout, std::unique_ptr<Communicator> control,
    kernels::Device device = kernels::Device::kCpu);

}  // namespace deltaserve
