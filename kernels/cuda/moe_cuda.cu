// The routed experts (kernels/moe.h MoeExperts) on the GPU, as on the CPU
// (kernels/cpu/moe_cpu.cc): the (token, slot) pairs are grouped by expert
// with a counting sort on the host (the entry point has the routing there
// already), the order goes to the device once, and each expert with tokens
// runs, in ascending id, as a gather of its tokens' rows, the CUDA Linear on
// w13 (kernels/cuda/gemm_cuda.cu: decode sizes stream the weights as stored,
// MXFP4 included), the gated activation, Linear on w2, and a weighted
// scatter-add into out. Experts in ascending id make each token's sum run in
// one order whatever its slots' order; the scatter adds atomically only so
// that a token routed twice to one expert (two rows of the same launch) adds
// both. A grouped GEMM over all experts in one launch would save the
// per-expert launches; not done here.
#include <vector>

#include "kernels/cuda/compat.h"
// compat.h first

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

constexpr int kRowThreads = 128;  // a block per row of the gather and scatter
constexpr int kElementThreads = 256;
constexpr int64_t kMaxElementBlocks = 1024;

unsigned ElementBlocks(int64_t n) {
  const int64_t blocks = (n + kElementThreads - 1) / kElementThreads;
  return static_cast<unsigned>(blocks < kMaxElementBlocks ? blocks : kMaxElementBlocks);
}

// x[r] = z[pair[r] / top_k]: the expert's tokens, gathered into [rows, din].
__global__ void __launch_bounds__(kRowThreads)
    GatherKernel(const float* __restrict__ z, const int32_t* __restrict__ pair, int64_t top_k,
                 int64_t din, float* __restrict__ x) {
  const int64_t r = blockIdx.x;
  const float* src = z + (pair[r] / top_k) * din;
  float* dst = x + r * din;
  for (int64_t c = threadIdx.x; c < din; c += kRowThreads) dst[c] = src[c];
}

// h[r, c] = act(gu[r, c], gu[r, width + c]), as kernels/cpu/activation_cpu.cc
// writes it: the sigmoid as a division by 1 + exp(-g), which gives exactly
// ±0 where exp(-g) overflows.
__global__ void __launch_bounds__(kElementThreads)
    GatedKernel(const float* __restrict__ gu, int64_t rows, int64_t width, bool situ, float beta,
                float lbeta, float* __restrict__ h) {
  const int64_t count = rows * width;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += step) {
    const int64_t r = e / width, c = e % width;
    const float g = gu[r * 2 * width + c], u = gu[r * 2 * width + width + c];
    h[e] = situ ? beta * tanhf(g / beta) / (1.0f + expf(-g)) * (lbeta * tanhf(u / lbeta))
                : g / (1.0f + expf(-g)) * u;
  }
}

// out[pair[r] / top_k] += weights[pair[r]] · y[r].
__global__ void __launch_bounds__(kRowThreads)
    ScatterKernel(const float* __restrict__ y, const int32_t* __restrict__ pair,
                  const float* __restrict__ weights, int64_t top_k, int64_t dout,
                  float* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const int32_t p = pair[r];
  const float w = weights[p];
  const float* src = y + r * dout;
  float* dst = out + (p / top_k) * dout;
  for (int64_t c = threadIdx.x; c < dout; c += kRowThreads) atomicAdd(dst + c, w * src[c]);
}

__global__ void __launch_bounds__(kElementThreads) ZeroKernel(float* __restrict__ y, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    y[e] = 0.0f;
  }
}

bool Empty(const Weight& w) { return w.rows == 0 || w.cols == 0; }

// Workspace memory of `count` T, none for 0; freed with this.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(int64_t count) : bytes_(static_cast<size_t>(count) * sizeof(T)) {
    if (bytes_ > 0) data_ = static_cast<T*>(WorkspaceAllocate(bytes_));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (data_ != nullptr) WorkspaceFree(data_, bytes_);
  }
  T* data() const { return data_; }

 private:
  size_t bytes_;
  T* data_ = nullptr;
};

}  // namespace

void MoeExperts(const MoeExpertsPtrs& a, const Stream& stream) {
  const int64_t pairs = a.t * a.top_k;
  if (a.t * a.dout > 0) {
    DELTASERVE_LAUNCH(ZeroKernel, dim3(ElementBlocks(a.t * a.dout)), dim3(kElementThreads), 0,
                      stream, a.out, a.t * a.dout);
  }
  if (pairs == 0) return;

  // Counting sort of pair p = t·top_k + j by expert, stable (each expert's
  // rows in token order): offset[e] .. offset[e + 1] index `order`.
  std::vector<int64_t> offset(a.n_experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) ++offset[a.idx_host[p] + 1];
  int64_t max_rows = 0;
  for (int64_t e = 0; e < a.n_experts; ++e) {
    max_rows = offset[e + 1] > max_rows ? offset[e + 1] : max_rows;
    offset[e + 1] += offset[e];
  }
  std::vector<int32_t> order(pairs);
  {
    std::vector<int64_t> cursor(offset.begin(), offset.end() - 1);
    for (int64_t p = 0; p < pairs; ++p) order[cursor[a.idx_host[p]]++] = static_cast<int32_t>(p);
  }
  // From pageable memory the copy has read `order` when it returns.
  const DeviceArray<int32_t> pair(pairs);
  ReportLaunch("CopyToDevice", CopyToDevice(pair.data(), order.data(),
                                            static_cast<size_t>(pairs) * sizeof(int32_t), stream)
                                   .c_str());

  // Per-expert buffers for the busiest expert: gathered tokens [rows, din],
  // gate|up [rows, 2 * inter], activation [rows, inter], output [rows, dout].
  const int64_t m = max_rows;
  const DeviceArray<float> x(m * a.din), gu(m * 2 * a.inter), h(m * a.inter), y(m * a.dout);
  for (int64_t e = 0; e < a.n_experts; ++e) {
    const int64_t rows = offset[e + 1] - offset[e];
    const MoeExpertWeights& ex = a.experts[e];
    if (rows == 0 || Empty(ex.w13)) continue;  // idle, or held elsewhere
    const int32_t* rows_pair = pair.data() + offset[e];
    if (a.din > 0) {
      DELTASERVE_LAUNCH(GatherKernel, dim3(static_cast<unsigned>(rows)), dim3(kRowThreads), 0,
                        stream, a.z, rows_pair, a.top_k, a.din, x.data());
    }
    LinearStrided(x.data(), a.din, ex.w13, rows, gu.data(), 2 * a.inter, false, stream);
    DELTASERVE_LAUNCH(GatedKernel, dim3(ElementBlocks(rows * a.inter)), dim3(kElementThreads), 0,
                      stream, gu.data(), rows, a.inter, a.situ, a.situ_beta, a.situ_linear_beta,
                      h.data());
    if (a.dout == 0) continue;
    LinearStrided(h.data(), a.inter, ex.w2, rows, y.data(), a.dout, false, stream);
    DELTASERVE_LAUNCH(ScatterKernel, dim3(static_cast<unsigned>(rows)), dim3(kRowThreads), 0,
                      stream, y.data(), rows_pair, a.weights, a.top_k, a.dout, a.out);
  }
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
