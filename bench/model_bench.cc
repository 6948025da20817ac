// Single-process model benchmark: prefill and decode speed of a model (by
// default a fresh k3-small) next to limits measured in the same run: the
// sgemm rate (for model-FLOP utilisation) and the memory bandwidth
// (for decode, which reads every active weight once per token).
//
//   build/bin/model_bench [--model DIR] [--experts bf16|mxfp4] [--prompts 4096,32768]
//                         [--decode 32] [--threads N]
// Prints a markdown report for docs/performance.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/isa.h"
#include "kernels/sampling.h"
#include "kernels/threads.h"
#include "runtime/model/model.h"
#include "runtime/model/random_checkpoint.h"
#include "runtime/model/weight_spec.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best-of-3 FLOP/s of y[m,n] = x[m,k]·w[n,k]ᵀ, the call the model makes for
// its projections, with float32 weights (oneDNN's sgemm as it is) or bf16
// weights (widened a panel at a time, then the same sgemm).
double LinearFlops(int64_t m, int64_t n, int64_t k, kernels::DType dtype,
                   kernels::DType compute = kernels::DType::kF32) {
  std::vector<float> x(m * k, 0.5f), w(n * k, 0.25f), y(m * n);
  std::vector<uint16_t> w16(n * k, 0x3e80);  // 0.25 in bf16
  kernels::Tensor t = dtype == kernels::DType::kBF16
                          ? kernels::Tensor{w16.data(), nullptr, dtype, kernels::Device::kCpu, n, k}
                          : kernels::Tensor::F32(w.data(), n, k);
  t.compute = compute;
  const kernels::Tensor xv = kernels::Tensor::F32(x.data(), m, k);
  const kernels::MutableTensor yv = kernels::MutableTensor::F32(y.data(), m, n);
  kernels::Linear(xv, t, yv);  // warm-up
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    kernels::Linear(xv, t, yv);
    best = std::max(best, 2.0 * m * n * k / Seconds(t0, Clock::now()));
  }
  return best;
}

// Best-of-5 read bandwidth: a sum over an array far larger than the caches.
double ReadBandwidth() {
  const size_t n = size_t{1} << 27;  // 512 MiB of floats
  std::vector<float> a(n, 1.0f);
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp parallel for reduction(+ : s0, s1, s2, s3)
    for (size_t i = 0; i < n; i += 4) {
      s0 += a[i];
      s1 += a[i + 1];
      s2 += a[i + 2];
      s3 += a[i + 3];
    }
    sink = s0 + s1 + s2 + s3;
    best = std::max(best, n * sizeof(float) / Seconds(t0, Clock::now()));
  }
  (void)sink;
  return best;
}

// Weights each token multiplies by: the parameters one token reads
// (weight_spec's count, routed experts at the share it is sent to) less the
// embedding, which is a lookup.
double ActiveMatmulParams(const ModelConfig& c) {
  const double embedding =
      c.tie_word_embeddings ? 0.0 : static_cast<double>(c.vocab_size) * c.hidden_size;
  return static_cast<double>(CountParameters(c).active_per_token) - embedding;
}

// Model FLOPs of a one-shot prefill of T tokens: 2 per active weight per
// token, causal MLA attention (q·k over P+R, p·v over Vd, average T/2 keys),
// and the KDA state update (decay, read, write, output: ~8·K·V per head).
// The model's own forward pass over new tokens of one sequence: the logits of
// the last one.
absl::StatusOr<std::vector<float>> Forward(const Model& model, SequenceState& state,
                                           const std::vector<int32_t>& tokens) {
  const ForwardInput input{&state, tokens, false};
  return model.Forward(std::span(&input, 1));
}

// Bytes of weights each decode token reads, as the model holds them (bf16,
// MXFP4 experts, float32 vectors): every matrix but the embedding (a lookup
// of one row), the routed experts at the share a token is sent to.
double ActiveWeightBytes(const ModelConfig& c) {
  double bytes = 0;
  for (const TensorSpec& spec : ExpectedTensors(c)) {
    if (spec.part == ModelPart::kEmbedding && !c.tie_word_embeddings) continue;
    double b = static_cast<double>(HeldBytes(spec, spec.NumElements()));
    if (spec.name.find(".experts.") != std::string::npos) {
      b *= static_cast<double>(c.num_experts_per_token) / static_cast<double>(c.num_experts);
    }
    bytes += b;
  }
  return bytes;
}

double PrefillFlops(const ModelConfig& c, double T) {
  double flops = 2 * ActiveMatmulParams(c) * T;
  int64_t mla = 0, kda = 0;
  for (LayerKind k : c.layer_kinds) (k == LayerKind::kMla ? mla : kda)++;
  const double per_key =
      2.0 * c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim);
  flops += mla * per_key * T * (T + 1) / 2;
  flops += kda * 8.0 * c.kda.num_heads * c.kda.head_dim * c.kda.head_dim * T;
  return flops;
}

}  // namespace
}  // namespace deltaserve

namespace {

constexpr char kUsage[] =
    "usage: model_bench [--model DIR] [--experts bf16|mxfp4] [--compute-dtype f32|bf16]\n"
    "                   [--prompts 4096,32768] [--decode 32] [--threads N]\n"
    "\n"
    "Prefill and decode speed of one process next to the sgemm rate and the memory bandwidth\n"
    "measured in the same run; prints markdown for docs/performance.md.\n"
    "\n"
    "  --model DIR       the model (default: a k3-small made once in the temp directory)\n"
    "  --experts FORMAT  the default model's routed experts: bf16 or mxfp4 (default: bf16)\n"
    "  --compute-dtype D GEMM precision on bf16 weights: f32 or bf16 (default: f32)\n"
    "  --prompts LIST    prompt lengths to prefill (default: 4096,32768)\n"
    "  --decode N        tokens decoded after each prompt (default: 32)\n"
    "  --threads N       compute threads (default: 0, OpenMP's default)\n"
    "  --help            this text\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace deltaserve;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "model_bench: flag %s needs a value\n%s", argv[argc - 1], kUsage);
    return 2;
  }
  std::string model_dir;
  std::vector<int64_t> prompts = {4096, 32768};
  int64_t decode_tokens = 32;
  int threads = 0;
  ExpertFormat experts = ExpertFormat::kBf16;
  ModelOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") {
      model_dir = value;
    } else if (flag == "--compute-dtype" && (value == "f32" || value == "bf16")) {
      options.compute_dtype = value == "bf16" ? kernels::DType::kBF16 : kernels::DType::kF32;
    } else if (flag == "--experts") {
      auto parsed = ParseExpertFormat(value);
      if (!parsed.ok()) {
        std::fprintf(stderr, "model_bench: %s\n", std::string(parsed.status().message()).c_str());
        return 2;
      }
      experts = *parsed;
    } else if (flag == "--prompts") {
      prompts.clear();
      for (size_t p = 0; p < value.size();) {
        size_t q = value.find(',', p);
        if (q == std::string::npos) q = value.size();
        prompts.push_back(std::stoll(value.substr(p, q - p)));
        p = q + 1;
      }
    } else if (flag == "--decode") {
      decode_tokens = std::stoll(value);
    } else if (flag == "--threads") {
      threads = std::stoi(value);
    } else {
      std::fprintf(stderr, "model_bench: unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  kernels::SetNumThreads(threads);
  if (auto dir = BenchCheckpoint("k3-small", model_dir, experts); dir.ok()) {
    model_dir = *dir;
  } else {
    std::fprintf(stderr, "make k3-small: %s\n", std::string(dir.status().message()).c_str());
    return 1;
  }
  auto model = Model::Load(model_dir, {}, nullptr, options);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const ModelConfig& config = (*model)->config();
  const double active = ActiveMatmulParams(config);

  const double sgemm = LinearFlops(4096, 1024, 1024, kernels::DType::kF32);
  const double bf16_gemm = LinearFlops(4096, 1024, 1024, kernels::DType::kBF16);
  const bool bf16_compute =
      options.compute_dtype == kernels::DType::kBF16 && kernels::Bf16ComputeAvailable();
  const double bf16_matmul =
      bf16_compute ? LinearFlops(4096, 1024, 1024, kernels::DType::kBF16, kernels::DType::kBF16)
                   : 0.0;
  // Model-FLOP utilisation is against the GEMM rate of the precision in use.
  const double gemm_limit = bf16_compute ? bf16_matmul : sgemm;
  const double bandwidth = ReadBandwidth();
  std::printf("## model_bench: %s, %d threads, CPU level %s, compute %s\n\n", model_dir.c_str(),
              kernels::NumThreads(), kernels::IsaName(kernels::ActiveIsa()),
              options.compute_dtype == kernels::DType::kBF16
                  ? (kernels::Bf16ComputeAvailable() ? "bf16 (oneDNN bf16 matmul)"
                                                     : "bf16 requested, float32 (no bf16 matmul)")
                  : "f32");
  std::printf("- active matmul parameters per token: %.1f M\n", active / 1e6);
  std::printf("- sgemm (oneDNN, float32 weights) [4096 x 1024] x [1024 x 1024]: %.1f GFLOP/s\n",
              sgemm / 1e9);
  std::printf("- the same product on bf16 weights (widened panels, then sgemm): %.1f GFLOP/s\n",
              bf16_gemm / 1e9);
  if (bf16_compute) {
    std::printf("- bf16 compute (oneDNN bf16 matmul, activations rounded): %.1f GFLOP/s\n",
                bf16_matmul / 1e9);
  }
  std::printf("- memory read bandwidth: %.1f GB/s\n\n", bandwidth / 1e9);

  std::printf("| prompt tokens | prefill s | tokens/s | model GFLOP/s | MFU (vs %s) |\n",
              bf16_compute ? "bf16 matmul" : "sgemm");
  std::printf("|---|---|---|---|---|\n");
  kernels::Rng rng(1);
  for (int64_t T : prompts) {
    std::vector<int32_t> tokens(T);
    for (auto& t : tokens) t = static_cast<int32_t>(rng.Next() % config.vocab_size);
    auto state = (*model)->NewSequence().value();
    const auto t0 = Clock::now();
    auto logits = Forward(**model, *state, tokens);
    const double s = Seconds(t0, Clock::now());
    if (!logits.ok()) {
      std::fprintf(stderr, "%s\n", std::string(logits.status().message()).c_str());
      return 1;
    }
    const double flops = PrefillFlops(config, static_cast<double>(T)) / s;
    std::printf("| %lld | %.2f | %.0f | %.1f | %.1f%% |\n", static_cast<long long>(T), s, T / s,
                flops / 1e9, 100 * flops / gemm_limit);
    std::fflush(stdout);
  }

  // Decode after a short prompt: each step reads every active weight once.
  auto state = (*model)->NewSequence().value();
  std::vector<int32_t> prompt(128, 7);
  auto logits = Forward(**model, *state, prompt);
  int32_t token = 1;
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < decode_tokens; ++i) {
    logits = Forward(**model, *state, {token});
    token = kernels::Sample(kernels::Tensor::F32(logits->data(), 1, config.vocab_size), {}, rng);
  }
  const double s = Seconds(t0, Clock::now());
  const double bytes_per_token = ActiveWeightBytes(config);
  std::printf("\n| decode | tokens/s | weight bytes/token | achieved GB/s | of read bandwidth |\n");
  std::printf("|---|---|---|---|---|\n");
  std::printf("| %lld steps after 128 tokens | %.1f | %.0f MB | %.1f | %.1f%% |\n",
              static_cast<long long>(decode_tokens), decode_tokens / s, bytes_per_token / 1e6,
              bytes_per_token * decode_tokens / s / 1e9,
              100 * bytes_per_token * decode_tokens / s / bandwidth);
  return 0;
}
