// What the CUDA runtime sees: the number of usable GPUs and their names. Only
// built with DELTASERVE_HAVE_CUDA; the CUDA kernels themselves come later.
#pragma once

#include <string>
#include <vector>

namespace deltaserve::kernels {

struct CudaDevice {
  int index = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  size_t memory_bytes = 0;
};

// The visible devices; empty with an error message in *error when the runtime
// or driver is unavailable (a CPU-only machine running a CUDA build).
std::vector<CudaDevice> ListCudaDevices(std::string* error);

}  // namespace deltaserve::kernels
