#include "runtime/model/weight_loader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {

WeightLoader::WeightLoader(const Checkpoint& checkpoint, const std::vector<TensorSpec>& specs,
                           int tp_rank, int tp_size, int64_t* bytes_read) {
  auto shared = std::make_shared<Shared>(Shared{checkpoint, {}, tp_rank, tp_size, bytes_read});
  for (const TensorSpec& spec : specs) shared->specs.emplace(spec.name, spec);
  shared_ = std::move(shared);
}

WeightLoader WeightLoader::Under(std::string_view sub) const {
  return WeightLoader(shared_, prefix_ + std::string(sub));
}

absl::StatusOr<std::vector<float>> WeightLoader::Load(const std::string& name) const {
  const std::string full = prefix_ + name;
  const auto it = shared_->specs.find(full);
  if (it == shared_->specs.end()) {
    return absl::InternalError(absl::StrCat("no tensor spec for '", full, "'"));
  }
  const TensorSpec& spec = it->second;
  const TpPart part = spec.RankPart(shared_->tp_rank, shared_->tp_size);
  if (part.elements == 0) return std::vector<float>{};
  DELTASERVE_ASSIGN_OR_RETURN(const TensorView* view, shared_->checkpoint.Get(full));
  const size_t elem = DTypeSize(view->dtype);
  const int64_t count = part.end - part.begin;
  TensorView slice = *view;
  switch (spec.split.cut) {
    case TpCut::kReplicated:
    case TpCut::kExpert:
      return Convert(*view);
    case TpCut::kRows: {
      const int64_t rows = view->shape.empty() ? 1 : view->shape[0];
      const size_t row_bytes = view->nbytes / static_cast<size_t>(rows);
      slice.shape[0] = count;
      slice.data += part.begin * row_bytes;
      slice.nbytes = count * row_bytes;
      return Convert(slice);
    }
    case TpCut::kLeading:
      // The first values are the real ones whatever the stored shape (K3's
      // A_log pads to 128 entries, Kimi Linear's is [1, 1, H, 1]).
      slice.shape = {count};
      slice.data += part.begin * elem;
      slice.nbytes = count * elem;
      return Convert(slice);
    case TpCut::kColumns: {
      const int64_t rows = view->shape[0], cols = view->shape[1];
      std::vector<float> out;
      out.reserve(rows * count);
      slice.shape = {count};
      slice.nbytes = count * elem;
      for (int64_t r = 0; r < rows; ++r) {
        slice.data = view->data + (r * cols + part.begin) * elem;
        DELTASERVE_ASSIGN_OR_RETURN(std::vector<float> row, Convert(slice));
        out.insert(out.end(), row.begin(), row.end());
      }
      return out;
    }
  }
  return absl::InternalError(absl::StrCat("unknown tensor-parallel cut of '", full, "'"));
}

absl::StatusOr<std::vector<float>> WeightLoader::Concat(
    std::initializer_list<std::string> names) const {
  std::vector<float> out;
  for (const std::string& name : names) {
    DELTASERVE_ASSIGN_OR_RETURN(std::vector<float> part, Load(name));
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

absl::StatusOr<std::vector<float>> WeightLoader::Convert(const TensorView& view) const {
  if (shared_->bytes_read != nullptr) *shared_->bytes_read += static_cast<int64_t>(view.nbytes);
  return ToFloat32(view);
}

}  // namespace deltaserve
