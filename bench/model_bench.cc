// Single-process model benchmark: prefill and decode speed of a model (by
// default a fresh k3-small, or another preset: k3-moe-small for the expert
// kernels) next to limits measured in the same run: the
// GEMM rate (for model-FLOP utilisation) and the memory read bandwidth
// (for decode, which reads every active weight once per step). On the CPU
// those are oneDNN's sgemm and a sum over host memory; with --device cuda
// the model's weights and state are on the GPU, and the limits are
// cuBLASLt's bf16 GEMM (through kernels/cuda/blas.h) and a read kernel's
// rate over device memory (kernels/cuda/read_sum_cuda.cu).
//
//   build/bin/model_bench [--model DIR | --config FILE | --preset NAME] [--experts bf16|mxfp4]
//                         [--prompts 4096,32768] [--decode 32] [--decode-batch 1,32]
//                         [--threads N] [--device cpu|cuda|cuda:N]
// Prints a markdown report for docs/performance.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench/read_bandwidth.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/ops.h"
#include "kernels/gemm.h"
#include "kernels/isa.h"
#include "kernels/sampling.h"
#include "kernels/threads.h"
#include "kernels/workspace.h"
#include "runtime/model/model.h"
#include "runtime/model/presets.h"
#include "runtime/model/random_checkpoint.h"
#include "runtime/model/weight_spec.h"

namespace deltaserve {
namespace {

using bench::Clock;
using bench::ReadBandwidth;
using bench::Seconds;

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

// The CUDA device's limits, each the best of a few runs: the rate of
// cuBLASLt's bf16 x bf16 -> f32 GEMM (the product Linear makes on bf16
// weights with --compute-dtype bf16; kernels/cuda/blas.h) at [n, n] x
// [n, n]ᵀ, and the rate at which ReadSum reads `read_bytes` of device
// memory. On the SIMT harness (one host thread) the shapes are small and the
// figures only show that the path runs.
struct DeviceLimits {
  int64_t gemm_n = 0;
  double gemm_flops = 0;
  int64_t read_bytes = 0;
  double read_bandwidth = 0;
  std::string error;  // what failed, "" when both were measured
};

std::string DeviceError(kernels::Workspace& ws) {
  const kernels::DeviceError e = ws.Synchronize();
  return e.ok() ? std::string() : e.op + ": " + e.message;
}

DeviceLimits MeasureDeviceLimits() {
  using kernels::Device;
  using kernels::DeviceBlock;
  DeviceLimits out;
  const bool sim = kernels::cuda::ActiveBackend() == kernels::cuda::Backend::kSim;
  out.gemm_n = sim ? 128 : 8192;  // 1.1 TFLOP a call on a GPU: ~1 ms at its bf16 peak
  out.read_bytes = sim ? int64_t{16} << 20 : int64_t{4} << 30;  // 4 GiB: ~1 ms at HBM3e rates
  kernels::Workspace& ws = kernels::Workspace::Of(Device::kCuda);
  {
    const int64_t n = out.gemm_n;
    // Random operands: a GPU draws less power (and clocks higher) on zeros.
    std::vector<uint16_t> host(static_cast<size_t>(n * n));
    kernels::Rng rng(2);
    for (uint16_t& v : host) {
      const float f = static_cast<float>(2 * rng.Uniform() - 1);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof(bits));
      v = static_cast<uint16_t>(bits >> 16);
    }
    // Blocks of the device's own, not the workspace's cache, which would keep
    // them from the model's run.
    DeviceBlock a, b, c;
    for (auto [block, bytes] : {std::pair{&a, host.size() * sizeof(uint16_t)},
                                std::pair{&b, host.size() * sizeof(uint16_t)},
                                std::pair{&c, host.size() * sizeof(float)}}) {
      if (std::string e = DeviceBlock::Allocate(Device::kCuda, bytes, block); !e.empty()) {
        out.error = "bf16 GEMM: " + e;
        return out;
      }
    }
    ws.CopyFromHost(a.data(), host.data(), host.size() * sizeof(uint16_t));
    ws.CopyFromHost(b.data(), host.data(), host.size() * sizeof(uint16_t));
    // The row-major y[n, n] = x · wᵀ in cuBLAS's column-major terms (blas.h).
    const auto gemm = [&] {
      return DELTASERVE_CUDA_DISPATCH(Gemm)(true, false, n, n, n, 1.0f,
                                            kernels::cuda::BlasType::kBF16, a.data(), n, b.data(),
                                            n, 0.0f, static_cast<float*>(c.data()), n, ws.stream());
    };
    constexpr int kCalls = 10;            // per timing: a host sync is ~10 us against ~1 ms a call
    for (int rep = 0; rep <= 5; ++rep) {  // the first warms up (cuBLASLt's handle, heuristics)
      const auto t0 = Clock::now();
      for (int i = 0; i < kCalls; ++i) {
        if (std::string e = gemm(); !e.empty()) {
          out.error = "bf16 GEMM: " + e;
          return out;
        }
      }
      if (std::string e = DeviceError(ws); !e.empty()) {
        out.error = "bf16 GEMM: " + e;
        return out;
      }
      const double s = Seconds(t0, Clock::now());
      if (rep > 0) out.gemm_flops = std::max(out.gemm_flops, 2.0 * n * n * n * kCalls / s);
    }
  }
  {
    const int64_t floats = out.read_bytes / static_cast<int64_t>(sizeof(float));
    DeviceBlock x, sum;
    for (auto [block, bytes] :
         {std::pair{&x, static_cast<size_t>(out.read_bytes)}, std::pair{&sum, sizeof(float)}}) {
      if (std::string e = DeviceBlock::Allocate(Device::kCuda, bytes, block); !e.empty()) {
        out.error = "read: " + e;
        return out;
      }
    }
    // Ones, so that the sum checks that every float was read.
    const std::vector<float> ones(static_cast<size_t>(std::min<int64_t>(floats, 1 << 24)), 1.0f);
    for (int64_t at = 0; at < floats; at += static_cast<int64_t>(ones.size())) {
      const int64_t count = std::min<int64_t>(floats - at, static_cast<int64_t>(ones.size()));
      ws.CopyFromHost(static_cast<float*>(x.data()) + at, ones.data(),
                      static_cast<size_t>(count) * sizeof(float));
    }
    constexpr int kReads = 3;
    float total = 0;
    for (int rep = 0; rep <= 5; ++rep) {  // the first warms up
      ws.Zero(sum.data(), sizeof(float));
      if (std::string e = DeviceError(ws); !e.empty()) {
        out.error = "read: " + e;
        return out;
      }
      const auto t0 = Clock::now();
      const auto read_sum = DELTASERVE_CUDA_DISPATCH(ReadSum);
      for (int i = 0; i < kReads; ++i) {
        read_sum(static_cast<const float*>(x.data()), floats, static_cast<float*>(sum.data()),
                 ws.stream());
      }
      if (std::string e = DeviceError(ws); !e.empty()) {
        out.error = "read: " + e;
        return out;
      }
      const double s = Seconds(t0, Clock::now());
      if (rep > 0) {
        out.read_bandwidth = std::max(out.read_bandwidth, 1.0 * out.read_bytes * kReads / s);
      }
    }
    ws.CopyToHost(&total, sum.data(), sizeof(float));
    const double expected = static_cast<double>(floats) * kReads;
    if (std::abs(total - expected) > 1e-3 * expected) {
      out.error = "read: ReadSum summed " + std::to_string(total) + ", expected " +
                  std::to_string(expected);
    }
  }
  return out;
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

// Bytes of weights a decode step of `batch` sequences reads, as the model
// holds them (bf16, MXFP4 experts, float32 vectors): every matrix but the
// embedding (a lookup of one row) once, and the routed experts at the share
// the step's tokens are sent to. Each token picks top_k of E experts; taking
// the routing as uniform, an expert goes untouched by the batch with
// probability (1 - top_k / E)^batch, so one sequence reads top_k / E of them.
double StepWeightBytes(const ModelConfig& c, int64_t batch) {
  const double picked =
      static_cast<double>(c.num_experts_per_token) / static_cast<double>(c.num_experts);
  const double touched =
      batch == 1 ? picked : 1.0 - std::pow(1.0 - picked, static_cast<double>(batch));
  double bytes = 0;
  for (const TensorSpec& spec : ExpectedTensors(c)) {
    if (spec.part == ModelPart::kEmbedding && !c.tie_word_embeddings) continue;
    double b = static_cast<double>(HeldBytes(spec, spec.NumElements()));
    if (spec.name.find(".experts.") != std::string::npos) b *= touched;
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

// --device: the CPU, or the CUDA device it names, selected for this process
// (as the launcher's --device does): "" or why it cannot be used.
std::string SelectDevice(const std::string& value, kernels::Device* device) {
  *device = kernels::Device::kCpu;
  if (value == "cpu") return "";
  if (value != "cuda" && !value.starts_with("cuda:")) {
    return "--device is '" + value + "'; it must be cpu, cuda or cuda:N";
  }
  int ordinal = 0;
  if (value != "cuda") {
    char* end = nullptr;
    const long parsed = std::strtol(value.c_str() + 5, &end, 10);
    if (value.size() == 5 || *end != '\0' || parsed < 0) {
      return "--device is '" + value + "'; N in cuda:N must be a number >= 0";
    }
    ordinal = static_cast<int>(parsed);
  }
  std::string error;
  const int count = kernels::CudaDeviceCount(&error);
  if (count <= 0) return "--device " + value + ": " + error;
  if (ordinal >= count) {
    return "--device " + value + ": this machine has " + std::to_string(count) + " CUDA device(s)";
  }
  if (error = kernels::SelectCudaDevice(ordinal); !error.empty()) {
    return "--device " + value + ": " + error;
  }
  *device = kernels::Device::kCuda;
  return "";
}

// The model of a config file (make-model --config's input): `dir` (by
// default deltaserve_bench_<file's stem>, with _mxfp4 for MXFP4 experts, in
// the temporary directory), holding a random checkpoint of it made with
// seed 1 unless one is there already.
absl::StatusOr<std::string> ConfigCheckpoint(const std::string& path, std::string dir,
                                             ExpertFormat experts) {
  namespace fs = std::filesystem;
  if (dir.empty()) {
    std::string name = "deltaserve_bench_" + fs::path(path).stem().string();
    if (experts == ExpertFormat::kMxfp4) name += "_mxfp4";
    dir = (fs::temp_directory_path() / name).string();
  }
  if (fs::exists(dir + "/model.safetensors")) return dir;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(path + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text.str(), path);
  if (!config.ok()) return config.status();
  absl::Status written = WriteRandomCheckpoint(WithExpertFormat(*config, experts), dir, 1);
  if (!written.ok()) return written;
  return dir;
}

}  // namespace
}  // namespace deltaserve

namespace {

constexpr char kUsage[] =
    "usage: model_bench [--model DIR | --config FILE | --preset NAME] [--experts bf16|mxfp4]\n"
    "                   [--compute-dtype f32|bf16] [--prompts 4096,32768] [--decode 32]\n"
    "                   [--decode-batch 1,32] [--threads N] [--device cpu|cuda|cuda:N]\n"
    "\n"
    "Prefill and decode speed of one process next to the GEMM rate and the memory read\n"
    "bandwidth measured in the same run; prints markdown for docs/performance.md.\n"
    "\n"
    "  --model DIR       the model (default: a k3-small made once in the temp directory)\n"
    "  --config FILE     a model config (as make-model --config takes); its random checkpoint\n"
    "                    is made once in the temp directory, or in --model DIR\n"
    "  --preset NAME     the preset to make (as make-model --preset takes) when no --config:\n"
    "                    k3-small (default) or k3-moe-small (K3's 128 experts, 8 active)\n"
    "  --experts FORMAT  the made model's routed experts: bf16 or mxfp4 (default: bf16)\n"
    "  --compute-dtype D GEMM precision on bf16 weights: f32 or bf16 (default: f32)\n"
    "  --prompts LIST    prompt lengths to prefill (default: 4096,32768)\n"
    "  --decode N        decode steps after each batch's prompts (default: 32)\n"
    "  --decode-batch L  sequences decoded together, each after a 128-token prompt\n"
    "                    (default: 1)\n"
    "  --threads N       compute threads (default: 0, OpenMP's default)\n"
    "  --device D        cpu, or cuda / cuda:N: weights and state on that GPU, limits\n"
    "                    measured there: cuBLASLt's bf16 GEMM and device memory reads\n"
    "                    (default: cpu)\n"
    "  --help            this text\n";

std::vector<int64_t> ParseList(const std::string& value) {
  std::vector<int64_t> list;
  for (size_t p = 0; p < value.size();) {
    size_t q = value.find(',', p);
    if (q == std::string::npos) q = value.size();
    list.push_back(std::stoll(value.substr(p, q - p)));
    p = q + 1;
  }
  return list;
}

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
  std::string model_dir, config_file, preset = "k3-small", device_name = "cpu";
  bool preset_given = false;
  std::vector<int64_t> prompts = {4096, 32768};
  std::vector<int64_t> decode_batches = {1};
  int64_t decode_tokens = 32;
  int threads = 0;
  ExpertFormat experts = ExpertFormat::kBf16;
  ModelOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") {
      model_dir = value;
    } else if (flag == "--config") {
      config_file = value;
    } else if (flag == "--preset") {
      preset = value;
      preset_given = true;
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
      prompts = ParseList(value);
    } else if (flag == "--decode") {
      decode_tokens = std::stoll(value);
    } else if (flag == "--decode-batch") {
      decode_batches = ParseList(value);
    } else if (flag == "--threads") {
      threads = std::stoi(value);
    } else if (flag == "--device") {
      device_name = value;
    } else {
      std::fprintf(stderr, "model_bench: unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  if (preset_given && !config_file.empty()) {
    std::fprintf(stderr, "model_bench: give one of --config, --preset\n");
    return 2;
  }
  if (const std::vector<std::string> names = PresetNames();
      std::find(names.begin(), names.end(), preset) == names.end()) {
    std::string known;
    for (const std::string& name : names) known += (known.empty() ? "" : ", ") + name;
    std::fprintf(stderr, "model_bench: --preset %s: not a preset a checkpoint is made of (%s)\n",
                 preset.c_str(), known.c_str());
    return 2;
  }
  for (int64_t b : decode_batches) {
    if (b < 1) {
      std::fprintf(stderr, "model_bench: --decode-batch entries must be >= 1\n");
      return 2;
    }
  }
  kernels::SetNumThreads(threads);
  if (std::string error = SelectDevice(device_name, &options.device); !error.empty()) {
    std::fprintf(stderr, "model_bench: %s\n", error.c_str());
    return 1;
  }
  const bool cuda = options.device == kernels::Device::kCuda;
  if (cuda) {
    // Device memory is allocated whole at load (docs/deployment.md, "GPUs"):
    // a cache for the longest prompt or every decode batch's sequences, in
    // pages of 64 tokens, and a state slot for each sequence alive at once.
    const int64_t max_batch = *std::max_element(decode_batches.begin(), decode_batches.end());
    const int64_t max_prompt =
        prompts.empty() ? 0 : *std::max_element(prompts.begin(), prompts.end());
    const int64_t per_sequence = ((128 + decode_tokens + 63) / 64 + 1) * 64;
    options.cache_tokens = std::max(max_prompt + 128, max_batch * per_sequence) + 1024;
    options.state_slots = std::max<int64_t>(max_batch, 2) + 2;
  }
  auto dir = config_file.empty() ? BenchCheckpoint(preset, model_dir, experts)
                                 : ConfigCheckpoint(config_file, model_dir, experts);
  if (!dir.ok()) {
    std::fprintf(stderr, "make %s: %s\n",
                 config_file.empty() ? preset.c_str() : config_file.c_str(),
                 std::string(dir.status().message()).c_str());
    return 1;
  }
  model_dir = *dir;
  auto model = Model::Load(model_dir, {}, nullptr, options);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const ModelConfig& config = (*model)->config();
  const double active = ActiveMatmulParams(config);

  double gemm_limit = 0, bandwidth = 0;
  std::string mfu_against;
  if (cuda) {
    const DeviceLimits limits = MeasureDeviceLimits();
    if (!limits.error.empty()) {
      std::fprintf(stderr, "model_bench: measuring the device's limits: %s\n",
                   limits.error.c_str());
      return 1;
    }
    gemm_limit = limits.gemm_flops;
    bandwidth = limits.read_bandwidth;
    mfu_against = "bf16 GEMM";
    const kernels::cuda::Backend backend = kernels::cuda::ActiveBackend();
    std::printf("## model_bench: %s, device cuda:%d (%s), compute %s\n\n", model_dir.c_str(),
                kernels::SelectedCudaDevice(), kernels::cuda::BackendName(backend),
                options.compute_dtype == kernels::DType::kBF16
                    ? "bf16 (cuBLASLt bf16 x bf16 -> f32)"
                    : "f32 (bf16 weights widened to f32, cuBLASLt f32)");
    std::printf("- active matmul parameters per token: %.1f M\n", active / 1e6);
    std::printf(
        "- bf16 GEMM (cuBLASLt, bf16 x bf16 -> f32) [%lld x %lld] x [%lld x %lld]: "
        "%.1f GFLOP/s\n",
        static_cast<long long>(limits.gemm_n), static_cast<long long>(limits.gemm_n),
        static_cast<long long>(limits.gemm_n), static_cast<long long>(limits.gemm_n),
        gemm_limit / 1e9);
    std::printf("- device memory read bandwidth (ReadSum over %lld MiB): %.1f GB/s\n",
                static_cast<long long>(limits.read_bytes >> 20), bandwidth / 1e9);
    if (backend == kernels::cuda::Backend::kSim) {
      std::printf(
          "- the SIMT harness (one host thread, small shapes): these figures only "
          "show that the path runs\n");
    }
    std::printf("\n");
  } else {
    const double sgemm = LinearFlops(4096, 1024, 1024, kernels::DType::kF32);
    const double bf16_gemm = LinearFlops(4096, 1024, 1024, kernels::DType::kBF16);
    const bool bf16_compute =
        options.compute_dtype == kernels::DType::kBF16 && kernels::Bf16ComputeAvailable();
    const double bf16_matmul =
        bf16_compute ? LinearFlops(4096, 1024, 1024, kernels::DType::kBF16, kernels::DType::kBF16)
                     : 0.0;
    // Model-FLOP utilisation is against the GEMM rate of the precision in use.
    gemm_limit = bf16_compute ? bf16_matmul : sgemm;
    mfu_against = bf16_compute ? "bf16 matmul" : "sgemm";
    bandwidth = ReadBandwidth();
    const double bandwidth_small_pages = ReadBandwidth(/*huge_pages=*/false);
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
    // The weights are on transparent huge pages where the kernel has them
    // (PlaceWeights), and so is the sum the decode rates are held against.
    std::printf(
        "- memory read bandwidth: %.1f GB/s on transparent huge pages (%s), %.1f GB/s on 4 KiB "
        "pages\n\n",
        bandwidth / 1e9, kernels::TransparentHugePages() ? "on" : "off: 4 KiB pages too",
        bandwidth_small_pages / 1e9);
  }

  kernels::Rng rng(1);
  if (cuda && !prompts.empty()) {
    // The first forward pass on a device loads cuBLASLt and grows the
    // workspace's cache; neither belongs in a prefill's time.
    std::vector<int32_t> warm(static_cast<size_t>(std::min<int64_t>(prompts[0], 4096)), 7);
    auto state = (*model)->NewSequence();
    auto logits = state.ok() ? Forward(**model, **state, warm)
                             : absl::StatusOr<std::vector<float>>(state.status());
    if (!logits.ok()) {
      std::fprintf(stderr, "warm-up: %s\n", std::string(logits.status().message()).c_str());
      return 1;
    }
  }
  std::printf("| prompt tokens | prefill s | tokens/s | model GFLOP/s | MFU (vs %s) |\n",
              mfu_against.c_str());
  std::printf("|---|---|---|---|---|\n");
  for (int64_t T : prompts) {
    std::vector<int32_t> tokens(T);
    for (auto& t : tokens) t = static_cast<int32_t>(rng.Next() % config.vocab_size);
    auto state = (*model)->NewSequence();
    if (!state.ok()) {
      std::fprintf(stderr, "%s\n", std::string(state.status().message()).c_str());
      return 1;
    }
    const auto t0 = Clock::now();
    auto logits = Forward(**model, **state, tokens);
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

  // Decode after a short prompt per sequence: each step reads every active
  // weight once, whatever the batch. Each sequence has a prompt of its own
  // (random tokens), so that the sequences of a batch go their own ways
  // through the routed experts, as StepWeightBytes assumes; with one prompt
  // for all, greedy decoding kept them identical and a batch read the experts
  // of one sequence.
  std::printf("\n| decode | tokens/s | weight bytes/token | achieved GB/s | of read bandwidth |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int64_t batch : decode_batches) {
    std::vector<std::unique_ptr<SequenceState>> states;
    for (int64_t b = 0; b < batch; ++b) {
      auto state = (*model)->NewSequence();
      if (!state.ok()) {
        std::fprintf(stderr, "%s\n", std::string(state.status().message()).c_str());
        return 1;
      }
      states.push_back(std::move(*state));
    }
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch),
                                              std::vector<int32_t>(128));
    for (auto& prompt : prompts) {
      for (auto& t : prompt) t = static_cast<int32_t>(rng.Next() % config.vocab_size);
    }
    std::vector<ForwardInput> inputs;
    for (int64_t b = 0; b < batch; ++b) inputs.push_back({states[b].get(), prompts[b], false});
    auto logits = (*model)->Forward(inputs);
    std::vector<int32_t> next(static_cast<size_t>(batch), 1);
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < decode_tokens && logits.ok(); ++i) {
      for (int64_t b = 0; b < batch; ++b) inputs[b].tokens = std::span(&next[b], 1);
      logits = (*model)->Forward(inputs);
      if (!logits.ok()) break;
      for (int64_t b = 0; b < batch; ++b) {
        next[b] = kernels::Sample(
            kernels::Tensor::F32(logits->data() + b * config.vocab_size, 1, config.vocab_size), {},
            rng);
      }
    }
    const double s = Seconds(t0, Clock::now());
    if (!logits.ok()) {
      std::fprintf(stderr, "%s\n", std::string(logits.status().message()).c_str());
      return 1;
    }
    const double step_bytes = StepWeightBytes(config, batch);
    const double steps_per_s = decode_tokens / s;
    const std::string what = batch == 1
                                 ? std::to_string(decode_tokens) + " steps after 128 tokens"
                                 : std::to_string(decode_tokens) + " steps of " +
                                       std::to_string(batch) + " sequences after 128 tokens each";
    std::printf("| %s | %.1f | %.0f MB | %.1f | %.1f%% |\n", what.c_str(), batch * steps_per_s,
                step_bytes / batch / 1e6, step_bytes * steps_per_s / 1e9,
                100 * step_bytes * steps_per_s / bandwidth);
    std::fflush(stdout);
  }
  return 0;
}
