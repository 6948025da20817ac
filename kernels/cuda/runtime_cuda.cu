// Device memory and copies for the CUDA workspace (kernels/cuda/ops.h): the
// CUDA runtime's on the GPU; on the SIMT harness, whose device memory is the
// host's, aligned allocations and memcpy.
#include "kernels/cuda/compat.h"

#ifndef __CUDACC__
#include <cstdlib>
#endif

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {

#ifdef __CUDACC__

namespace {
std::string Error(cudaError_t status) {
  return status == cudaSuccess ? std::string() : std::string(cudaGetErrorString(status));
}
cudaStream_t Of(const Stream& stream) { return static_cast<cudaStream_t>(stream.handle); }
}  // namespace

int DeviceCount(std::string* error) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    *error = cudaGetErrorString(status);
    return 0;
  }
  return count;
}

std::string DeviceMalloc(size_t bytes, void** out) { return Error(cudaMalloc(out, bytes)); }

void DeviceFree(void* data) { cudaFree(data); }

std::string CopyToDevice(void* dst, const void* src, size_t bytes, const Stream& stream) {
  return Error(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, Of(stream)));
}

std::string CopyToHost(void* dst, const void* src, size_t bytes, const Stream& stream) {
  const std::string error = Error(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, Of(stream)));
  return error.empty() ? Error(cudaStreamSynchronize(Of(stream))) : error;
}

std::string StreamSynchronize(const Stream& stream) {
  const std::string error = Error(cudaStreamSynchronize(Of(stream)));
  return error.empty() ? Error(cudaGetLastError()) : error;
}

#else

int DeviceCount(std::string* error) { return 1; }

std::string DeviceMalloc(size_t bytes, void** out) {
  *out = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  return *out != nullptr ? std::string() : std::string("out of memory");
}

void DeviceFree(void* data) { std::free(data); }

std::string CopyToDevice(void* dst, const void* src, size_t bytes, const Stream& stream) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return std::string();
}

std::string CopyToHost(void* dst, const void* src, size_t bytes, const Stream& stream) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return std::string();
}

std::string StreamSynchronize(const Stream& stream) { return std::string(); }

#endif

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
