// The worker side of continuous batching: one step is a batch of work for any
// number of sequences (prefill chunks, decode tokens, scoring pieces), run
// through this rank's part of the model in one forward pass. Sequence state
// lives here, keyed by the coordinator's sequence ids, from the step that
// starts a sequence until one that releases it. The last stage samples (each
// sequence has its own seeded generator, so tokens do not depend on what else
// shares the step) and computes log-probs; its TP rank 0 holds the outputs.
// Every rank of a replica runs the same steps in the same order.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/sampling.h"
#include "runtime/engine/stage_runner.h"
#include "runtime/model/model.h"

namespace deltaserve {

enum class WorkOutput { kNone, kSample, kScore };

struct SequenceWork {
  uint64_t sequence_id = 0;
  bool start = false;           // make the sequence's state first
  std::vector<int32_t> tokens;  // new tokens, non-empty
  WorkOutput output = WorkOutput::kNone;
  kernels::SamplingParams sampling;  // read with start
  uint64_t seed = 0;                 // read with start
  bool logprobs = false;             // kSample: the sampled token's log-prob
  int32_t top_logprobs = 0;          // kSample: that many alternatives
  std::vector<int32_t> targets;      // kScore: the token after each (-1: none)
};

struct Step {
  uint64_t id = 0;
  std::vector<uint64_t> release;  // freed before the work runs
  std::vector<SequenceWork> work;
};

struct SequenceResult {
  uint64_t sequence_id = 0;
  int32_t token = -1;  // kSample
  float logprob = 0;
  std::vector<int32_t> top_ids;  // highest first
  std::vector<float> top_logprobs;
  std::vector<float> target_logprobs;  // kScore, one per target (0 for -1)
};

// What this rank holds.
struct HeldState {
  int64_t sequences = 0;
  int64_t kda_bytes = 0;
  int64_t mla_bytes = 0;
  int64_t tokens = 0;  // sum of the sequences' lengths
};

class StepExecutor {
 public:
  StepExecutor(const Model& model, const WorldLayout& layout, Communicator& world);

  // Releases, then runs the work. Errors (unknown or duplicate sequence ids,
  // bad tokens, a context past the model's) leave every sequence as it was
  // before the work, released ones gone. Results, in work order for the work
  // with output, are filled on the output rank only.
  absl::StatusOr<std::vector<SequenceResult>> Run(const Step& step);

  HeldState Held() const;
  bool is_output() const { return stage_.last_stage() && stage_.coord().tp_rank == 0; }
  StageRunner& stage() { return stage_; }

 private:
  struct Sequence {
    std::unique_ptr<SequenceState> state;
    kernels::SamplingParams sampling;
    kernels::Rng rng{0};
  };
  StageRunner stage_;
  std::map<uint64_t, Sequence> sequences_;
};

// log(sum(exp(logits))) of one row, and its log softmax, in double.
double LogSumExp(const float* logits, int64_t vocab);
std::vector<double> LogSoftmax(const float* logits, int64_t vocab);

}  // namespace deltaserve
