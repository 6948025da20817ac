// Times Linear on a bf16 [1024 x 1024] weight (k3-small's attention
// projections) with 1, 2, 4, 8 and 16 rows of x: the decode GEMMs, which the
// skinny kernel runs (kernels/cpu/gemm_cpu.cc). Once with W streamed from
// memory (enough distinct matrices to pass the last-level cache) and once
// with W in cache (one 2 MB matrix), so that the time to read W and the
// arithmetic show apart.
// Usage: skinny_bench [THREADS] [MB streamed]. Prints us per matrix, GB/s of
// W and GFLOP/s for each row count, and each row count's time against one
// row's.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "bench/int_args.h"
#include "kernels/gemm.h"
#include "kernels/threads.h"

namespace {

using deltaserve::kernels::Device;
using deltaserve::kernels::DType;
using deltaserve::kernels::MutableTensor;
using deltaserve::kernels::Tensor;

constexpr int64_t kN = 1024, kK = 1024;

// Best of 5 passes over `weights`, in us per matrix.
double BestUs(const std::vector<std::vector<uint16_t>>& weights, const std::vector<float>& x,
              int64_t m, std::vector<float>& y) {
  const auto pass = [&] {
    for (const auto& w : weights) {
      const Tensor wt{w.data(), nullptr, DType::kBF16, Device::kCpu, kN, kK};
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
  std::mt19937 gen(1);
  // bf16 values in [1, 2): sign and exponent fixed, random mantissa bits.
  std::uniform_int_distribution<int> mantissa(0, 127);
  std::vector<std::vector<uint16_t>> streamed(mb * (1 << 20) / (kN * kK * 2));
  for (auto& w : streamed) {
    w.resize(kN * kK);
    for (uint16_t& v : w) v = static_cast<uint16_t>(0x3f80 + mantissa(gen));
  }
  const std::vector<std::vector<uint16_t>> cached(streamed.begin(), streamed.begin() + 1);
  std::vector<float> x(16 * kK, 0.5f), y(16 * kN);

  std::printf("Linear, bf16 W [%lld x %lld], %d threads; %zu matrices streamed (%lld MB)\n\n",
              static_cast<long long>(kN), static_cast<long long>(kK), threads, streamed.size(),
              static_cast<long long>(mb));
  std::printf(
      "| rows of x | streamed us | GB/s of W | GFLOP/s | x one row | in cache us | GFLOP/s "
      "| x one row |\n|---|---|---|---|---|---|---|---|\n");
  double one_streamed = 0, one_cached = 0;
  for (int64_t m : {1, 2, 4, 8, 16}) {
    const double s = BestUs(streamed, x, m, y), c = BestUs(cached, x, m, y);
    if (m == 1) {
      one_streamed = s;
      one_cached = c;
    }
    const double flops = 2.0 * m * kN * kK;
    std::printf("| %lld | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n",
                static_cast<long long>(m), s, kN * kK * 2 / s * 1e-3, flops / s * 1e-3,
                s / one_streamed, c, flops / c * 1e-3, c / one_cached);
  }
  return 0;
}
