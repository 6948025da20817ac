// The communication interface of the data path: activation packets between
// pipeline stages (point to point) and the in-place float32 sums inside a
// tensor-parallel group, each call ordered on the stream of the work around
// it (kernels/stream.h). The control path (steps, results, reports between a
// replica's ranks: communicator.h) is a different communicator, so a control
// message and a data message never match each other, whatever their tags.
// rank_communicators.h builds a rank's three communicators from the layout.
//
// Implementations: HostDataCommunicator (host_data_communicator.h; over MPI
// or one process, host buffers, the CPU stream) and the NCCL one
// (nccl_runtime.h; device buffers, CUDA streams). No MPI, NCCL or CUDA types
// appear here.
//
// Contract shared by every implementation:
// - Ranks are 0..size()-1 within this communicator; tags are >= 0. A stage
//   communicator is ranked by stage, a TP communicator by TP rank.
// - Point to point: Recv must be given exactly the number of bytes that was
//   sent. Messages from one rank to another are received in the order they
//   were sent (per tag on the host; NCCL has no tags, so there in the order
//   of the calls). A rank never sends to itself on the data path; the host
//   implementations allow Isend to self followed by Recv, NCCL refuses it.
// - AllReduceSum is collective: every rank of the communicator calls it in
//   the same order with the same count, interleaved with the same point to
//   point calls.
// - A communicator is used from one thread at a time, and `stream` must be
//   on the communicator's device() (a mismatch is InvalidArgument).
// - Ordering and completion. Every call is ordered after the work enqueued on
//   `stream` before it and before the work enqueued after it:
//   * On the CPU stream (single, mpi) the call has completed when it
//     returns, as a host call does: Recv's bytes and AllReduceSum's sums are
//     in the buffer, Send's buffer may be reused. Synchronize returns at once.
//   * On a CUDA stream (nccl) the call is enqueued and returns without
//     waiting for the transfer; the buffers belong to the stream until it has
//     passed the call. The host waits in Synchronize(stream), the completion
//     point: it returns when everything enqueued on the stream so far is done,
//     or with the error of a failed peer or network. An Isend's Wait is the
//     same for that one send. Read a Recv's or an AllReduceSum's result on
//     the host only after Synchronize; free or overwrite a Send's buffer from
//     the host only after Synchronize (or, for an Isend, Wait).
// - Isend (SendRequest, communicator.h): the buffer must stay alive and
//   unchanged until Wait returns; wait for every request before the
//   communicator is destroyed.
// - Every failure is a Status naming the communicator, the operation and the
//   peer rank(s): "mpi Recv from rank 3 (tag 7) failed: ...". Argument errors
//   (peer, tag, buffer, stream) are InvalidArgument and are detected before
//   any communication.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/stream.h"
#include "kernels/tensor.h"
#include "runtime/comm/communicator.h"

namespace deltaserve {

class DataCommunicator {
 public:
  virtual ~DataCommunicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single", "mpi" or "nccl", for messages.
  virtual std::string Name() const = 0;
  // Where the buffers live and the streams run: kCpu (single, mpi), kCuda
  // (nccl).
  virtual kernels::Device device() const = 0;

  // Point to point, of `bytes` bytes.
  virtual absl::Status Send(const void* data, size_t bytes, int dest, int tag,
                            const kernels::Stream& stream) = 0;
  virtual absl::Status Recv(void* data, size_t bytes, int src, int tag,
                            const kernels::Stream& stream) = 0;
  // A send whose completion the host can wait for by itself (a stage sends a
  // packet on and goes on with the next batch).
  virtual absl::StatusOr<std::unique_ptr<SendRequest>> Isend(const void* data, size_t bytes,
                                                             int dest, int tag,
                                                             const kernels::Stream& stream) = 0;

  // In place, float32: data[i] = sum over ranks of data[i].
  virtual absl::Status AllReduceSum(float* data, size_t count, const kernels::Stream& stream) = 0;

  // The completion point: returns when every call this communicator enqueued
  // on `stream` is done (at once on the CPU stream).
  virtual absl::Status Synchronize(const kernels::Stream& stream) = 0;
};

}  // namespace deltaserve
