// Entry point of kernels/kda.h: the contract, then the variant of the
// output's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/kda.h"

#include <initializer_list>

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {
namespace {

// Both forms share the contract of kernels/kda.h; returns the device they
// run on, o's.
Device CheckKda(const KdaShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& g, const Tensor& beta, const MutableTensor& state,
                const MutableTensor& o) {
  DELTASERVE_CHECK(s.t >= 0 && s.heads > 0 && s.v_heads > 0 && s.k_dim > 0 && s.v_dim > 0);
  DELTASERVE_CHECK(s.v_heads % s.heads == 0);
  const Device device = DELTASERVE_OP_DEVICE(o);
  DELTASERVE_CHECK_VIEW_ON(device, q, DType::kF32, s.t, s.heads * s.k_dim);
  DELTASERVE_CHECK_VIEW_ON(device, k, DType::kF32, s.t, s.heads * s.k_dim);
  DELTASERVE_CHECK_VIEW_ON(device, v, DType::kF32, s.t, s.v_heads * s.v_dim);
  DELTASERVE_CHECK_VIEW_ON(device, g, DType::kF32, s.t, s.v_heads * s.k_dim);
  DELTASERVE_CHECK_VIEW_ON(device, beta, DType::kF32, s.t, s.v_heads);
  DELTASERVE_CHECK_VIEW_ON(device, state, DType::kF32, s.v_heads, s.k_dim * s.v_dim);
  DELTASERVE_CHECK_VIEW_ON(device, o, DType::kF32, s.t, s.v_heads * s.v_dim);
  for (const Tensor* in : {&q, &k, &v, &g, &beta}) {
    DELTASERVE_CHECK(!Overlaps(*in, o) && !Overlaps(*in, state));
  }
  DELTASERVE_CHECK(!Overlaps(state, o));
  return device;
}

}  // namespace

void KdaRecurrent(const KdaShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& beta, float scale, const MutableTensor& state,
                  const MutableTensor& o) {
  const Device device = CheckKda(shape, q, k, v, g, beta, state, o);
  if (device == Device::kCuda) {
    DELTASERVE_CUDA_DISPATCH(KdaRecurrent)
    (shape.t, shape.heads, shape.v_heads, shape.k_dim, shape.v_dim, q.As<float>(), k.As<float>(),
     v.As<float>(), g.As<float>(), beta.As<float>(), scale, state.As<float>(), o.As<float>(),
     Workspace::Of(device).stream());
    return;
  }
  DELTASERVE_CPU_DISPATCH(KdaRecurrent)
  (shape, q.As<float>(), k.As<float>(), v.As<float>(), g.As<float>(), beta.As<float>(), scale,
   state.As<float>(), o.As<float>());
}

void KdaChunk(const KdaShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& g, const Tensor& beta, float scale, const MutableTensor& state,
              const MutableTensor& o, int64_t chunk_size) {
  const Device device = CheckKda(shape, q, k, v, g, beta, state, o);
  DELTASERVE_CHECK(chunk_size >= 1);
  if (device == Device::kCuda) {
    // The scratch goes back to the workspace at once: later work on the
    // same stream that reuses it runs after these kernels.
    Workspace& workspace = Workspace::Of(device);
    const size_t bytes = DELTASERVE_CUDA_DISPATCH(KdaChunkScratchBytes)(
        shape.t, shape.v_heads, shape.k_dim, shape.v_dim, chunk_size);
    if (bytes == 0) return;
    void* scratch = workspace.Allocate(bytes);
    DELTASERVE_CUDA_DISPATCH(KdaChunk)
    (shape.t, shape.heads, shape.v_heads, shape.k_dim, shape.v_dim, q.As<float>(), k.As<float>(),
     v.As<float>(), g.As<float>(), beta.As<float>(), scale, state.As<float>(), o.As<float>(),
     chunk_size, scratch, workspace.stream());
    workspace.Free(scratch, bytes);
    return;
  }
  DELTASERVE_CPU_DISPATCH(KdaChunk)
  (shape, q.As<float>(), k.As<float>(), v.As<float>(), g.As<float>(), beta.As<float>(), scale,
   state.As<float>(), o.As<float>(), chunk_size);
}

}  // namespace deltaserve::kernels
