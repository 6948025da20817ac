#include "runtime/model/state_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {

// On the CPU, `bytes` of address space, backed on first touch (zeros). On
// CUDA, whose memory cannot be committed on first touch, `bytes` of device
// memory held from the start (uninitialised). ResourceExhausted naming
// `what` when it cannot be had.
absl::Status StatePool::Reserve(size_t bytes, const std::string& what, Region* region) const {
  if (device_ != kernels::Device::kCpu) {
    const std::string error = kernels::DeviceBlock::Allocate(device_, bytes, &region->device);
    if (!error.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of ",
                                                       kernels::DeviceName(device_), " memory for ",
                                                       what, ": ", error));
    }
    region->base = region->device.data();
    region->bytes = bytes;
    return absl::OkStatus();
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot reserve ", bytes,
                                                     " bytes of address space for ", what, ": ",
                                                     std::strerror(errno)));
  }
  region->base = base;
  region->bytes = bytes;
  return absl::OkStatus();
}

namespace {

int64_t LayerEnd(const ModelConfig& local, const ModelShard& shard) {
  return shard.layer_end < 0 ? local.num_layers : shard.layer_end;
}

}  // namespace

int64_t KdaSlotBytes(const ModelConfig& local, const ModelShard& shard) {
  const int64_t H = local.kda.num_heads, d = local.kda.head_dim;
  const int64_t layer_bytes = ((local.kda.conv_kernel_size - 1) * 3 * H * d + H * d * d) *
                              static_cast<int64_t>(sizeof(float));
  int64_t bytes = 0;
  for (int64_t i = shard.layer_begin; i < LayerEnd(local, shard); ++i) {
    if (local.layer_kinds[i] == LayerKind::kKda) bytes += layer_bytes;
  }
  return bytes;
}

absl::StatusOr<int64_t> DeviceCacheTokens(const ModelConfig& local, const ModelShard& shard,
                                          kernels::Device device, kernels::DType cache_dtype,
                                          int64_t slots) {
  size_t free_bytes = 0, total_bytes = 0;
  const std::string error = kernels::Workspace::Of(device).Memory(&free_bytes, &total_bytes);
  if (!error.empty()) {
    return absl::InternalError(absl::StrCat("cannot read the free memory of the ",
                                            kernels::DeviceName(device), ": ", error));
  }
  int64_t mla_layers = 0;
  for (int64_t i = shard.layer_begin; i < LayerEnd(local, shard); ++i) {
    mla_layers += local.layer_kinds[i] == LayerKind::kMla ? 1 : 0;
  }
  // A rank without MLA layers holds no cache: any count does.
  if (mla_layers == 0) return kCachePageTokens;
  const int64_t token_bytes = mla_layers * CacheRowBytes(local, cache_dtype);
  const int64_t reserve =
      std::min<int64_t>(kDeviceWorkspaceReserveBytes, static_cast<int64_t>(total_bytes / 10));
  const int64_t room = static_cast<int64_t>(static_cast<double>(free_bytes) * kDeviceCacheShare) -
                       slots * KdaSlotBytes(local, shard) - reserve;
  if (room < kCachePageTokens * token_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the ", kernels::DeviceName(device), " has ", free_bytes,
                     " bytes free after the weights: no room for an MLA cache beside ", slots,
                     " KDA state slots and a workspace of ", reserve,
                     " bytes (--kv-cache-tokens and --kv-state-slots set smaller ones)"));
  }
  return room / token_bytes / kCachePageTokens * kCachePageTokens;
}

absl::StatusOr<std::shared_ptr<StatePool>> StatePool::Create(const ModelConfig& local,
                                                             const ModelShard& shard,
                                                             kernels::Device device,
                                                             kernels::DType cache_dtype,
                                                             StatePoolSize size) {
  if (device == kernels::Device::kCuda &&
      kernels::cuda::ActiveBackend() == kernels::cuda::Backend::kNone) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence state on cuda: ", kernels::cuda::BackendProblem()));
  }
  if (cache_dtype != kernels::DType::kF32 && cache_dtype != kernels::DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("the MLA cache can be f32 or bf16, not ", kernels::DTypeName(cache_dtype)));
  }
  if (size.pages < 1 || size.pages > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("an MLA cache of ", size.pages, " pages: it must hold 1 to 2^31 - 1 pages"));
  }
  if (size.slots < 2 || size.slots > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(size.slots,
                     " KDA state slots: there must be 2 to 2^31 - 1 (a prefix and "
                     "a sequence that forks from it; --kv-state-slots)"));
  }
  std::shared_ptr<StatePool> pool(new StatePool);
  pool->device_ = device;
  pool->dtype_ = cache_dtype;
  pool->width_ = local.MlaCacheWidth();
  pool->capacity_pages_ = size.pages;
  pool->regions_.resize(static_cast<size_t>(local.num_layers));
  const int64_t layer_page_bytes = kCachePageTokens * CacheRowBytes(local, cache_dtype);
  for (int64_t i = shard.layer_begin; i < LayerEnd(local, shard); ++i) {
    if (local.layer_kinds[i] != LayerKind::kMla) continue;
    // Checked: pages < 2^31 and a page of a layer is far below 2^32.
    const size_t bytes = static_cast<size_t>(size.pages) * layer_page_bytes;
    DELTASERVE_RETURN_IF_ERROR(
        pool->Reserve(bytes,
                      absl::StrCat("the MLA cache of layer ", i, " (", size.pages, " pages of ",
                                   kCachePageTokens, " tokens; --kv-cache-tokens sets fewer)"),
                      &pool->regions_[i]));
    pool->page_bytes_ += layer_page_bytes;
    ++pool->layer_count_;
  }

  const int64_t H = local.kda.num_heads, d = local.kda.head_dim;
  pool->kda_.resize(static_cast<size_t>(local.num_layers));
  int64_t offset = 0;
  for (int64_t i = shard.layer_begin; i < LayerEnd(local, shard); ++i) {
    if (local.layer_kinds[i] != LayerKind::kKda) continue;
    KdaLayout& l = pool->kda_[i];
    l.conv_rows = local.kda.conv_kernel_size - 1;
    l.conv_cols = 3 * H * d;
    l.state_rows = H;
    l.state_cols = d * d;
    l.conv_offset = offset;
    offset += l.conv_rows * l.conv_cols * static_cast<int64_t>(sizeof(float));
    l.state_offset = offset;
    offset += l.state_rows * l.state_cols * static_cast<int64_t>(sizeof(float));
  }
  pool->slot_bytes_ = offset;
  pool->capacity_slots_ = size.slots;
  if (offset > 0) {
    const int64_t system_page = sysconf(_SC_PAGESIZE);
    pool->slot_stride_ = (offset + system_page - 1) / system_page * system_page;
    const int64_t max_slots = static_cast<int64_t>(SIZE_MAX / 2) / pool->slot_stride_;
    if (size.slots > max_slots) {
      return absl::InvalidArgumentError(absl::StrCat(size.slots, " KDA state slots of ", offset,
                                                     " bytes do not fit in the address space"));
    }
    const size_t bytes = static_cast<size_t>(size.slots) * pool->slot_stride_;
    DELTASERVE_RETURN_IF_ERROR(
        pool->Reserve(bytes,
                      absl::StrCat("the KDA state (", size.slots, " slots of ", offset,
                                   " bytes; --kv-state-slots sets fewer)"),
                      &pool->slots_));
  }
  return pool;
}

StatePool::~StatePool() {
  if (device_ != kernels::Device::kCpu) return;  // the regions' DeviceBlocks free it
  for (const Region& r : regions_) {
    if (r.base != nullptr) munmap(r.base, r.bytes);
  }
  if (slots_.base != nullptr) munmap(slots_.base, slots_.bytes);
}

int64_t StatePool::used_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

kernels::MutableTensor StatePool::Layer(int64_t layer) const {
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

absl::Status StatePool::Allocate(int64_t count, std::vector<int32_t>* pages) {
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

void StatePool::Retain(int32_t page) {
  std::lock_guard<std::mutex> lock(mu_);
  if (HoldersLocked(page) <= 0) std::abort();  // a page nobody holds cannot be shared
  ++holders_[page];
}

void StatePool::Release(int32_t page) {
  std::lock_guard<std::mutex> lock(mu_);
  if (HoldersLocked(page) <= 0) std::abort();  // released more often than held
  if (--holders_[page] == 0) {
    free_.push_back(page);
    --used_;
  }
}

int32_t StatePool::Holders(int32_t page) const {
  std::lock_guard<std::mutex> lock(mu_);
  return HoldersLocked(page);
}

int32_t StatePool::HoldersLocked(int32_t page) const {
  if (page < 0 || static_cast<size_t>(page) >= holders_.size()) return 0;
  return holders_[page];
}

int64_t StatePool::used_slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_slots_;
}

absl::StatusOr<int32_t> StatePool::AcquireSlot() {
  std::lock_guard<std::mutex> lock(mu_);
  if (used_slots_ >= capacity_slots_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("all ", capacity_slots_,
                     " KDA state slots are held (--kv-state-slots sets how many sequences a "
                     "rank holds at once)"));
  }
  int32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<int32_t>(slot_held_.size());
    slot_held_.push_back(false);
  }
  slot_held_[slot] = true;
  ++used_slots_;
  if (device_ != kernels::Device::kCpu && slots_.base != nullptr) {
    // Device memory starts as whatever was there: zeroed in the stream's
    // order, before any work on the slot.
    kernels::Workspace::Of(device_).Zero(static_cast<char*>(slots_.base) + slot * slot_stride_,
                                         static_cast<size_t>(slot_stride_));
  }
  // On the CPU, zeros already: never touched, or handed back to the system
  // when freed.
  return slot;
}

void StatePool::ReleaseSlot(int32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slot < 0 || static_cast<size_t>(slot) >= slot_held_.size() || !slot_held_[slot]) {
    std::abort();  // released more often than acquired
  }
  if (slots_.base != nullptr) {
    // The memory goes back; the slot reads as zeros when it is taken again.
    // (Device memory is zeroed when the slot is taken.)
    if (device_ == kernels::Device::kCpu) {
      madvise(static_cast<char*>(slots_.base) + slot * slot_stride_, slot_stride_, MADV_DONTNEED);
    }
  }
  slot_held_[slot] = false;
  free_slots_.push_back(slot);
  --used_slots_;
}

kernels::MutableTensor StatePool::SlotView(int32_t slot, int64_t offset, int64_t rows,
                                           int64_t cols) const {
  if (offset < 0 || slot < 0 || slot >= capacity_slots_) return {};
  kernels::MutableTensor view;
  view.data = static_cast<char*>(slots_.base) + slot * slot_stride_ + offset;
  view.dtype = kernels::DType::kF32;
  view.device = device_;
  view.rows = rows;
  view.cols = cols;
  return view;
}

kernels::MutableTensor StatePool::KdaState(int32_t slot, int64_t layer) const {
  const KdaLayout& l = kda_[static_cast<size_t>(layer)];
  return SlotView(slot, l.state_offset, l.state_rows, l.state_cols);
}

kernels::MutableTensor StatePool::KdaConv(int32_t slot, int64_t layer) const {
  const KdaLayout& l = kda_[static_cast<size_t>(layer)];
  return SlotView(slot, l.conv_offset, l.conv_rows, l.conv_cols);
}

}  // namespace deltaserve
