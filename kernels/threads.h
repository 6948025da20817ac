// Thread control for the CPU kernels: deltaserve's own loops and oneDNN's
// GEMMs run on the one OpenMP pool.
#pragma once

namespace deltaserve::kernels {

// Sets the number of threads used by the CPU kernels and GEMMs; n <= 0 means
// one per hardware thread.
void SetNumThreads(int n);
int NumThreads();

}  // namespace deltaserve::kernels
