// The stream a piece of work is ordered on: the device it runs on and, on
// CUDA, the cudaStream_t as an opaque handle. The data path's communication
// (runtime/comm/data_communicator.h) takes one per call, so a transfer runs
// after the work that made its buffer and before the work that reads it.
//
// A plain value: copying it copies the handle, not the stream; whoever
// created the stream owns and destroys it. A default-constructed Stream is
// the CPU's (the host: work on it is done when the call returns). No CUDA
// headers here: a CUDA caller passes `Stream::Cuda(static_cast<void*>(s))`;
// a null CUDA handle is the legacy default stream.
#pragma once

#include "kernels/device.h"

namespace deltaserve::kernels {

struct Stream {
  Device device = Device::kCpu;
  void* handle = nullptr;  // null on the CPU; a cudaStream_t on CUDA

  static Stream Cpu() { return Stream{}; }
  static Stream Cuda(void* cuda_stream) { return Stream{Device::kCuda, cuda_stream}; }

  bool on_cpu() const { return device == Device::kCpu; }

  friend bool operator==(const Stream& a, const Stream& b) {
    return a.device == b.device && a.handle == b.handle;
  }
};

}  // namespace deltaserve::kernels
