// The per-device side of the kernel tests: the devices a test runs on, a
// fixture parameterised over them, and output buffers with guard bands, so a
// kernel that writes one element past either end of its output fails the
// test instead of corrupting a neighbour. Header-only, on the kernels and
// tests/test_util.h, so every test of tests/kernels/ links nothing more.
//
//   class AddTest : public testing::DeviceTest {};
//   TEST_P(AddTest, Matches) {
//     auto out = Output<float>(rows * cols);  // NaN, guarded, on device()
//     Add(a, b, out.View(rows, cols));
//     EXPECT_TRUE(AllClose(out.Values(), want, atol, rtol));
//     EXPECT_TRUE(out.GuardsIntact());
//   }
//   DELTASERVE_INSTANTIATE_DEVICE_TEST(AddTest);
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/ops.h"
#include "kernels/tensor.h"
#include "kernels/workspace.h"

namespace deltaserve::testing {

// The devices a kernel test is instantiated for: the CPU and CUDA. A CUDA
// case runs on the active backend (kernels/cuda/ops.h: a GPU, or the SIMT
// harness with DELTASERVE_CUDA_BACKEND=sim) and is skipped without one;
// ctest runs the CUDA cases apart from the CPU levels, labelled cuda-sim
// (on the harness) and gpu. An op with no CUDA variant yet instantiates
// its tests with DELTASERVE_INSTANTIATE_CPU_TEST.
inline std::vector<kernels::Device> AvailableDevices() {
  return {kernels::Device::kCpu, kernels::Device::kCuda};
}
inline std::vector<kernels::Device> CpuOnly() { return {kernels::Device::kCpu}; }

inline std::string DeviceTestName(const ::testing::TestParamInfo<kernels::Device>& info) {
  return kernels::DeviceName(info.param);
}

// dense [rows, cols] laid out at row stride `stride` (>= cols), the gaps
// between rows holding `fill`; and back.
template <typename T>
std::vector<T> WithStride(const std::vector<T>& dense, int64_t rows, int64_t cols, int64_t stride,
                          T fill) {
  std::vector<T> out(static_cast<size_t>(rows * stride), fill);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(dense.begin() + r * cols, dense.begin() + (r + 1) * cols, out.begin() + r * stride);
  }
  return out;
}
template <typename T>
std::vector<T> WithoutStride(const std::vector<T>& strided, int64_t rows, int64_t cols,
                             int64_t stride) {
  std::vector<T> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(strided.begin() + r * stride, strided.begin() + r * stride + cols,
              out.begin() + r * cols);
  }
  return out;
}

// Per element type: its dtype, the value an unwritten output holds (NaN for
// floating types, so it fails every comparison) and the guard bands' bit
// pattern. The guards are signalling NaNs with a payload no kernel produces
// (conversions quieten NaNs, arithmetic makes the default quiet NaN), and an
// odd integer pattern no index or count takes.
template <typename T>
struct GuardTraits;
template <>
struct GuardTraits<float> {
  static constexpr kernels::DType kDType = kernels::DType::kF32;
  static constexpr uint32_t kPoison = 0x7fc00000u;
  static constexpr uint32_t kGuard = 0x7fa5a5a5u;
};
template <>
struct GuardTraits<double> {
  static constexpr kernels::DType kDType = kernels::DType::kF64;
  static constexpr uint64_t kPoison = 0x7ff8000000000000u;
  static constexpr uint64_t kGuard = 0x7ff5a5a5a5a5a5a5u;
};
template <>
struct GuardTraits<uint16_t> {  // bf16 bits
  static constexpr kernels::DType kDType = kernels::DType::kBF16;
  static constexpr uint16_t kPoison = 0x7fc0u;
  static constexpr uint16_t kGuard = 0x7fa5u;
};
template <>
struct GuardTraits<int32_t> {
  static constexpr kernels::DType kDType = kernels::DType::kI32;
  static constexpr uint32_t kPoison = 0x80000000u;  // INT32_MIN: no valid index
  static constexpr uint32_t kGuard = 0xa5a5a5a5u;
};

// n elements of T on `device`, poisoned, between two guard bands of kGuard
// elements each. View() hands a kernel the body; Values() reads it back;
// GuardsIntact() says whether anything wrote outside it.
template <typename T>
class GuardedBuffer {
 public:
  static constexpr int64_t kGuard = 64;  // elements in each band

  GuardedBuffer(kernels::Device device, int64_t n) : device_(device), n_(n) {
    storage_.resize(static_cast<size_t>(n + 2 * kGuard));
    for (int64_t i = 0; i < kGuard; ++i) {
      SetBits(&storage_[i], GuardTraits<T>::kGuard);
      SetBits(&storage_[kGuard + n + i], GuardTraits<T>::kGuard);
    }
    for (int64_t i = 0; i < n; ++i) SetBits(&storage_[kGuard + i], GuardTraits<T>::kPoison);
    if (device != kernels::Device::kCpu) {
      device_storage_ = static_cast<T*>(Workspace().Allocate(Bytes()));
      Upload();
    }
  }
  GuardedBuffer(GuardedBuffer&& other) noexcept
      : device_(other.device_),
        n_(other.n_),
        storage_(std::move(other.storage_)),
        device_storage_(std::exchange(other.device_storage_, nullptr)) {}
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  ~GuardedBuffer() {
    if (device_storage_ != nullptr) Workspace().Free(device_storage_, Bytes());
  }

  int64_t size() const { return n_; }
  kernels::Device device() const { return device_; }
  // The body, for a test that fills an in-place operand or writes into a
  // guard on purpose (data()[-1], data()[size()]): host memory, which on
  // another device reaches the buffer at Upload().
  T* data() { return storage_.data() + kGuard; }
  void Upload() {
    if (device_storage_ != nullptr) {
      Workspace().CopyFromHost(device_storage_, storage_.data(), Bytes());
    }
  }

  // [rows, cols] at row stride `stride` (0: contiguous) over the body, which
  // must hold it.
  kernels::MutableTensor View(int64_t rows, int64_t cols, int64_t stride = 0) {
    const int64_t row_stride = stride != 0 ? stride : cols;
    const int64_t span = rows == 0 || cols == 0 ? 0 : (rows - 1) * row_stride + cols;
    EXPECT_LE(span, n_) << "GuardedBuffer: a [" << rows << ", " << cols << "] view at stride "
                        << row_stride << " outgrows its " << n_ << " elements";
    kernels::MutableTensor view;
    view.data = (device_storage_ != nullptr ? device_storage_ : storage_.data()) + kGuard;
    view.dtype = GuardTraits<T>::kDType;
    view.device = device_;
    view.rows = rows;
    view.cols = cols;
    view.stride = stride;
    return view;
  }

  // Copies `values` (at most size()) to the start of the body.
  void Fill(const std::vector<T>& values) {
    EXPECT_LE(static_cast<int64_t>(values.size()), n_);
    std::copy(values.begin(), values.end(), data());
    Upload();
  }

  // The body, copied to the host.
  std::vector<T> Values() const {
    const std::vector<T> all = Downloaded();
    return std::vector<T>(all.begin() + kGuard, all.begin() + kGuard + n_);
  }

  // Success when every guard element still holds its pattern; otherwise
  // names the first overwritten one (in address order) and how many were.
  ::testing::AssertionResult GuardsIntact() const {
    const std::vector<T> all = Downloaded();
    int64_t first = -1, count = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) {
      if (i == kGuard) i += n_;  // skip the body
      if (i >= static_cast<int64_t>(all.size())) break;
      if (Bits(all[i]) != static_cast<Uint>(GuardTraits<T>::kGuard)) {
        if (first < 0) first = i;
        ++count;
      }
    }
    if (first < 0) return ::testing::AssertionSuccess();
    char where[96];
    if (first < kGuard) {
      std::snprintf(where, sizeof(where), "%" PRId64 " before the start", kGuard - first);
    } else {
      std::snprintf(where, sizeof(where), "%" PRId64 " past the end", first - kGuard - n_ + 1);
    }
    char bits[32];
    std::snprintf(bits, sizeof(bits), "0x%0*llx", static_cast<int>(2 * sizeof(T)),
                  static_cast<unsigned long long>(Bits(all[first])));
    return ::testing::AssertionFailure()
           << "guard overwritten: the element " << where << " of a " << n_
           << "-element buffer holds " << bits << " (" << count << " guard elements changed)";
  }

 private:
  using Uint = std::conditional_t<sizeof(T) == 2, uint16_t,
                                  std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
  static Uint Bits(const T& x) {
    Uint u;
    std::memcpy(&u, &x, sizeof(u));
    return u;
  }
  template <typename U>
  static void SetBits(T* x, U bits) {
    const Uint u = static_cast<Uint>(bits);
    std::memcpy(x, &u, sizeof(u));
  }

  size_t Bytes() const { return storage_.size() * sizeof(T); }
  kernels::Workspace& Workspace() const { return kernels::Workspace::Of(device_); }

  // The whole storage as the device holds it, after the work issued so far;
  // a kernel's failure fails the test.
  std::vector<T> Downloaded() const {
    if (device_storage_ == nullptr) return storage_;
    std::vector<T> host(storage_.size());
    const kernels::DeviceError error = Workspace().Synchronize();
    EXPECT_TRUE(error.ok()) << error.op << ": " << error.message;
    Workspace().CopyToHost(host.data(), device_storage_, Bytes());
    return host;
  }

  kernels::Device device_;
  int64_t n_;
  std::vector<T> storage_;       // [kGuard | n | kGuard] on the host
  T* device_storage_ = nullptr;  // the same on another device
};

// A kernel test run once per device of AvailableDevices(): TEST_P on a
// subclass, then DELTASERVE_INSTANTIATE_DEVICE_TEST(subclass). The test names
// end in /cpu, /cuda.
// Skips a CUDA case where no CUDA backend is active.
#define DELTASERVE_SKIP_WITHOUT_BACKEND(device)                                             \
  do {                                                                                      \
    if ((device) == ::deltaserve::kernels::Device::kCuda &&                                 \
        ::deltaserve::kernels::cuda::ActiveBackend() ==                                     \
            ::deltaserve::kernels::cuda::Backend::kNone) {                                  \
      GTEST_SKIP() << "no CUDA backend: " << ::deltaserve::kernels::cuda::BackendProblem(); \
    }                                                                                       \
  } while (0)

class DeviceTest : public ::testing::TestWithParam<kernels::Device> {
 protected:
  void SetUp() override { DELTASERVE_SKIP_WITHOUT_BACKEND(device()); }
  kernels::Device device() const { return GetParam(); }
  // A poisoned, guarded output of n elements on the device under test.
  template <typename T>
  GuardedBuffer<T> Output(int64_t n) const {
    return GuardedBuffer<T>(device(), n);
  }
  // `values` on the device under test, guarded: an input.
  template <typename T>
  GuardedBuffer<T> Input(const std::vector<T>& values) const {
    GuardedBuffer<T> buffer(device(), static_cast<int64_t>(values.size()));
    buffer.Fill(values);
    return buffer;
  }
};

#define DELTASERVE_INSTANTIATE_DEVICE_TEST(suite)                                          \
  INSTANTIATE_TEST_SUITE_P(, suite,                                                        \
                           ::testing::ValuesIn(::deltaserve::testing::AvailableDevices()), \
                           ::deltaserve::testing::DeviceTestName)
// The same for an op that runs only on the CPU so far.
#define DELTASERVE_INSTANTIATE_CPU_TEST(suite)                                             \
  INSTANTIATE_TEST_SUITE_P(, suite, ::testing::ValuesIn(::deltaserve::testing::CpuOnly()), \
                           ::deltaserve::testing::DeviceTestName)

// The same for a test with a parameter of its own: the parameter is a
// (device, P) tuple; Param() is the P.
template <typename P>
class DeviceTestWithParam : public ::testing::TestWithParam<std::tuple<kernels::Device, P>> {
 protected:
  void SetUp() override { DELTASERVE_SKIP_WITHOUT_BACKEND(device()); }
  kernels::Device device() const { return std::get<0>(this->GetParam()); }
  const P& Param() const { return std::get<1>(this->GetParam()); }
  template <typename T>
  GuardedBuffer<T> Output(int64_t n) const {
    return GuardedBuffer<T>(device(), n);
  }
  template <typename T>
  GuardedBuffer<T> Input(const std::vector<T>& values) const {
    GuardedBuffer<T> buffer(device(), static_cast<int64_t>(values.size()));
    buffer.Fill(values);
    return buffer;
  }
};

// `values` is the generator of the P values, `name(P)` a gtest-name string.
#define DELTASERVE_INSTANTIATE_DEVICE_TEST_WITH_PARAM(suite, values, name)                    \
  DELTASERVE_INSTANTIATE_TEST_WITH_PARAM_ON(suite, ::deltaserve::testing::AvailableDevices(), \
                                            values, name)
#define DELTASERVE_INSTANTIATE_CPU_TEST_WITH_PARAM(suite, values, name) \
  DELTASERVE_INSTANTIATE_TEST_WITH_PARAM_ON(suite, ::deltaserve::testing::CpuOnly(), values, name)
#define DELTASERVE_INSTANTIATE_TEST_WITH_PARAM_ON(suite, devices, values, name)                 \
  INSTANTIATE_TEST_SUITE_P(, suite, ::testing::Combine(::testing::ValuesIn(devices), values),   \
                           [](const auto& info) {                                               \
                             return std::string(name(std::get<1>(info.param))) + "_" +          \
                                    ::deltaserve::kernels::DeviceName(std::get<0>(info.param)); \
                           })

}  // namespace deltaserve::testing
