#include "runtime/comm/rank_communicators.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"
#include "runtime/comm/host_data_communicator.h"
#include "runtime/comm/staged_data_communicator.h"
#include "runtime/common/build_config.h"
#include "runtime/common/status_macros.h"
#if DELTASERVE_HAVE_NCCL
#include "runtime/comm/nccl_runtime.h"
#endif

namespace deltaserve {
namespace {

// The data communicator over `group`, a host communicator of the group's
// ranks that nothing else uses. This is where the backend is chosen.
absl::StatusOr<std::unique_ptr<DataCommunicator>> MakeDataCommunicator(
    std::unique_ptr<Communicator> group, kernels::Device device, const char* which) {
  switch (device) {
    case kernels::Device::kCpu:
      return std::make_unique<HostDataCommunicator>(std::move(group));
    case kernels::Device::kCuda:
#if DELTASERVE_HAVE_NCCL
      // GPUs of several ranks: NCCL, bootstrapped over `group`, on the GPU
      // this process selected.
      if (group->size() > 1 && kernels::cuda::ActiveBackend() == kernels::cuda::Backend::kGpu) {
        return MakeNcclDataCommunicator(*group, kernels::SelectedCudaDevice());
      }
#endif
      // One rank (nothing crosses), or the SIMT harness: the host path, with
      // the device buffers copied through host memory.
      return std::make_unique<StagedDataCommunicator>(
          std::make_unique<HostDataCommunicator>(std::move(group)), device);
  }
  return absl::InternalError(absl::StrCat("the ", which, " data communicator: unknown device"));
}

}  // namespace

absl::StatusOr<RankCommunicators> MakeRankCommunicators(const WorldLayout& layout,
                                                        std::unique_ptr<Communicator> control,
                                                        kernels::Device device) {
  if (control == nullptr) {
    return absl::InvalidArgumentError("MakeRankCommunicators: no control communicator");
  }
  DELTASERVE_RETURN_IF_ERROR(layout.CheckWorld(control->size()));
  if (device == kernels::Device::kCuda &&
      kernels::cuda::ActiveBackend() == kernels::cuda::Backend::kNone) {
    // Before the splits: every rank of a job sees the same build and
    // environment, so all refuse alike.
    return absl::FailedPreconditionError(
        absl::StrCat("the data path on cuda: ", kernels::cuda::BackendProblem()));
  }
  const RankCoord me = layout.CoordOf(control->rank());
  RankCommunicators comms;
  // Both splits on every rank, in this order, before any other check can
  // fail: Split is collective.
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> stage_group,
                              control->Split(me.replica * layout.tp + me.tp_rank, me.stage));
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> tp_group,
                              control->Split(me.replica * layout.pp + me.stage, me.tp_rank));
  DELTASERVE_ASSIGN_OR_RETURN(comms.stage,
                              MakeDataCommunicator(std::move(stage_group), device, "stage"));
  DELTASERVE_ASSIGN_OR_RETURN(comms.tp, MakeDataCommunicator(std::move(tp_group), device, "tp"));
  comms.control = std::move(control);
  return comms;
}

}  // namespace deltaserve
