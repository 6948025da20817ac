#include <cuda_runtime.h>

#include "kernels/cuda/device_info.h"

namespace deltaserve::kernels {

std::vector<CudaDevice> ListCudaDevices(std::string* error) {
  std::vector<CudaDevice> devices;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    *error = cudaGetErrorString(status);
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    devices.push_back({i, prop.name, prop.major, prop.minor, prop.totalGlobalMem});
  }
  return devices;
}

}  // namespace deltaserve::kernels
