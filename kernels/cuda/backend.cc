// The choice of CUDA backend (kernels/cuda/ops.h), made once per process.
#include <cstdlib>
#include <string>

#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels::cuda {
namespace {

struct Choice {
  Backend backend = Backend::kNone;
  std::string problem;
};

Choice Choose() {
  const char* env = std::getenv("DELTASERVE_CUDA_BACKEND");
  const std::string asked = env != nullptr ? env : "";
  if (asked == "sim") return {Backend::kSim, ""};
  if (!asked.empty() && asked != "gpu") {
    return {Backend::kNone, "DELTASERVE_CUDA_BACKEND is '" + asked + "'; it is gpu or sim"};
  }
#if DELTASERVE_KERNELS_CUDA
  std::string error;
  const int count = gpu::DeviceCount(&error);
  if (count > 0) return {Backend::kGpu, ""};
  return {Backend::kNone, error.empty() ? "the CUDA runtime sees no device" : error};
#else
  return {Backend::kNone, "this build has no CUDA (built without a CUDA compiler)"};
#endif
}

const Choice& Chosen() {
  static const Choice choice = Choose();
  return choice;
}

}  // namespace

Backend ActiveBackend() { return Chosen().backend; }
const std::string& BackendProblem() { return Chosen().problem; }

const char* BackendName(Backend backend) {
  switch (backend) {
    case Backend::kGpu:
      return "gpu";
    case Backend::kSim:
      return "sim";
    case Backend::kNone:
      break;
  }
  return "none";
}

void ReportLaunch(const char* kernel, const char* error) {
  if (error == nullptr || error[0] == '\0' || std::string(error) == "no error") return;
  Workspace::Of(Device::kCuda).ReportError(kernel, error);
}

}  // namespace deltaserve::kernels::cuda

namespace deltaserve::kernels::cuda {

void* WorkspaceAllocate(size_t bytes) { return Workspace::Of(Device::kCuda).Allocate(bytes); }

void WorkspaceFree(void* data, size_t bytes) { Workspace::Of(Device::kCuda).Free(data, bytes); }

}  // namespace deltaserve::kernels::cuda
