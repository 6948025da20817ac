// The MLA latent caches of one rank's sequences, in fixed-size pages from one
// pool (kernels/paged_cache.h has the layout). A page holds kCachePageTokens
// consecutive tokens of one sequence in every MLA layer the rank holds: one
// region per layer, [capacity_pages * kCachePageTokens, C + R], so a page id
// means the same rows in each. Pages are reference counted: a forked
// sequence shares its parent's full pages and copies only the last, partly
// filled one (SequenceState::Fork).
//
// Why 64 tokens: it is the MLA kernels' key block (kernels/cpu/
// mla_attention_cpu.cc) and KDA's chunk, so a page boundary is a boundary of
// both, where a cached prefix can later be resumed; a fork copies at most 63
// tokens a layer; and a page of a K3 layer (576 values, bf16) is 72 KB, large
// enough that a million-token table is 16,384 entries.
//
// The regions are address space reserved up front and backed on first touch,
// so the cache never moves or grows by reallocation, and memory is committed
// only for pages that were written. A freed page is reused before any never
// touched one. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "runtime/model/config.h"
#include "runtime/model/shard.h"

namespace deltaserve {

inline constexpr int64_t kCachePageTokens = 64;

// Pages for `tokens` tokens.
inline int64_t CachePagesFor(int64_t tokens) {
  return (tokens + kCachePageTokens - 1) / kCachePageTokens;
}

class CachePool {
 public:
  // A pool on `device` for the MLA layers of `shard` (head counts as in
  // `local`), rows of `dtype` (f32 or bf16), room for `capacity_pages`
  // pages. Fails when the address space cannot be reserved, or for a device
  // this build has no backend for.
  static absl::StatusOr<std::shared_ptr<CachePool>> Create(const ModelConfig& local,
                                                           const ModelShard& shard,
                                                           kernels::Device device,
                                                           kernels::DType dtype,
                                                           int64_t capacity_pages);
  ~CachePool();
  CachePool(const CachePool&) = delete;
  CachePool& operator=(const CachePool&) = delete;

  kernels::DType dtype() const { return dtype_; }
  kernels::Device device() const { return device_; }
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

 private:
  CachePool() = default;
  int32_t HoldersLocked(int32_t page) const;  // with mu_ held; 0 for a page never used

  kernels::Device device_ = kernels::Device::kCpu;
  kernels::DType dtype_ = kernels::DType::kF32;
  int64_t width_ = 0;
  int64_t capacity_pages_ = 0;
  int64_t page_bytes_ = 0;
  int64_t layer_count_ = 0;
  struct Region {
    void* base = nullptr;  // null: not an MLA layer of the rank
    size_t bytes = 0;
  };
  std::vector<Region> regions_;  // by layer

  mutable std::mutex mu_;
  std::vector<int32_t> holders_;  // by page, for the pages used so far
  // Freed pages, reused last freed first; then pages never used, in order.
  std::vector<int32_t> free_;
  int64_t next_unused_ = 0;
  int64_t used_ = 0;
};

}  // namespace deltaserve
