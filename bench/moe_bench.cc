// Times the routed experts of a decode step (MoeExperts, kernels/moe.h) on
// k3-moe-small's expert layer: 128 experts of [1024 x 512] gate|up and
// [512 x 512] down, 8 picked per token, in bf16 and in MXFP4. Enough layers
// of experts that they pass the last-level cache (MB of experts per format),
// each step on the next layer, the routing random (8 distinct experts a
// token, uniform), after one untimed read of every layer (ReadOnce). A
// step's ideal bytes are those of the experts its tokens touch, each read
// once however many of its tokens share it; the achieved rate is those bytes
// over the step's time, next to the memory read bandwidth measured in the
// same run (the sum model_bench uses).
//
// With --prefill it times prefill steps of 512, 2048 and 8192 tokens instead:
// each expert then gets ~tokens/16 rows, and the experts' GEMMs are bound by
// arithmetic, not by reading weights. The rate is the experts' FLOPs (2 per
// multiply-add of the gate|up and down products of every routed token) over
// the step's time, next to the rate of oneDNN's sgemm on a large square
// measured in the same run (through Linear on a float32 weight, which is that
// sgemm), so that runs on a busy machine compare by their ratios.
// Usage: moe_bench [--prefill] [THREADS] [MB] [STEPS]. Prints markdown.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/int_args.h"
#include "bench/read_bandwidth.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "kernels/threads.h"
#include "kernels/workspace.h"

namespace {

using deltaserve::bench::Clock;
using deltaserve::bench::ReadBandwidth;
using deltaserve::bench::Seconds;
using deltaserve::kernels::Device;
using deltaserve::kernels::DType;
using deltaserve::kernels::MoeExpert;
using deltaserve::kernels::MutableTensor;
using deltaserve::kernels::Tensor;

// k3-moe-small (runtime/model/presets.cc): the latent of 512 in and out.
constexpr int64_t kExperts = 128, kTopK = 8, kDin = 512, kInter = 512, kDout = 512;

// One matrix's bytes: bf16 values in [0.5, 2) or MXFP4 codes under scales of
// 2^-7 .. 2^-1 (random, as a checkpoint's are for the kernel's purposes), in
// a region on transparent huge pages, as the engine holds its weights.
struct Matrix {
  uint8_t* data = nullptr;
  uint8_t* scales = nullptr;
  Tensor View(DType dtype, int64_t rows, int64_t cols) const {
    return Tensor{data, dtype == DType::kMxfp4 ? scales : nullptr, dtype, Device::kCpu, rows, cols};
  }
};

// Bytes of a [rows, cols] matrix of `dtype`: its values (codes), then scales.
std::pair<int64_t, int64_t> MatrixBytes(DType dtype, int64_t rows, int64_t cols) {
  if (dtype == DType::kBF16) return {rows * cols * 2, 0};
  return {rows * cols / 2, rows * cols / 32};
}

// A matrix at *at in the region, *at moved past it.
Matrix MakeMatrix(DType dtype, int64_t rows, int64_t cols, std::mt19937& gen, uint8_t** at) {
  const auto [data_bytes, scale_bytes] = MatrixBytes(dtype, rows, cols);
  Matrix m{*at, *at + data_bytes};
  *at += data_bytes + scale_bytes;
  std::uniform_int_distribution<int> byte(0, 255);
  if (dtype == DType::kBF16) {
    for (int64_t i = 0; i < data_bytes; i += 2) {
      m.data[i] = static_cast<uint8_t>(byte(gen));
      m.data[i + 1] = static_cast<uint8_t>(0x3f);  // high byte: [0.5, 2)
    }
  } else {
    for (int64_t i = 0; i < data_bytes; ++i) m.data[i] = static_cast<uint8_t>(byte(gen));
    for (int64_t i = 0; i < scale_bytes; ++i)
      m.scales[i] = static_cast<uint8_t>(120 + byte(gen) % 7);
  }
  return m;
}

struct Layer {
  std::shared_ptr<uint8_t> region;  // the bytes of every layer's matrices
  std::vector<Matrix> w13, w2;
  std::vector<MoeExpert> experts;
};

struct Result {
  double us_per_step = 0, best_us = 0, touched = 0, ideal_bytes = 0, unshared_bytes = 0;
};

// `steps` steps of `batch` tokens, each on the next layer, after `warmup`
// untimed ones.
Result Run(std::vector<Layer>& layers, int64_t batch, int64_t steps, int64_t warmup,
           double expert_bytes, std::mt19937& gen) {
  std::vector<float> z(batch * kDin), out(batch * kDout), weights(batch * kTopK, 1.0f / kTopK);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& v : z) v = uniform(gen);
  // Routings drawn ahead, so that the timed loop is the experts alone.
  std::vector<std::vector<int32_t>> routes(steps, std::vector<int32_t>(batch * kTopK));
  std::vector<int32_t> ids(kExperts);
  std::iota(ids.begin(), ids.end(), 0);
  double touched = 0;
  for (auto& route : routes) {
    std::vector<bool> used(kExperts, false);
    for (int64_t t = 0; t < batch; ++t) {
      std::shuffle(ids.begin(), ids.end(), gen);
      for (int64_t j = 0; j < kTopK; ++j) {
        route[t * kTopK + j] = ids[j];
        used[ids[j]] = true;
      }
    }
    touched += static_cast<double>(std::count(used.begin(), used.end(), true));
  }
  const auto step = [&](int64_t s) {
    deltaserve::kernels::MoeExpertsArgs args;
    args.t = batch;
    args.din = kDin;
    args.inter = kInter;
    args.dout = kDout;
    args.top_k = kTopK;
    args.n_experts = kExperts;
    args.z = Tensor::F32(z.data(), batch, kDin);
    args.experts = layers[s % layers.size()].experts.data();
    args.idx = Tensor::I32(routes[s].data(), batch, kTopK);
    args.weights = Tensor::F32(weights.data(), batch, kTopK);
    args.act.kind = deltaserve::kernels::Activation::kSitu;
    args.out = MutableTensor::F32(out.data(), batch, kDout);
    deltaserve::kernels::MoeExperts(args);
  };
  for (int64_t s = 0; s < std::min(steps, warmup); ++s) step(s);  // thread start-up
  double seconds = 0, best = 1e30;
  for (int64_t s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    step(s);
    const double one = Seconds(t0, Clock::now());
    seconds += one;
    best = std::min(best, one);
  }
  Result r;
  r.us_per_step = seconds / steps * 1e6;
  r.best_us = best * 1e6;
  r.touched = touched / steps;
  r.ideal_bytes = r.touched * expert_bytes;
  r.unshared_bytes = static_cast<double>(batch * kTopK) * expert_bytes;
  return r;
}

// oneDNN sgemm's rate on an n x n x n product, in FLOP/s, best of `reps`:
// Linear on a float32 weight and more than 16 rows is that sgemm as it is
// (kernels/cpu/gemm_cpu.cc).
double SgemmRate(int64_t n, int reps) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(n * n), w(n * n), y(n * n);
  for (float& v : x) v = uniform(gen);
  for (float& v : w) v = uniform(gen);
  const Tensor wt = Tensor::F32(w.data(), n, n);
  double best = 0;
  for (int rep = 0; rep <= reps; ++rep) {  // the first one untimed: thread start-up
    const auto t0 = Clock::now();
    deltaserve::kernels::Linear(Tensor::F32(x.data(), n, n), wt,
                                MutableTensor::F32(y.data(), n, n));
    const double seconds = Seconds(t0, Clock::now());
    if (rep > 0) best = std::max(best, 2.0 * n * n * n / seconds);
  }
  return best;
}

// Layers of experts in `dtype`, `mb` MB of them or at least two.
// Layers of experts for about `mb` MB, at least two, in one region on
// transparent huge pages; none (and a message) when it cannot be had.
std::vector<Layer> MakeLayers(DType dtype, int64_t mb, double expert_bytes, std::mt19937& gen) {
  const int64_t n_layers =
      std::max<int64_t>(2, static_cast<int64_t>(mb * 1e6 / (expert_bytes * kExperts) + 0.999));
  const std::shared_ptr<uint8_t> region =
      deltaserve::kernels::HugePageRegion(static_cast<size_t>(n_layers * kExperts * expert_bytes));
  if (region == nullptr) {
    std::fprintf(stderr, "moe_bench: no memory for %lld layers of experts\n",
                 static_cast<long long>(n_layers));
    return {};
  }
  uint8_t* at = region.get();
  std::vector<Layer> layers(n_layers);
  for (Layer& layer : layers) {
    layer.region = region;
    for (int64_t e = 0; e < kExperts; ++e) {
      layer.w13.push_back(MakeMatrix(dtype, 2 * kInter, kDin, gen, &at));
      layer.w2.push_back(MakeMatrix(dtype, kDout, kInter, gen, &at));
    }
    for (int64_t e = 0; e < kExperts; ++e) {
      layer.experts.push_back(
          {layer.w13[e].View(dtype, 2 * kInter, kDin), layer.w2[e].View(dtype, kDout, kInter)});
    }
  }
  return layers;
}

// One expert's bytes: gate|up and down, values (codes) and scales.
double ExpertBytes(DType dtype) {
  const auto [w13_data, w13_scales] = MatrixBytes(dtype, 2 * kInter, kDin);
  const auto [w2_data, w2_scales] = MatrixBytes(dtype, kDout, kInter);
  return static_cast<double>(w13_data + w13_scales + w2_data + w2_scales);
}

const char* Name(DType dtype) { return dtype == DType::kBF16 ? "bf16" : "mxfp4"; }

// Prefill steps of 512, 2048 and 8192 tokens: the experts' FLOP rate against
// sgemm's.
int Prefill(int64_t mb, int64_t steps) {
  constexpr int64_t kSquare = 2048;
  const double sgemm = SgemmRate(kSquare, 5);
  std::printf(
      "- oneDNN sgemm, %lld x %lld x %lld (Linear on a float32 weight, best of 5): %.1f "
      "GFLOP/s\n\n",
      static_cast<long long>(kSquare), static_cast<long long>(kSquare),
      static_cast<long long>(kSquare), sgemm / 1e9);
  std::printf(
      "| experts | tokens a step | rows an expert (mean) | ms a step (mean) | ms (best) "
      "| GFLOP/s (best) | of sgemm |\n|---|---|---|---|---|---|---|\n");
  std::mt19937 gen(1);
  for (const DType dtype : {DType::kBF16, DType::kMxfp4}) {
    const double expert_bytes = ExpertBytes(dtype);
    std::vector<Layer> layers = MakeLayers(dtype, mb, expert_bytes, gen);
    if (layers.empty()) return 1;
    for (const int64_t tokens : {512, 2048, 8192}) {
      const Result r = Run(layers, tokens, steps, 1, expert_bytes, gen);
      const double flops = 2.0 * tokens * kTopK * (2 * kInter * kDin + kDout * kInter);  // per step
      const double rate = flops / (r.best_us * 1e-6);
      std::printf("| %s (%zu layers, %.0f MB) | %lld | %.1f | %.2f | %.2f | %.1f | %.1f%% |\n",
                  Name(dtype), layers.size(), expert_bytes * kExperts * layers.size() / 1e6,
                  static_cast<long long>(tokens), static_cast<double>(tokens * kTopK) / kExperts,
                  r.us_per_step / 1e3, r.best_us / 1e3, rate / 1e9, 100 * rate / sgemm);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kUsage[] =
      "usage: moe_bench [--prefill] [THREADS] [MB] [STEPS]\n"
      "\n"
      "Times the routed experts of decode steps of 1, 8 and 32 tokens on k3-moe-small's expert\n"
      "layer (128 experts, 8 active, latent 512, width 512), bf16 and MXFP4, against the memory\n"
      "read bandwidth measured in the same run: the experts' bytes each step touches, read\n"
      "once, over the step's time.\n"
      "\n"
      "  --prefill instead time prefill steps of 512, 2048 and 8192 tokens: the experts'\n"
      "            FLOPs a step over its time, against oneDNN sgemm's rate on a 2048 x 2048 x\n"
      "            2048 product measured in the same run\n"
      "  THREADS   compute threads (default: 0, OpenMP's default)\n"
      "  MB        bytes of experts per format, in MB, cycled through a layer a step\n"
      "            (default: 1024)\n"
      "  STEPS     steps timed per batch size (default: 256 decode steps, 3 prefill steps)\n";
  // --prefill comes first; the integers after it are parsed as without it.
  const bool prefill = argc > 1 && std::string_view(argv[1]) == "--prefill";
  if (prefill) {
    --argc;
    ++argv;
  }
  std::vector<int64_t> args = {0, 1024, prefill ? 3 : 256};  // THREADS, MB, STEPS
  if (auto exit_code = deltaserve::bench::ParseIntArgs(argc, argv, kUsage, &args)) {
    return *exit_code;
  }
  if (args[0] < 0 || args[1] < 1 || args[2] < 1) {
    std::fprintf(stderr,
                 "moe_bench: THREADS must be >= 0, MB and STEPS >= 1 (got %lld %lld %lld)\n\n%s",
                 static_cast<long long>(args[0]), static_cast<long long>(args[1]),
                 static_cast<long long>(args[2]), kUsage);
    return 2;
  }
  deltaserve::kernels::SetNumThreads(static_cast<int>(args[0]));
  const int64_t mb = args[1], steps = args[2];
  std::printf(
      "## moe_bench: %d threads; k3-moe-small's experts (%lld, %lld active; gate|up [%lld x "
      "%lld], down [%lld x %lld])\n\n",
      deltaserve::kernels::NumThreads(), static_cast<long long>(kExperts),
      static_cast<long long>(kTopK), static_cast<long long>(2 * kInter),
      static_cast<long long>(kDin), static_cast<long long>(kDout), static_cast<long long>(kInter));
  if (prefill) return Prefill(mb, steps);
  const double bandwidth = ReadBandwidth();
  const double bandwidth_small_pages = ReadBandwidth(/*huge_pages=*/false);
  std::printf(
      "- memory read bandwidth (a threaded sum over 512 MiB, best of 5): %.1f GB/s on "
      "transparent huge pages (%s), where the experts are; %.1f GB/s on 4 KiB pages\n\n",
      bandwidth / 1e9, deltaserve::kernels::TransparentHugePages() ? "on" : "off: 4 KiB pages too",
      bandwidth_small_pages / 1e9);
  std::printf(
      "| experts | tokens a step | experts touched | ideal MB a step | unshared MB | us a step "
      "| GB/s (ideal bytes) | of read bandwidth |\n|---|---|---|---|---|---|---|---|\n");
  std::mt19937 gen(1);
  for (const DType dtype : {DType::kBF16, DType::kMxfp4}) {
    const double expert_bytes = ExpertBytes(dtype);
    std::vector<Layer> layers = MakeLayers(dtype, mb, expert_bytes, gen);
    if (layers.empty()) return 1;
    deltaserve::bench::ReadOnce(layers[0].region.get(),
                                static_cast<size_t>(layers.size() * kExperts * expert_bytes));
    for (const int64_t batch : {1, 8, 32}) {
      const Result r = Run(layers, batch, steps, 4, expert_bytes, gen);
      const double rate = r.ideal_bytes / (r.us_per_step * 1e-6);
      std::printf(
          "| %s (%zu layers, %.0f MB) | %lld | %.1f | %.2f | %.2f | %.1f | %.1f | %.1f%% |\n",
          Name(dtype), layers.size(), expert_bytes * kExperts * layers.size() / 1e6,
          static_cast<long long>(batch), r.touched, r.ideal_bytes / 1e6, r.unshared_bytes / 1e6,
          r.us_per_step, rate / 1e9, 100 * rate / bandwidth);
      std::fflush(stdout);
    }
  }
  return 0;
}
