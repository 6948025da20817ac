// What the model commands run on: the whole model in this process, or — when
// started under mpirun/srun, or asked for --pp/--tp — this rank's part of a
// pipeline- and tensor-parallel job, checked against the MPI world it got.
// Either way the result is one replica (runtime/engine/replica.h) whose
// leader drives the steps and whose other ranks follow.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/flags.h"
#include "runtime/comm/rank_communicators.h"
#include "runtime/comm/world_layout.h"
#include "runtime/engine/replica.h"
#include "runtime/engine/step_executor.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"

namespace deltaserve {

// The flags every model command takes for this: --model, --threads, --pp,
// --tp, --stage-layers.
const std::vector<FlagSpec>& DeploymentFlags();

struct Deployment {
  ModelConfig config;
  bool distributed = false;
  WorldLayout layout;
  // Control (the world: steps, results, reports), the stage and the TP data
  // communicators; declared before what uses them, so destroyed after.
  RankCommunicators comms;
  std::unique_ptr<Model> model;
  std::unique_ptr<StepExecutor> executor;
  std::unique_ptr<Replica> replica;
  std::string description;  // "rank 3: stage 1 (layers 5-8), tp 1 of 2"
};

// Reads the config (for validating a request before any loading).
absl::StatusOr<ModelConfig> DeploymentConfig(const Flags& flags);

// Sets threads, starts MPI when distributed, plans the stages (by
// --stage-layers, else balanced for `context_tokens`), loads this rank's
// shard and makes its replica.
absl::StatusOr<Deployment> Deploy(const Flags& flags, const ModelConfig& config,
                                  int64_t context_tokens);

// Ends the MPI job if one was started: cleanly after success; after an error
// on this rank, by aborting every rank so none waits on it.
void EndDeployment(bool ok);

// Writes this rank's pipeline counters to stderr (distributed runs).
void PrintPipelineStats(const Deployment& deployment);

}  // namespace deltaserve
