// The view every op takes its weights through: pointer, element type, device
// and shape. Ops dispatch on dtype and device at their entry point
// (kernels/<op>.cc), so a weight stays in the dtype its checkpoint stores and
// a second backend adds kernels, not branches in the layers.
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

enum class DType : uint8_t {
  kF32,
  kBF16,
  // OCP MXFP4 as K3 publishes its routed experts (kernels/mxfp4.h): two 4-bit
  // E2M1 codes per byte, even column in the low nibble, and one E8M0 scale
  // byte per 32 consecutive values of a row, held apart in `scales`.
  kMxfp4,
};

enum class Device : uint8_t { kCpu, kCuda };

const char* DTypeName(DType dtype);

// A row-major [rows, cols] matrix (a vector is one row) that the view does not
// own. For kMxfp4, data holds [rows, cols / 2] code bytes and scales
// [rows, cols / 32] scale bytes; cols must be a multiple of 32.
struct Tensor {
  const void* data = nullptr;
  const uint8_t* scales = nullptr;  // kMxfp4 only
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int64_t rows = 0, cols = 0;
  // The precision a product with this weight may use: kF32 (the default:
  // float32 activations against the exactly widened weight), or kBF16 (opt-in,
  // a bf16 weight only: activations rounded to bf16 so bf16 units, AVX512-BF16
  // or AMX, multiply natively; docs/numerics.md bounds its error).
  DType compute = DType::kF32;

  static Tensor F32(const float* data, int64_t rows, int64_t cols) {
    return Tensor{data, nullptr, DType::kF32, Device::kCpu, rows, cols, DType::kF32};
  }

  bool empty() const { return rows == 0 || cols == 0; }
  // Bytes of one row of data (not counting scales).
  int64_t RowBytes() const;
  // Bytes of one row of scales (0 unless kMxfp4).
  int64_t ScaleRowBytes() const;
  // Rows [begin, begin + count) as a view of the same memory.
  Tensor Rows(int64_t begin, int64_t count) const;
};

}  // namespace deltaserve::kernels
