#include "kernels/onednn.h"

#include <omp.h>

#include <dnnl.hpp>
#include <memory>

#include "kernels/scratch.h"

namespace deltaserve::kernels::onednn {
namespace {

const dnnl::engine& Engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

}  // namespace

bool Bf16Matmul(const uint16_t* x, const uint16_t* w, int64_t m, int64_t n, int64_t k, float* y,
                int64_t ldy, bool accumulate) {
  using dt = dnnl::memory::data_type;
  try {
    const dnnl::memory::desc src_md({m, k}, dt::bf16, {k, 1});
    const dnnl::memory::desc wei_md({k, n}, dt::bf16, {1, k});  // w[n, k] read as its transpose
    const dnnl::memory::desc dst_md({m, n}, dt::f32, {ldy, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    // oneDNN keeps created primitives in its cache, keyed by these shapes.
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), attr,
                                          Engine());
    dnnl::memory src(src_md, Engine(), const_cast<uint16_t*>(x));
    dnnl::memory wei(wei_md, Engine(), const_cast<uint16_t*>(w));
    dnnl::memory dst(dst_md, Engine(), y);
    dnnl::stream stream(Engine());
    dnnl::matmul(pd).execute(stream,
                             {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream.wait();
    return true;
  } catch (const dnnl::error&) {
    return false;  // no bf16 matmul on this CPU (or this shape)
  }
}

bool HasBf16Matmul() {
  static const bool has = [] {
    float y[1] = {};
    const uint16_t x[16] = {}, w[16] = {};
    return Bf16Matmul(x, w, 1, 1, 16, y, 1, false);
  }();
  return has;
}

}  // namespace deltaserve::kernels::onednn
