// The element types and devices of the ops' arrays, apart from the views
// (kernels/tensor.h) so that the CUDA sources, which nvcc compiles as C++17,
// can name them.
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
  kI32,  // token ids, expert indices
  kF64,  // sampling probabilities
};

enum class Device : uint8_t { kCpu, kCuda };

const char* DTypeName(DType dtype);
const char* DeviceName(Device device);

}  // namespace deltaserve::kernels
