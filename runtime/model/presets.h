// Named model configurations for tests, benchmarks and `make-model`: the two
// tiny golden architectures (identical to ../shared/golden/model/*/config.json)
// and k3-small, a K3-shaped model of 111M parameters for benchmarks.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/config.h"

namespace deltaserve {

// "k3-tiny", "kimi-linear-tiny", "k3-small"; anything else is NotFound
// naming the preset and listing the known ones.
absl::StatusOr<ModelConfig> PresetConfig(const std::string& name);
std::vector<std::string> PresetNames();

}  // namespace deltaserve
