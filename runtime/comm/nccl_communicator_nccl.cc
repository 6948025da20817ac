// The NCCL data communicator (device buffers, the caller's CUDA streams), see
// nccl_runtime.h for how it follows data_communicator.h. Built only with CUDA,
// NCCL and MPI; <nccl.h> and the CUDA runtime stay in this file.
//
// NOT YET RUN: this compiles and links in CI, which has no GPU. It is first
// exercised on GPUs by a later issue; treat it as untested until then.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/comm/nccl_runtime.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

absl::StatusCode StatusCodeForNccl(ncclResult_t result) {
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::StatusCode::kInvalidArgument;
    case ncclSystemError:
    case ncclRemoteError:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

// "<what> failed: <call>: <cudaGetErrorString>"
absl::Status CudaStatus(cudaError_t error, const std::string& what, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, " failed: ", call, ": ", cudaGetErrorString(error)));
}

// "<what> failed: <call>: <ncclGetErrorString> (<ncclGetLastError>)"
absl::Status NcclStatus(ncclResult_t result, ncclComm_t comm, const std::string& what,
                        const char* call) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, " failed: ", call, ": ", ncclGetErrorString(result));
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && detail[0] != '\0') absl::StrAppend(&message, " (", detail, ")");
  return absl::Status(StatusCodeForNccl(result), message);
}

// Early returns with a lazily built description, so the fast path builds no
// strings.
#define DELTASERVE_CUDA_RETURN(call, describe)                  \
  do {                                                          \
    const cudaError_t deltaserve_cuda_ = (call);                \
    if (deltaserve_cuda_ != cudaSuccess) {                      \
      return CudaStatus(deltaserve_cuda_, (describe)(), #call); \
    }                                                           \
  } while (0)

cudaStream_t CudaStreamOf(const kernels::Stream& stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

// What the communicator and its send requests share, so that a request can
// still report an abort (or that the communicator is gone) safely.
struct NcclShared {
  int device = 0;
  ncclComm_t comm = nullptr;  // null before Attach, after an abort and once destroyed
  bool aborted = false;
};

// Polls `query` (cudaEventQuery / cudaStreamQuery) until the work is done,
// checking for asynchronous NCCL errors (a failed peer or network) so the rank
// reports them instead of waiting forever; on one, aborts the communicator,
// which also ends its kernels.
absl::Status WaitUntil(NcclShared& shared, const std::function<cudaError_t()>& query,
                       const std::string& what) {
  for (;;) {
    const cudaError_t done = query();
    if (done == cudaSuccess) break;
    if (done != cudaErrorNotReady) return CudaStatus(done, what, "waiting for the stream");
    if (shared.comm != nullptr) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t query_result = ncclCommGetAsyncError(shared.comm, &async);
      if (query_result != ncclSuccess) async = query_result;
      if (async != ncclSuccess && async != ncclInProgress) {
        absl::Status status = NcclStatus(async, shared.comm, what, "asynchronous NCCL error");
        ncclCommAbort(shared.comm);
        shared.comm = nullptr;
        shared.aborted = true;
        return absl::Status(status.code(),
                            absl::StrCat(status.message(), "; the communicator was aborted"));
      }
    }
    std::this_thread::yield();
  }
  if (shared.aborted) {
    // The work "finished" because the abort ended it: its data is not valid.
    return absl::FailedPreconditionError(
        absl::StrCat(what, " failed: the communicator was aborted after an earlier NCCL error"));
  }
  return absl::OkStatus();
}

// One Isend: its ncclSend is on the stream, `done` recorded after it.
class NcclSendRequest final : public SendRequest {
 public:
  NcclSendRequest(std::shared_ptr<NcclShared> shared, cudaEvent_t done, std::string description)
      : shared_(std::move(shared)), done_(done), description_(std::move(description)) {}
  ~NcclSendRequest() override {
    if (!result_.has_value()) Wait().IgnoreError();
    if (done_ != nullptr) cudaEventDestroy(done_);
  }

  absl::Status Wait() override {
    if (result_.has_value()) return *result_;
    const std::string what = absl::StrCat(description_, " (Wait)");
    absl::Status status = CudaStatus(cudaSetDevice(shared_->device), what, "cudaSetDevice");
    if (status.ok()) {
      cudaEvent_t done = done_;
      status = WaitUntil(
          *shared_, [done] { return cudaEventQuery(done); }, what);
    }
    result_ = status;
    return status;
  }

 private:
  std::shared_ptr<NcclShared> shared_;
  cudaEvent_t done_;
  std::string description_;  // "nccl Isend to rank 3 (tag 7)"
  std::optional<absl::Status> result_;
};

class NcclDataCommunicator final : public DataCommunicator {
 public:
  explicit NcclDataCommunicator(int device) : shared_(std::make_shared<NcclShared>()) {
    shared_->device = device;
  }

  ~NcclDataCommunicator() override {
    // The caller has synchronized the streams (nccl_runtime.h): nothing of
    // this communicator is still running.
    if (shared_->comm != nullptr) {
      cudaSetDevice(shared_->device);
      ncclCommDestroy(shared_->comm);
      shared_->comm = nullptr;
    }
  }

  // Takes ownership of `comm`.
  absl::Status Attach(ncclComm_t comm) {
    shared_->comm = comm;
    const std::string what = absl::StrCat("nccl setup on device ", shared_->device);
    DELTASERVE_RETURN_IF_ERROR(
        NcclStatus(ncclCommCount(comm, &size_), comm, what, "ncclCommCount"));
    return NcclStatus(ncclCommUserRank(comm, &rank_), comm, what, "ncclCommUserRank");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string Name() const override { return "nccl"; }
  kernels::Device device() const override { return kernels::Device::kCuda; }

  absl::Status Send(const void* data, size_t bytes, int dest, int tag,
                    const kernels::Stream& stream) override {
    auto describe = [&] { return Describe("Send", "to", dest, tag); };
    DELTASERVE_RETURN_IF_ERROR(CheckPointToPoint(data, bytes, dest, tag, stream, describe));
    return NcclStatus(ncclSend(data, bytes, ncclChar, dest, shared_->comm, CudaStreamOf(stream)),
                      shared_->comm, describe(), "ncclSend");
  }

  absl::Status Recv(void* data, size_t bytes, int src, int tag,
                    const kernels::Stream& stream) override {
    auto describe = [&] { return Describe("Recv", "from", src, tag); };
    DELTASERVE_RETURN_IF_ERROR(CheckPointToPoint(data, bytes, src, tag, stream, describe));
    return NcclStatus(ncclRecv(data, bytes, ncclChar, src, shared_->comm, CudaStreamOf(stream)),
                      shared_->comm, describe(), "ncclRecv");
  }

  absl::StatusOr<std::unique_ptr<SendRequest>> Isend(const void* data, size_t bytes, int dest,
                                                     int tag,
                                                     const kernels::Stream& stream) override {
    auto describe = [&] { return Describe("Isend", "to", dest, tag); };
    DELTASERVE_RETURN_IF_ERROR(CheckPointToPoint(data, bytes, dest, tag, stream, describe));
    // The event first: once the send is enqueued, the request must exist.
    cudaEvent_t done = nullptr;
    DELTASERVE_CUDA_RETURN(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), describe);
    const absl::Status sent =
        NcclStatus(ncclSend(data, bytes, ncclChar, dest, shared_->comm, CudaStreamOf(stream)),
                   shared_->comm, describe(), "ncclSend");
    if (!sent.ok()) {
      cudaEventDestroy(done);
      return sent;
    }
    const absl::Status recorded =
        CudaStatus(cudaEventRecord(done, CudaStreamOf(stream)), describe(), "cudaEventRecord");
    if (!recorded.ok()) {
      // The send is enqueued but has no event: wait for the whole stream, so
      // the caller never frees a buffer NCCL may still read.
      cudaEventDestroy(done);
      DELTASERVE_RETURN_IF_ERROR(Synchronize(stream));
      return recorded;
    }
    return std::make_unique<NcclSendRequest>(shared_, done, describe());
  }

  absl::Status AllReduceSum(float* data, size_t count, const kernels::Stream& stream) override {
    auto describe = [&] {
      return absl::StrCat("nccl AllReduceSum of ", count, " floats over ", size_, " ranks");
    };
    DELTASERVE_RETURN_IF_ERROR(CheckUsable(stream, describe));
    DELTASERVE_RETURN_IF_ERROR(CheckDeviceBuffer(data, count * sizeof(float), describe));
    if (count == 0) return absl::OkStatus();  // every rank has the same count
    return NcclStatus(
        ncclAllReduce(data, data, count, ncclFloat, ncclSum, shared_->comm, CudaStreamOf(stream)),
        shared_->comm, describe(), "ncclAllReduce");
  }

  absl::Status Synchronize(const kernels::Stream& stream) override {
    auto describe = [&] { return std::string("nccl Synchronize"); };
    DELTASERVE_RETURN_IF_ERROR(CheckStream(stream, describe));
    DELTASERVE_CUDA_RETURN(cudaSetDevice(shared_->device), describe);
    cudaStream_t cuda_stream = CudaStreamOf(stream);
    return WaitUntil(
        *shared_, [cuda_stream] { return cudaStreamQuery(cuda_stream); }, describe());
  }

 private:
  std::string Describe(const char* op, const char* direction, int peer, int tag) const {
    return absl::StrCat("nccl ", op, " ", direction, " rank ", peer, " (tag ", tag, ")");
  }
  std::string OutOfRange(int peer) const {
    return absl::StrCat("rank ", peer, " is out of range: this communicator has ranks 0..",
                        size_ - 1);
  }

  template <typename DescribeFn>
  absl::Status CheckStream(const kernels::Stream& stream, const DescribeFn& describe) const {
    if (stream.device == kernels::Device::kCuda) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        describe(), " failed: the stream is on ", kernels::DeviceName(stream.device),
        ", but the nccl data communicator needs a CUDA stream of device ", shared_->device));
  }

  template <typename DescribeFn>
  absl::Status CheckUsable(const kernels::Stream& stream, const DescribeFn& describe) {
    if (shared_->comm == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          describe(), " failed: the communicator was aborted after an earlier NCCL error"));
    }
    DELTASERVE_RETURN_IF_ERROR(CheckStream(stream, describe));
    DELTASERVE_CUDA_RETURN(cudaSetDevice(shared_->device), describe);
    return absl::OkStatus();
  }

  // NCCL reads device memory; a host pointer would fault or hang inside it.
  template <typename DescribeFn>
  absl::Status CheckDeviceBuffer(const void* data, size_t bytes, const DescribeFn& describe) {
    if (bytes == 0) return absl::OkStatus();
    if (data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(), " failed: null buffer for ", bytes, " bytes"));
    }
    cudaPointerAttributes attributes;
    std::memset(&attributes, 0, sizeof(attributes));
    if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) error of the failed query
      attributes.type = cudaMemoryTypeUnregistered;
    }
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(),
                       " failed: the buffer is not device memory (NCCL needs cudaMalloc'd or "
                       "managed memory)"));
    }
    if (attributes.type == cudaMemoryTypeDevice && attributes.device != shared_->device) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(), " failed: the buffer is on device ", attributes.device,
                       ", the communicator on ", shared_->device));
    }
    return absl::OkStatus();
  }

  template <typename DescribeFn>
  absl::Status CheckPointToPoint(const void* data, size_t bytes, int peer, int tag,
                                 const kernels::Stream& stream, const DescribeFn& describe) {
    DELTASERVE_RETURN_IF_ERROR(CheckUsable(stream, describe));
    if (peer < 0 || peer >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(describe(), " failed: ", OutOfRange(peer)));
    }
    if (peer == rank_) {
      // Outside a group NCCL's send to self waits for a receive that the
      // same stream can only run after it.
      return absl::InvalidArgumentError(
          absl::StrCat(describe(), " failed: the nccl data communicator does not send to itself"));
    }
    if (tag < 0) {
      return absl::InvalidArgumentError(absl::StrCat(describe(), " failed: tags must be >= 0"));
    }
    return CheckDeviceBuffer(data, bytes, describe);
  }

  std::shared_ptr<NcclShared> shared_;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DataCommunicator>> MakeNcclDataCommunicator(Communicator& bootstrap,
                                                                           int device) {
  const std::string what = absl::StrCat("nccl setup on device ", device, " (rank ",
                                        bootstrap.rank(), " of ", bootstrap.size(), ")");

  // Rank 0's id, and whether rank 0 could make one: a failure there must not
  // leave the other ranks waiting in ncclCommInitRank.
  struct IdMessage {
    int32_t ok;
    ncclUniqueId id;
  };
  IdMessage message{};
  absl::Status id_status;
  if (bootstrap.rank() == 0) {
    id_status = NcclStatus(ncclGetUniqueId(&message.id), nullptr, what, "ncclGetUniqueId");
    message.ok = id_status.ok() ? 1 : 0;
  }
  DELTASERVE_RETURN_IF_ERROR(bootstrap.Broadcast(&message, sizeof(message), 0));
  if (!message.ok) {
    if (!id_status.ok()) return id_status;
    return absl::UnavailableError(
        absl::StrCat(what, " failed: rank 0 could not create the NCCL unique id"));
  }

  absl::Status local =
      device < 0 ? absl::InvalidArgumentError(absl::StrCat(what, " failed: device must be >= 0"))
                 : CudaStatus(cudaSetDevice(device), what, "cudaSetDevice");
  // Every rank learns how many failed before anyone enters ncclCommInitRank.
  float failed = local.ok() ? 0.0f : 1.0f;
  DELTASERVE_RETURN_IF_ERROR(bootstrap.AllReduceSum(&failed, 1));
  if (!local.ok()) return local;
  if (failed > 0.0f) {
    return absl::UnavailableError(absl::StrCat(what, " failed: ", static_cast<int>(failed),
                                               " other rank(s) could not set up their GPU; see "
                                               "their errors"));
  }

  ncclComm_t raw = nullptr;
  DELTASERVE_RETURN_IF_ERROR(
      NcclStatus(ncclCommInitRank(&raw, bootstrap.size(), message.id, bootstrap.rank()), nullptr,
                 what, "ncclCommInitRank"));
  auto comm = std::make_unique<NcclDataCommunicator>(device);
  DELTASERVE_RETURN_IF_ERROR(comm->Attach(raw));
  return comm;
}

}  // namespace deltaserve
