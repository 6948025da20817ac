// The NCCL communicator (device buffers), see nccl_runtime.h for how it differs
// from the MPI one. Built only with CUDA, NCCL and MPI; <nccl.h> and the CUDA
// runtime stay in this file.
//
// NOT YET RUN: this compiles and links in CI, which has no GPU. It is first
// exercised on GPUs by a later issue; treat it as untested until then.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

// One Isend: pending until launched in a group, then in flight until its
// event completes.
struct SendState {
  const void* data = nullptr;
  size_t bytes = 0;
  int dest = 0;
  int tag = 0;
  bool launched = false;
  cudaEvent_t done = nullptr;  // recorded on the stream after the launch
  std::optional<absl::Status> result;
};

class NcclCommunicator;

class NcclSendRequest final : public SendRequest {
 public:
  NcclSendRequest(NcclCommunicator* owner, std::shared_ptr<SendState> state)
      : owner_(owner), state_(std::move(state)) {}
  ~NcclSendRequest() override;
  absl::Status Wait() override;

 private:
  NcclCommunicator* owner_;
  std::shared_ptr<SendState> state_;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(int device) : device_(device) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    for (const std::shared_ptr<SendState>& state : outstanding_) {
      if (!state->launched) {
        state->result = absl::FailedPreconditionError(
            absl::StrCat(Describe("Isend", "to", state->dest, state->tag),
                         " failed: the communicator was destroyed before the send was launched"));
      }
    }
    if (comm_ != nullptr) {
      // Launched sends still read their buffers: let them finish.
      if (stream_ != nullptr) WaitForStream("destroy").IgnoreError();
      if (comm_ != nullptr) ncclCommDestroy(comm_);
    }
    for (const std::shared_ptr<SendState>& state : outstanding_) {
      if (!state->result.has_value()) state->result = absl::OkStatus();
      if (state->done != nullptr) cudaEventDestroy(state->done);
      state->done = nullptr;
    }
    if (barrier_ != nullptr) cudaFree(barrier_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // The stream and the barrier's float; before the NCCL communicator exists.
  absl::Status CreateResources() {
    auto describe = [&] { return absl::StrCat("nccl setup on device ", device_); };
    DELTASERVE_CUDA_RETURN(cudaSetDevice(device_), describe);
    DELTASERVE_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), describe);
    void* barrier = nullptr;
    DELTASERVE_CUDA_RETURN(cudaMalloc(&barrier, sizeof(float)), describe);
    barrier_ = static_cast<float*>(barrier);
    DELTASERVE_CUDA_RETURN(cudaMemsetAsync(barrier_, 0, sizeof(float), stream_), describe);
    DELTASERVE_CUDA_RETURN(cudaStreamSynchronize(stream_), describe);
    return absl::OkStatus();
  }

  // Takes ownership of `comm`.
  absl::Status Attach(ncclComm_t comm) {
    comm_ = comm;
    auto what = absl::StrCat("nccl setup on device ", device_);
    DELTASERVE_RETURN_IF_ERROR(
        NcclStatus(ncclCommCount(comm_, &size_), comm_, what, "ncclCommCount"));
    return NcclStatus(ncclCommUserRank(comm_, &rank_), comm_, what, "ncclCommUserRank");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string Name() const override { return "nccl"; }

  absl::Status Send(const void* data, size_t bytes, int dest, int tag) override {
    auto describe = [&] { return Describe("Send", "to", dest, tag); };
    DELTASERVE_RETURN_IF_ERROR(CheckPointToPoint(data, bytes, dest, tag, describe));
    if (dest == rank_) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(),
                       " failed: a blocking NCCL send to self cannot complete; use Isend, then "
                       "Recv"));
    }
    DELTASERVE_RETURN_IF_ERROR(
        LaunchGroup([&] { return ncclSend(data, bytes, ncclChar, dest, comm_, stream_); },
                    "ncclSend", describe, /*recv_from_self=*/false));
    return WaitForStream(describe());
  }

  absl::Status Recv(void* data, size_t bytes, int src, int tag) override {
    auto describe = [&] { return Describe("Recv", "from", src, tag); };
    DELTASERVE_RETURN_IF_ERROR(CheckPointToPoint(data, bytes, src, tag, describe));
    if (src == rank_) {
      const SendState* self_send = nullptr;
      for (const std::shared_ptr<SendState>& state : outstanding_) {
        if (!state->launched && state->dest == rank_) {
          self_send = state.get();
          break;
        }
      }
      if (self_send == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(describe(),
                         " failed: no pending Isend to self; a receive from self would never "
                         "complete"));
      }
      if (self_send->bytes != bytes) {
        return absl::InvalidArgumentError(absl::StrCat(describe(),
                                                       " failed: the pending Isend to self has ",
                                                       self_send->bytes, " bytes, not ", bytes));
      }
    }
    DELTASERVE_RETURN_IF_ERROR(
        LaunchGroup([&] { return ncclRecv(data, bytes, ncclChar, src, comm_, stream_); },
                    "ncclRecv", describe, /*recv_from_self=*/src == rank_));
    return WaitForStream(describe());
  }

  absl::StatusOr<std::unique_ptr<SendRequest>> Isend(const void* data, size_t bytes, int dest,
                                                     int tag) override {
    auto describe = [&] { return Describe("Isend", "to", dest, tag); };
    DELTASERVE_RETURN_IF_ERROR(CheckPointToPoint(data, bytes, dest, tag, describe));
    auto state = std::make_shared<SendState>();
    state->data = data;
    state->bytes = bytes;
    state->dest = dest;
    state->tag = tag;
    outstanding_.push_back(state);
    return std::make_unique<NcclSendRequest>(this, std::move(state));
  }

  absl::Status AllReduceSum(float* data, size_t count) override {
    auto describe = [&] {
      return absl::StrCat("nccl AllReduceSum of ", count, " floats over ", size_, " ranks");
    };
    DELTASERVE_RETURN_IF_ERROR(CheckUsable(describe));
    DELTASERVE_RETURN_IF_ERROR(CheckDeviceBuffer(data, count * sizeof(float), describe));
    DELTASERVE_RETURN_IF_ERROR(LaunchPendingAlone());
    DELTASERVE_RETURN_IF_ERROR(
        NcclStatus(ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, stream_), comm_,
                   describe(), "ncclAllReduce"));
    return WaitForStream(describe());
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    auto describe = [&] {
      return absl::StrCat("nccl Broadcast of ", bytes, " bytes from root rank ", root);
    };
    DELTASERVE_RETURN_IF_ERROR(CheckUsable(describe));
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(describe(), " failed: ", OutOfRange(root)));
    }
    DELTASERVE_RETURN_IF_ERROR(CheckDeviceBuffer(data, bytes, describe));
    DELTASERVE_RETURN_IF_ERROR(LaunchPendingAlone());
    DELTASERVE_RETURN_IF_ERROR(
        NcclStatus(ncclBroadcast(data, data, bytes, ncclChar, root, comm_, stream_), comm_,
                   describe(), "ncclBroadcast"));
    return WaitForStream(describe());
  }

  // NCCL has no barrier: an all-reduce of one float orders every rank.
  absl::Status Barrier() override {
    auto describe = [&] { return absl::StrCat("nccl Barrier over ", size_, " ranks"); };
    DELTASERVE_RETURN_IF_ERROR(CheckUsable(describe));
    DELTASERVE_RETURN_IF_ERROR(LaunchPendingAlone());
    DELTASERVE_RETURN_IF_ERROR(
        NcclStatus(ncclAllReduce(barrier_, barrier_, 1, ncclFloat, ncclSum, comm_, stream_), comm_,
                   describe(), "ncclAllReduce"));
    return WaitForStream(describe());
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    auto describe = [&] {
      return absl::StrCat("nccl Split (color ", color, ", key ", key, ") on rank ", rank_, " of ",
                          size_);
    };
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    DELTASERVE_RETURN_IF_ERROR(CheckUsable(describe));
    DELTASERVE_RETURN_IF_ERROR(LaunchPendingAlone());
    // A rank with a bad color still takes part, so its peers do not hang.
    ncclComm_t part = nullptr;
    DELTASERVE_RETURN_IF_ERROR(NcclStatus(
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &part, nullptr), comm_,
        describe(), "ncclCommSplit"));
    if (color < 0) {
      if (part != nullptr) ncclCommDestroy(part);
      return absl::InvalidArgumentError(absl::StrCat(describe(), " failed: colors must be >= 0"));
    }
    auto child = std::make_unique<NcclCommunicator>(device_);
    // Attach first, so the child's destructor owns `part` even if the rest fails.
    DELTASERVE_RETURN_IF_ERROR(child->Attach(part));
    DELTASERVE_RETURN_IF_ERROR(child->CreateResources());
    return child;
#else
    return absl::UnimplementedError(
        absl::StrCat(describe(), " failed: ncclCommSplit needs NCCL >= 2.18; this build has ",
                     NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH));
#endif
  }

  // For NcclSendRequest::Wait: launches the send if it is still pending, then
  // waits for its event.
  absl::Status WaitSend(const std::shared_ptr<SendState>& state) {
    if (state->result.has_value()) return *state->result;
    auto describe = [&] { return Describe("Isend", "to", state->dest, state->tag) + " (Wait)"; };
    absl::Status status = CheckUsable(describe);
    if (status.ok() && !state->launched && state->dest == rank_) {
      // Nothing can complete it now: its Recv from self would have launched it.
      status = absl::FailedPreconditionError(
          absl::StrCat(describe(),
                       " failed: a send to self completes only with a Recv from self, "
                       "issued before Wait"));
    }
    if (status.ok() && !state->launched) status = LaunchPendingAlone();
    if (status.ok() && !state->result.has_value()) {
      cudaEvent_t done = state->done;
      status = WaitUntil([done] { return cudaEventQuery(done); }, describe());
    }
    Forget(state);
    if (!state->result.has_value()) state->result = status;
    return *state->result;
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
  absl::Status CheckUsable(const DescribeFn& describe) {
    if (comm_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          describe(), " failed: the communicator was aborted after an earlier NCCL error"));
    }
    DELTASERVE_CUDA_RETURN(cudaSetDevice(device_), describe);
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
    if (attributes.type == cudaMemoryTypeDevice && attributes.device != device_) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(), " failed: the buffer is on device ", attributes.device,
                       ", the communicator on ", device_));
    }
    return absl::OkStatus();
  }

  template <typename DescribeFn>
  absl::Status CheckPointToPoint(const void* data, size_t bytes, int peer, int tag,
                                 const DescribeFn& describe) {
    DELTASERVE_RETURN_IF_ERROR(CheckUsable(describe));
    if (peer < 0 || peer >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(describe(), " failed: ", OutOfRange(peer)));
    }
    if (tag < 0) {
      return absl::InvalidArgumentError(absl::StrCat(describe(), " failed: tags must be >= 0"));
    }
    return CheckDeviceBuffer(data, bytes, describe);
  }

  // One NCCL group: the pending Isends, then `extra` (a Send or Recv, or
  // nothing). A send to self can only complete together with its receive, so
  // the oldest pending one joins only a Recv from self (`recv_from_self`);
  // others stay pending. Each launched send gets an event recorded after the
  // group.
  template <typename DescribeFn>
  absl::Status LaunchGroup(const std::function<ncclResult_t()>& extra, const char* extra_call,
                           const DescribeFn& describe, bool recv_from_self) {
    std::vector<std::shared_ptr<SendState>> launching;
    bool self_send_paired = !recv_from_self;
    for (const std::shared_ptr<SendState>& state : outstanding_) {
      if (state->launched) continue;
      if (state->dest == rank_) {
        if (self_send_paired) continue;
        self_send_paired = true;
      }
      launching.push_back(state);
    }
    if (launching.empty() && !extra) return absl::OkStatus();
    std::string what = extra ? describe() : std::string("nccl pending Isends");
    absl::Status status = NcclStatus(ncclGroupStart(), comm_, what, "ncclGroupStart");
    if (status.ok()) {
      for (const std::shared_ptr<SendState>& state : launching) {
        absl::Status send =
            NcclStatus(ncclSend(state->data, state->bytes, ncclChar, state->dest, comm_, stream_),
                       comm_, Describe("Isend", "to", state->dest, state->tag), "ncclSend");
        if (status.ok()) status = send;
      }
      if (extra) {
        absl::Status op = NcclStatus(extra(), comm_, what, extra_call);
        if (status.ok()) status = op;
      }
      absl::Status end = NcclStatus(ncclGroupEnd(), comm_, what, "ncclGroupEnd");
      if (status.ok()) status = end;
    }
    for (const std::shared_ptr<SendState>& state : launching) {
      state->launched = true;
      if (!status.ok()) {
        state->result = status;
        continue;
      }
      absl::Status recorded =
          CudaStatus(cudaEventCreateWithFlags(&state->done, cudaEventDisableTiming),
                     Describe("Isend", "to", state->dest, state->tag), "cudaEventCreate");
      if (recorded.ok()) {
        recorded = CudaStatus(cudaEventRecord(state->done, stream_),
                              Describe("Isend", "to", state->dest, state->tag), "cudaEventRecord");
      }
      // Without an event the send is complete once the stream is.
      if (!recorded.ok()) {
        if (state->done != nullptr) cudaEventDestroy(state->done);
        state->done = nullptr;
        state->result = WaitForStream(Describe("Isend", "to", state->dest, state->tag));
      }
    }
    return status;
  }

  // Launches pending Isends to other ranks by themselves (before a collective
  // or for Wait); sends to self wait for their Recv.
  absl::Status LaunchPendingAlone() {
    return LaunchGroup(
        nullptr, "", [] { return std::string(); }, /*recv_from_self=*/false);
  }

  // Polls `query` (cudaEventQuery / cudaStreamQuery) until the work is done,
  // checking for asynchronous NCCL errors (a failed peer or network) so the
  // rank reports them instead of waiting forever.
  absl::Status WaitUntil(const std::function<cudaError_t()>& query, const std::string& what) {
    for (;;) {
      const cudaError_t done = query();
      if (done == cudaSuccess) return absl::OkStatus();
      if (done != cudaErrorNotReady) return CudaStatus(done, what, "waiting for the stream");
      ncclResult_t async = ncclSuccess;
      const ncclResult_t query_result = ncclCommGetAsyncError(comm_, &async);
      if (query_result != ncclSuccess) async = query_result;
      if (async != ncclSuccess && async != ncclInProgress) {
        absl::Status status = NcclStatus(async, comm_, what, "asynchronous NCCL error");
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return absl::Status(status.code(),
                            absl::StrCat(status.message(), "; the communicator was aborted"));
      }
      std::this_thread::yield();
    }
  }
  absl::Status WaitForStream(const std::string& what) {
    if (comm_ == nullptr) return absl::OkStatus();  // aborted: nothing will finish
    cudaStream_t stream = stream_;
    return WaitUntil([stream] { return cudaStreamQuery(stream); }, what);
  }

  void Forget(const std::shared_ptr<SendState>& state) {
    if (state->done != nullptr) cudaEventDestroy(state->done);
    state->done = nullptr;
    for (auto it = outstanding_.begin(); it != outstanding_.end(); ++it) {
      if (it->get() == state.get()) {
        outstanding_.erase(it);
        break;
      }
    }
  }

  int device_;
  ncclComm_t comm_ = nullptr;  // null before Attach and after an abort
  cudaStream_t stream_ = nullptr;
  float* barrier_ = nullptr;  // [1] on device_
  int rank_ = 0;
  int size_ = 0;
  // Isends not yet waited for, oldest first (pending ones launch in this order).
  std::deque<std::shared_ptr<SendState>> outstanding_;
};

NcclSendRequest::~NcclSendRequest() {
  if (!state_->result.has_value()) Wait().IgnoreError();
}

absl::Status NcclSendRequest::Wait() {
  // After the communicator is gone its destructor has settled the result.
  if (state_->result.has_value()) return *state_->result;
  return owner_->WaitSend(state_);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap,
                                                                   int device) {
  const std::string what = absl::StrCat("nccl setup on device ", device, " (rank ",
                                        bootstrap.rank(), " of ", bootstrap.size(), ")");
  if (bootstrap.Name() == "nccl") {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " failed: the bootstrap communicator must use host memory (mpi or single)"));
  }

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

  auto comm = std::make_unique<NcclCommunicator>(device);
  absl::Status local =
      device < 0 ? absl::InvalidArgumentError(absl::StrCat(what, " failed: device must be >= 0"))
                 : comm->CreateResources();
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
  DELTASERVE_RETURN_IF_ERROR(comm->Attach(raw));
  return comm;
}

}  // namespace deltaserve
