// The subcommands of build/bin/deltaserve. Each has a spec (its flags, help
// and examples: launcher/flags.h) and a body that takes the arguments after
// its name and returns an absl::Status; main() answers --help from the spec,
// prints errors and sets the exit code.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/flags.h"

namespace deltaserve {

using Args = std::vector<std::string>;

const CommandSpec& MakeModelSpec();
absl::Status RunMakeModel(const Args& args);
const CommandSpec& GenerateSpec();
absl::Status RunGenerate(const Args& args);
const CommandSpec& ScoreSpec();
absl::Status RunScore(const Args& args);
const CommandSpec& BatchSpec();
absl::Status RunBatch(const Args& args);
const CommandSpec& PlanSpec();
absl::Status RunPlan(const Args& args);
const CommandSpec& ServeSpec();
absl::Status RunServe(const Args& args);
const CommandSpec& CoordinatorSpec();
absl::Status RunCoordinator(const Args& args);
const CommandSpec& WorkerSpec();
absl::Status RunWorkerCommand(const Args& args);
// `client` and its subcommands (generate, score, info, status).
const CommandSpec& ClientSpec();
absl::Status RunClient(const Args& args);
const CommandSpec& BenchServeSpec();
absl::Status RunBenchServe(const Args& args);

}  // namespace deltaserve
