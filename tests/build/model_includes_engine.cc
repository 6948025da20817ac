// Fixture for the layering tests (CMakeLists.txt, layering_*): not built. As
// a file of runtime/model/ it must be refused, since the model library does
// not depend on the engine; as a file of runtime/engine/ it is fine.
#include <vector>

#include "kernels/gemm.h"
#include "runtime/engine/session.h"
#include "runtime/model/model.h"
