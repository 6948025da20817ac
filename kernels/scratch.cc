#include "kernels/scratch.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <tuple>
#include <utility>
#include <vector>

namespace deltaserve::kernels {

class ScratchPool {
 public:
  ~ScratchPool() {
    for (const Block& b : free_) std::free(b.data);
  }

  // A block of at least `bytes`: the smallest free one no more than twice
  // that, else a new one.
  std::pair<void*, size_t> Take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->bytes >= bytes && it->bytes / 2 <= bytes &&
            (best == free_.end() || it->bytes < best->bytes)) {
          best = it;
        }
      }
      if (best != free_.end()) {
        const Block b = *best;
        *best = free_.back();
        free_.pop_back();
        free_bytes_ -= b.bytes;
        Use(b.bytes);
        return {b.data, b.bytes};
      }
    }
    const size_t capacity = (bytes + kAlign - 1) / kAlign * kAlign;
    void* data = std::aligned_alloc(kAlign, capacity);
    if (data == nullptr) throw std::bad_alloc();
    std::lock_guard<std::mutex> lock(mu_);
    held_bytes_ += capacity;
    Use(capacity);
    return {data, capacity};
  }

  // Takes a block back; keeps no more free bytes than the most ever in use,
  // dropping the largest free blocks first.
  void Give(void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_bytes_ -= bytes;
    free_.push_back({data, bytes});
    free_bytes_ += bytes;
    while (free_bytes_ > peak_in_use_bytes_ && !free_.empty()) {
      auto largest =
          std::max_element(free_.begin(), free_.end(),
                           [](const Block& a, const Block& b) { return a.bytes < b.bytes; });
      std::free(largest->data);
      free_bytes_ -= largest->bytes;
      held_bytes_ -= largest->bytes;
      *largest = free_.back();
      free_.pop_back();
    }
  }

  ScratchStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {held_bytes_, in_use_bytes_, peak_in_use_bytes_};
  }

 private:
  static constexpr size_t kAlign = 64;
  struct Block {
    void* data;
    size_t bytes;
  };

  void Use(size_t bytes) {
    in_use_bytes_ += bytes;
    peak_in_use_bytes_ = std::max(peak_in_use_bytes_, in_use_bytes_);
  }

  std::mutex mu_;
  std::vector<Block> free_;
  size_t free_bytes_ = 0, held_bytes_ = 0, in_use_bytes_ = 0, peak_in_use_bytes_ = 0;
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

void ZeroBytes(void* data, size_t bytes) {
  if (bytes > 0) std::memset(data, 0, bytes);
}

ScratchStats ThisThreadScratchStats() { return ThisThreadPool()->Stats(); }

}  // namespace deltaserve::kernels
