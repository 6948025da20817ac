// The subcommands of build/bin/deltaserve. Each takes the arguments after its
// name and returns an absl::Status; main() prints errors and sets the exit code.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace deltaserve {

using Args = std::vector<std::string>;

absl::Status RunMakeModel(const Args& args);
absl::Status RunGenerate(const Args& args);
absl::Status RunScore(const Args& args);
absl::Status RunPlan(const Args& args);
absl::Status RunServe(const Args& args);
absl::Status RunCoordinator(const Args& args);
absl::Status RunWorkerCommand(const Args& args);
absl::Status RunClient(const Args& args);
absl::Status RunBenchServe(const Args& args);

}  // namespace deltaserve
