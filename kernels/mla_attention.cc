// Entry point of kernels/mla_attention.h: the contract, then the variant of
// the output's device (the CPU's of this machine's level, or CUDA's).
#include "kernels/mla_attention.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"

namespace deltaserve::kernels {

void MlaPrefillAttention(const MlaPrefillArgs& a) {
  DELTASERVE_CHECK(a.t >= 0 && a.prefix >= 0 && a.heads >= 0);
  DELTASERVE_CHECK(a.nope_dim >= 0 && a.rope_dim >= 0 && a.v_dim >= 0);
  const int64_t s = a.prefix + a.t;
  const Device device = DELTASERVE_OP_DEVICE(a.o);
  DELTASERVE_CHECK_VIEW_ON(device, a.q, DType::kF32, a.t, a.heads * (a.nope_dim + a.rope_dim));
  DELTASERVE_CHECK_VIEW_ON(device, a.kv, DType::kF32, s, a.heads * (a.nope_dim + a.v_dim));
  DELTASERVE_CHECK_STRIDED_VIEW_ON(device, a.k_rope, DType::kF32, s, a.rope_dim);
  DELTASERVE_CHECK_VIEW_ON(device, a.o, DType::kF32, a.t, a.heads * a.v_dim);
  DELTASERVE_CHECK(!Overlaps(a.q, a.o) && !Overlaps(a.kv, a.o) && !Overlaps(a.k_rope, a.o));
  if (device == Device::kCuda) {
    cuda::MlaPrefillPtrs p;
    p.t = a.t;
    p.prefix = a.prefix;
    p.heads = a.heads;
    p.nope_dim = a.nope_dim;
    p.rope_dim = a.rope_dim;
    p.v_dim = a.v_dim;
    p.q = a.q.As<float>();
    p.kv = a.kv.As<float>();
    p.k_rope = a.k_rope.As<float>();
    p.k_rope_stride = a.k_rope.RowStride();
    p.scale = a.scale;
    p.o = a.o.As<float>();
    // The key splits' partial states: freed here, reused only by work
    // ordered after this op's kernels on the same stream.
    const int64_t floats = DELTASERVE_CUDA_DISPATCH(MlaPrefillPartialFloats)(p);
    Buffer partials;
    if (floats > 0) {
      partials = Buffer(device, DType::kF32, 1, floats);
      p.partials = partials.view().As<float>();
    }
    DELTASERVE_CUDA_DISPATCH(MlaPrefillAttention)(p, Workspace::Of(device).stream());
    return;
  }
  cpu::MlaPrefillPtrs p;
  p.t = a.t;
  p.prefix = a.prefix;
  p.heads = a.heads;
  p.nope_dim = a.nope_dim;
  p.rope_dim = a.rope_dim;
  p.v_dim = a.v_dim;
  p.q = a.q.As<float>();
  p.kv = a.kv.As<float>();
  p.k_rope = a.k_rope.As<float>();
  p.k_rope_stride = a.k_rope.RowStride();
  p.scale = a.scale;
  p.o = a.o.As<float>();
  DELTASERVE_CPU_DISPATCH(MlaPrefillAttention)(p);
}

void MlaAbsorbedAttention(const MlaAbsorbedArgs& a) {
  DELTASERVE_CHECK(a.t >= 0 && a.prefix >= 0 && a.heads >= 0);
  DELTASERVE_CHECK(a.latent_dim >= 0 && a.rope_dim >= 0);
  DELTASERVE_CHECK(a.cache.dtype == DType::kF32 || a.cache.dtype == DType::kBF16);
  const Device device = DELTASERVE_OP_DEVICE(a.o_latent);
  DELTASERVE_CHECK_VIEW_ON(device, a.q_latent, DType::kF32, a.t, a.heads * a.latent_dim);
  DELTASERVE_CHECK_VIEW_ON(device, a.q_rope, DType::kF32, a.t, a.heads * a.rope_dim);
  const int64_t keys = a.prefix + a.t;
  if (a.page_tokens > 0) {
    // Every page the keys need names a page of the pool.
    const int64_t pool_pages = a.cache.rows / a.page_tokens;
    const int64_t pages = (keys + a.page_tokens - 1) / a.page_tokens;
    DELTASERVE_CHECK_VIEW_ON(device, a.cache, a.cache.dtype, pool_pages * a.page_tokens,
                             a.latent_dim + a.rope_dim);
    DELTASERVE_CHECK_VIEW_ON(device, a.page_table, DType::kI32, 1, pages);
    // A table in CUDA memory is not read here (that would wait for the
    // device): the caller's page allocator is trusted there.
    for (int64_t i = 0; device == Device::kCpu && i < pages; ++i) {
      const int32_t page = a.page_table.As<int32_t>()[i];
      DELTASERVE_CHECK(page >= 0 && page < pool_pages);
    }
  } else {
    DELTASERVE_CHECK(a.page_tokens == 0);
    DELTASERVE_CHECK_VIEW_ON(device, a.cache, a.cache.dtype, keys, a.latent_dim + a.rope_dim);
  }
  DELTASERVE_CHECK_VIEW_ON(device, a.o_latent, DType::kF32, a.t, a.heads * a.latent_dim);
  DELTASERVE_CHECK(!Overlaps(a.q_latent, a.o_latent) && !Overlaps(a.q_rope, a.o_latent) &&
                   !Overlaps(a.cache, a.o_latent));
  if (device == Device::kCuda) {
    cuda::MlaAbsorbedPtrs p;
    p.t = a.t;
    p.prefix = a.prefix;
    p.heads = a.heads;
    p.latent_dim = a.latent_dim;
    p.rope_dim = a.rope_dim;
    p.q_latent = a.q_latent.As<float>();
    p.q_rope = a.q_rope.As<float>();
    p.cache = a.cache.data;
    p.cache_bf16 = a.cache.dtype == DType::kBF16;
    p.page_table = a.page_tokens > 0 ? a.page_table.As<int32_t>() : nullptr;
    p.page_tokens = a.page_tokens;
    p.scale = a.scale;
    p.o_latent = a.o_latent.As<float>();
    const int64_t floats = DELTASERVE_CUDA_DISPATCH(MlaAbsorbedPartialFloats)(p);
    Buffer partials;
    if (floats > 0) {
      partials = Buffer(device, DType::kF32, 1, floats);
      p.partials = partials.view().As<float>();
    }
    DELTASERVE_CUDA_DISPATCH(MlaAbsorbedAttention)(p, Workspace::Of(device).stream());
    return;
  }
  cpu::MlaAbsorbedPtrs p;
  p.t = a.t;
  p.prefix = a.prefix;
  p.heads = a.heads;
  p.latent_dim = a.latent_dim;
  p.rope_dim = a.rope_dim;
  p.q_latent = a.q_latent.As<float>();
  p.q_rope = a.q_rope.As<float>();
  p.cache = a.cache.data;
  p.cache_dtype = a.cache.dtype;
  p.page_table = a.page_tokens > 0 ? a.page_table.As<int32_t>() : nullptr;
  p.page_tokens = a.page_tokens;
  p.scale = a.scale;
  p.o_latent = a.o_latent.As<float>();
  DELTASERVE_CPU_DISPATCH(MlaAbsorbedAttention)(p);
}

}  // namespace deltaserve::kernels
