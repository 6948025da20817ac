#include "runtime/model/cache_pool.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace deltaserve {

absl::StatusOr<std::shared_ptr<CachePool>> CachePool::Create(const ModelConfig& local,
                                                             const ModelShard& shard,
                                                             kernels::Device device,
                                                             kernels::DType dtype,
                                                             int64_t capacity_pages) {
  if (device != kernels::Device::kCpu) {
    return absl::UnimplementedError(absl::StrCat("an MLA cache on ", kernels::DeviceName(device),
                                                 ": this build has the cpu backend only"));
  }
  if (dtype != kernels::DType::kF32 && dtype != kernels::DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("the MLA cache can be f32 or bf16, not ", kernels::DTypeName(dtype)));
  }
  if (capacity_pages < 1 || capacity_pages > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("an MLA cache of ", capacity_pages,
                                                   " pages: it must hold 1 to 2^31 - 1 pages"));
  }
  std::shared_ptr<CachePool> pool(new CachePool);
  pool->device_ = device;
  pool->dtype_ = dtype;
  pool->width_ = local.kv_lora_rank + local.qk_rope_head_dim;
  pool->capacity_pages_ = capacity_pages;
  pool->regions_.resize(static_cast<size_t>(local.num_layers));
  const int64_t elem = dtype == kernels::DType::kBF16 ? 2 : 4;
  const int64_t layer_page_bytes = kCachePageTokens * pool->width_ * elem;
  const int64_t end = shard.layer_end < 0 ? local.num_layers : shard.layer_end;
  for (int64_t i = shard.layer_begin; i < end; ++i) {
    if (local.layer_kinds[i] != LayerKind::kMla) continue;
    // Checked: capacity_pages < 2^31 and a page of a layer is far below 2^32.
    const size_t bytes = static_cast<size_t>(capacity_pages) * layer_page_bytes;
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot reserve ", bytes, " bytes of address space for the MLA cache of layer ", i, " (",
          capacity_pages, " pages of ", kCachePageTokens,
          " tokens; --kv-cache-tokens sets fewer): ", std::strerror(errno)));
    }
    pool->regions_[i] = {base, bytes};
    pool->page_bytes_ += layer_page_bytes;
    ++pool->layer_count_;
  }
  return pool;
}

CachePool::~CachePool() {
  for (const Region& r : regions_) {
    if (r.base != nullptr) munmap(r.base, r.bytes);
  }
}

int64_t CachePool::used_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

kernels::MutableTensor CachePool::Layer(int64_t layer) const {
  const Region& r = regions_[static_cast<size_t>(layer)];
  if (r.base == nullptr) return {};
  kernels::MutableTensor view;
  view.data = r.base;
  view.dtype = dtype_;
  view.device = device_;
  view.rows = capacity_pages_ * kCachePageTokens;
  view.cols = width_;
  return view;
}

absl::Status CachePool::Allocate(int64_t count, std::vector<int32_t>* pages) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t free = capacity_pages_ - used_;
  if (count > free) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the MLA cache needs ", count, " more pages of ", kCachePageTokens, " tokens, and ", free,
        " of its ", capacity_pages_, " are free (--kv-cache-tokens sets its size)"));
  }
  for (int64_t i = 0; i < count; ++i) {
    if (!free_.empty()) {
      const int32_t page = free_.back();
      free_.pop_back();
      holders_[page] = 1;
      pages->push_back(page);
    } else {
      // A page never used: the holder counts grow with the pages touched.
      holders_.push_back(1);
      pages->push_back(static_cast<int32_t>(next_unused_++));
    }
  }
  used_ += count;
  return absl::OkStatus();
}

void CachePool::Retain(int32_t page) {
  std::lock_guard<std::mutex> lock(mu_);
  if (HoldersLocked(page) <= 0) std::abort();  // a page nobody holds cannot be shared
  ++holders_[page];
}

void CachePool::Release(int32_t page) {
  std::lock_guard<std::mutex> lock(mu_);
  if (HoldersLocked(page) <= 0) std::abort();  // released more often than held
  if (--holders_[page] == 0) {
    free_.push_back(page);
    --used_;
  }
}

int32_t CachePool::Holders(int32_t page) const {
  std::lock_guard<std::mutex> lock(mu_);
  return HoldersLocked(page);
}

int32_t CachePool::HoldersLocked(int32_t page) const {
  if (page < 0 || static_cast<size_t>(page) >= holders_.size()) return 0;
  return holders_[page];
}

}  // namespace deltaserve
