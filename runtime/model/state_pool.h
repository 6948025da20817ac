// The inference state of one rank's sequences, in one pool made at load
// (Model::Load), so that nothing of it moves or grows by reallocation:
//
// - MLA latent caches in fixed-size pages (kernels/paged_cache.h has the
//   layout). A page holds kCachePageTokens consecutive tokens of one sequence
//   in every MLA layer the rank holds: one region per layer,
//   [capacity_pages * kCachePageTokens, C + R], so a page id means the same
//   rows in each. Pages are reference counted: a forked sequence shares its
//   parent's full pages and copies only the last, partly filled one
//   (SequenceState::Fork).
// - KDA state in fixed slots. A slot holds one sequence's recurrent state and
//   short-convolution tail for every KDA layer the rank holds (per layer, f32:
//   the tail [W - 1, 3 * H * d], then the state [H, d_k * d_v]); a sequence
//   takes one slot for its life, and a fork copies its parent's slot into
//   its own. Every sequence takes a slot, also on a rank without KDA layers
//   (a slot of no bytes), so every rank of a replica counts the same.
//
// Why 64-token pages: it is the MLA kernels' key block (kernels/cpu/
// mla_attention_cpu.cc) and KDA's chunk, so a page boundary is a boundary of
// both, where a cached prefix can later be resumed; a fork copies at most 63
// tokens a layer; and a page of a K3 layer (576 values, bf16) is 72 KB, large
// enough that a million-token table is 16,384 entries.
//
// On the CPU the regions are address space reserved up front and backed on
// first touch, so memory is committed only for pages and slots that were
// written; a freed slot's memory goes back to the system (a slot always
// starts as zeros). Device memory cannot be committed on first touch, so on
// CUDA the regions are allocated whole at load and a slot is zeroed when
// taken.
// A freed page is reused before any never touched one. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "kernels/workspace.h"
#include "runtime/model/config.h"
#include "runtime/model/shard.h"

namespace deltaserve {

inline constexpr int64_t kCachePageTokens = 64;

// Pages for `tokens` tokens.
inline int64_t CachePagesFor(int64_t tokens) {
  return (tokens + kCachePageTokens - 1) / kCachePageTokens;
}

// Slots a pool has when none are asked for: room for the default 64 running
// sequences and as many held prefixes, and more.
inline constexpr int64_t kDefaultStateSlots = 256;

// Bytes of one token's row of the MLA cache in one layer: C + R values of
// `cache_dtype` (f32 or bf16).
inline int64_t CacheRowBytes(const ModelConfig& config, kernels::DType cache_dtype) {
  return config.MlaCacheWidth() * (cache_dtype == kernels::DType::kBF16 ? 2 : 4);
}

// Bytes of one sequence's KDA state on the layers `shard` holds (`local`
// head counts): what a slot holds.
int64_t KdaSlotBytes(const ModelConfig& local, const ModelShard& shard);

// On a device, whose pool is allocated whole at load, the default pool
// (Model::Load's) is also at most what fits in kDeviceCacheShare of the memory free once the
// weights are placed, less the `slots` KDA slots and a workspace reserve
// (kDeviceWorkspaceReserveBytes, or a tenth of the device when smaller: the
// CUDA context, library workspaces, communicator buffers and a prefill
// chunk's activations; a planning figure, not a measurement):
// the tokens of MLA cache of the rank's layers (`local`, `shard`) that fit,
// in whole pages. ResourceExhausted when not one page fits.
inline constexpr double kDeviceCacheShare = 0.9;
inline constexpr int64_t kDeviceWorkspaceReserveBytes = int64_t{4} << 30;
absl::StatusOr<int64_t> DeviceCacheTokens(const ModelConfig& local, const ModelShard& shard,
                                          kernels::Device device, kernels::DType cache_dtype,
                                          int64_t slots);

// Bytes of one MLA page (over every MLA layer of a rank) and of one KDA
// slot in a rank's pool: what the prefix cache's budget counts.
struct StateUnitBytes {
  int64_t page = 0;
  int64_t slot = 0;
};

struct StatePoolSize {
  int64_t pages = 1;  // MLA cache pages of kCachePageTokens tokens
  int64_t slots = 2;  // sequences holding state at once (>= 2: a prefix and its fork)
};

class StatePool {
 public:
  // A pool on `device` for the layers of `shard` (head counts as in
  // `local`), MLA rows of `cache_dtype` (f32 or bf16). Fails when the address
  // space cannot be reserved, or for a device this build has no backend for.
  static absl::StatusOr<std::shared_ptr<StatePool>> Create(const ModelConfig& local,
                                                           const ModelShard& shard,
                                                           kernels::Device device,
                                                           kernels::DType cache_dtype,
                                                           StatePoolSize size);
  ~StatePool();
  StatePool(const StatePool&) = delete;
  StatePool& operator=(const StatePool&) = delete;

  kernels::DType dtype() const { return dtype_; }  // of the MLA rows
  kernels::Device device() const { return device_; }
  int64_t num_layers() const { return static_cast<int64_t>(regions_.size()); }  // of the model

  // The MLA cache.
  int64_t width() const { return width_; }  // C + R
  // Whether the rank holds MLA layers; without any, sequences take no pages.
  bool has_layers() const { return layer_count_ > 0; }
  int64_t capacity_pages() const { return capacity_pages_; }
  int64_t used_pages() const;
  // Bytes of one page over every MLA layer of the rank.
  int64_t page_bytes() const { return page_bytes_; }
  // Layer `layer`'s rows [capacity_pages * kCachePageTokens, C + R]; empty
  // for a layer that is not an MLA layer of the rank.
  kernels::MutableTensor Layer(int64_t layer) const;
  // Appends `count` new pages (each held once) to `pages`: all of them, or
  // none and ResourceExhausted naming the need and what is free.
  absl::Status Allocate(int64_t count, std::vector<int32_t>* pages);
  void Retain(int32_t page);   // one more holder
  void Release(int32_t page);  // one fewer; free when none is left
  int32_t Holders(int32_t page) const;

  // The KDA slots.
  int64_t capacity_slots() const { return capacity_slots_; }
  int64_t used_slots() const;
  int64_t slot_bytes() const { return slot_bytes_; }  // 0 on a rank without KDA layers
  // A free slot, all zeros; ResourceExhausted when every slot is held.
  absl::StatusOr<int32_t> AcquireSlot();
  void ReleaseSlot(int32_t slot);
  // Slot `slot`'s state [H, d_k * d_v] and conv tail [W - 1, 3 * H * d] of
  // layer `layer`; empty for a layer that is not a KDA layer of the rank.
  kernels::MutableTensor KdaState(int32_t slot, int64_t layer) const;
  kernels::MutableTensor KdaConv(int32_t slot, int64_t layer) const;

 private:
  StatePool() = default;
  int32_t HoldersLocked(int32_t page) const;  // with mu_ held; 0 for a page never used
  kernels::MutableTensor SlotView(int32_t slot, int64_t offset, int64_t rows, int64_t cols) const;

  kernels::Device device_ = kernels::Device::kCpu;
  kernels::DType dtype_ = kernels::DType::kF32;
  int64_t width_ = 0;
  int64_t capacity_pages_ = 0;
  int64_t page_bytes_ = 0;
  int64_t layer_count_ = 0;
  struct Region {
    void* base = nullptr;  // null: nothing reserved
    size_t bytes = 0;
    kernels::DeviceBlock device;  // what holds it off the CPU
  };
  absl::Status Reserve(size_t bytes, const std::string& what, Region* region) const;
  std::vector<Region> regions_;  // MLA rows, by layer

  // KDA: per layer, where its tail and state start in a slot (-1: not a KDA
  // layer of the rank), and their shapes.
  struct KdaLayout {
    int64_t conv_offset = -1, state_offset = -1;
    int64_t conv_rows = 0, conv_cols = 0, state_rows = 0, state_cols = 0;
  };
  std::vector<KdaLayout> kda_;  // by layer
  Region slots_;
  int64_t capacity_slots_ = 0;
  int64_t slot_bytes_ = 0;
  int64_t slot_stride_ = 0;  // slot_bytes_ rounded up to whole system pages

  mutable std::mutex mu_;
  std::vector<int32_t> holders_;  // by page, for the pages used so far
  // Freed pages, reused last freed first; then pages never used, in order.
  std::vector<int32_t> free_;
  int64_t next_unused_ = 0;
  int64_t used_ = 0;
  std::vector<int32_t> free_slots_;  // freed slots, last freed first; then never used ones
  std::vector<bool> slot_held_;      // by slot, for the slots used so far
  int64_t used_slots_ = 0;
};

}  // namespace deltaserve
