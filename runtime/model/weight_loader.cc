#include "runtime/model/weight_loader.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/mxfp4.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

void ReleasePages(const Weight& w) {
  if (!w.mapped()) return;
  const kernels::Tensor& t = w.tensor();
  ReleaseCheckpointPages(t.data, static_cast<size_t>(t.rows * t.RowBytes()));
  if (t.scales != nullptr) {
    ReleaseCheckpointPages(t.scales, static_cast<size_t>(t.rows * t.ScaleRowBytes()));
  }
}

}  // namespace

WeightLoader::WeightLoader(std::shared_ptr<const Checkpoint> checkpoint,
                           const std::vector<TensorSpec>& specs, int tp_rank, int tp_size,
                           int64_t* bytes_read) {
  auto shared =
      std::make_shared<Shared>(Shared{std::move(checkpoint), {}, tp_rank, tp_size, bytes_read});
  for (const TensorSpec& spec : specs) shared->specs.emplace(spec.name, spec);
  shared_ = std::move(shared);
}

WeightLoader WeightLoader::Under(std::string_view sub) const {
  return WeightLoader(shared_, prefix_ + std::string(sub));
}

absl::StatusOr<const TensorSpec*> WeightLoader::Spec(const std::string& full) const {
  const auto it = shared_->specs.find(full);
  if (it == shared_->specs.end()) {
    return absl::InternalError(absl::StrCat("no tensor spec for '", full, "'"));
  }
  return &it->second;
}

absl::StatusOr<VectorWeight> WeightLoader::Load(const std::string& name) const {
  DELTASERVE_ASSIGN_OR_RETURN(std::vector<float> values, Values(name));
  return VectorWeight::FromHost(values);
}

absl::StatusOr<std::vector<float>> WeightLoader::Values(const std::string& name) const {
  const std::string full = prefix_ + name;
  DELTASERVE_ASSIGN_OR_RETURN(const TensorSpec* spec, Spec(full));
  const TpPart part = spec->RankPart(shared_->tp_rank, shared_->tp_size);
  if (part.elements == 0) return std::vector<float>{};
  DELTASERVE_ASSIGN_OR_RETURN(const TensorView* view, shared_->checkpoint->Get(full));
  const size_t elem = DTypeSize(view->dtype);
  const int64_t count = part.end - part.begin;
  TensorView slice = *view;
  switch (spec->split.cut) {
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

absl::StatusOr<VectorWeight> WeightLoader::Concat(std::initializer_list<std::string> names) const {
  std::vector<float> out;
  for (const std::string& name : names) {
    DELTASERVE_ASSIGN_OR_RETURN(std::vector<float> part, Values(name));
    out.insert(out.end(), part.begin(), part.end());
  }
  return VectorWeight::FromHost(out);
}

absl::StatusOr<Weight> WeightLoader::Matrix(const std::string& name) const {
  const std::string full = prefix_ + name;
  DELTASERVE_ASSIGN_OR_RETURN(const TensorSpec* spec, Spec(full));
  const TpPart part = spec->RankPart(shared_->tp_rank, shared_->tp_size);
  if (part.elements == 0) return Weight{};
  const Checkpoint& checkpoint = *shared_->checkpoint;
  const TpCut cut = spec->split.cut;
  if (cut == TpCut::kLeading) {
    return absl::InternalError(absl::StrCat("'", full, "' is split as a vector, not a matrix"));
  }

  // MXFP4: the checkpoint holds the codes and scales in place of the matrix
  // (GetMxfp4 has refused a NaN scale).
  if (spec->stored == Storage::kMxfp4) {
    DELTASERVE_ASSIGN_OR_RETURN(const Mxfp4Views views, GetMxfp4(checkpoint, *spec));
    const TensorView* packed = views.packed;
    const TensorView* scales = views.scale;
    if (cut == TpCut::kColumns) {
      return absl::UnimplementedError(absl::StrCat(
          "'", spec->PackedName(), "': a column split of an MXFP4 tensor is not supported"));
    }
    const int64_t cols = packed->shape[1] * 2;
    const int64_t r0 = cut == TpCut::kRows ? part.begin : 0;
    const int64_t r1 = cut == TpCut::kRows ? part.end : packed->shape[0];
    const kernels::Tensor t{packed->data + r0 * (cols / 2),
                            scales->data + r0 * (cols / kernels::kMxfp4Group),
                            kernels::DType::kMxfp4,
                            kernels::Device::kCpu,
                            r1 - r0,
                            cols};
    const int64_t groups = t.rows * t.ScaleRowBytes();
    if (shared_->bytes_read != nullptr) *shared_->bytes_read += t.rows * t.RowBytes() + groups;
    return Weight(t, shared_->checkpoint, /*mapped=*/true);
  }

  DELTASERVE_ASSIGN_OR_RETURN(const TensorView* view, checkpoint.Get(full));
  if (view->shape.size() != 2) {
    return absl::InternalError(absl::StrCat("'", full, "' is not a matrix"));
  }
  const int64_t rows = view->shape[0], cols = view->shape[1];
  const int64_t r0 = cut == TpCut::kRows ? part.begin : 0;
  const int64_t r1 = cut == TpCut::kRows ? part.end : rows;
  const int64_t c0 = cut == TpCut::kColumns ? part.begin : 0;
  const int64_t c1 = cut == TpCut::kColumns ? part.end : cols;
  const size_t elem = DTypeSize(view->dtype);
  const bool kept = view->dtype == DType::kF32 || view->dtype == DType::kBF16;
  const kernels::DType dtype =
      view->dtype == DType::kBF16 ? kernels::DType::kBF16 : kernels::DType::kF32;
  if (shared_->bytes_read != nullptr) {
    *shared_->bytes_read += static_cast<int64_t>((r1 - r0) * (c1 - c0) * elem);
  }
  if (kept && c0 == 0 && c1 == cols) {  // contiguous in the file: map it
    const kernels::Tensor t{view->data + r0 * cols * elem, nullptr, dtype,
                            kernels::Device::kCpu,         r1 - r0, cols};
    return Weight(t, shared_->checkpoint, /*mapped=*/true);
  }
  // A column slice, or a dtype the kernels do not take (f16, f64): a copy,
  // row by row, in the stored dtype or as float32.
  Weight out = Weight::Allocate(dtype, r1 - r0, c1 - c0);
  TensorView row_view = *view;
  row_view.shape = {c1 - c0};
  row_view.nbytes = static_cast<size_t>(c1 - c0) * elem;
  for (int64_t r = r0; r < r1; ++r) {
    row_view.data = view->data + (r * cols + c0) * elem;
    uint8_t* dst = out.MutableData() + (r - r0) * out.tensor().RowBytes();
    if (kept) {
      std::memcpy(dst, row_view.data, row_view.nbytes);
    } else {
      DELTASERVE_ASSIGN_OR_RETURN(std::vector<float> values, ToFloat32(row_view));
      std::memcpy(dst, values.data(), values.size() * sizeof(float));
    }
  }
  ReleaseCheckpointPages(view->data + r0 * cols * elem,
                         static_cast<size_t>((r1 - r0) * cols) * elem);
  return out;
}

absl::StatusOr<Weight> WeightLoader::ConcatRows(std::initializer_list<std::string> names) const {
  std::vector<Weight> parts;
  int64_t rows = 0;
  for (const std::string& name : names) {
    DELTASERVE_ASSIGN_OR_RETURN(Weight part, Matrix(name));
    if (part.empty()) continue;
    if (!parts.empty() &&
        (part.tensor().dtype != parts[0].tensor().dtype || part.cols() != parts[0].cols())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", prefix_, name, "' is ", kernels::DTypeName(part.tensor().dtype), " [", part.rows(),
          ", ", part.cols(), "], the tensors fused with it ",
          kernels::DTypeName(parts[0].tensor().dtype), " with ", parts[0].cols(), " columns"));
    }
    rows += part.rows();
    parts.push_back(std::move(part));
  }
  if (parts.empty()) return Weight{};
  Weight out = Weight::Allocate(parts[0].tensor().dtype, rows, parts[0].cols());
  int64_t at = 0;
  for (const Weight& part : parts) {
    const kernels::Tensor& t = part.tensor();
    std::memcpy(out.MutableData() + at * t.RowBytes(), t.data,
                static_cast<size_t>(t.rows * t.RowBytes()));
    if (t.scales != nullptr) {
      std::memcpy(out.MutableScales() + at * t.ScaleRowBytes(), t.scales,
                  static_cast<size_t>(t.rows * t.ScaleRowBytes()));
    }
    at += t.rows;
    ReleasePages(part);
  }
  return out;
}

absl::StatusOr<std::vector<float>> WeightLoader::Convert(const TensorView& view) const {
  if (shared_->bytes_read != nullptr) *shared_->bytes_read += static_cast<int64_t>(view.nbytes);
  return ToFloat32(view);
}

}  // namespace deltaserve
