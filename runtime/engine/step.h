// The unit of work of continuous batching, as plain values: a Step is a batch
// of work for any number of sequences (prefill chunks, decode tokens, scoring
// pieces) that one replica runs in one forward pass, and a StepResult is what
// comes back. The scheduler (runtime/scheduler) makes steps, the replica
// (runtime/engine/replica.h) runs them; the serving layer converts them to and
// from protobuf for the worker link in one place (runtime/serving/step_proto.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/sampling.h"

namespace deltaserve {

enum class WorkOutput : int32_t {
  kNone = 0,    // a prefill chunk that is not the prompt's last
  kSample = 1,  // sample the next token after the last one given
  kScore = 2,   // the log-prob of each target
  kLogits = 3,  // the logits of every token given
};

struct SequenceWork {
  uint64_t sequence_id = 0;
  bool start = false;           // make the sequence's state first
  std::vector<int32_t> tokens;  // new tokens, non-empty unless feed_sampled
  WorkOutput output = WorkOutput::kNone;
  kernels::SamplingParams sampling;  // read with start
  uint64_t seed = 0;                 // read with start
  bool logprobs = false;             // kSample: the sampled token's log-prob
  int32_t top_logprobs = 0;          // kSample, kScore: that many alternatives (per row)
  std::vector<int32_t> targets;      // kScore: the token after each (-1: none)
  // With start: the new state is a copy of this sequence's state as it was
  // before the step (a prefix computed once, forked for several requests).
  std::optional<uint64_t> fork_from;
  // kSample, sent before the result of the sequence's previous step (which
  // sampled a token) came back: `tokens` is empty and the replica's leader
  // feeds that sampled token (Replica::Start), so decoding sequences keep
  // stepping without waiting for a round trip through the scheduler.
  bool feed_sampled = false;
};

struct Step {
  uint64_t id = 0;
  std::vector<uint64_t> release;  // freed before the work runs
  std::vector<SequenceWork> work;
  // Another step follows without waiting for this one's result, so a
  // pipelined replica may start it while its later stages still run this one.
  bool more_coming = false;
};

struct SequenceResult {
  uint64_t sequence_id = 0;
  int32_t token = -1;  // kSample
  float logprob = 0;
  // Highest first; kScore: [tokens, top_logprobs], a row per target.
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  std::vector<float> target_logprobs;  // kScore, one per target (0 for -1)
  std::vector<float> logits;           // kLogits, [tokens, vocab]
  // The sequence failed (the model's logits were not finite); it advanced
  // like the rest of the step and its outputs are empty.
  std::string error;
};

// Sequence state held by a rank, or by a replica's ranks together.
struct HeldState {
  int64_t sequences = 0;
  int64_t kda_bytes = 0;
  int64_t mla_bytes = 0;
  int64_t tokens = 0;  // sum of the sequences' lengths
};

struct StepResult {
  uint64_t step_id = 0;
  std::string error;                    // the replica refused the step; no state advanced
  std::vector<SequenceResult> outputs;  // the work with output, in work order
  double wall_s = 0;                    // the leader: step started -> result ready
  std::vector<double> stage_compute_s;  // per pipeline stage, the slowest rank
  // What the replica's ranks hold after the step, summed over ranks.
  int64_t live_sequences = 0;
  int64_t kda_state_bytes = 0;
  int64_t mla_cache_bytes = 0;
};

}  // namespace deltaserve
