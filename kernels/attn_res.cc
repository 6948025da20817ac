// Entry point of kernels/attn_res.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/attn_res.h"

#include <vector>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

void AttnResMix(const Tensor* candidates, int64_t n, const Tensor& norm_w, const Tensor& proj_w,
                float eps, const MutableTensor& out) {
  const int64_t t = out.rows, d = out.cols;
  DELTASERVE_CHECK(candidates != nullptr && n >= 1);
  const Device device = DELTASERVE_OP_DEVICE(out);
  DELTASERVE_CHECK_VIEW_ON(device, out, DType::kF32, t, d);
  DELTASERVE_CHECK_VIEW_ON(device, norm_w, DType::kF32, 1, d);
  DELTASERVE_CHECK_VIEW_ON(device, proj_w, DType::kF32, 1, d);
  std::vector<const float*> rows(n);  // n is the block count: a few dozen at most
  for (int64_t i = 0; i < n; ++i) {
    DELTASERVE_CHECK_VIEW_ON(device, candidates[i], DType::kF32, t, d);
    DELTASERVE_CHECK(!Overlaps(candidates[i], out));
    rows[i] = candidates[i].As<float>();
  }
  if (device == Device::kCuda) {
    // The kernel keeps n weights and n row pointers in shared memory.
    DELTASERVE_CHECK(n <= 2048);
    if (t == 0 || d == 0) return;
    // The row pointers go to the device for the kernel; the block is freed
    // back to the stream-ordered cache after the launch.
    Workspace& ws = Workspace::Of(device);
    const size_t bytes = sizeof(const float*) * static_cast<size_t>(n);
    void* on_device = ws.Allocate(bytes);
    ws.CopyFromHost(on_device, rows.data(), bytes);
    DELTASERVE_CUDA_DISPATCH(AttnResMix)
    (static_cast<const float* const*>(on_device), n, t, d, norm_w.As<float>(), proj_w.As<float>(),
     eps, out.As<float>(), ws.stream());
    ws.Free(on_device, bytes);
    return;
  }
  DELTASERVE_CPU_DISPATCH(AttnResMix)
  (rows.data(), n, t, d, norm_w.As<float>(), proj_w.As<float>(), eps, out.As<float>());
}

}  // namespace deltaserve::kernels
