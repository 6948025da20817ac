// Device memory and copies for the CUDA workspace (kernels/cuda/ops.h): the
// CUDA runtime's on the GPU; on the SIMT harness, whose device memory is the
// host's, aligned allocations and memcpy.
#include "kernels/cuda/compat.h"

#ifndef __CUDACC__
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
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

std::string DeviceZero(void* dst, size_t bytes, const Stream& stream) {
  return Error(cudaMemsetAsync(dst, 0, bytes, Of(stream)));
}

std::string SelectDevice(int ordinal) { return Error(cudaSetDevice(ordinal)); }

std::string DeviceMemory(size_t* free_bytes, size_t* total_bytes) {
  return Error(cudaMemGetInfo(free_bytes, total_bytes));
}

#else

int DeviceCount(std::string* error) { return 1; }

// The harness's device memory is the host's: more than the host has is
// refused as a device would refuse it (and before the allocator, which
// under AddressSanitizer aborts on a request past its limit).
std::string DeviceMalloc(size_t bytes, void** out) {
  const size_t host_bytes =
      static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > host_bytes) {
    return "out of memory: " + std::to_string(bytes) + " bytes asked of the harness's device, " +
           "which is the host's " + std::to_string(host_bytes) + " bytes";
  }
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

std::string DeviceZero(void* dst, size_t bytes, const Stream& stream) {
  if (bytes > 0) std::memset(dst, 0, bytes);
  return std::string();
}

// The harness has one device, whose memory is the host's: what is
// available of it is what the host has available.
std::string SelectDevice(int ordinal) {
  return ordinal == 0
             ? std::string()
             : "the SIMT harness has one device (cuda:0), not cuda:" + std::to_string(ordinal);
}

std::string DeviceMemory(size_t* free_bytes, size_t* total_bytes) {
  const long page = sysconf(_SC_PAGESIZE);
  *free_bytes = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<size_t>(page);
  *total_bytes = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(page);
  return std::string();
}

#endif

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
