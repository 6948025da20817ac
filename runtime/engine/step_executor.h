// One rank's side of continuous batching: each step (runtime/engine/step.h)
// runs through this rank's part of the model in one forward pass. Sequence state
// lives here, keyed by the coordinator's sequence ids, from the step that
// starts a sequence until one that releases it. The last stage samples (each
// draw from the sequence's seed and the token's position, so tokens do not
// depend on what else shares the step, nor on where the sequence ran before)
// and computes log-probs; its TP rank 0 holds the outputs.
// Every rank of a replica runs the same steps in the same order.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/sampling.h"
#include "runtime/engine/stage_runner.h"
#include "runtime/engine/step.h"
#include "runtime/model/model.h"

namespace deltaserve {

class StepExecutor {
 public:
  // The communicators as StageRunner takes them; they must outlive it.
  StepExecutor(const Model& model, const WorldLayout& layout, Communicator& control,
               DataCommunicator& stage);

  // Releases, then runs the work. Errors (unknown or duplicate sequence ids,
  // bad tokens, a context past the model's) leave every sequence as it was
  // before the work, released ones gone. Results, in work order for the work
  // with output, are filled on the output rank only. Refused steps are
  // refused on every rank alike: the same checks run everywhere before any
  // communication.
  absl::StatusOr<std::vector<SequenceResult>> Run(const Step& step);

  HeldState Held() const;
  bool is_output() const { return stage_.last_stage() && stage_.coord().tp_rank == 0; }
  StageRunner& stage() { return stage_; }

 private:
  absl::StatusOr<std::vector<SequenceResult>> RunTimed(const Step& step);

  struct Sequence {
    std::unique_ptr<SequenceState> state;
    kernels::SamplingParams sampling;
    uint64_t seed = 0;  // with the position, picks each draw (Rng::ForPosition)
  };
  StageRunner stage_;
  std::map<uint64_t, Sequence> sequences_;
};

}  // namespace deltaserve
