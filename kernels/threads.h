// Thread control for the CPU kernels: OpenMP for deltaserve's own loops and
// OpenBLAS's pool for GEMMs use the same count.
#pragma once

namespace deltaserve::kernels {

// Sets the number of threads used by the CPU kernels and BLAS; n <= 0 means
// one per hardware thread.
void SetNumThreads(int n);
int NumThreads();

}  // namespace deltaserve::kernels
