// Named model configurations for tests, benchmarks and `make-model`: the two
// tiny golden architectures (identical to ../shared/golden/model/*/config.json)
// k3-small, a K3-shaped model of 111M parameters for benchmarks, and
// k3-moe-small, K3's many-expert mixture (128 experts, 8 active) at 854M
// parameters, for benchmarks of the expert kernels; and, for `plan` only, k3:
// the real Kimi K3 (2.78T parameters, routed experts MXFP4).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/config.h"

namespace deltaserve {

// "k3-tiny", "kimi-linear-tiny", "k3-small", "k3-moe-small", "k3"; anything else is NotFound
// naming the preset and listing the known ones.
absl::StatusOr<ModelConfig> PresetConfig(const std::string& name);
// The presets a random checkpoint can be made of (make-model, the tests
// that write every preset): all but the full-size ones.
std::vector<std::string> PresetNames();
// Full-size presets, configs only: their checkpoints are terabytes ("k3").
std::vector<std::string> FullSizePresetNames();

}  // namespace deltaserve
