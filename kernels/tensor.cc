#include "kernels/tensor.h"

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/mxfp4.h"

namespace deltaserve::kernels {
namespace {

// Bytes of `elements` consecutive values (for kMxfp4, codes only).
int64_t BytesOf(DType dtype, int64_t elements) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return elements * 4;
    case DType::kBF16:
      return elements * 2;
    case DType::kMxfp4:
      return elements / 2;
    case DType::kF64:
      return elements * 8;
  }
  return 0;
}

[[noreturn]] void Fail(const char* file, int line, const char* name, const char* what) {
  std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", file, line, name, what);
  std::abort();
}

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kMxfp4:
      return "mxfp4";
    case DType::kI32:
      return "i32";
    case DType::kF64:
      return "f64";
  }
  return "?";
}

const char* DeviceName(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "?";
}

template <bool kWritable>
int64_t BasicTensor<kWritable>::RowBytes() const {
  return BytesOf(dtype, cols);
}

template <bool kWritable>
int64_t BasicTensor<kWritable>::ScaleRowBytes() const {
  return dtype == DType::kMxfp4 ? cols / kMxfp4Group : 0;
}

template <bool kWritable>
int64_t BasicTensor<kWritable>::SpanBytes() const {
  if (empty()) return 0;
  return BytesOf(dtype, (rows - 1) * RowStride()) + RowBytes();
}

template <bool kWritable>
BasicTensor<kWritable> BasicTensor<kWritable>::Rows(int64_t begin, int64_t count) const {
  DELTASERVE_CHECK(begin >= 0 && count >= 0 && begin + count <= rows);
  BasicTensor out = *this;
  out.rows = count;
  using Byte = std::conditional_t<kWritable, uint8_t, const uint8_t>;
  out.data = static_cast<Byte*>(data) + BytesOf(dtype, begin * RowStride());
  if (scales != nullptr) out.scales = scales + begin * ScaleRowBytes();
  return out;
}

template <bool kWritable>
BasicTensor<kWritable> BasicTensor<kWritable>::Columns(int64_t begin, int64_t count) const {
  DELTASERVE_CHECK(dtype != DType::kMxfp4);
  DELTASERVE_CHECK(begin >= 0 && count >= 0 && begin + count <= cols);
  BasicTensor out = *this;
  out.cols = count;
  out.stride = count == RowStride() ? stride : RowStride();
  using Byte = std::conditional_t<kWritable, uint8_t, const uint8_t>;
  if (data != nullptr) out.data = static_cast<Byte*>(data) + BytesOf(dtype, begin);
  return out;
}

template <bool kWritable>
BasicTensor<kWritable> BasicTensor<kWritable>::Reshaped(int64_t new_rows, int64_t new_cols) const {
  DELTASERVE_CHECK(stride == 0 || stride == cols || rows <= 1);
  DELTASERVE_CHECK(new_rows >= 0 && new_cols >= 0 && new_rows * new_cols == rows * cols);
  DELTASERVE_CHECK(dtype != DType::kMxfp4 || new_cols % kMxfp4Group == 0);
  BasicTensor out = *this;
  out.rows = new_rows;
  out.cols = new_cols;
  out.stride = 0;
  return out;
}

template struct BasicTensor<false>;
template struct BasicTensor<true>;

bool Overlaps(const Tensor& a, const Tensor& b) {
  if (a.empty() || b.empty()) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  const auto a1 = a0 + static_cast<uintptr_t>(a.SpanBytes());
  const auto b1 = b0 + static_cast<uintptr_t>(b.SpanBytes());
  if (!(a0 < b1 && b0 < a1)) return false;
  // Rows of one matrix (one dtype of whole bytes, one row stride): exact.
  if (a.dtype != b.dtype || a.dtype == DType::kMxfp4 || a.RowStride() != b.RowStride()) return true;
  const Tensor& first = a0 <= b0 ? a : b;
  const Tensor& second = a0 <= b0 ? b : a;
  const int64_t element = BytesOf(a.dtype, 1), stride = BytesOf(a.dtype, a.RowStride());
  const auto offset = static_cast<int64_t>(a0 <= b0 ? b0 - a0 : a0 - b0);
  if (offset % element != 0) return true;
  // second's first element: row `row`, byte `col` of that row, in first's rows.
  const int64_t row = offset / stride, col = offset % stride;
  if (col + second.RowBytes() > stride) return true;  // its rows straddle first's
  return row < first.rows && col < first.RowBytes();
}

Device OpDevice(const char* file, int line, const char* name, const Tensor& view, bool has_cuda) {
  if (view.device == Device::kCpu) return Device::kCpu;
  char what[320];
  if (view.device != Device::kCuda || !has_cuda) {
    std::snprintf(what, sizeof(what), "device %s, but this op runs only on the cpu",
                  DeviceName(view.device));
    Fail(file, line, name, what);
  }
  if (cuda::ActiveBackend() == cuda::Backend::kNone) {
    std::snprintf(what, sizeof(what), "device cuda, but no CUDA backend is active: %s",
                  cuda::BackendProblem().c_str());
    Fail(file, line, name, what);
  }
  return Device::kCuda;
}

void CheckView(const char* file, int line, const char* name, const Tensor& view, DType dtype,
               int64_t rows, int64_t cols, bool strided, Device device) {
  char what[160];
  if (view.device != device) {
    std::snprintf(what, sizeof(what), "device %s, but the op runs on the %s",
                  DeviceName(view.device), DeviceName(device));
    Fail(file, line, name, what);
  }
  if (view.dtype != dtype) {
    std::snprintf(what, sizeof(what), "dtype %s, expected %s", DTypeName(view.dtype),
                  DTypeName(dtype));
    Fail(file, line, name, what);
  }
  if (rows < 0 || cols < 0 || view.rows != rows || view.cols != cols) {
    std::snprintf(what, sizeof(what),
                  "shape [%" PRId64 ", %" PRId64 "], expected [%" PRId64 ", %" PRId64 "]",
                  view.rows, view.cols, rows, cols);
    Fail(file, line, name, what);
  }
  if (view.stride != 0 && (!strided || view.stride < view.cols)) {
    std::snprintf(what, sizeof(what), "row stride %" PRId64 " where %s", view.stride,
                  strided ? "it must be >= cols" : "the op reads contiguous rows");
    Fail(file, line, name, what);
  }
  if (view.data == nullptr && !view.empty()) Fail(file, line, name, "null data");
}

void CheckWeight(const char* file, int line, const char* name, const Tensor& view, int64_t rows,
                 int64_t cols, Device device) {
  if (view.dtype != DType::kF32 && view.dtype != DType::kBF16 && view.dtype != DType::kMxfp4) {
    char what[80];
    std::snprintf(what, sizeof(what), "dtype %s, but a weight is f32, bf16 or mxfp4",
                  DTypeName(view.dtype));
    Fail(file, line, name, what);
  }
  CheckView(file, line, name, view, view.dtype, rows, cols, false, device);
  if (view.dtype == DType::kMxfp4 && !view.empty() &&
      (view.cols % kMxfp4Group != 0 || view.scales == nullptr)) {
    Fail(file, line, name, "mxfp4 needs cols a multiple of 32 and scales");
  }
}

}  // namespace deltaserve::kernels
