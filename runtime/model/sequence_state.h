// Per-sequence inference state: for each KDA layer the float32 recurrent state
// and the short-convolution tail, and the sequence's pages of the rank's MLA
// cache pool (runtime/model/cache_pool.h): its page table, one entry per 64
// tokens, the same for every MLA layer. KDA state is constant in sequence
// length; the MLA cache grows by C + R values per token per MLA layer,
// float32 or bf16 (--kv-cache-dtype), a page at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/paged_cache.h"
#include "kernels/tensor.h"
#include "kernels/workspace.h"
#include "runtime/model/cache_pool.h"
#include "runtime/model/config.h"
#include "runtime/model/shard.h"

namespace deltaserve {

struct KdaLayerState {
  kernels::Buffer conv;   // f32 [W - 1, 3 * H * d]: last pre-convolution q/k/v inputs
  kernels::Buffer state;  // f32 [H, d_k * d_v]
};

class SequenceState {
 public:
  // State for the layers `shard` holds, with `local` (its LocalConfig) head
  // counts, its MLA cache in `pool` (null: a sequence that never runs an MLA
  // layer, for counting KDA bytes).
  explicit SequenceState(const ModelConfig& local, const ModelShard& shard = {},
                         std::shared_ptr<CachePool> pool = nullptr);
  ~SequenceState();  // gives its pages back
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  // A new sequence that continues this one: the KDA state and conv tails
  // copied, the full MLA pages shared, the partly filled last page copied
  // (ResourceExhausted when the pool has no page for it; nothing changes).
  absl::StatusOr<std::unique_ptr<SequenceState>> Fork() const;
  // Bytes Fork copies: the KDA state and conv tails, and the rows of the
  // partly filled last page in every MLA layer.
  int64_t ForkCopyBytes() const;

  // More pages needed to hold `tokens` tokens in all (0 when it has them).
  int64_t PagesNeeded(int64_t tokens) const;
  // Takes those pages from the pool: all, or none and ResourceExhausted.
  absl::Status ReservePages(int64_t tokens);

  // Layer `layer`'s KDA state and conv tail as the kernels take them.
  kernels::MutableTensor KdaState(int64_t layer) const { return kda[layer].state; }
  kernels::MutableTensor KdaConv(int64_t layer) const { return kda[layer].conv; }
  // Layer `layer`'s cache as the paged kernels take it.
  kernels::MutablePagedCache MlaCache(int64_t layer) const;
  const std::vector<int32_t>& pages() const { return pages_; }

  int64_t length = 0;  // tokens consumed so far
  // Indexed by layer; empty for the other kind and other stages.
  std::vector<KdaLayerState> kda;

  // Bytes held now: KDA state + conv state, and the MLA pages (a page shared
  // with a fork counts for each of them).
  int64_t KdaBytes() const;
  int64_t MlaCacheBytes() const;

 private:
  explicit SequenceState(std::shared_ptr<CachePool> pool) : pool_(std::move(pool)) {}

  std::shared_ptr<CachePool> pool_;
  std::vector<int32_t> pages_;  // the page table
};

}  // namespace deltaserve
