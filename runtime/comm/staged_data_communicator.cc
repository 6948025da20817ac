#include "runtime/comm/staged_data_communicator.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/workspace.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

// An Isend's host copy lives with its request until the send is done.
class StagedSendRequest final : public SendRequest {
 public:
  StagedSendRequest(std::vector<char> bytes, std::unique_ptr<SendRequest> inner)
      : bytes_(std::move(bytes)), inner_(std::move(inner)) {}
  absl::Status Wait() override { return inner_->Wait(); }

 private:
  std::vector<char> bytes_;
  std::unique_ptr<SendRequest> inner_;
};

}  // namespace

StagedDataCommunicator::StagedDataCommunicator(std::unique_ptr<DataCommunicator> host,
                                               kernels::Device device)
    : host_(std::move(host)), device_(device) {}

absl::Status StagedDataCommunicator::CheckStream(const kernels::Stream& stream,
                                                 const char* op) const {
  if (stream.device != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), " ", op, ": a ", kernels::DeviceName(stream.device),
                     " stream, where the buffers are on the ", kernels::DeviceName(device_)));
  }
  return absl::OkStatus();
}

absl::Status StagedDataCommunicator::ToHost(const void* data, size_t bytes, void* host,
                                            const char* op) const {
  kernels::Workspace& workspace = kernels::Workspace::Of(device_);
  workspace.CopyToHost(host, data, bytes);
  if (const kernels::DeviceError error = workspace.Synchronize(); !error.ok()) {
    return absl::InternalError(absl::StrCat(Name(), " ", op, ": ", error.op, " failed on the ",
                                            kernels::DeviceName(device_), ": ", error.message));
  }
  return absl::OkStatus();
}

absl::Status StagedDataCommunicator::Send(const void* data, size_t bytes, int dest, int tag,
                                          const kernels::Stream& stream) {
  DELTASERVE_RETURN_IF_ERROR(CheckStream(stream, "Send"));
  std::vector<char> host(bytes);
  DELTASERVE_RETURN_IF_ERROR(ToHost(data, bytes, host.data(), "Send"));
  return host_->Send(host.data(), bytes, dest, tag, kernels::Stream::Cpu());
}

absl::Status StagedDataCommunicator::Recv(void* data, size_t bytes, int src, int tag,
                                          const kernels::Stream& stream) {
  DELTASERVE_RETURN_IF_ERROR(CheckStream(stream, "Recv"));
  std::vector<char> host(bytes);
  DELTASERVE_RETURN_IF_ERROR(host_->Recv(host.data(), bytes, src, tag, kernels::Stream::Cpu()));
  kernels::Workspace::Of(device_).CopyFromHost(data, host.data(), bytes);
  // The host copy must outlive the transfer: wait for it here.
  return Synchronize(stream);
}

absl::StatusOr<std::unique_ptr<SendRequest>> StagedDataCommunicator::Isend(
    const void* data, size_t bytes, int dest, int tag, const kernels::Stream& stream) {
  DELTASERVE_RETURN_IF_ERROR(CheckStream(stream, "Isend"));
  std::vector<char> host(bytes);
  DELTASERVE_RETURN_IF_ERROR(ToHost(data, bytes, host.data(), "Isend"));
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<SendRequest> inner,
                              host_->Isend(host.data(), bytes, dest, tag, kernels::Stream::Cpu()));
  return std::unique_ptr<SendRequest>(new StagedSendRequest(std::move(host), std::move(inner)));
}

absl::Status StagedDataCommunicator::AllReduceSum(float* data, size_t count,
                                                  const kernels::Stream& stream) {
  DELTASERVE_RETURN_IF_ERROR(CheckStream(stream, "AllReduceSum"));
  if (size() == 1) return absl::OkStatus();
  std::vector<float> host(count);
  DELTASERVE_RETURN_IF_ERROR(ToHost(data, count * sizeof(float), host.data(), "AllReduceSum"));
  DELTASERVE_RETURN_IF_ERROR(host_->AllReduceSum(host.data(), count, kernels::Stream::Cpu()));
  kernels::Workspace::Of(device_).CopyFromHost(data, host.data(), count * sizeof(float));
  return Synchronize(stream);
}

absl::Status StagedDataCommunicator::Synchronize(const kernels::Stream& stream) {
  DELTASERVE_RETURN_IF_ERROR(CheckStream(stream, "Synchronize"));
  if (const kernels::DeviceError error = kernels::Workspace::Of(device_).Synchronize();
      !error.ok()) {
    return absl::InternalError(absl::StrCat(Name(), " Synchronize: ", error.op, " failed on the ",
                                            kernels::DeviceName(device_), ": ", error.message));
  }
  return absl::OkStatus();
}

}  // namespace deltaserve
