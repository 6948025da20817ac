// Memory and ordering of one device: where the forward pass's arrays come
// from. A Buffer (owning, tagged with its device and dtype: activations,
// anything that outlives a layer) takes its bytes from the device's
// workspace, which keeps freed blocks for reuse (a caching allocator, as
// device allocators must be: cudaMalloc synchronises the device). A Temp (a
// layer's projections, gates, attention outputs) comes from the calling
// thread's scratch stack (kernels/scratch.h), taken and dropped last in first
// out. Both hand out Tensor / MutableTensor views; layers pass views, never
// the memory itself.
//
// Ops are issued in order on the workspace's stream; on the CPU that is the
// host, and every op has finished when it returns. Synchronize is the point
// at the end of a step where the work issued so far is waited for and an
// error an asynchronous kernel reported (ReportError) comes back, naming the
// op, so that the runtime turns it into a Status and fails the step cleanly.
// A CUDA workspace adds the stream, the cuBLASLt handle and device memory
// behind the same calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/scratch.h"
#include "kernels/stream.h"
#include "kernels/tensor.h"

namespace deltaserve::kernels {

// What Synchronize returns: empty `op` when nothing failed.
struct DeviceError {
  std::string op;       // the op whose kernel failed
  std::string message;  // what the device said
  bool ok() const { return op.empty(); }
};

class Workspace {
 public:
  // The workspace of `device` (one per process and device): the CPU's, or
  // the CUDA device's when a CUDA backend is active (kernels/cuda/ops.h);
  // asking for a device without one is a broken invariant (the views'
  // checks refuse it first).
  static Workspace& Of(Device device);

  Device device() const { return device_; }
  // The stream the device's ops and data transfers are ordered on (the
  // CPU's: the host).
  const Stream& stream() const { return stream_; }

  // `bytes` (> 0) of uninitialised memory, 64-byte aligned: a cached block
  // of the same size class when there is one.
  void* Allocate(size_t bytes);
  // Gives back what Allocate returned for the same `bytes`; kept for reuse
  // while the cache holds less than its bound, else freed.
  void Free(void* data, size_t bytes);

  struct Stats {
    size_t in_use_bytes = 0;  // allocated and not freed (size classes)
    size_t cached_bytes = 0;  // freed and kept for reuse
    int64_t allocations = 0;  // fresh blocks from the system
    int64_t reuses = 0;       // requests served from the cache
  };
  Stats stats() const;

  // Copies `bytes` from the host into this device's memory, or back, in the
  // stream's order; CopyToHost waits for the copy. A failure is reported
  // (ReportError) and comes back from Synchronize. On the CPU, memcpy.
  void CopyFromHost(void* dst, const void* src, size_t bytes);
  void CopyToHost(void* dst, const void* src, size_t bytes);
  // Zeros `bytes` of this device's memory at `dst`, in the stream's order.
  void Zero(void* dst, size_t bytes);
  // The device's free and total memory (the host's for the CPU and the SIMT
  // harness): "" or why they cannot be read.
  std::string Memory(size_t* free_bytes, size_t* total_bytes) const;

  // Records that `op`'s kernel failed asynchronously; the first report since
  // the last Synchronize is the one returned.
  void ReportError(const char* op, std::string message);
  // Waits for the ops issued so far (on the CPU they are done) and returns,
  // then clears, the first error reported since the last call.
  DeviceError Synchronize();

 private:
  explicit Workspace(Device device);
  ~Workspace() = delete;  // lives as long as the process

  // A block from the device itself, and back.
  void* FreshBlock(size_t bytes);
  void ReleaseBlock(void* data);

  const Device device_;
  const Stream stream_;
  // Whether blocks are host memory (the CPU, or the SIMT harness's device),
  // which AddressSanitizer poisons while they are cached.
  const bool host_memory_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;  // by size class
  Stats stats_;
  DeviceError error_;
};

// CUDA devices this process can use (0 without a backend; *error says why),
// and the choice of one, made before the first CUDA allocation: "" or why
// `ordinal` cannot be used.
int CudaDeviceCount(std::string* error);
std::string SelectCudaDevice(int ordinal);
// The ordinal SelectCudaDevice last chose (0 before).
int SelectedCudaDevice();

// An owning [rows, cols] array of one dtype on one device, from that
// device's workspace; uninitialised. Movable, not copyable (copies are ops:
// kernels/convert.h).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, DType dtype, int64_t rows, int64_t cols);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  MutableTensor view() const { return view_; }
  operator MutableTensor() const { return view_; }  // NOLINT: a view of it
  operator Tensor() const { return view_; }         // NOLINT: a view of it
  bool empty() const { return view_.empty(); }
  int64_t rows() const { return view_.rows; }
  int64_t cols() const { return view_.cols; }
  DType dtype() const { return view_.dtype; }
  Device device() const { return view_.device; }
  size_t bytes() const { return bytes_; }

 private:
  void Release();

  MutableTensor view_;
  size_t bytes_ = 0;
};

// A temporary [rows, cols] array for the span of a layer; uninitialised. On
// the CPU it comes from the calling thread's scratch stack: drop temporaries
// in the reverse order of taking them where possible (the stack keeps the
// space of one dropped early until those above it go). On CUDA it is a
// block of the device workspace's cache, whose reuse the stream orders.
class Temp {
 public:
  Temp() = default;
  Temp(Device device, DType dtype, int64_t rows, int64_t cols);

  MutableTensor view() const { return view_; }
  operator MutableTensor() const { return view_; }  // NOLINT: a view of it
  operator Tensor() const { return view_; }         // NOLINT: a view of it

 private:
  ScratchBytes bytes_;  // the CPU's
  Buffer device_;       // another device's
  MutableTensor view_;
};

// Memory that lives as long as what owns it (a model's weights, its state
// pool): one allocation from the device itself rather than the workspace's
// cache, whose size classes round a request up by as much as a quarter.
// Host memory on the CPU. Movable; uninitialised.
class DeviceBlock {
 public:
  DeviceBlock() = default;
  // `bytes` (> 0) on `device` into *out: "" or why it failed (the device's
  // error), *out unchanged then.
  static std::string Allocate(Device device, size_t bytes, DeviceBlock* out);
  DeviceBlock(DeviceBlock&& other) noexcept;
  DeviceBlock& operator=(DeviceBlock&& other) noexcept;
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  ~DeviceBlock();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void Release();

  Device device_ = Device::kCpu;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Host memory for what is read over and over in long streams (the weights a
// decode step reads): a region of at least `bytes` at a 2 MiB boundary that
// the kernel is asked (MADV_HUGEPAGE) to back with transparent huge pages, so
// that a stream takes one address translation per 2 MiB instead of per 4
// KiB; unmapped when its last owner goes; null when it cannot be mapped.
// TransparentHugePages: whether the kernel would ("always" or "madvise" in
// /sys/kernel/mm/transparent_hugepage/enabled, not "never").
std::shared_ptr<uint8_t> HugePageRegion(size_t bytes);
bool TransparentHugePages();

}  // namespace deltaserve::kernels
