// The NCCL data communicator for the GPU data path (DESIGN.md, Processes):
// a TP group or a replica's stage chain, bootstrapped through a host
// communicator of the same ranks. No <nccl.h> here; the implementation is
// nccl_communicator_nccl.cc, built only with CUDA, NCCL and MPI
// (DELTASERVE_HAVE_NCCL in CMake; there is no stub without them).
//
// It follows data_communicator.h with these specifics:
// - Buffers are device memory on `device` (checked: a host pointer is an
//   InvalidArgument error, not a crash), streams are CUDA streams
//   (kernels::Stream::Cuda) of that device.
// - Every call is enqueued on the caller's stream (ncclSend, ncclRecv,
//   ncclAllReduce) and returns without waiting for the transfer; the first
//   message to a peer may block the host while NCCL connects the pair.
//   Synchronize(stream) is where the host waits: it polls the stream and
//   ncclCommGetAsyncError, so a failed peer or network is an error instead of
//   a hang. An Isend records an event after its ncclSend; Wait polls it the
//   same way.
// - NCCL has no tags: tags are checked (>= 0) but messages between two ranks
//   match in the order they were issued, and the receive must have exactly the
//   sent size (NCCL cannot detect a mismatch).
// - Each call is its own NCCL operation (no grouping): a send on a stream
//   holds the stream until the peer's receive is running, so a chain (stage p
//   sends to p + 1, receives from p - 1) works, a ring does not. Point to
//   point with self is refused.
// - Every rank issues the operations of one communicator in the same order.
//   A rank with two NCCL communicators on one GPU (its stage and its TP one)
//   must also order the two alike on every rank, or their kernels can wait
//   on each other (NCCL: using multiple communicators concurrently);
//   enqueuing both on the same stream does that.
// - After an asynchronous NCCL error the communicator is aborted
//   (ncclCommAbort) and every later call returns FailedPrecondition.
// - Destroy it after Synchronize on every stream it was used on (NCCL may
//   still read the buffers until then).
//
// Compiled and linked in CI without a GPU; it has not been run yet (a later
// issue runs it on GPUs).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/data_communicator.h"

namespace deltaserve {

// Collective over `bootstrap` (a host communicator: "mpi" or "single", which
// may be destroyed afterwards): rank 0 makes the ncclUniqueId and broadcasts
// it, every rank selects `device` (cudaSetDevice) and joins with
// ncclCommInitRank. The NCCL communicator has the ranks of `bootstrap`. If
// any rank fails to select its device, every rank returns an error (none is
// left waiting in ncclCommInitRank).
absl::StatusOr<std::unique_ptr<DataCommunicator>> MakeNcclDataCommunicator(Communicator& bootstrap,
                                                                           int device);

}  // namespace deltaserve
