// Random checkpoints in the real layouts, for tests and benchmarks when no
// trained weights are at hand (`make-model`). The values give a numerically
// sane model (unit-scale activations through every layer, decays in a useful
// range), not a useful one. Deterministic from the seed: each tensor draws
// from its own stream keyed by seed and tensor name, so the values of a tensor
// do not depend on which other tensors the model has.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/config.h"

namespace deltaserve {

// Creates `dir` (and parents) and writes `config.json` (ModelConfigToJson)
// and `model.safetensors` holding every ExpectedTensors(config) entry in its
// stored form: dtype, and for the routed experts its quantization_config
// targets the MXFP4 pair (`.weight_packed`, `.weight_scale`, as real K3
// checkpoints store them), which is the bf16 initialisation quantised, so of
// the same magnitude. The config is validated first (by reading its JSON
// back; an MXFP4 expert also needs rows of a multiple of 32 values); an
// invalid one is an error and nothing is written. Holds the model's weights
// in memory once, in their stored form; the tensors are made in parallel
// (OpenMP), the same bytes whatever the threads.
absl::Status WriteRandomCheckpoint(const ModelConfig& config, const std::string& dir,
                                   uint64_t seed);

// How a random checkpoint stores its routed experts (make-model --experts).
enum class ExpertFormat {
  kBf16,   // like the other matrices
  kMxfp4,  // MXFP4, as real K3 checkpoints publish them
};
// "bf16" / "mxfp4", and back.
absl::StatusOr<ExpertFormat> ParseExpertFormat(const std::string& name);
const char* ExpertFormatName(ExpertFormat format);
// `config` set to store its routed experts as `format`: kBf16 drops any
// quantization_config; kMxfp4 keeps the config's own, else sets the real
// K3's (RoutedExpertsMxfp4).
ModelConfig WithExpertFormat(ModelConfig config, ExpertFormat format);

// The benchmarks' model: `dir` (by default deltaserve_bench_<preset>, with
// `_mxfp4` for MXFP4 experts, in the temporary directory, with '-' as '_'),
// holding a random checkpoint of `preset` with its routed experts as
// `experts`, made with seed 1 unless one is there already. Returns the dir.
absl::StatusOr<std::string> BenchCheckpoint(const std::string& preset, std::string dir = "",
                                            ExpertFormat experts = ExpertFormat::kBf16);

}  // namespace deltaserve
