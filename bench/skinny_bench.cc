// Times Linear on a bf16 [1024 x 1024] weight (k3-small's attention
// projections) with 1, 2, 4, 8 and 16 rows of x: the decode GEMMs, which the
// skinny kernel runs (kernels/cpu/gemm_cpu.cc). Once with W streamed from
// memory (enough distinct matrices to pass the last-level cache) and once
// with W in cache (one 2 MB matrix), so that the time to read W and the
// arithmetic show apart. The matrices lie in one region on transparent huge
// pages, as the engine holds its weights, and the rate is printed against
// the memory read bandwidth measured in the same run (the sum model_bench
// uses).
// Usage: skinny_bench [THREADS] [MB streamed]. Prints us per matrix, GB/s of
// W and GFLOP/s for each row count, and each row count's time against one
// row's.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
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

constexpr int64_t kN = 1024, kK = 1024;

// Best of 5 passes over `weights` (each kN x kK bf16), in us per matrix.
double BestUs(const std::vector<const uint16_t*>& weights, const std::vector<float>& x, int64_t m,
              std::vector<float>& y) {
  const auto pass = [&] {
    for (const uint16_t* w : weights) {
      const Tensor wt{w, nullptr, DType::kBF16, Device::kCpu, kN, kK};
      deltaserve::kernels::Linear(Tensor::F32(x.data(), m, kK), wt,
                                  MutableTensor::F32(y.data(), m, kN));
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
      "usage: skinny_bench [THREADS] [MB]\n"
      "\n"
      "Times the decode GEMM (Linear with 1-16 rows of x) on bf16 [1024 x 1024] weights, W\n"
      "streamed from memory and W in cache: us per matrix, GB/s of W, GFLOP/s, and each row\n"
      "count's time against one row's.\n"
      "\n"
      "  THREADS   compute threads (default: 1)\n"
      "  MB        bytes of weights streamed, in MB (default: 256)\n";
  std::vector<int64_t> args = {1, 256};  // THREADS, MB
  if (auto exit_code = deltaserve::bench::ParseIntArgs(argc, argv, kUsage, &args)) {
    return *exit_code;
  }
  const int threads = static_cast<int>(args[0]);
  const int64_t mb = std::max<int64_t>(2, args[1]);
  deltaserve::kernels::SetNumThreads(threads);
  const double bandwidth = deltaserve::bench::ReadBandwidth();
  std::mt19937 gen(1);
  // bf16 values in [1, 2): sign and exponent fixed, random mantissa bits.
  std::uniform_int_distribution<int> mantissa(0, 127);
  const int64_t count = mb * (1 << 20) / (kN * kK * 2);
  const std::shared_ptr<uint8_t> region =
      deltaserve::kernels::HugePageRegion(static_cast<size_t>(count * kN * kK * 2));
  if (region == nullptr) {
    std::fprintf(stderr, "skinny_bench: no memory for %lld MB of weights\n",
                 static_cast<long long>(mb));
    return 1;
  }
  std::vector<const uint16_t*> streamed;
  for (int64_t i = 0; i < count; ++i) {
    uint16_t* w = reinterpret_cast<uint16_t*>(region.get()) + i * kN * kK;
    for (int64_t j = 0; j < kN * kK; ++j) w[j] = static_cast<uint16_t>(0x3f80 + mantissa(gen));
    streamed.push_back(w);
  }
  const std::vector<const uint16_t*> cached(streamed.begin(), streamed.begin() + 1);
  std::vector<float> x(16 * kK, 0.5f), y(16 * kN);

  std::printf(
      "Linear, bf16 W [%lld x %lld], %d threads; %zu matrices streamed (%lld MB) on "
      "transparent huge pages; memory read bandwidth %.1f GB/s\n\n",
      static_cast<long long>(kN), static_cast<long long>(kK), threads, streamed.size(),
      static_cast<long long>(mb), bandwidth / 1e9);
  std::printf(
      "| rows of x | streamed us | GB/s of W | of bandwidth | GFLOP/s | x one row | in cache us "
      "| GFLOP/s | x one row |\n|---|---|---|---|---|---|---|---|---|\n");
  double one_streamed = 0, one_cached = 0;
  for (int64_t m : {1, 2, 4, 8, 16}) {
    const double s = BestUs(streamed, x, m, y), c = BestUs(cached, x, m, y);
    if (m == 1) {
      one_streamed = s;
      one_cached = c;
    }
    const double flops = 2.0 * m * kN * kK;
    const double rate = kN * kK * 2 / (s * 1e-6);  // bytes of W a second
    std::printf("| %lld | %.1f | %.1f | %.1f%% | %.1f | %.2f | %.1f | %.1f | %.2f |\n",
                static_cast<long long>(m), s, rate / 1e9, 100 * rate / bandwidth, flops / s * 1e-3,
                s / one_streamed, c, flops / c * 1e-3, c / one_cached);
  }
  return 0;
}
