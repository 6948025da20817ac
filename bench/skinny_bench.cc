// Times Linear on a bf16 [1024 x 1024] weight (k3-small's attention
// projections) with 1, 2, 4, 8 and 16 rows of x: the decode GEMMs, which the
// skinny kernel runs (kernels/cpu/gemm_cpu.cc). With --mxfp4, an MXFP4
// [512 x 3584] weight instead (rows as long as those of K3's routed experts).
// Once with W streamed from memory (enough distinct matrices to pass the
// last-level cache) and once with W in cache (one matrix), so that the time
// to read W and the arithmetic show apart: the in-cache rate is what the
// kernel could reach with no wait on memory. The matrices lie in one region
// on transparent huge pages, as the engine holds its weights, and both rates
// are printed against the memory read bandwidth measured in the same run
// (the sum model_bench uses).
// Usage: skinny_bench [--mxfp4] [THREADS] [MB streamed]. Prints us per
// matrix, GB/s of W and GFLOP/s for each row count, and each row count's time
// against one row's.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string_view>
#include <vector>

#include "bench/int_args.h"
#include "bench/read_bandwidth.h"
#include "kernels/gemm.h"
#include "kernels/threads.h"
#include "kernels/workspace.h"

namespace {

using deltaserve::kernels::Device;
using deltaserve::kernels::DType;
using deltaserve::kernels::MutableTensor;
using deltaserve::kernels::Tensor;

// Best of 5 passes over `weights`, in us per matrix.
double BestUs(const std::vector<Tensor>& weights, const std::vector<float>& x, int64_t m,
              std::vector<float>& y) {
  const int64_t n = weights[0].rows, k = weights[0].cols;
  const auto pass = [&] {
    for (const Tensor& w : weights) {
      deltaserve::kernels::Linear(Tensor::F32(x.data(), m, k), w,
                                  MutableTensor::F32(y.data(), m, n));
    }
  };
  pass();  // first touch, thread start-up
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    const auto stop = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::micro>(stop - start).count());
  }
  return best / static_cast<double>(weights.size());
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kUsage[] =
      "usage: skinny_bench [--mxfp4] [THREADS] [MB]\n"
      "\n"
      "Times the decode GEMM (Linear with 1-16 rows of x) on bf16 [1024 x 1024] weights, W\n"
      "streamed from memory and W in cache: us per matrix, GB/s of W, GFLOP/s, and each row\n"
      "count's time against one row's.\n"
      "\n"
      "  --mxfp4   MXFP4 [512 x 3584] weights instead\n"
      "  THREADS   compute threads (default: 1)\n"
      "  MB        bytes of weights streamed, in MB (default: 256)\n";
  // --mxfp4 comes first; the integers after it are parsed as without it.
  const bool mxfp4 = argc > 1 && std::string_view(argv[1]) == "--mxfp4";
  if (mxfp4) {
    --argc;
    ++argv;
  }
  std::vector<int64_t> args = {1, 256};  // THREADS, MB
  if (auto exit_code = deltaserve::bench::ParseIntArgs(argc, argv, kUsage, &args)) {
    return *exit_code;
  }
  const int threads = static_cast<int>(args[0]);
  const int64_t mb = std::max<int64_t>(2, args[1]);
  deltaserve::kernels::SetNumThreads(threads);
  const double bandwidth = deltaserve::bench::ReadBandwidth();
  const DType dtype = mxfp4 ? DType::kMxfp4 : DType::kBF16;
  const int64_t n = mxfp4 ? 512 : 1024, k = mxfp4 ? 3584 : 1024;
  // Bytes of one matrix: its data, then (MXFP4) its scales.
  const int64_t data_bytes = mxfp4 ? n * k / 2 : n * k * 2;
  const int64_t bytes = data_bytes + (mxfp4 ? n * k / 32 : 0);
  const int64_t count = std::max<int64_t>(1, mb * (1 << 20) / bytes);
  const std::shared_ptr<uint8_t> region =
      deltaserve::kernels::HugePageRegion(static_cast<size_t>(count * bytes));
  if (region == nullptr) {
    std::fprintf(stderr, "skinny_bench: no memory for %lld MB of weights\n",
                 static_cast<long long>(mb));
    return 1;
  }
  std::mt19937 gen(1);
  // bf16 values in [1, 2) (sign and exponent fixed, random mantissa bits);
  // MXFP4 random codes under scales 2^-7 to 2^3.
  std::uniform_int_distribution<int> mantissa(0, 127), code(0, 255), scale(120, 130);
  std::vector<Tensor> streamed;
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* w = region.get() + i * bytes;
    if (mxfp4) {
      for (int64_t j = 0; j < data_bytes; ++j) w[j] = static_cast<uint8_t>(code(gen));
      for (int64_t j = data_bytes; j < bytes; ++j) w[j] = static_cast<uint8_t>(scale(gen));
    } else {
      auto* h = reinterpret_cast<uint16_t*>(w);
      for (int64_t j = 0; j < n * k; ++j) h[j] = static_cast<uint16_t>(0x3f80 + mantissa(gen));
    }
    streamed.push_back(Tensor{w, mxfp4 ? w + data_bytes : nullptr, dtype, Device::kCpu, n, k});
  }
  const std::vector<Tensor> cached(streamed.begin(), streamed.begin() + 1);
  std::vector<float> x(16 * k, 0.5f), y(16 * n);

  std::printf(
      "Linear, %s W [%lld x %lld], %d threads; %zu matrices streamed (%lld MB) on "
      "transparent huge pages; memory read bandwidth %.1f GB/s\n\n",
      mxfp4 ? "MXFP4" : "bf16", static_cast<long long>(n), static_cast<long long>(k), threads,
      streamed.size(), static_cast<long long>(mb), bandwidth / 1e9);
  std::printf(
      "| rows of x | streamed us | GB/s of W | of bandwidth | GFLOP/s | x one row | in cache us "
      "| GB/s of W | of bandwidth | x one row |\n|---|---|---|---|---|---|---|---|---|---|\n");
  double one_streamed = 0, one_cached = 0;
  for (int64_t m : {1, 2, 4, 8, 16}) {
    const double s = BestUs(streamed, x, m, y), c = BestUs(cached, x, m, y);
    if (m == 1) {
      one_streamed = s;
      one_cached = c;
    }
    const double flops = 2.0 * m * n * k;
    // bytes of W a second
    const double rate = static_cast<double>(bytes) / (s * 1e-6), in_cache = bytes / (c * 1e-6);
    std::printf("| %lld | %.1f | %.1f | %.1f%% | %.1f | %.2f | %.1f | %.1f | %.1f%% | %.2f |\n",
                static_cast<long long>(m), s, rate / 1e9, 100 * rate / bandwidth, flops / s * 1e-3,
                s / one_streamed, c, in_cache / 1e9, 100 * in_cache / bandwidth, c / one_cached);
  }
  return 0;
}
