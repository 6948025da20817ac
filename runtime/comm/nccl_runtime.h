// NCCL communicators for the GPU data path (DESIGN.md, Processes): TP groups
// and stage pairs, bootstrapped through an MPI communicator. No <nccl.h> here;
// the implementation is nccl_communicator_nccl.cc, built only with CUDA, NCCL
// and MPI (DELTASERVE_HAVE_NCCL in CMake; there is no stub without them).
//
// The NCCL communicator follows communicator.h with these differences:
// - Buffers are device memory on `device` (checked: a host pointer is an
//   InvalidArgument error, not a crash).
// - NCCL has no tags: tags are checked (>= 0) but messages between two ranks
//   match in the order they were issued, and the receive must have exactly the
//   sent size (NCCL cannot detect a mismatch).
// - Isend does not start the transfer: it is launched together with this
//   rank's next Send or Recv in one NCCL group (so the ring pattern "Isend to
//   next, Recv from previous, Wait" works for any size), or alone by Wait or by
//   any collective. Two Isends to different peers before one Recv can deadlock
//   where MPI would buffer them: issue Recvs as early as possible.
// - Send to self is an error (NCCL would hang); Isend to self followed by Recv
//   from self works.
// - Blocking calls return when the stream finished, polling
//   ncclCommGetAsyncError; after an asynchronous NCCL error the communicator is
//   aborted (ncclCommAbort) and every later call returns FailedPrecondition.
// - Split needs NCCL >= 2.18 (ncclCommSplit); older NCCL returns Unimplemented.
//
// Compiled and linked in CI without a GPU; it has not been run yet (a later
// issue runs it on GPUs).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace deltaserve {

// Collective over `bootstrap` (a host communicator: "mpi" or "single"): rank 0
// makes the ncclUniqueId and broadcasts it, every rank selects `device`
// (cudaSetDevice) and joins with ncclCommInitRank. The NCCL communicator has the
// ranks of `bootstrap`. If any rank fails to set up its device, every rank
// returns an error (none is left waiting in ncclCommInitRank).
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap,
                                                                   int device);

}  // namespace deltaserve
