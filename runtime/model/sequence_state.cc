#include "runtime/model/sequence_state.h"

#include <algorithm>
#include <utility>

#include "kernels/convert.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {

absl::StatusOr<std::unique_ptr<SequenceState>> SequenceState::Create(
    std::shared_ptr<StatePool> pool) {
  DELTASERVE_ASSIGN_OR_RETURN(int32_t slot, pool->AcquireSlot());
  return std::unique_ptr<SequenceState>(new SequenceState(std::move(pool), slot));
}

SequenceState::~SequenceState() {
  for (int32_t page : pages_) pool_->Release(page);
  pool_->ReleaseSlot(slot_);
}

absl::StatusOr<std::unique_ptr<SequenceState>> SequenceState::Fork() const {
  // The child's own slot and last page first, so a full pool changes nothing.
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<SequenceState> child, Create(pool_));
  child->length = length;
  const int64_t full = length / kCachePageTokens;
  const int64_t partial = length % kCachePageTokens;
  std::vector<int32_t> own;
  if (!pages_.empty() && partial > 0) DELTASERVE_RETURN_IF_ERROR(pool_->Allocate(1, &own));
  const int64_t layers = pool_->num_layers();
  for (int64_t layer = 0; layer < layers; ++layer) {
    for (auto [from, to] : {std::pair{KdaState(layer), child->KdaState(layer)},
                            std::pair{KdaConv(layer), child->KdaConv(layer)}}) {
      if (!from.empty()) kernels::Convert(from, to);
    }
  }
  if (pages_.empty()) return child;
  for (int64_t p = 0; p < full; ++p) pool_->Retain(pages_[p]);
  child->pages_.assign(pages_.begin(), pages_.begin() + full);
  if (partial > 0) {
    child->pages_.push_back(own[0]);
    for (int64_t layer = 0; layer < layers; ++layer) {
      const kernels::MutableTensor rows = pool_->Layer(layer);
      if (rows.empty()) continue;
      kernels::PagedCacheCopyPage(rows, kCachePageTokens, pages_[full], own[0], partial);
    }
  }
  // Pages reserved past the length hold nothing yet: the child takes its own.
  child->MirrorPages();
  return child;
}

int64_t SequenceState::ForkCopyBytes() const {
  int64_t bytes = KdaBytes();
  if (pool_->has_layers()) {
    bytes += pool_->page_bytes() / kCachePageTokens * (length % kCachePageTokens);
  }
  return bytes;
}

int64_t SequenceState::PagesNeeded(int64_t tokens) const {
  if (!pool_->has_layers()) return 0;
  const int64_t need = CachePagesFor(tokens) - static_cast<int64_t>(pages_.size());
  return need > 0 ? need : 0;
}

absl::Status SequenceState::ReservePages(int64_t tokens) {
  const int64_t need = PagesNeeded(tokens);
  if (need == 0) return absl::OkStatus();
  DELTASERVE_RETURN_IF_ERROR(pool_->Allocate(need, &pages_));
  MirrorPages();
  return absl::OkStatus();
}

void SequenceState::MirrorPages() {
  const kernels::Device device = pool_->device();
  if (device == kernels::Device::kCpu || pages_.empty()) return;
  const int64_t n = static_cast<int64_t>(pages_.size());
  if (device_pages_.cols() < n) {
    // Doubling: a growing sequence reallocates its mirror log(pages) times.
    device_pages_ = kernels::Buffer(device, kernels::DType::kI32, 1,
                                    std::max<int64_t>(n, 2 * device_pages_.cols()));
  }
  kernels::Workspace::Of(device).CopyFromHost(device_pages_.view().data, pages_.data(),
                                              pages_.size() * sizeof(int32_t));
}

kernels::MutablePagedCache SequenceState::MlaCache(int64_t layer) const {
  const int64_t n = static_cast<int64_t>(pages_.size());
  kernels::Tensor table = kernels::Tensor::I32(pages_.data(), 1, n);
  if (pool_->device() != kernels::Device::kCpu) {
    table.data = device_pages_.view().data;
    table.device = pool_->device();
  }
  return kernels::MutablePagedCache{pool_->Layer(layer), table, kCachePageTokens};
}

int64_t SequenceState::MlaCacheBytes() const {
  return static_cast<int64_t>(pages_.size()) * pool_->page_bytes();
}

}  // namespace deltaserve
