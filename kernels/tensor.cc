#include "kernels/tensor.h"

#include "kernels/check.h"
#include "kernels/mxfp4.h"

namespace deltaserve::kernels {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

int64_t Tensor::RowBytes() const {
  switch (dtype) {
    case DType::kF32:
      return cols * 4;
    case DType::kBF16:
      return cols * 2;
    case DType::kMxfp4:
      return cols / 2;
  }
  return 0;
}

int64_t Tensor::ScaleRowBytes() const { return dtype == DType::kMxfp4 ? cols / kMxfp4Group : 0; }

Tensor Tensor::Rows(int64_t begin, int64_t count) const {
  DELTASERVE_CHECK(begin >= 0 && count >= 0 && begin + count <= rows);
  Tensor out = *this;
  out.rows = count;
  out.data = static_cast<const uint8_t*>(data) + begin * RowBytes();
  if (scales != nullptr) out.scales = scales + begin * ScaleRowBytes();
  return out;
}

}  // namespace deltaserve::kernels
