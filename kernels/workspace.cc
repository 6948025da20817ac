#include "kernels/workspace.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "kernels/check.h"
#include "kernels/cuda/ops.h"

#if DELTASERVE_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace deltaserve::kernels {
namespace {

constexpr size_t kAlign = 64;
// Freed blocks kept for reuse at most; beyond it they go back to the system.
constexpr size_t kMaxCachedBytes = size_t{256} << 20;

// The size class of a request: a multiple of 64 bytes up to 4 KiB, then
// four classes per power of two (at most 25% over the request), so blocks
// of a step's rows serve the next step's slightly different rows.
size_t SizeClass(size_t bytes) {
  if (bytes <= 4096) return (bytes + kAlign - 1) / kAlign * kAlign;
  int shift = 63 - __builtin_clzll(bytes);  // 2^shift <= bytes
  const size_t quarter = size_t{1} << (shift - 2);
  return (bytes + quarter - 1) / quarter * quarter;
}

// A cached block is unusable to AddressSanitizer until it is handed out
// again, so a use after Free is reported as for the heap.
void MarkCached(void* data, size_t bytes, bool cached) {
#if DELTASERVE_ASAN
  if (cached) {
    ASAN_POISON_MEMORY_REGION(data, bytes);
  } else {
    ASAN_UNPOISON_MEMORY_REGION(data, bytes);
  }
#else
  static_cast<void>(data);
  static_cast<void>(bytes);
  static_cast<void>(cached);
#endif
}

MutableTensor ViewOf(void* data, Device device, DType dtype, int64_t rows, int64_t cols) {
  MutableTensor view;
  view.data = data;
  view.device = device;
  view.dtype = dtype;
  view.rows = rows;
  view.cols = cols;
  return view;
}

size_t BytesOf(DType dtype, int64_t rows, int64_t cols) {
  DELTASERVE_CHECK(dtype != DType::kMxfp4);  // codes and scales: weights only
  DELTASERVE_CHECK(rows >= 0 && cols >= 0);
  return static_cast<size_t>(rows) * ViewOf(nullptr, Device::kCpu, dtype, 1, cols).RowBytes();
}

}  // namespace

Workspace& Workspace::Of(Device device) {
  if (device == Device::kCpu) {
    static Workspace* const cpu = new Workspace(Device::kCpu);
    return *cpu;
  }
  // The views' checks refuse a CUDA device without a backend first.
  DELTASERVE_CHECK(device == Device::kCuda && cuda::ActiveBackend() != cuda::Backend::kNone);
  static Workspace* const gpu = new Workspace(Device::kCuda);
  return *gpu;
}

Workspace::Workspace(Device device)
    : device_(device),
      stream_(device == Device::kCpu ? Stream::Cpu() : Stream::Cuda(nullptr)),
      host_memory_(device == Device::kCpu || cuda::ActiveBackend() == cuda::Backend::kSim) {}

void* Workspace::FreshBlock(size_t bytes) {
  if (device_ == Device::kCpu) {
    void* data = std::aligned_alloc(kAlign, bytes);
    DELTASERVE_CHECK(data != nullptr);
    return data;
  }
  void* data = nullptr;
  const std::string error = DELTASERVE_CUDA_DISPATCH(DeviceMalloc)(bytes, &data);
  if (!error.empty()) {
    std::fprintf(stderr, "deltaserve: device allocation of %zu bytes failed: %s\n", bytes,
                 error.c_str());
    std::abort();
  }
  return data;
}

void Workspace::ReleaseBlock(void* data) {
  if (device_ == Device::kCpu) {
    std::free(data);
  } else {
    DELTASERVE_CUDA_DISPATCH(DeviceFree)(data);
  }
}

void Workspace::CopyFromHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (device_ == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const std::string error = DELTASERVE_CUDA_DISPATCH(CopyToDevice)(dst, src, bytes, stream_);
  if (!error.empty()) ReportError("CopyFromHost", error);
}

void Workspace::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (device_ == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const std::string error = DELTASERVE_CUDA_DISPATCH(CopyToHost)(dst, src, bytes, stream_);
  if (!error.empty()) ReportError("CopyToHost", error);
}

void Workspace::Zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  if (device_ == Device::kCpu) {
    std::memset(dst, 0, bytes);
    return;
  }
  const std::string error = DELTASERVE_CUDA_DISPATCH(DeviceZero)(dst, bytes, stream_);
  if (!error.empty()) ReportError("Zero", error);
}

std::string Workspace::Memory(size_t* free_bytes, size_t* total_bytes) const {
  if (device_ == Device::kCpu) {
    const long page = sysconf(_SC_PAGESIZE);
    *free_bytes = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<size_t>(page);
    *total_bytes = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(page);
    return std::string();
  }
  return DELTASERVE_CUDA_DISPATCH(DeviceMemory)(free_bytes, total_bytes);
}

int CudaDeviceCount(std::string* error) {
  if (cuda::ActiveBackend() == cuda::Backend::kNone) {
    *error = cuda::BackendProblem();
    return 0;
  }
  return DELTASERVE_CUDA_DISPATCH(DeviceCount)(error);
}

namespace {
std::atomic<int> selected_cuda_device{0};
}  // namespace

std::string SelectCudaDevice(int ordinal) {
  if (cuda::ActiveBackend() == cuda::Backend::kNone) return cuda::BackendProblem();
  std::string error = DELTASERVE_CUDA_DISPATCH(SelectDevice)(ordinal);
  if (error.empty()) selected_cuda_device = ordinal;
  return error;
}

int SelectedCudaDevice() { return selected_cuda_device; }

void* Workspace::Allocate(size_t bytes) {
  DELTASERVE_CHECK(bytes > 0);
  const size_t size = SizeClass(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use_bytes += size;
    if (auto it = cached_.find(size); it != cached_.end()) {
      void* data = it->second;
      cached_.erase(it);
      stats_.cached_bytes -= size;
      ++stats_.reuses;
      if (host_memory_) MarkCached(data, size, false);
      return data;
    }
    ++stats_.allocations;
  }
  return FreshBlock(size);
}

void Workspace::Free(void* data, size_t bytes) {
  if (data == nullptr) return;
  const size_t size = SizeClass(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use_bytes -= size;
    if (stats_.cached_bytes + size <= kMaxCachedBytes) {
      if (host_memory_) MarkCached(data, size, true);
      cached_.emplace(size, data);
      stats_.cached_bytes += size;
      return;
    }
  }
  ReleaseBlock(data);
}

Workspace::Stats Workspace::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Workspace::ReportError(const char* op, std::string message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = DeviceError{op, std::move(message)};
}

DeviceError Workspace::Synchronize() {
  // The CPU's ops complete before they return: nothing is in flight.
  if (device_ != Device::kCpu) {
    const std::string error = DELTASERVE_CUDA_DISPATCH(StreamSynchronize)(stream_);
    if (!error.empty()) ReportError("Synchronize", error);
  }
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(error_, DeviceError{});
}

Buffer::Buffer(Device device, DType dtype, int64_t rows, int64_t cols)
    : bytes_(BytesOf(dtype, rows, cols)) {
  void* data = bytes_ > 0 ? Workspace::Of(device).Allocate(bytes_) : nullptr;
  view_ = ViewOf(data, device, dtype, rows, cols);
}

Buffer::Buffer(Buffer&& other) noexcept
    : view_(std::exchange(other.view_, MutableTensor{})), bytes_(std::exchange(other.bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    view_ = std::exchange(other.view_, MutableTensor{});
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Buffer::~Buffer() { Release(); }

void Buffer::Release() {
  if (view_.data != nullptr) Workspace::Of(view_.device).Free(view_.data, bytes_);
  view_ = MutableTensor{};
  bytes_ = 0;
}

Temp::Temp(Device device, DType dtype, int64_t rows, int64_t cols) {
  if (device != Device::kCpu) {
    device_ = Buffer(device, dtype, rows, cols);
    view_ = device_.view();
    return;
  }
  const size_t bytes = BytesOf(dtype, rows, cols);
  bytes_ = ScratchBytes(bytes);
  view_ = ViewOf(bytes > 0 ? bytes_.data() : nullptr, device, dtype, rows, cols);
}

std::string DeviceBlock::Allocate(Device device, size_t bytes, DeviceBlock* out) {
  DELTASERVE_CHECK(bytes > 0);
  void* data = nullptr;
  if (device == Device::kCpu) {
    data = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (data == nullptr) return "out of memory";
  } else {
    DELTASERVE_CHECK(device == Device::kCuda && cuda::ActiveBackend() != cuda::Backend::kNone);
    std::string error = DELTASERVE_CUDA_DISPATCH(DeviceMalloc)(bytes, &data);
    if (!error.empty()) return error;
  }
  out->Release();
  out->device_ = device;
  out->data_ = data;
  out->bytes_ = bytes;
  return std::string();
}

DeviceBlock::DeviceBlock(DeviceBlock&& other) noexcept
    : device_(other.device_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBlock& DeviceBlock::operator=(DeviceBlock&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBlock::~DeviceBlock() { Release(); }

void DeviceBlock::Release() {
  if (data_ == nullptr) return;
  if (device_ == Device::kCpu) {
    std::free(data_);
  } else {
    DELTASERVE_CUDA_DISPATCH(DeviceFree)(data_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

bool TransparentHugePages() {
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(setting, line) && line.find("[never]") == std::string::npos;
}

std::shared_ptr<uint8_t> HugePageRegion(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t span = (std::max<size_t>(bytes, 1) + kHuge - 1) / kHuge * kHuge;
  void* const mapped =
      ::mmap(nullptr, span + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return nullptr;
  // The whole huge pages of the mapping: the slack before and after goes back.
  const auto at = reinterpret_cast<uintptr_t>(mapped);
  const uintptr_t begin = (at + kHuge - 1) & ~(kHuge - 1);
  if (begin > at) ::munmap(mapped, begin - at);
  if (at + kHuge > begin) ::munmap(reinterpret_cast<void*>(begin + span), at + kHuge - begin);
  auto* region = reinterpret_cast<uint8_t*>(begin);
  ::madvise(region, span, MADV_HUGEPAGE);  // advice: a kernel that declines keeps 4 KiB pages
  return std::shared_ptr<uint8_t>(region, [span](uint8_t* p) { ::munmap(p, span); });
}

}  // namespace deltaserve::kernels
