// Starting, wrapping and ending MPI for a worker job (DESIGN.md, Processes).
// No <mpi.h> here: the MPI types stay inside mpi_communicator_mpi.cc. In a
// build without MPI (DELTASERVE_HAVE_MPI 0) the same functions exist
// (mpi_runtime_stub.cc): InitMpiWorld returns an error, FinalizeMpi does
// nothing, AbortMpi exits.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace deltaserve {

// Initializes MPI (MPI_Init_thread, at least MPI_THREAD_FUNNELED) unless it is
// already initialized, in which case the existing initialization is adopted as
// is (its owner chose the thread level and finalizes it). Makes MPI errors on
// MPI_COMM_WORLD come back as return codes (MPI_ERRORS_RETURN), rejects a
// singleton fallback (CheckNotSingletonFallback), and returns a communicator
// over a duplicate of MPI_COMM_WORLD (same ranks, separate message space).
// Collective over the world. argc / argv may be null. MPI may stay initialized
// after an error: FinalizeMpi() is still the way out.
absl::StatusOr<std::unique_ptr<Communicator>> InitMpiWorld(int* argc, char*** argv);

// Finalizes MPI if InitMpiWorld initialized it and it is not finalized yet;
// otherwise does nothing. Destroy every MPI communicator first.
void FinalizeMpi();

// For fatal errors on one rank: ends the whole job quickly (MPI_Abort on the
// world, so mpirun / srun kill the other ranks instead of leaving them blocked
// in a receive forever). Exits with `code` when MPI is not running. Flushes
// stdout and stderr first. Does not return.
[[noreturn]] void AbortMpi(int code);

// True when the environment says this process was started by an MPI launcher
// (mpirun: OMPI_COMM_WORLD_SIZE; PMIx / PMI: PMIX_RANK, PMI_RANK; a Slurm step
// of more than one task). Needs no MPI initialization; call it before
// InitMpiWorld to choose between it and a SingleCommunicator (after MPI_Init
// even an Open MPI singleton has PMIX_RANK set). Answers the
// same in a build without MPI, where InitMpiWorld then explains the problem.
bool LaunchedUnderMpi();

}  // namespace deltaserve
