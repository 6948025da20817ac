// A data communicator for device buffers over a host one
// (data_communicator.h): each call copies the device buffer through host
// memory (kernels::Workspace's copies, in the stream's order) and runs the
// host communicator's call on it. It is the CUDA data path where NCCL is not
// used: the SIMT harness, whose "device" is host memory but whose buffers
// are still CUDA views, and a group of one rank. Every call has completed
// when it returns, as on the CPU stream; Synchronize only checks the stream.
#pragma once

#include <memory>
#include <string>

#include "runtime/comm/data_communicator.h"

namespace deltaserve {

class StagedDataCommunicator final : public DataCommunicator {
 public:
  // `host` is a CPU data communicator (HostDataCommunicator), not null;
  // `device` is where the buffers live.
  StagedDataCommunicator(std::unique_ptr<DataCommunicator> host, kernels::Device device);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string Name() const override { return host_->Name() + " (staged)"; }
  kernels::Device device() const override { return device_; }

  absl::Status Send(const void* data, size_t bytes, int dest, int tag,
                    const kernels::Stream& stream) override;
  absl::Status Recv(void* data, size_t bytes, int src, int tag,
                    const kernels::Stream& stream) override;
  absl::StatusOr<std::unique_ptr<SendRequest>> Isend(const void* data, size_t bytes, int dest,
                                                     int tag,
                                                     const kernels::Stream& stream) override;
  absl::Status AllReduceSum(float* data, size_t count, const kernels::Stream& stream) override;
  absl::Status Synchronize(const kernels::Stream& stream) override;

 private:
  absl::Status CheckStream(const kernels::Stream& stream, const char* op) const;
  // Copies `bytes` at the device address `data` into host memory, waiting
  // for the copy; an asynchronous failure of earlier work comes back here.
  absl::Status ToHost(const void* data, size_t bytes, void* host, const char* op) const;

  std::unique_ptr<DataCommunicator> host_;
  kernels::Device device_;
};

}  // namespace deltaserve
