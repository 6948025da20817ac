// Scratch memory for the forward pass's temporaries: the projections,
// gates and attention outputs of a layer, the widened weight panels of a
// GEMM. They are megabytes each at a prefill chunk's rows, made and dropped
// per layer and per step. From the C++ heap each one is a fresh mmap that the
// kernel zeroes page by page on first touch, and munmaps again on free: 10-13%
// of a prefill in kernel time (docs/performance.md). A Scratch buffer comes
// instead from a region kept per thread and used as a stack (a layer takes
// its buffers and drops them on return, last in first out), so after the
// first step the same pages serve every layer and every step. The first step
// allocates separately and measures what it has live at most; once nothing
// is live the region becomes that size. Its touched pages are then the most
// the process had live at once, which it reached anyway: a pool of blocks
// of assorted sizes held 20 MB more at the peak of a 512-token prefill on
// k3-small, its blocks not fitting the next layer's sizes.
//
// Under AddressSanitizer the region's free part and each buffer's bytes past
// its request are poisoned, and buffers are kept apart by a red zone, so an
// overrun into the next buffer or a read of a dropped one is reported as it
// would be for separate heap blocks (without the heap's quarantine, which
// held a million-token score's freed buffers past its memory bound).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#if defined(__SANITIZE_ADDRESS__)
#define DELTASERVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DELTASERVE_ASAN 1
#endif
#endif
#ifndef DELTASERVE_ASAN
#define DELTASERVE_ASAN 0
#endif

namespace deltaserve::kernels {

// Whether this build runs under AddressSanitizer, which also makes compute
// 10-15x slower: the tests that size their work by time read it.
inline constexpr bool kAddressSanitizer = DELTASERVE_ASAN != 0;

// Bytes left poisoned after each buffer in the region: a red zone under
// AddressSanitizer, none otherwise.
inline constexpr size_t kScratchRedzoneBytes = DELTASERVE_ASAN ? 64 : 0;

class ScratchPool;

// `bytes` of uninitialised memory, 64-byte aligned, from the calling thread's
// pool, back to that pool when destroyed (from any thread; out of order is
// allowed, its space then waits for the buffers above it). Movable.
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

// `count` elements of a trivial type T, uninitialised.
template <typename T>
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(int64_t count) : bytes_(static_cast<size_t>(count) * sizeof(T)), count_(count) {}

  T* data() const { return static_cast<T*>(bytes_.data()); }
  int64_t size() const { return count_; }
  T& operator[](int64_t i) const { return data()[i]; }
  T* begin() const { return data(); }
  T* end() const { return data() + count_; }

 private:
  ScratchBytes bytes_;
  int64_t count_ = 0;
};

using ScratchFloats = Scratch<float>;

// The calling thread's pool, for tests: bytes of its region, bytes live, and
// the most ever live at once.
struct ScratchStats {
  size_t held_bytes = 0;
  size_t in_use_bytes = 0;
  size_t peak_in_use_bytes = 0;
};
ScratchStats ThisThreadScratchStats();

}  // namespace deltaserve::kernels
