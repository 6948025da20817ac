// Per-sequence inference state, all of it in the rank's state pool
// (runtime/model/state_pool.h): one KDA slot (for each KDA layer the float32
// recurrent state and the short-convolution tail) and the sequence's pages of
// the MLA cache, through its page table, one entry per 64 tokens, the same for
// every MLA layer. KDA state is constant in sequence length; the MLA cache
// grows by C + R values per token per MLA layer, float32 or bf16
// (--kv-cache-dtype), a page at a time. On a device the page table is
// mirrored in its memory whenever it changes.
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
#include "runtime/model/state_pool.h"

namespace deltaserve {

class SequenceState {
 public:
  // A new sequence in `pool`, its KDA state zero and no pages yet;
  // ResourceExhausted when every slot is held.
  static absl::StatusOr<std::unique_ptr<SequenceState>> Create(std::shared_ptr<StatePool> pool);
  ~SequenceState();  // gives its slot and pages back
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  // A new sequence that continues this one: the KDA slot copied, the full MLA
  // pages shared, the partly filled last page copied (ResourceExhausted when
  // the pool has no slot or page for it; nothing changes).
  absl::StatusOr<std::unique_ptr<SequenceState>> Fork() const;
  // Bytes Fork copies: the KDA slot, and the rows of the partly filled last
  // page in every MLA layer.
  int64_t ForkCopyBytes() const;

  // More pages needed to hold `tokens` tokens in all (0 when it has them).
  int64_t PagesNeeded(int64_t tokens) const;
  // Takes those pages from the pool: all, or none and ResourceExhausted.
  absl::Status ReservePages(int64_t tokens);

  // Layer `layer`'s KDA state [H, d_k * d_v] and conv tail [W - 1, 3 * H * d]
  // as the kernels take them.
  kernels::MutableTensor KdaState(int64_t layer) const { return pool_->KdaState(slot_, layer); }
  kernels::MutableTensor KdaConv(int64_t layer) const { return pool_->KdaConv(slot_, layer); }
  // Layer `layer`'s cache as the paged kernels take it.
  kernels::MutablePagedCache MlaCache(int64_t layer) const;
  const std::vector<int32_t>& pages() const { return pages_; }
  int32_t slot() const { return slot_; }

  int64_t length = 0;  // tokens consumed so far

  // Bytes held now: the KDA slot, and the MLA pages (a page shared with a
  // fork counts for each of them).
  int64_t KdaBytes() const { return pool_->slot_bytes(); }
  int64_t MlaCacheBytes() const;

 private:
  SequenceState(std::shared_ptr<StatePool> pool, int32_t slot)
      : pool_(std::move(pool)), slot_(slot) {}

  // Copies the page table to the pool's device after it changed (nothing on
  // the CPU, where the kernels read pages_ itself).
  void MirrorPages();

  std::shared_ptr<StatePool> pool_;
  int32_t slot_;
  std::vector<int32_t> pages_;  // the page table
  // Off the CPU: the page table as the kernels read it, [1, capacity] of
  // which the first pages_.size() entries are current.
  kernels::Buffer device_pages_;
};

}  // namespace deltaserve
