// One rank's part of a model spread over pipeline stages and tensor-parallel
// ranks. Every rank of a replica calls the same methods with the same tokens:
// stage 0 embeds, each stage runs its layers and forwards the activation
// packet (K3: bank entries then prefix; Kimi Linear: the hidden state) to the
// same TP rank of the next stage with a non-blocking send, and the last stage
// makes the logits. A long prompt is cut into chunks; since a stage sends a
// chunk on and starts the next one without waiting, stage p works on chunk
// i+1 while stage p+1 works on chunk i. KDA state, conv state and MLA cache
// carry across chunks in each stage's own SequenceState.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/world_layout.h"
#include "runtime/engine/sequence_runner.h"
#include "runtime/model/model.h"

namespace deltaserve {

struct PipelineStats {
  int64_t bytes_sent = 0;      // activation packets sent to the next stage
  int64_t tokens_sent = 0;     // tokens those packets carried
  double compute_s = 0;        // embedding, layers and logits on this rank
  double busy_wall_s = 0;      // wall time inside Prefill / Decode
};

class PipelineRunner : public SequenceRunner {
 public:
  // `model` holds this rank's shard; `world` spans the replica's ranks with
  // ranks numbered as `layout` says.
  PipelineRunner(const Model& model, const WorldLayout& layout, Communicator& world);

  absl::StatusOr<std::vector<float>> Prefill(std::span<const int32_t> tokens,
                                             int64_t chunk = 0,
                                             bool all_logits = false) override;
  absl::StatusOr<std::vector<float>> Decode(int32_t token) override;
  bool HasLogits() const override { return last_stage_; }
  bool IsOutput() const override { return last_stage_ && coord_.tp_rank == 0; }
  absl::StatusOr<int32_t> ShareToken(int32_t token) override;

  const PipelineStats& stats() const { return stats_; }
  const RankCoord& coord() const { return coord_; }

 private:
  // Runs one piece through this stage; appends logits on the last stage.
  absl::Status Step(std::span<const int32_t> tokens, bool all_logits,
                    std::vector<float>* logits);
  absl::Status DrainSends();

  const Model& model_;
  WorldLayout layout_;
  Communicator& world_;
  RankCoord coord_;
  bool first_stage_, last_stage_;
  std::unique_ptr<SequenceState> state_;
  struct InFlight {
    std::vector<float> packet;
    std::unique_ptr<SendRequest> request;
  };
  std::deque<InFlight> in_flight_;
  PipelineStats stats_;
};

}  // namespace deltaserve
