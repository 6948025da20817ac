#include "runtime/model/random_checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/mxfp4.h"
#include "runtime/common/file_util.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/presets.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_spec.h"

namespace deltaserve {
namespace {

// splitmix64: tiny, fast, and identical on every platform (the std
// distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // [0, 1)
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform with mean 0 and standard deviation `std`.
  double Centered(double std) {
    const double a = std * std::sqrt(3.0);
    return Uniform(-a, a);
  }
  // Standard normal (Box-Muller; one of the pair is dropped for simplicity).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]: log stays finite
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  uint64_t state_;
};

uint64_t HashName(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

// What a tensor holds, from its name (MODEL.md's roles).
enum class Init {
  kEmbedding,   // std 1, like a trained embedding's scale
  kNorm,        // RMSNorm gains: 1 + small noise
  kLinear,      // std 1/sqrt(fan_in): unit-scale outputs for unit inputs
  kResProj,     // attention-residual query: mix scores of order 1
  kConv,        // short convolution taps: std 1/sqrt(width)
  kALog,        // log(U(1, 16)) per head, zero padding
  kDtBias,      // decay-gate bias
  kRouterBias,  // expert-selection bias: small
};

Init InitFor(const std::string& name) {
  if (absl::EndsWith(name, "embed_tokens.weight")) return Init::kEmbedding;
  if (absl::EndsWith(name, ".A_log")) return Init::kALog;
  if (absl::EndsWith(name, ".dt_bias")) return Init::kDtBias;
  if (absl::EndsWith(name, "e_score_correction_bias")) return Init::kRouterBias;
  if (absl::EndsWith(name, "_conv1d.weight")) return Init::kConv;
  if (absl::EndsWith(name, "_res_proj.weight")) return Init::kResProj;
  if (absl::EndsWith(name, "norm.weight")) return Init::kNorm;  // *layernorm, *_norm
  return Init::kLinear;
}

std::vector<float> RandomValues(const ModelConfig& c, const TensorSpec& spec, uint64_t seed) {
  Rng rng(seed ^ HashName(spec.name));
  rng.Next();  // decorrelate nearby seeds before the first value
  const size_t n = static_cast<size_t>(spec.NumElements());
  std::vector<float> v(n);
  const Init init = InitFor(spec.name);
  switch (init) {
    case Init::kEmbedding:
      for (float& x : v) x = static_cast<float>(rng.Normal());
      break;
    case Init::kNorm:
      for (float& x : v) x = static_cast<float>(1.0 + rng.Centered(0.1));
      break;
    case Init::kLinear: {
      const double fan_in = static_cast<double>(spec.shape.back());
      for (float& x : v) x = static_cast<float>(rng.Centered(1.0 / std::sqrt(fan_in)));
      break;
    }
    case Init::kResProj: {
      const double dim = static_cast<double>(spec.shape.back());
      for (float& x : v) x = static_cast<float>(rng.Centered(1.0 / std::sqrt(dim)));
      break;
    }
    case Init::kConv: {
      const double width = static_cast<double>(spec.shape.back());
      for (float& x : v) x = static_cast<float>(rng.Centered(1.0 / std::sqrt(width)));
      break;
    }
    case Init::kALog:
      // Decay rates exp(A_log) in [1, 16]; K3's padding stays zero.
      for (size_t i = 0; i < n; ++i) {
        v[i] = static_cast<int64_t>(i) < c.kda.num_heads
                   ? static_cast<float>(std::log(rng.Uniform(1.0, 16.0)))
                   : 0.0f;
      }
      break;
    case Init::kDtBias:
      if (c.kda.has_lower_bound) {
        // K3: g = lb * sigmoid(exp(A_log) * graw); a small bias keeps the
        // gate's operating point near the middle of the sigmoid.
        for (float& x : v) x = static_cast<float>(rng.Centered(0.3));
      } else {
        // Kimi Linear: g = -exp(A_log) * softplus(graw). A bias near 0
        // would decay the state by up to e^-11 per token; instead the usual
        // Mamba init: softplus(dt_bias) = dt, dt log-uniform in
        // [1e-3, 1e-1], so states live for tens to thousands of tokens.
        for (float& x : v) {
          const double dt = std::exp(rng.Uniform(std::log(1e-3), std::log(1e-1)));
          x = static_cast<float>(dt + std::log(-std::expm1(-dt)));  // softplus^-1
        }
      }
      break;
    case Init::kRouterBias:
      for (float& x : v) x = static_cast<float>(rng.Centered(0.05));
      break;
  }
  return v;
}

// The E2M1 magnitudes, by code (kernels/mxfp4.h).
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// MXFP4 of values [rows, cols], cols a multiple of 32: each group of 32 gets
// the smallest power-of-two scale that brings its largest magnitude within
// E2M1's 6 (none saturates), and each value the nearest code.
void QuantizeMxfp4(const std::vector<float>& values, int64_t rows, int64_t cols,
                   std::vector<uint8_t>* packed, std::vector<uint8_t>* scales) {
  constexpr int64_t G = kernels::kMxfp4Group;
  packed->assign(static_cast<size_t>(rows * cols / 2), 0);
  scales->assign(static_cast<size_t>(rows * cols / G), 0);
  for (int64_t group = 0; group < rows * cols / G; ++group) {
    const float* x = values.data() + group * G;
    float amax = 0;
    for (int64_t i = 0; i < G; ++i) amax = std::max(amax, std::abs(x[i]));
    // 2^e >= amax / 6, e as small as that allows; E8M0 holds e in -127..127.
    int exponent = 0;
    if (amax > 0) {
      const double mantissa = std::frexp(amax / 6.0, &exponent);  // in [0.5, 1)
      if (mantissa == 0.5) --exponent;                            // a power of two
    }
    exponent = std::clamp(exponent, -127, 127);
    (*scales)[static_cast<size_t>(group)] = static_cast<uint8_t>(exponent + 127);
    const double scale = std::ldexp(1.0, exponent);
    for (int64_t i = 0; i < G; ++i) {
      const double magnitude = std::abs(x[i]) / scale;
      uint8_t code = 0;
      for (uint8_t c = 1; c < 8; ++c) {
        if (std::abs(magnitude - kE2m1[c]) < std::abs(magnitude - kE2m1[code])) code = c;
      }
      if (x[i] < 0 && code != 0) code |= 8;  // sign bit
      const int64_t at = group * G + i;      // row-major, so also the column's place
      (*packed)[static_cast<size_t>(at / 2)] |=
          static_cast<uint8_t>(at % 2 == 0 ? code : code << 4);
    }
  }
}

// An MXFP4 expert needs rows of whole groups; the error names the config key
// that sets the row width.
absl::Status CheckMxfp4Shape(const ModelConfig& c, const TensorSpec& spec) {
  const int64_t in = spec.shape.back();
  if (in % kernels::kMxfp4Group == 0) return absl::OkStatus();
  const char* key = absl::EndsWith(spec.name, ".w2.weight") ? "moe_intermediate_size"
                    : c.routed_expert_hidden_size > 0       ? "routed_expert_hidden_size"
                                                            : "hidden_size";
  return absl::InvalidArgumentError(
      absl::StrCat("routed expert '", spec.name, "' cannot be MXFP4: its rows of ", in,
                   " values do not split into groups of ", kernels::kMxfp4Group, " (", key, " is ",
                   in, "; MXFP4 needs a multiple of ", kernels::kMxfp4Group, ")"));
}

}  // namespace

absl::StatusOr<ExpertFormat> ParseExpertFormat(const std::string& name) {
  if (name == "bf16") return ExpertFormat::kBf16;
  if (name == "mxfp4") return ExpertFormat::kMxfp4;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown expert format '", name, "' (expected bf16 or mxfp4)"));
}

const char* ExpertFormatName(ExpertFormat format) {
  return format == ExpertFormat::kMxfp4 ? "mxfp4" : "bf16";
}

ModelConfig WithExpertFormat(ModelConfig config, ExpertFormat format) {
  if (format == ExpertFormat::kBf16) {
    config.quantization = QuantizationConfig{};
  } else if (!config.quantization.mxfp4) {
    config.quantization = RoutedExpertsMxfp4();
  }
  return config;
}

absl::Status WriteRandomCheckpoint(const ModelConfig& config, const std::string& dir,
                                   uint64_t seed) {
  namespace fs = std::filesystem;
  const std::string config_text = ModelConfigToJson(config);
  const std::string config_path = (fs::path(dir) / "config.json").string();
  // Reading the JSON back checks everything ParseModelConfig checks.
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig checked,
                              ParseModelConfig(config_text, config_path + " (to be written)"));
  const std::vector<TensorSpec> specs = ExpectedTensors(checked);
  for (const TensorSpec& spec : specs) {
    if (spec.stored == Storage::kMxfp4) DELTASERVE_RETURN_IF_ERROR(CheckMxfp4Shape(checked, spec));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": cannot create directory: ", ec.message()));
  }
  // Each tensor draws from its own stream, so they are made in parallel (a
  // K3-width model's billions of values take minutes on one core) and come
  // out the same whatever the threads; written in the specs' order.
  std::vector<std::vector<TensorData>> made(specs.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < static_cast<int64_t>(specs.size()); ++i) {
    const TensorSpec& spec = specs[static_cast<size_t>(i)];
    std::vector<TensorData>& out_tensors = made[static_cast<size_t>(i)];
    // Drawn from the stream of the tensor's name: an MXFP4 expert is its bf16
    // twin quantised.
    const std::vector<float> values = RandomValues(checked, spec, seed);
    // Converted tensor by tensor: only the stored bytes of the whole model
    // (and a float32 tensor per thread) are ever held at once.
    if (spec.stored == Storage::kMxfp4) {
      const int64_t out = spec.shape[0], in = spec.shape[1];
      TensorData packed{spec.PackedName(), DType::kU8, {out, in / 2}, {}};
      TensorData scale{spec.ScaleName(), DType::kU8, {out, in / kernels::kMxfp4Group}, {}};
      QuantizeMxfp4(values, out, in, &packed.bytes, &scale.bytes);
      out_tensors.push_back(std::move(packed));
      out_tensors.push_back(std::move(scale));
    } else if (spec.dtype == DType::kF32) {
      out_tensors.push_back(MakeF32Tensor(spec.name, spec.shape, values));
    } else {
      out_tensors.push_back(MakeBF16Tensor(spec.name, spec.shape, values));
    }
  }
  std::vector<TensorData> tensors;
  for (std::vector<TensorData>& group : made) {
    for (TensorData& tensor : group) tensors.push_back(std::move(tensor));
  }
  DELTASERVE_RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / "model.safetensors").string(),
                                              tensors, {{"format", "pt"}}));
  return WriteFileAtomically(config_path, [&](std::ostream& out) { out << config_text; });
}

absl::StatusOr<std::string> BenchCheckpoint(const std::string& preset, std::string dir,
                                            ExpertFormat experts) {
  if (dir.empty()) {
    std::string name = "deltaserve_bench_" + preset;
    if (experts == ExpertFormat::kMxfp4) name += "_mxfp4";
    std::replace(name.begin(), name.end(), '-', '_');
    dir = (std::filesystem::temp_directory_path() / name).string();
  }
  if (std::filesystem::exists(dir + "/model.safetensors")) return dir;
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(preset));
  DELTASERVE_RETURN_IF_ERROR(WriteRandomCheckpoint(WithExpertFormat(config, experts), dir, 1));
  return dir;
}

}  // namespace deltaserve
