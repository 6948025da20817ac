// The SIMT harness: CUDA kernels run on the host, so that the logic of every
// kernel of kernels/cuda/ is tested without a GPU. The same `.cu` source is
// compiled by nvcc for the device and, through kernels/cuda/compat.h, by the
// host compiler against this harness (docs/architecture.md, "The CUDA
// backend").
//
// A launch runs its blocks one after another. A block's threads are fibers
// on the launching OS thread, each on a stack of its own; a fiber runs until
// it reaches a barrier (__syncthreads, or a warp collective: shuffles, votes,
// __syncwarp), then the next one runs, in thread order. A barrier opens when
// every thread it waits for has reached it. So a kernel that reads what
// another thread writes without a barrier between sees the value from before
// the write (thread 0 runs ahead of thread 1), and per-block shared memory
// starts each block filled with 0xff bytes (a float NaN, an int -1), so a
// read of shared memory nobody wrote shows.
//
// It reports, and stops the launch at, what would hang or misbehave on the
// device: a __syncthreads() that some threads of the block never reach (they
// exited, or wait at a warp barrier instead), warp collectives whose lanes
// disagree on the mask, a block of more than 1024 threads, shared memory
// beyond the 227 KiB a block of sm_90 may hold.
//
// It does not show: the memory model (fibers switch only at barriers, so a
// missing __threadfence or a racy non-atomic write between barriers goes
// unseen unless the order above exposes it), timing, occupancy, bank
// conflicts, register limits, or anything of independent thread scheduling
// within a warp beyond its collectives. Atomics are plain read-modify-writes
// (one fiber runs at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

namespace deltaserve::kernels::simt {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  Dim3() = default;
  Dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT
  uint64_t count() const { return uint64_t{x} * y * z; }
};

constexpr int kWarpSize = 32;
// What a block of sm_90 may hold: threads, and shared memory (static and
// dynamic together).
constexpr unsigned kMaxBlockThreads = 1024;
constexpr size_t kMaxSharedBytes = 227 * 1024;

// Runs `body` as the kernel of a launch of `grid` blocks of `block` threads
// with `dynamic_shared` bytes of dynamic shared memory. Returns "" or what
// went wrong, naming `kernel`; a launch that fails stops at the failing
// block, its fibers abandoned.
std::string Launch(const char* kernel, Dim3 grid, Dim3 block, size_t dynamic_shared,
                   const std::function<void()>& body);

// The calling fiber's coordinates; only inside a launch.
const Dim3& ThreadIdx();
const Dim3& BlockIdx();
const Dim3& BlockDim();
const Dim3& GridDim();

void SyncThreads();
// Waits for the lanes of `mask` in the calling thread's warp.
void SyncWarp(unsigned mask);

// The block's shared memory: StaticShared hands the calling thread the
// block's `bytes` for its n-th declaration (every thread of a block makes the
// same declarations in the same order); DynamicShared, the launch's dynamic
// shared bytes.
void* StaticShared(size_t bytes, size_t align);
void* DynamicShared();

// Warp exchange: the calling lane publishes `bits` and gets those of lane
// `src` after every lane of `mask` has published.
uint64_t Exchange(unsigned mask, uint64_t bits, int src_lane);
int LaneId();

template <typename T>
T Shuffle(unsigned mask, T value, int src_lane) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = Exchange(mask, bits, src_lane);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
// Source lanes as CUDA computes them, in segments of `width` lanes: a lane
// whose source lies past its segment's end (or, shuffling up, before its
// start) gets its own value back.
template <typename T>
T ShflSync(unsigned mask, T value, int src, int width) {
  const int lane = LaneId(), base = lane & ~(width - 1);
  return Shuffle(mask, value, base + (src & (width - 1)));
}
template <typename T>
T ShflXorSync(unsigned mask, T value, int lane_mask, int width) {
  const int lane = LaneId(), base = lane & ~(width - 1);
  const int src = lane ^ lane_mask;  // an earlier segment's lane may be read
  return Shuffle(mask, value, src >= base + width ? lane : src);
}
template <typename T>
T ShflDownSync(unsigned mask, T value, unsigned delta, int width) {
  const int lane = LaneId(), base = lane & ~(width - 1);
  const int src = lane + static_cast<int>(delta);
  return Shuffle(mask, value, src >= base + width ? lane : src);
}
template <typename T>
T ShflUpSync(unsigned mask, T value, unsigned delta, int width) {
  const int lane = LaneId(), base = lane & ~(width - 1);
  const int src = lane - static_cast<int>(delta);
  return Shuffle(mask, value, src < base ? lane : src);
}
unsigned BallotSync(unsigned mask, int predicate);

// Atomics: one fiber runs at a time, so a read-modify-write is atomic.
template <typename T>
T AtomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
template <typename T>
T AtomicMax(T* address, T value) {
  const T old = *address;
  if (value > old) *address = value;
  return old;
}

}  // namespace deltaserve::kernels::simt
