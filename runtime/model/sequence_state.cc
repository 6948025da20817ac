#include "runtime/model/sequence_state.h"

#include <utility>

#include "kernels/convert.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {

SequenceState::SequenceState(const ModelConfig& config, const ModelShard& shard,
                             std::shared_ptr<CachePool> pool)
    : kda(static_cast<size_t>(config.num_layers)), pool_(std::move(pool)) {
  const int64_t H = config.kda.num_heads, d = config.kda.head_dim;
  const kernels::Device device = pool_ != nullptr ? pool_->device() : kernels::Device::kCpu;
  const int64_t end = shard.layer_end < 0 ? config.num_layers : shard.layer_end;
  for (int64_t i = shard.layer_begin; i < end; ++i) {
    if (config.layer_kinds[i] != LayerKind::kKda) continue;
    kda[i].conv = kernels::Buffer::Zeros(device, kernels::DType::kF32,
                                         config.kda.conv_kernel_size - 1, 3 * H * d);
    kda[i].state = kernels::Buffer::Zeros(device, kernels::DType::kF32, H, d * d);
  }
}

SequenceState::~SequenceState() {
  for (int32_t page : pages_) pool_->Release(page);
}

absl::StatusOr<std::unique_ptr<SequenceState>> SequenceState::Fork() const {
  auto child = std::unique_ptr<SequenceState>(new SequenceState(pool_));
  child->length = length;
  child->kda.resize(kda.size());
  for (size_t i = 0; i < kda.size(); ++i) {
    for (auto [from, to] : {std::pair{&kda[i].conv, &child->kda[i].conv},
                            std::pair{&kda[i].state, &child->kda[i].state}}) {
      if (from->empty()) continue;
      *to = kernels::Buffer(from->device(), from->dtype(), from->rows(), from->cols());
      kernels::Convert(*from, *to);
    }
  }
  if (pages_.empty()) return child;
  const int64_t full = length / kCachePageTokens;
  const int64_t partial = length % kCachePageTokens;
  if (partial > 0) {
    // The child's own last page first, so a full pool changes nothing.
    std::vector<int32_t> own;
    DELTASERVE_RETURN_IF_ERROR(pool_->Allocate(1, &own));
    for (int64_t p = 0; p < full; ++p) pool_->Retain(pages_[p]);
    child->pages_.assign(pages_.begin(), pages_.begin() + full);
    child->pages_.push_back(own[0]);
    for (int64_t layer = 0; layer < static_cast<int64_t>(kda.size()); ++layer) {
      const kernels::MutableTensor rows = pool_->Layer(layer);
      if (rows.empty()) continue;
      kernels::PagedCacheCopyPage(rows, kCachePageTokens, pages_[full], own[0], partial);
    }
  } else {
    for (int64_t p = 0; p < full; ++p) pool_->Retain(pages_[p]);
    child->pages_.assign(pages_.begin(), pages_.begin() + full);
  }
  // Pages reserved past the length hold nothing yet: the child takes its own.
  return child;
}

int64_t SequenceState::ForkCopyBytes() const {
  int64_t bytes = KdaBytes();
  if (pool_ != nullptr && pool_->has_layers()) {
    bytes += pool_->page_bytes() / kCachePageTokens * (length % kCachePageTokens);
  }
  return bytes;
}

int64_t SequenceState::PagesNeeded(int64_t tokens) const {
  if (pool_ == nullptr || !pool_->has_layers()) return 0;
  const int64_t need = CachePagesFor(tokens) - static_cast<int64_t>(pages_.size());
  return need > 0 ? need : 0;
}

absl::Status SequenceState::ReservePages(int64_t tokens) {
  const int64_t need = PagesNeeded(tokens);
  if (need == 0) return absl::OkStatus();
  return pool_->Allocate(need, &pages_);
}

kernels::MutablePagedCache SequenceState::MlaCache(int64_t layer) const {
  return kernels::MutablePagedCache{
      pool_->Layer(layer),
      kernels::Tensor::I32(pages_.data(), 1, static_cast<int64_t>(pages_.size())),
      kCachePageTokens};
}

int64_t SequenceState::KdaBytes() const {
  int64_t bytes = 0;
  for (const KdaLayerState& s : kda) bytes += s.conv.bytes() + s.state.bytes();
  return bytes;
}

int64_t SequenceState::MlaCacheBytes() const {
  if (pool_ == nullptr) return 0;
  return static_cast<int64_t>(pages_.size()) * pool_->page_bytes();
}

}  // namespace deltaserve
