// Fixture for the layering tests (CMakeLists.txt, layering_*): not built. A
// communicator file that is not a *_mpi.cc wrapper must not include <mpi.h>.
#include <mpi.h>

#include "runtime/comm/communicator.h"
