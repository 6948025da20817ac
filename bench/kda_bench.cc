// Times the two KDA forms at the k3-small prefill shape (T = 8192, H = HV = 8,
// K = V = 128): KdaChunk (prefill) against KdaRecurrent (token by token).
// Usage: kda_bench [threads] [tokens]. Prints ms per call, the speed-up and
// tokens/s, and how far the two outputs are apart.
//
// With --device cuda it times KdaChunk on the GPU instead, at each of
// --tokens (prefixes of one set of inputs) and --heads heads, as
// bench/fla_kda_compare.py times flash-linear-attention's chunk_kda on the
// same shapes; --check also runs the CPU's KdaChunk on the same inputs and
// prints how far the outputs differ.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench/int_args.h"
#include "kernels/cuda/ops.h"
#include "kernels/kda.h"
#include "kernels/threads.h"
#include "kernels/workspace.h"

namespace {

using deltaserve::kernels::Device;
using deltaserve::kernels::KdaShape;
using deltaserve::kernels::MutableTensor;
using deltaserve::kernels::Tensor;

std::vector<float> Uniform(size_t n, float lo, float hi, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

void NormalizeRows(std::vector<float>& x, int64_t dim) {
  for (size_t r = 0; r < x.size() / dim; ++r) {
    float sum = 0.0f;
    for (int64_t c = 0; c < dim; ++c) sum += x[r * dim + c] * x[r * dim + c];
    const float inv = 1.0f / std::sqrt(sum + 1e-6f);
    for (int64_t c = 0; c < dim; ++c) x[r * dim + c] *= inv;
  }
}

// Best of `reps` calls, in ms; every call starts from the same state.
template <typename F>
double BestMs(int reps, const std::vector<float>& state0, std::vector<float>& state, F call) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    state = state0;
    const auto start = std::chrono::steady_clock::now();
    call();
    const auto stop = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(stop - start).count());
  }
  return best;
}

// Uniform values drawn in blocks of 1M, each from its own stream: the same
// values whatever the thread count, and quick at the sizes the GPU runs
// (hundreds of millions).
std::vector<float> UniformParallel(size_t n, float lo, float hi, uint64_t seed) {
  constexpr size_t kBlock = size_t{1} << 20;
  std::vector<float> x(n);
  const int64_t blocks = static_cast<int64_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    std::mt19937_64 gen(seed * 1000003 + static_cast<uint64_t>(b));
    std::uniform_real_distribution<float> dist(lo, hi);
    const size_t end = std::min(n, static_cast<size_t>(b + 1) * kBlock);
    for (size_t i = static_cast<size_t>(b) * kBlock; i < end; ++i) x[i] = dist(gen);
  }
  return x;
}

void NormalizeRowsParallel(std::vector<float>& x, int64_t dim) {
  const int64_t rows = static_cast<int64_t>(x.size()) / dim;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0.0f;
    for (int64_t c = 0; c < dim; ++c) sum += x[r * dim + c] * x[r * dim + c];
    const float inv = 1.0f / std::sqrt(sum + 1e-6f);
    for (int64_t c = 0; c < dim; ++c) x[r * dim + c] *= inv;
  }
}

// A device copy of a host array, as a [rows, cols] f32 view.
struct DeviceArray {
  deltaserve::kernels::Buffer buffer;
  DeviceArray(const std::vector<float>& host, int64_t rows, int64_t cols)
      : buffer(Device::kCuda, deltaserve::kernels::DType::kF32, rows, cols) {
    deltaserve::kernels::Workspace::Of(Device::kCuda)
        .CopyFromHost(buffer.view().data, host.data(), host.size() * sizeof(float));
  }
  // The first `rows` rows.
  MutableTensor Rows(int64_t rows) const {
    MutableTensor view = buffer.view();
    view.rows = rows;
    return view;
  }
};

// KdaChunk on the GPU at each of `tokens` (prefixes of one set of inputs of
// the largest) with H = HV = heads, K = V = 128, best of 3 after a warm-up,
// each call from the same initial state. Returns the exit status.
int RunOnDevice(const std::string& device_name, const std::vector<int64_t>& tokens, int64_t heads,
                bool check) {
  namespace k = deltaserve::kernels;
  int ordinal = 0;
  if (device_name != "cuda") {
    if (!device_name.starts_with("cuda:")) {
      std::fprintf(stderr, "kda_bench: --device is '%s'; it must be cpu, cuda or cuda:N\n",
                   device_name.c_str());
      return 2;
    }
    ordinal = std::atoi(device_name.c_str() + 5);
  }
  std::string error;
  if (k::CudaDeviceCount(&error) <= ordinal) {
    std::fprintf(stderr, "kda_bench: --device %s: %s\n", device_name.c_str(),
                 error.empty() ? "no such device" : error.c_str());
    return 1;
  }
  if (error = k::SelectCudaDevice(ordinal); !error.empty()) {
    std::fprintf(stderr, "kda_bench: --device %s: %s\n", device_name.c_str(), error.c_str());
    return 1;
  }
  const int64_t t_max = *std::max_element(tokens.begin(), tokens.end());
  const KdaShape max_shape{t_max, heads, heads, 128, 128};
  const int64_t qk_cols = heads * max_shape.k_dim, v_cols = heads * max_shape.v_dim;
  std::vector<float> q = UniformParallel(t_max * qk_cols, -1, 1, 1);
  std::vector<float> kk = UniformParallel(t_max * qk_cols, -1, 1, 2);
  NormalizeRowsParallel(q, max_shape.k_dim);
  NormalizeRowsParallel(kk, max_shape.k_dim);
  const std::vector<float> v = UniformParallel(t_max * v_cols, -1, 1, 3);
  // K3's gate: lower bound -5 times a sigmoid; most channels decay slowly.
  const std::vector<float> g = UniformParallel(t_max * qk_cols, -1.0f, -0.001f, 4);
  const std::vector<float> beta = UniformParallel(t_max * heads, 0.01f, 0.99f, 5);
  const std::vector<float> state0 =
      UniformParallel(heads * max_shape.k_dim * max_shape.v_dim, -1, 1, 6);
  const float scale = 1.0f / std::sqrt(static_cast<float>(max_shape.k_dim));
  const DeviceArray dq(q, t_max, qk_cols), dk(kk, t_max, qk_cols), dv(v, t_max, v_cols),
      dg(g, t_max, qk_cols), dbeta(beta, t_max, heads),
      dstate(state0, heads, max_shape.k_dim * max_shape.v_dim);
  const DeviceArray dout(std::vector<float>(t_max * v_cols), t_max, v_cols);
  k::Workspace& ws = k::Workspace::Of(Device::kCuda);
  std::printf("KDA chunked prefill on cuda:%d (%s), H=HV=%lld K=V=%lld, f32 inputs and state\n",
              ordinal, k::cuda::BackendName(k::cuda::ActiveBackend()),
              static_cast<long long>(heads), static_cast<long long>(max_shape.k_dim));
  for (int64_t t : tokens) {
    const KdaShape s{t, heads, heads, max_shape.k_dim, max_shape.v_dim};
    double best = 1e30;
    for (int rep = 0; rep <= 3; ++rep) {  // the first warms up
      ws.CopyFromHost(dstate.buffer.view().data, state0.data(), state0.size() * sizeof(float));
      if (const k::DeviceError e = ws.Synchronize(); !e.ok()) {
        std::fprintf(stderr, "kda_bench: %s: %s\n", e.op.c_str(), e.message.c_str());
        return 1;
      }
      const auto start = std::chrono::steady_clock::now();
      k::KdaChunk(s, dq.Rows(t), dk.Rows(t), dv.Rows(t), dg.Rows(t), dbeta.Rows(t), scale,
                  dstate.Rows(heads), dout.Rows(t));
      const k::DeviceError e = ws.Synchronize();
      const auto stop = std::chrono::steady_clock::now();
      if (!e.ok()) {
        std::fprintf(stderr, "kda_bench: %s: %s\n", e.op.c_str(), e.message.c_str());
        return 1;
      }
      if (rep > 0) {
        best = std::min(best, std::chrono::duration<double, std::milli>(stop - start).count());
      }
    }
    std::printf("  KdaChunk T=%lld %9.2f ms  %10.0f tokens/s\n", static_cast<long long>(t), best,
                t / (best * 1e-3));
    std::fflush(stdout);
    if (check) {
      std::vector<float> o_gpu(t * v_cols), o_cpu(t * v_cols), state = state0;
      ws.CopyToHost(o_gpu.data(), dout.buffer.view().data, o_gpu.size() * sizeof(float));
      k::KdaChunk(s, Tensor::F32(q.data(), t, qk_cols), Tensor::F32(kk.data(), t, qk_cols),
                  Tensor::F32(v.data(), t, v_cols), Tensor::F32(g.data(), t, qk_cols),
                  Tensor::F32(beta.data(), t, heads), scale,
                  MutableTensor::F32(state.data(), heads, s.k_dim * s.v_dim),
                  MutableTensor::F32(o_cpu.data(), t, v_cols));
      double num = 0, den = 0;
      for (size_t i = 0; i < o_cpu.size(); ++i) {
        num += double(o_gpu[i] - o_cpu[i]) * (o_gpu[i] - o_cpu[i]);
        den += double(o_cpu[i]) * o_cpu[i];
      }
      std::printf("    rel L2 difference of o from the CPU's KdaChunk %.2g\n",
                  std::sqrt(num / den));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kUsage[] =
      "usage: kda_bench [THREADS] [TOKENS]\n"
      "       kda_bench [THREADS] --device cuda|cuda:N [--tokens 4096,32768] [--heads 96]\n"
      "                 [--check]\n"
      "\n"
      "Times KdaChunk (prefill) against KdaRecurrent (token by token) at the k3-small shape\n"
      "(H = 8, K = V = 128): ms per call, speed-up, tokens/s, and how far the outputs differ.\n"
      "With --device, times KdaChunk on that GPU at each prompt length of --tokens with\n"
      "H = HV = --heads, K = V = 128 (the shapes bench/fla_kda_compare.py gives chunk_kda).\n"
      "\n"
      "  THREADS   compute threads (default: 0, OpenMP's default)\n"
      "  TOKENS    prompt tokens (default: 8192)\n"
      "  --tokens  prompt lengths on the GPU (default: 4096,32768)\n"
      "  --heads   heads on the GPU (default: 96, K3's)\n"
      "  --check   also run the CPU's KdaChunk and print how far the outputs differ\n";
  // The GPU's flags, taken out before the positional integers.
  std::string device = "cpu";
  std::vector<int64_t> gpu_tokens = {4096, 32768};
  int64_t gpu_heads = 96;
  bool check = false;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--device" && has_value) {
      device = argv[++i];
    } else if (arg == "--tokens" && has_value) {
      gpu_tokens.clear();
      for (std::string_view list = argv[++i]; !list.empty();) {
        const size_t comma = std::min(list.find(','), list.size());
        gpu_tokens.push_back(std::atoll(std::string(list.substr(0, comma)).c_str()));
        list.remove_prefix(std::min(comma + 1, list.size()));
      }
    } else if (arg == "--heads" && has_value) {
      gpu_heads = std::atoll(argv[++i]);
    } else if (arg == "--check") {
      check = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  std::vector<int64_t> args = {0, 8192};  // THREADS, TOKENS
  if (auto exit_code = deltaserve::bench::ParseIntArgs(static_cast<int>(rest.size()), rest.data(),
                                                       kUsage, &args)) {
    return *exit_code;
  }
  const int threads = static_cast<int>(args[0]);
  const int64_t tokens = args[1];
  deltaserve::kernels::SetNumThreads(threads);
  if (device != "cpu") {
    for (int64_t t : gpu_tokens) {
      if (t < 1 || gpu_heads < 1) {
        std::fprintf(stderr, "kda_bench: --tokens and --heads must be >= 1\n%s", kUsage);
        return 2;
      }
    }
    if (gpu_tokens.empty()) {
      std::fprintf(stderr, "kda_bench: --tokens is empty\n%s", kUsage);
      return 2;
    }
    return RunOnDevice(device, gpu_tokens, gpu_heads, check);
  }
  const KdaShape s{tokens, 8, 8, 128, 128};
  std::vector<float> q = Uniform(s.t * s.heads * s.k_dim, -1, 1, 1);
  std::vector<float> k = Uniform(s.t * s.heads * s.k_dim, -1, 1, 2);
  NormalizeRows(q, s.k_dim);
  NormalizeRows(k, s.k_dim);
  const std::vector<float> v = Uniform(s.t * s.v_heads * s.v_dim, -1, 1, 3);
  // K3's gate: lower bound -5 times a sigmoid; most channels decay slowly.
  const std::vector<float> g = Uniform(s.t * s.v_heads * s.k_dim, -1.0f, -0.001f, 4);
  const std::vector<float> beta = Uniform(s.t * s.v_heads, 0.01f, 0.99f, 5);
  const std::vector<float> state0 = Uniform(s.v_heads * s.k_dim * s.v_dim, -1, 1, 6);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.k_dim));
  std::vector<float> o_chunk(s.t * s.v_heads * s.v_dim), o_rec(o_chunk.size());
  std::vector<float> state_chunk, state_rec;

  const double chunk_ms = BestMs(3, state0, state_chunk, [&] {
    deltaserve::kernels::KdaChunk(
        s, Tensor::F32(q.data(), s.t, s.heads * s.k_dim),
        Tensor::F32(k.data(), s.t, s.heads * s.k_dim),
        Tensor::F32(v.data(), s.t, s.v_heads * s.v_dim),
        Tensor::F32(g.data(), s.t, s.v_heads * s.k_dim), Tensor::F32(beta.data(), s.t, s.v_heads),
        scale, MutableTensor::F32(state_chunk.data(), s.v_heads, s.k_dim * s.v_dim),
        MutableTensor::F32(o_chunk.data(), s.t, s.v_heads * s.v_dim));
  });
  const double rec_ms = BestMs(2, state0, state_rec, [&] {
    deltaserve::kernels::KdaRecurrent(
        s, Tensor::F32(q.data(), s.t, s.heads * s.k_dim),
        Tensor::F32(k.data(), s.t, s.heads * s.k_dim),
        Tensor::F32(v.data(), s.t, s.v_heads * s.v_dim),
        Tensor::F32(g.data(), s.t, s.v_heads * s.k_dim), Tensor::F32(beta.data(), s.t, s.v_heads),
        scale, MutableTensor::F32(state_rec.data(), s.v_heads, s.k_dim * s.v_dim),
        MutableTensor::F32(o_rec.data(), s.t, s.v_heads * s.v_dim));
  });

  double num = 0, den = 0;
  for (size_t i = 0; i < o_rec.size(); ++i) {
    num += double(o_chunk[i] - o_rec[i]) * (o_chunk[i] - o_rec[i]);
    den += double(o_rec[i]) * o_rec[i];
  }
  std::printf("KDA T=%lld H=HV=%lld K=V=%lld, %d threads\n", static_cast<long long>(s.t),
              static_cast<long long>(s.heads), static_cast<long long>(s.k_dim),
              omp_get_max_threads());
  std::printf("  KdaRecurrent %9.2f ms  %10.0f tokens/s\n", rec_ms, s.t / (rec_ms * 1e-3));
  std::printf("  KdaChunk     %9.2f ms  %10.0f tokens/s\n", chunk_ms, s.t / (chunk_ms * 1e-3));
  std::printf("  chunk speed-up x%.2f, rel L2 difference of o %.2g\n", rec_ms / chunk_ms,
              std::sqrt(num / den));
  return 0;
}
