// A fixture for tools/check_compute.py (ctest compute_check_refuses_loop): a
// layer that gates its output in a loop of its own instead of calling an op.
// No library globs tests/build/; it is never compiled.
#include <cmath>

#include "kernels/scratch.h"

namespace deltaserve {

void GateInALoop(float* o, const float* gate, int64_t n) {
  kernels::ScratchFloats scaled(n);
  for (int64_t i = 0; i < n; ++i) scaled[i] = o[i] / (1.0f + std::exp(-gate[i]));
}

}  // namespace deltaserve
