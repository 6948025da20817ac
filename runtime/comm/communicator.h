// The host communication interface: the control path between a replica's
// ranks (steps from the leader, results and reports back: point to point and
// broadcast), collectives on host memory, and Split to build groups
// (DESIGN.md, Processes). Implementations: SingleCommunicator (one process, no
// MPI) and the MPI one (mpi_runtime.h, host buffers). The tensors between
// stages and inside a TP group go over data communicators instead
// (data_communicator.h, which also runs on NCCL), built over groups split from
// this one (rank_communicators.h). No MPI or NCCL types appear here.
//
// Contract shared by every implementation:
// - Ranks are 0..size()-1 within this communicator; tags are >= 0.
// - Collectives (AllReduceSum, Broadcast, Barrier, Split) must be called by
//   every rank of the communicator in the same order, with the same count /
//   bytes / root.
// - A communicator is used from one thread at a time (MPI_THREAD_FUNNELED).
// - Every failure is a Status naming the communicator, the operation and the
//   peer rank(s): "mpi Recv from rank 3 (tag 7) failed: ...". Argument errors
//   are InvalidArgument and are detected before any communication.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace deltaserve {

// A send in flight. The buffer passed to Isend must stay alive and unchanged
// until Wait returns. Destroying a request that was not waited for waits for it
// (so the buffer is never read after the request is gone). Wait it before the
// communicator that issued it is destroyed.
class SendRequest {
 public:
  virtual ~SendRequest() = default;
  // Blocks until the send completed; later calls return the same result.
  virtual absl::Status Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single" or "mpi", for messages.
  virtual std::string Name() const = 0;

  // Point to point, on host memory. Recv must be given exactly the number of
  // bytes that was sent.
  virtual absl::Status Send(const void* data, size_t bytes, int dest, int tag) = 0;
  virtual absl::Status Recv(void* data, size_t bytes, int src, int tag) = 0;
  // Non-blocking send: the buffer must stay alive and unchanged until Wait
  // returns.
  virtual absl::StatusOr<std::unique_ptr<SendRequest>> Isend(const void* data, size_t bytes,
                                                             int dest, int tag) = 0;

  // In place, float32: data[i] = sum over ranks of data[i].
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;
  // In place: every rank ends with root's `bytes` bytes.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual absl::Status Barrier() = 0;

  // A sub-communicator of the ranks that pass the same color (>= 0), ranked by
  // key, ties broken by rank in this communicator (MPI_Comm_split semantics).
  // A negative color is an error, reported after the rank has taken part in the
  // split so that its peers do not hang.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;
};

}  // namespace deltaserve
