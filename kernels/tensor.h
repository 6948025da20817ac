// The view every op takes its arrays through: pointer, element type, device
// and shape. Each op's entry point (kernels/<op>.cc) checks the views against
// its contract once and dispatches on device and dtype, so a weight stays in
// the dtype its checkpoint stores and a second backend adds kernels, not
// branches in the layers.
//
// Inputs are `Tensor` (read-only data) and outputs `MutableTensor` (writable
// data): one class template, BasicTensor<kWritable>, so the two share every
// field and helper and differ only in the constness of `data`. A writable view
// converts implicitly to a read-only one (an in-place op passes the same
// buffer as both); nothing converts the other way, so an op cannot write
// through an input. Constness on the view rather than a flag checked at run
// time: a wrong call does not compile.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/device.h"

namespace deltaserve::kernels {

// A row-major [rows, cols] matrix (a vector is one row; [T, heads, dim]
// activations are [T, heads * dim]) that the view does not own. Row r starts
// RowStride() elements after row r - 1: `stride` is 0 (contiguous, the
// default) or >= cols for a kernel that documents it reads a column block of
// wider rows; every other kernel refuses a strided view. For kMxfp4, data
// holds [rows, cols / 2] code bytes and scales [rows, cols / 32] scale bytes;
// cols must be a multiple of 32 and the view contiguous.
template <bool kWritable>
struct BasicTensor {
  using Void = std::conditional_t<kWritable, void, const void>;
  template <typename T>
  using Elem = std::conditional_t<kWritable, T, const T>;

  Void* data = nullptr;
  const uint8_t* scales = nullptr;  // kMxfp4 only
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int64_t rows = 0, cols = 0;
  // The precision a product with this weight may use: kF32 (the default:
  // float32 activations against the exactly widened weight), or kBF16 (opt-in,
  // a bf16 weight only: activations rounded to bf16 so bf16 units, AVX512-BF16
  // or AMX, multiply natively; docs/numerics.md bounds its error).
  DType compute = DType::kF32;
  int64_t stride = 0;  // elements between row starts; 0 = cols

  // CPU views of plain arrays, the way call sites build them.
  static BasicTensor F32(Elem<float>* p, int64_t rows, int64_t cols, int64_t stride = 0) {
    return Of(p, DType::kF32, rows, cols, stride);
  }
  static BasicTensor F64(Elem<double>* p, int64_t rows, int64_t cols) {
    return Of(p, DType::kF64, rows, cols, 0);
  }
  static BasicTensor I32(Elem<int32_t>* p, int64_t rows, int64_t cols) {
    return Of(p, DType::kI32, rows, cols, 0);
  }
  // bf16 values as their bit patterns (kernels/bf16.h).
  static BasicTensor BF16(Elem<uint16_t>* p, int64_t rows, int64_t cols, int64_t stride = 0) {
    return Of(p, DType::kBF16, rows, cols, stride);
  }

  // The read-only view of the same memory.
  operator BasicTensor<false>() const requires kWritable {
    return BasicTensor<false>{data, scales, dtype, device, rows, cols, compute, stride};
  }

  // The data as T*; the entry point has checked the dtype.
  template <typename T>
  Elem<T>* As() const {
    return static_cast<Elem<T>*>(data);
  }

  bool empty() const { return rows == 0 || cols == 0; }
  int64_t RowStride() const { return stride != 0 ? stride : cols; }
  // Bytes of one row of data (not counting scales or stride).
  int64_t RowBytes() const;
  // Bytes of one row of scales (0 unless kMxfp4).
  int64_t ScaleRowBytes() const;
  // Bytes from data to the end of the last row (0 when empty).
  int64_t SpanBytes() const;
  // Rows [begin, begin + count) as a view of the same memory.
  BasicTensor Rows(int64_t begin, int64_t count) const;
  // Columns [begin, begin + count) of every row as a view of the same memory:
  // the same rows, data `begin` elements on, stride RowStride() (kept as it
  // is when the block is whole rows, so a contiguous view stays contiguous).
  // For f32, bf16, i32 and f64; an mxfp4 row cannot be cut at any column.
  BasicTensor Columns(int64_t begin, int64_t count) const;
  // The same contiguous elements as [rows, cols] (rows * cols unchanged; for
  // mxfp4 cols stays a multiple of 32). The view must be contiguous.
  BasicTensor Reshaped(int64_t rows, int64_t cols) const;

 private:
  static BasicTensor Of(Void* p, DType dtype, int64_t rows, int64_t cols, int64_t stride) {
    return BasicTensor{p, nullptr, dtype, Device::kCpu, rows, cols, DType::kF32, stride};
  }
};

using Tensor = BasicTensor<false>;
using MutableTensor = BasicTensor<true>;

extern template struct BasicTensor<false>;
extern template struct BasicTensor<true>;

// Whether two views share any byte (empty views never do): exactly for views
// of one dtype and row stride, such as column blocks of one matrix, and by
// the bytes each spans otherwise.
bool Overlaps(const Tensor& a, const Tensor& b);

// The device an op runs on: that of `view` (its output), which must be the
// CPU or, for an op with a CUDA variant (`has_cuda`), a CUDA device whose
// backend is active (kernels/cuda/ops.h). Otherwise it prints where, the
// argument and why, and aborts (kernels/check.h).
Device OpDevice(const char* file, int line, const char* name, const Tensor& view, bool has_cuda);

// The contract check of one view at an op's entry point: on `device` (the
// op's), of `dtype`, shape [rows, cols], contiguous unless `strided`, and
// with data unless empty. On a violation it prints where, the op's argument
// name and what is wrong, and aborts (kernels/check.h).
void CheckView(const char* file, int line, const char* name, const Tensor& view, DType dtype,
               int64_t rows, int64_t cols, bool strided, Device device);
// The same for a weight, which may be f32, bf16 or mxfp4 (with its scales,
// cols a multiple of 32), never strided.
void CheckWeight(const char* file, int line, const char* name, const Tensor& view, int64_t rows,
                 int64_t cols, Device device);

}  // namespace deltaserve::kernels
