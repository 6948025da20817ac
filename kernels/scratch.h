// Scratch memory for the forward pass's temporaries: the projections,
// gates and attention outputs of a layer, the widened weight panels of a
// GEMM. They are megabytes each at a prefill chunk's rows, made and dropped
// per layer and per step. From the C++ heap each one is a fresh mmap that the
// kernel zeroes page by page on first touch, and munmaps again on free: 10-13%
// of a prefill in kernel time (docs/performance.md). A Scratch buffer comes
// instead from a pool of blocks kept per thread, so after the first layer of
// the first step the same pages serve every layer and every step.
//
// The pool reuses a free block for a request of at least half its size (so a
// block's touched pages are mostly what the request needs) and keeps at most
// as many free bytes as the most it ever had in use at once, freeing the
// largest blocks beyond that: what stays resident between steps is bounded by
// the peak of one step, which the process reached anyway.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace deltaserve::kernels {

class ScratchPool;

// `bytes` of uninitialised memory, 64-byte aligned, from the calling thread's
// pool, back to that pool when destroyed (from any thread). Movable.
class ScratchBytes {
 public:
  ScratchBytes() = default;
  explicit ScratchBytes(size_t bytes);
  ScratchBytes(ScratchBytes&& other) noexcept;
  ScratchBytes& operator=(ScratchBytes&& other) noexcept;
  ScratchBytes(const ScratchBytes&) = delete;
  ScratchBytes& operator=(const ScratchBytes&) = delete;
  ~ScratchBytes();

  void* data() const { return data_; }

 private:
  void Release();

  void* data_ = nullptr;
  size_t capacity_ = 0;  // of the block, >= the request
  std::shared_ptr<ScratchPool> pool_;
};

// `count` elements of a trivial type T. Uninitialised: a caller that reads
// before it writes (an accumulating GEMM, a sum) asks for Zeroed.
template <typename T>
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(int64_t count) : bytes_(static_cast<size_t>(count) * sizeof(T)), count_(count) {}
  static Scratch Zeroed(int64_t count);

  T* data() const { return static_cast<T*>(bytes_.data()); }
  int64_t size() const { return count_; }
  T& operator[](int64_t i) const { return data()[i]; }
  T* begin() const { return data(); }
  T* end() const { return data() + count_; }
  std::span<T> span() const { return {data(), static_cast<size_t>(count_)}; }

 private:
  ScratchBytes bytes_;
  int64_t count_ = 0;
};

using ScratchFloats = Scratch<float>;

// Sets `bytes` at `data` to zero (out of line: see kernels/cpu/dispatch.h on
// inline code in headers the CPU levels include).
void ZeroBytes(void* data, size_t bytes);

template <typename T>
Scratch<T> Scratch<T>::Zeroed(int64_t count) {
  Scratch<T> s(count);
  ZeroBytes(s.data(), static_cast<size_t>(count) * sizeof(T));
  return s;
}

// The calling thread's pool, for tests and --stats: bytes in blocks it holds
// (in use and free) and the most it had in use at once.
struct ScratchStats {
  size_t held_bytes = 0;
  size_t in_use_bytes = 0;
  size_t peak_in_use_bytes = 0;
};
ScratchStats ThisThreadScratchStats();

}  // namespace deltaserve::kernels
