// Times the two KDA forms at the k3-small prefill shape (T = 8192, H = HV = 8,
// K = V = 128): KdaChunk (prefill) against KdaRecurrent (token by token).
// Usage: kda_bench [threads] [tokens]. Prints ms per call, the speed-up and
// tokens/s, and how far the two outputs are apart.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "bench/int_args.h"
#include "kernels/kda.h"
#include "kernels/threads.h"

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  constexpr char kUsage[] =
      "usage: kda_bench [THREADS] [TOKENS]\n"
      "\n"
      "Times KdaChunk (prefill) against KdaRecurrent (token by token) at the k3-small shape\n"
      "(H = 8, K = V = 128): ms per call, speed-up, tokens/s, and how far the outputs differ.\n"
      "\n"
      "  THREADS   compute threads (default: 0, OpenMP's default)\n"
      "  TOKENS    prompt tokens (default: 8192)\n";
  std::vector<int64_t> args = {0, 8192};  // THREADS, TOKENS
  if (auto exit_code = deltaserve::bench::ParseIntArgs(argc, argv, kUsage, &args)) {
    return *exit_code;
  }
  const int threads = static_cast<int>(args[0]);
  const int64_t tokens = args[1];
  deltaserve::kernels::SetNumThreads(threads);
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
