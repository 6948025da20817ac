// Linear (kernels/gemm.h) on the GPU: y[m, n] (+)= x[m, k] · w[n, k]ᵀ, x and
// y float32 at row strides ldx, ldy, w f32, bf16 or mxfp4.
//
// Up to 16 rows (decode) the product is bound by reading W: a warp per row of
// W streams it once in its stored dtype, widening each value in registers,
// and multiplies it by every row of x; lane sums, then a fixed butterfly, so
// each (row of x, row of W) pair sums in one order whatever the batch, as
// the contract requires (gemm.h; the CPU's skinny kernel does the same).
//
// More rows go to cuBLASLt (kernels/cuda/blas.h), with float32 sums
// (CUBLAS_COMPUTE_32F, no TF32: TF32's 10-bit products are 1e-3 off, far
// outside the float32 bound the contract gives and the CPU variant meets):
//   - f32 weights: one f32 GEMM on x and W as they are.
//   - bf16 weights with the opt-in compute kBF16 (tensor.h): x rounded to
//     bf16 into workspace memory by a kernel, then a bf16 x bf16 -> f32 GEMM
//     on the tensor cores, W read as stored; what the CPU's oneDNN path does.
//   - bf16 weights with compute kF32 (the default), and mxfp4: cuBLASLt has
//     no product of a bf16 (or fp4) W with f32 x, and rounding x to bf16 would
//     break the float32 contract, so a kernel widens W, exactly, into f32
//     panels of at most 32 MiB in workspace memory (a block of W's rows at a
//     time, never a whole matrix), each then an f32 GEMM. MXFP4 goes to f32,
//     not to bf16 tiles (into which it also converts exactly): a bf16 tile
//     could only meet bf16-rounded activations. The widening is O(n·k)
//     against the GEMM's O(m·n·k) at m > 16.
#include "kernels/cuda/compat.h"
// compat.h first
#include "kernels/cuda/blas.h"

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

#ifdef __CUDACC__
#define DELTASERVE_UNROLL _Pragma("unroll")
#else
#define DELTASERVE_UNROLL
#endif

// The skinny kernel's rows of x at most (the CPU's kMaxSkinnyRows: the batch
// size up to which a row's result must not depend on the batch), and its
// block: four warps, one row of W each.
constexpr int64_t kMaxSkinnyRows = 16;
constexpr int kSkinnyThreads = 128;
constexpr int kSkinnyWarps = kSkinnyThreads / 32;

// Elementwise kernels: 256 threads a block, at most 1024 blocks (a few
// waves of an H100's 132 SMs) striding over the elements.
constexpr int kElementThreads = 256;
constexpr int64_t kMaxElementBlocks = 1024;

// A widened panel of W at most, in floats (32 MiB).
constexpr int64_t kPanelFloats = int64_t{1} << 23;

unsigned ElementBlocks(int64_t n) {
  const int64_t blocks = (n + kElementThreads - 1) / kElementThreads;
  return static_cast<unsigned>(blocks < kMaxElementBlocks ? blocks : kMaxElementBlocks);
}

// 2^(s - 127), s = 0 the subnormal 2^-127 (kernels/mxfp4.h).
__device__ __forceinline__ float E8m0(uint8_t s) {
  return __uint_as_float(s == 0 ? (1u << 22) : static_cast<unsigned>(s) << 23);
}

// The E2M1 value of the low nibble of `code`: sign bit 3, exponent bits 1-2
// (bias 1), mantissa bit 0; exponent 0 is the subnormal 0.5·m.
__device__ __forceinline__ float E2m1(unsigned code) {
  const unsigned e = (code >> 1) & 3u, m = code & 1u;
  const float magnitude =
      e == 0 ? 0.5f * static_cast<float>(m) : __uint_as_float(((e + 126u) << 23) | (m << 22));
  return (code & 8u) != 0 ? -magnitude : magnitude;
}

// Value c of row `row` of a weight (bytes of the row; `scales` its scale row).
template <DType D>
__device__ __forceinline__ float WeightAt(const uint8_t* row, const uint8_t* scales, int64_t c) {
  if (D == DType::kF32) return reinterpret_cast<const float*>(row)[c];
  if (D == DType::kBF16) return Bf16Bits(reinterpret_cast<const uint16_t*>(row)[c]);
  const unsigned byte = row[c / 2];
  return E2m1(c % 2 == 0 ? byte & 15u : byte >> 4) * E8m0(scales[c / 32]);
}

template <DType D>
constexpr int64_t RowBytes(int64_t k) {
  return D == DType::kF32 ? 4 * k : D == DType::kBF16 ? 2 * k : k / 2;
}

// y[i, j] (+)= Σ_c x[i, c] · w[j, c] for i < m <= 16: warp `threadIdx.x / 32`
// takes row j of W, lane l columns l, l + 32, ...
template <DType D>
__global__ void __launch_bounds__(kSkinnyThreads)
    SkinnyKernel(const float* __restrict__ x, int64_t ldx, const uint8_t* __restrict__ w,
                 const uint8_t* __restrict__ scales, int64_t n, int64_t k, int64_t m,
                 float* __restrict__ y, int64_t ldy, bool accumulate) {
  const int lane = threadIdx.x % 32;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kSkinnyWarps + threadIdx.x / 32;
  if (j >= n) return;  // the whole warp: no barrier below waits for it
  const uint8_t* row = w + j * RowBytes<D>(k);
  const uint8_t* srow = scales == nullptr ? nullptr : scales + j * (k / 32);
  float acc[kMaxSkinnyRows];
  DELTASERVE_UNROLL
  for (int i = 0; i < kMaxSkinnyRows; ++i) acc[i] = 0.0f;
  for (int64_t c = lane; c < k; c += 32) {
    const float wv = WeightAt<D>(row, srow, c);
    DELTASERVE_UNROLL
    for (int i = 0; i < kMaxSkinnyRows; ++i) {
      if (i < m) acc[i] = fmaf(wv, x[i * ldx + c], acc[i]);
    }
  }
  DELTASERVE_UNROLL
  for (int i = 0; i < kMaxSkinnyRows; ++i) {
    if (i >= m) break;  // m is the same for every lane
    float sum = acc[i];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      float& out = y[i * ldy + j];
      out = accumulate ? out + sum : sum;
    }
  }
}

// out[r, c] = row r0 + r of W widened to f32 (exact), r < rows, c < k.
template <DType D>
__global__ void __launch_bounds__(kElementThreads)
    WidenKernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ scales, int64_t r0,
                int64_t rows, int64_t k, float* __restrict__ out) {
  const int64_t count = rows * k;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += step) {
    const int64_t r = r0 + e / k, c = e % k;
    out[e] =
        WeightAt<D>(w + r * RowBytes<D>(k), scales == nullptr ? nullptr : scales + r * (k / 32), c);
  }
}

// out[m, k] (contiguous) = x (rows at ldx) rounded to bf16.
__global__ void __launch_bounds__(kElementThreads)
    RoundBf16Kernel(const float* __restrict__ x, int64_t ldx, int64_t m, int64_t k,
                    uint16_t* __restrict__ out) {
  const int64_t count = m * k;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += step) {
    out[e] = ToBf16Bits(x[(e / k) * ldx + e % k]);
  }
}

// y[m, n] (rows at ldy) = 0: the product over k = 0.
__global__ void __launch_bounds__(kElementThreads)
    ZeroKernel(float* __restrict__ y, int64_t ldy, int64_t m, int64_t n) {
  const int64_t count = m * n;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += step) {
    y[(e / n) * ldy + e % n] = 0.0f;
  }
}

template <DType D>
void Skinny(const float* x, int64_t ldx, const Weight& w, int64_t m, float* y, int64_t ldy,
            bool accumulate, const Stream& stream) {
  DELTASERVE_LAUNCH(SkinnyKernel<D>, dim3(BlocksFor(w.rows, kSkinnyWarps)), dim3(kSkinnyThreads), 0,
                    stream, x, ldx, static_cast<const uint8_t*>(w.data), w.scales, w.rows, w.cols,
                    m, y, ldy, accumulate);
}

// Widened panels of W's rows, each an f32 GEMM into its columns of y.
template <DType D>
void Widened(const float* x, int64_t ldx, const Weight& w, int64_t m, float* y, int64_t ldy,
             float beta, const Stream& stream) {
  const int64_t n = w.rows, k = w.cols;
  const int64_t fit = kPanelFloats / k;
  const int64_t block = n < fit ? n : (fit > 1 ? fit : 1);
  const size_t bytes = static_cast<size_t>(block * k) * sizeof(float);
  float* panel = static_cast<float*>(WorkspaceAllocate(bytes));
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t nb = n - j0 < block ? n - j0 : block;
    DELTASERVE_LAUNCH(WidenKernel<D>, dim3(ElementBlocks(nb * k)), dim3(kElementThreads), 0, stream,
                      static_cast<const uint8_t*>(w.data), w.scales, j0, nb, k, panel);
    const std::string error = Gemm(true, false, nb, m, k, 1.0f, BlasType::kF32, panel, k, x, ldx,
                                   beta, y + j0, ldy, stream);
    ReportLaunch("Gemm", error.c_str());
  }
  WorkspaceFree(panel, bytes);
}

}  // namespace

void LinearStrided(const float* x, int64_t ldx, const Weight& w, int64_t m, float* y, int64_t ldy,
                   bool accumulate, const Stream& stream) {
  const int64_t n = w.rows, k = w.cols;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) {
      DELTASERVE_LAUNCH(ZeroKernel, dim3(ElementBlocks(m * n)), dim3(kElementThreads), 0, stream, y,
                        ldy, m, n);
    }
    return;
  }
  if (m <= kMaxSkinnyRows) {
    switch (w.dtype) {
      case DType::kF32:
        return Skinny<DType::kF32>(x, ldx, w, m, y, ldy, accumulate, stream);
      case DType::kBF16:
        return Skinny<DType::kBF16>(x, ldx, w, m, y, ldy, accumulate, stream);
      case DType::kMxfp4:
        return Skinny<DType::kMxfp4>(x, ldx, w, m, y, ldy, accumulate, stream);
      case DType::kI32:
      case DType::kF64:
        return;  // not weight dtypes: the entry point refuses them
    }
  }
  const float beta = accumulate ? 1.0f : 0.0f;
  switch (w.dtype) {
    case DType::kF32: {
      // The row-major product in column-major terms (kernels/cuda/blas.h).
      const std::string error =
          Gemm(true, false, n, m, k, 1.0f, BlasType::kF32, w.data, k, x, ldx, beta, y, ldy, stream);
      ReportLaunch("Gemm", error.c_str());
      return;
    }
    case DType::kBF16: {
      if (w.compute != DType::kBF16)
        return Widened<DType::kBF16>(x, ldx, w, m, y, ldy, beta, stream);
      const size_t bytes = static_cast<size_t>(m * k) * sizeof(uint16_t);
      uint16_t* xb = static_cast<uint16_t*>(WorkspaceAllocate(bytes));
      DELTASERVE_LAUNCH(RoundBf16Kernel, dim3(ElementBlocks(m * k)), dim3(kElementThreads), 0,
                        stream, x, ldx, m, k, xb);
      const std::string error =
          Gemm(true, false, n, m, k, 1.0f, BlasType::kBF16, w.data, k, xb, k, beta, y, ldy, stream);
      ReportLaunch("Gemm", error.c_str());
      WorkspaceFree(xb, bytes);
      return;
    }
    case DType::kMxfp4:
      return Widened<DType::kMxfp4>(x, ldx, w, m, y, ldy, beta, stream);
    case DType::kI32:
    case DType::kF64:
      return;
  }
}

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
