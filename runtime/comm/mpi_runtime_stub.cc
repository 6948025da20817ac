// The MPI entry points of a build without MPI (DELTASERVE_HAVE_MPI 0). When MPI
// is present this file is empty and mpi_communicator_mpi.cc defines them.
#include "runtime/common/build_config.h"

#if !DELTASERVE_HAVE_MPI

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "runtime/comm/mpi_runtime.h"

namespace deltaserve {

absl::StatusOr<std::unique_ptr<Communicator>> InitMpiWorld(int* argc, char*** argv) {
  return absl::UnimplementedError("this build has no MPI (configure with -DDELTASERVE_MPI=ON)");
}

void FinalizeMpi() {}

void AbortMpi(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::exit(code);
}

}  // namespace deltaserve

#endif  // !DELTASERVE_HAVE_MPI
