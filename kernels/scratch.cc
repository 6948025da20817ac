#include "kernels/scratch.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <tuple>
#include <utility>
#include <vector>

#if DELTASERVE_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace deltaserve::kernels {
namespace {

// Marks [p, p + bytes) unusable (poisoned) or usable for AddressSanitizer;
// a no-op without it.
void MarkPoisoned(const void* p, size_t bytes, bool poisoned) {
#if DELTASERVE_ASAN
  if (poisoned) {
    ASAN_POISON_MEMORY_REGION(p, bytes);
  } else {
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
  }
#else
  static_cast<void>(p);
  static_cast<void>(bytes);
  static_cast<void>(poisoned);
#endif
}
void Poison(const void* p, size_t bytes) { MarkPoisoned(p, bytes, true); }
void Unpoison(const void* p, size_t bytes) { MarkPoisoned(p, bytes, false); }

}  // namespace

// A stack in one region: the forward pass takes and drops its buffers
// nested, last in first out, so the region's top is what is live, and the
// region's touched pages are the most ever live at once. A buffer dropped out
// of order stays until the ones above it go. A request that does not fit is
// a separate allocation, and once nothing is live the region grows to the
// most that was live, for the next step.
class ScratchPool {
 public:
  ~ScratchPool() { FreeRegion(); }

  // Returns the buffer and its size in the pool's accounting (the request
  // rounded up to the alignment, plus the red zone); only the requested
  // bytes are usable under AddressSanitizer.
  std::pair<void*, size_t> Take(size_t bytes) {
    const size_t size = (bytes + kAlign - 1) / kAlign * kAlign + kScratchRedzoneBytes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (live_.empty() && overflow_live_ == 0 && capacity_ < high_water_) Grow();
      live_bytes_ += size;
      high_water_ = std::max(high_water_, live_bytes_);
      if (top_ + size <= capacity_) {
        void* data = static_cast<char*>(region_) + top_;
        live_.push_back({top_, size, false});
        top_ += size;
        Unpoison(data, bytes);
        return {data, size};
      }
      ++overflow_live_;
    }
    void* data = std::aligned_alloc(kAlign, size);
    if (data == nullptr) throw std::bad_alloc();
    Poison(static_cast<char*>(data) + bytes, size - bytes);
    return {data, size};
  }

  void Give(void* data, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    live_bytes_ -= size;
    const char* base = static_cast<const char*>(region_);
    const char* at = static_cast<const char*>(data);
    if (region_ == nullptr || at < base || at >= base + capacity_) {
      Unpoison(data, size);
      std::free(data);
      --overflow_live_;
      return;
    }
    const size_t offset = static_cast<size_t>(at - base);
    Poison(data, size);
    for (auto it = live_.rbegin(); it != live_.rend(); ++it) {
      if (it->offset == offset) {
        it->freed = true;
        break;
      }
    }
    while (!live_.empty() && live_.back().freed) {
      top_ = live_.back().offset;
      live_.pop_back();
    }
  }

  ScratchStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {capacity_, live_bytes_, high_water_};
  }

 private:
  static constexpr size_t kAlign = 64;
  struct Entry {
    size_t offset, size;
    bool freed;
  };

  // Nothing is live: the region becomes the size of the most ever live.
  void Grow() {
    FreeRegion();
    region_ = std::aligned_alloc(kAlign, high_water_);
    if (region_ == nullptr) throw std::bad_alloc();
    capacity_ = high_water_;
    top_ = 0;
    Poison(region_, capacity_);
  }

  void FreeRegion() {
    if (region_ != nullptr) Unpoison(region_, capacity_);
    std::free(region_);
    region_ = nullptr;
    capacity_ = 0;
  }

  std::mutex mu_;
  void* region_ = nullptr;
  size_t capacity_ = 0, top_ = 0;
  std::vector<Entry> live_;  // in the region, bottom to top
  size_t overflow_live_ = 0;
  size_t live_bytes_ = 0, high_water_ = 0;
};

namespace {

// Shared with the buffers it lent, so a buffer may outlive its thread.
const std::shared_ptr<ScratchPool>& ThisThreadPool() {
  thread_local const std::shared_ptr<ScratchPool> pool = std::make_shared<ScratchPool>();
  return pool;
}

}  // namespace

ScratchBytes::ScratchBytes(size_t bytes) {
  if (bytes == 0) return;
  pool_ = ThisThreadPool();
  std::tie(data_, capacity_) = pool_->Take(bytes);
}

ScratchBytes::ScratchBytes(ScratchBytes&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      pool_(std::move(other.pool_)) {}

ScratchBytes& ScratchBytes::operator=(ScratchBytes&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    pool_ = std::move(other.pool_);
  }
  return *this;
}

ScratchBytes::~ScratchBytes() { Release(); }

void ScratchBytes::Release() {
  if (data_ != nullptr) pool_->Give(data_, capacity_);
  data_ = nullptr;
  capacity_ = 0;
  pool_.reset();
}

ScratchStats ThisThreadScratchStats() { return ThisThreadPool()->Stats(); }

}  // namespace deltaserve::kernels
