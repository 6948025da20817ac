// The data communicator of the CPU path (data_communicator.h): host buffers,
// the CPU stream, every call complete when it returns. It runs over a host
// Communicator of its own ("mpi": one made by Split or MPI_Comm_dup, so its
// messages never match the control communicator's; "single": its own queue),
// which nothing else uses. MPI stays in mpi_communicator_mpi.cc.
#pragma once

#include <memory>
#include <string>

#include "runtime/comm/communicator.h"
#include "runtime/comm/data_communicator.h"

namespace deltaserve {

class HostDataCommunicator : public DataCommunicator {
 public:
  // `host` must be a host communicator ("mpi" or "single"), not null.
  explicit HostDataCommunicator(std::unique_ptr<Communicator> host);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string Name() const override { return host_->Name(); }
  kernels::Device device() const override { return kernels::Device::kCpu; }

  absl::Status Send(const void* data, size_t bytes, int dest, int tag,
                    const kernels::Stream& stream) override;
  absl::Status Recv(void* data, size_t bytes, int src, int tag,
                    const kernels::Stream& stream) override;
  absl::StatusOr<std::unique_ptr<SendRequest>> Isend(const void* data, size_t bytes, int dest,
                                                     int tag,
                                                     const kernels::Stream& stream) override;
  absl::Status AllReduceSum(float* data, size_t count, const kernels::Stream& stream) override;
  // Checks the stream; the host's calls are already complete.
  absl::Status Synchronize(const kernels::Stream& stream) override;

 private:
  std::unique_ptr<Communicator> host_;
};

// The data communicator of a one-process world: HostDataCommunicator over a
// new SingleCommunicator (single_communicator.h: Isend to rank 0, then Recv).
class SingleDataCommunicator final : public HostDataCommunicator {
 public:
  SingleDataCommunicator();
};

}  // namespace deltaserve
