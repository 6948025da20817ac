// One rank's part of a forward pass over a batch of sequences, when the model
// is spread over pipeline stages and tensor-parallel ranks (or not: a
// one-stage layout in one process is the whole model). Every rank of a
// replica calls Forward with the same inputs: stage 0 embeds, each stage runs
// its layers and forwards the activation packet (K3: bank entries then prefix;
// Kimi Linear: the hidden state) to the same TP rank of the next stage with a
// non-blocking send, and the last stage makes the logits. Since a stage sends
// a batch on and returns without waiting, stage p works on the next batch
// while stage p+1 works on this one. The packets go over the stage data
// communicator on this stage's stream (the CPU's: the layers run on the
// host); the steps around them over the control communicator (replica.h).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/stream.h"
#include "kernels/workspace.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/data_communicator.h"
#include "runtime/comm/world_layout.h"
#include "runtime/model/model.h"

namespace deltaserve {

struct PipelineStats {
  int64_t bytes_sent = 0;   // activation packets sent to the next stage
  int64_t tokens_sent = 0;  // tokens those packets carried
  double compute_s = 0;     // embedding, layers and logits on this rank
  double busy_wall_s = 0;   // wall time inside StepExecutor::Run
  int64_t fork_bytes = 0;   // sequence state copied to fork new sequences
  double fork_s = 0;        // time those copies took
  // The most a step's logits buffer held on this rank (capacity, bytes):
  // rows x vocab x 4 of the largest step on the last stage, 0 elsewhere.
  int64_t peak_logits_bytes = 0;
};

class StageRunner {
 public:
  // `model` holds this rank's shard; `control` spans the replica's ranks with
  // ranks numbered as `layout` says; `stage` is this rank's stage data
  // communicator, ranked by stage (rank_communicators.h). All must outlive the
  // runner.
  StageRunner(const Model& model, const WorldLayout& layout, Communicator& control,
              DataCommunicator& stage);

  // Runs this stage's part of one forward over `inputs` and advances their
  // states (Model::Forward's contract, split over the stages). On the last
  // stage appends the logits to `logits`: per input in order, every new
  // token's row when all_logits, else the last one's.
  absl::Status Forward(std::span<const ForwardInput> inputs, std::vector<float>* logits);

  bool first_stage() const { return coord_.stage == 0; }
  bool last_stage() const { return coord_.stage == layout_.pp - 1; }
  const RankCoord& coord() const { return coord_; }
  const WorldLayout& layout() const { return layout_; }
  // Steps, results and reports (Replica); never activations.
  Communicator& control() { return control_; }
  // The rank that reports: the last stage's TP rank 0 of this replica.
  int output_rank() const { return layout_.Rank(coord_.replica, layout_.pp - 1, 0); }
  // This replica's leader: stage 0, TP rank 0.
  int leader_rank() const { return layout_.Rank(coord_.replica, 0, 0); }
  const Model& model() const { return model_; }
  const kernels::Stream& stream() const;
  PipelineStats& stats() { return stats_; }
  const PipelineStats& stats() const { return stats_; }

 private:
  const Model& model_;
  WorldLayout layout_;
  Communicator& control_;
  DataCommunicator& stage_;
  RankCoord coord_;
  struct InFlight {
    kernels::Buffer packet;  // bank entries then prefix, [entries * rows, D]
    std::unique_ptr<SendRequest> request;
  };
  std::deque<InFlight> in_flight_;
  PipelineStats stats_;
};

}  // namespace deltaserve
