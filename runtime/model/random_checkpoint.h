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
// and `model.safetensors` holding every ExpectedTensors(config) entry with
// its stored dtype. The config is validated first (by reading its JSON back);
// an invalid one is an error and nothing is written. Holds the model's
// weights in memory once, in their stored dtype.
absl::Status WriteRandomCheckpoint(const ModelConfig& config, const std::string& dir,
                                   uint64_t seed);

// The benchmarks' model: `dir` (by default deltaserve_bench_<preset> in the
// temporary directory, with '-' as '_'), holding a random checkpoint of
// `preset` made with seed 1 unless one is there already. Returns the dir.
absl::StatusOr<std::string> BenchCheckpoint(const std::string& preset, std::string dir = "");

}  // namespace deltaserve
