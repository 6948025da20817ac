#include "runtime/comm/host_data_communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/comm/single_communicator.h"

namespace deltaserve {
namespace {

// OK for the CPU stream; otherwise "<what> failed: ..." (InvalidArgument).
absl::Status CheckHostStream(const kernels::Stream& stream, const Communicator& host,
                             absl::string_view what) {
  if (stream.on_cpu()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " failed: the stream is on ", kernels::DeviceName(stream.device), ", but the ",
      host.Name(), " data communicator works on host buffers and the CPU stream"));
}

// "mpi Send to rank 3 (tag 7)", the form the host communicators use.
std::string Describe(const Communicator& host, const char* op, const char* direction, int peer,
                     int tag) {
  return absl::StrCat(host.Name(), " ", op, " ", direction, " rank ", peer, " (tag ", tag, ")");
}

}  // namespace

HostDataCommunicator::HostDataCommunicator(std::unique_ptr<Communicator> host)
    : host_(std::move(host)) {}

absl::Status HostDataCommunicator::Send(const void* data, size_t bytes, int dest, int tag,
                                        const kernels::Stream& stream) {
  if (!stream.on_cpu()) {
    return CheckHostStream(stream, *host_, Describe(*host_, "Send", "to", dest, tag));
  }
  return host_->Send(data, bytes, dest, tag);
}

absl::Status HostDataCommunicator::Recv(void* data, size_t bytes, int src, int tag,
                                        const kernels::Stream& stream) {
  if (!stream.on_cpu()) {
    return CheckHostStream(stream, *host_, Describe(*host_, "Recv", "from", src, tag));
  }
  return host_->Recv(data, bytes, src, tag);
}

absl::StatusOr<std::unique_ptr<SendRequest>> HostDataCommunicator::Isend(
    const void* data, size_t bytes, int dest, int tag, const kernels::Stream& stream) {
  if (!stream.on_cpu()) {
    return CheckHostStream(stream, *host_, Describe(*host_, "Isend", "to", dest, tag));
  }
  return host_->Isend(data, bytes, dest, tag);
}

absl::Status HostDataCommunicator::AllReduceSum(float* data, size_t count,
                                                const kernels::Stream& stream) {
  if (!stream.on_cpu()) {
    return CheckHostStream(
        stream, *host_,
        absl::StrCat(host_->Name(), " AllReduceSum of ", count, " floats over ", size(), " ranks"));
  }
  return host_->AllReduceSum(data, count);
}

absl::Status HostDataCommunicator::Synchronize(const kernels::Stream& stream) {
  return CheckHostStream(stream, *host_, absl::StrCat(host_->Name(), " Synchronize"));
}

SingleDataCommunicator::SingleDataCommunicator()
    : HostDataCommunicator(std::make_unique<SingleCommunicator>()) {}

}  // namespace deltaserve
