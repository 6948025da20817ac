// One sequence run by this rank's part of a pipeline- and tensor-parallel
// replica (runtime/engine/stage_runner.h does the stage's work). A long prompt
// is cut into chunks; since a stage sends a chunk on and starts the next one
// without waiting, stage p works on chunk i+1 while stage p+1 works on chunk
// i. KDA state, conv state and MLA cache carry across chunks in each stage's
// own SequenceState.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/world_layout.h"
#include "runtime/engine/sequence_runner.h"
#include "runtime/engine/stage_runner.h"
#include "runtime/model/model.h"

namespace deltaserve {

class PipelineRunner : public SequenceRunner {
 public:
  // `model` holds this rank's shard; `world` spans the replica's ranks with
  // ranks numbered as `layout` says.
  PipelineRunner(const Model& model, const WorldLayout& layout, Communicator& world);

  absl::StatusOr<std::vector<float>> Prefill(std::span<const int32_t> tokens, int64_t chunk = 0,
                                             bool all_logits = false) override;
  absl::StatusOr<std::vector<float>> Decode(int32_t token) override;
  bool HasLogits() const override { return stage_.last_stage(); }
  bool IsOutput() const override { return stage_.last_stage() && stage_.coord().tp_rank == 0; }
  absl::StatusOr<int32_t> ShareToken(int32_t token) override;

  const PipelineStats& stats() const { return stage_.stats(); }
  const RankCoord& coord() const { return stage_.coord(); }

 private:
  StageRunner stage_;
  std::unique_ptr<SequenceState> state_;
};

}  // namespace deltaserve
