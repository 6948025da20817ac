#include "runtime/engine/step_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {

double LogSumExp(const float* logits, int64_t vocab) {
  const double max = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max);
  return max + std::log(sum);
}

std::vector<double> LogSoftmax(const float* logits, int64_t vocab) {
  const double log_z = LogSumExp(logits, vocab);
  std::vector<double> out(vocab);
  for (int64_t i = 0; i < vocab; ++i) out[i] = logits[i] - log_z;
  return out;
}

namespace {

// Appends the n most likely ids of one row (highest first, lower id on ties)
// and their log-probs (logit - log_z) to `r`. `order` is scratch, reused
// across rows so that scoring a piece allocates one vocabulary's worth.
void AppendTop(const float* logits, int64_t vocab, double log_z, int64_t n,
               std::vector<int32_t>& order, SequenceResult& r) {
  n = std::min(n, vocab);
  if (n <= 0) return;
  order.resize(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int64_t i = 0; i < n; ++i) {
    r.top_ids.push_back(order[i]);
    r.top_logprobs.push_back(static_cast<float>(logits[order[i]] - log_z));
  }
}

}  // namespace

StepExecutor::StepExecutor(const Model& model, const WorldLayout& layout, Communicator& control,
                           DataCommunicator& stage)
    : stage_(model, layout, control, stage) {}

HeldState StepExecutor::Held() const {
  HeldState held;
  for (const auto& [id, seq] : sequences_) {
    ++held.sequences;
    held.kda_bytes += seq.state->KdaBytes();
    held.mla_bytes += seq.state->MlaCacheBytes();
    held.tokens += seq.state->length;
  }
  return held;
}

absl::StatusOr<std::vector<SequenceResult>> StepExecutor::Run(const Step& step) {
  const auto start = std::chrono::steady_clock::now();
  auto results = RunTimed(step);
  stage_.stats().busy_wall_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return results;
}

absl::StatusOr<std::vector<SequenceResult>> StepExecutor::RunTimed(const Step& step) {
  for (uint64_t id : step.release) sequences_.erase(id);
  if (step.work.empty()) return std::vector<SequenceResult>{};

  // Check the work before touching any state.
  std::set<uint64_t> seen;
  for (const SequenceWork& w : step.work) {
    if (!seen.insert(w.sequence_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step.id, ": sequence ", w.sequence_id, " appears twice"));
    }
    const bool exists = sequences_.contains(w.sequence_id);
    if (w.start == exists) {
      return absl::FailedPreconditionError(
          absl::StrCat("step ", step.id, ": sequence ", w.sequence_id,
                       w.start ? " started again while it still holds state"
                               : " has no state (never started, or released)"));
    }
    if (w.fork_from && (!w.start || !sequences_.contains(*w.fork_from))) {
      return absl::FailedPreconditionError(
          absl::StrCat("step ", step.id, ": sequence ", w.sequence_id, " forks from sequence ",
                       *w.fork_from, w.start ? ", which holds no state" : " but is not starting"));
    }
    if (w.top_logprobs < 0) {
      return absl::InvalidArgumentError(absl::StrCat("step ", step.id, ": sequence ", w.sequence_id,
                                                     " asks for ", w.top_logprobs,
                                                     " top log-probs"));
    }
    if (w.output == WorkOutput::kScore && w.targets.size() != w.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("step ", step.id, ": sequence ", w.sequence_id,
                                                     " has ", w.tokens.size(), " tokens but ",
                                                     w.targets.size(), " score targets"));
    }
  }
  const Model& model = stage_.model();
  for (const SequenceWork& w : step.work) {
    if (!w.start) continue;
    Sequence seq;
    if (w.fork_from) {
      // A copy of the prefix's state as it is before this step's work.
      const auto t0 = std::chrono::steady_clock::now();
      const SequenceState& prefix = *sequences_.at(*w.fork_from).state;
      seq.state = std::make_unique<SequenceState>(prefix);
      PipelineStats& stats = stage_.stats();
      stats.fork_bytes += prefix.KdaBytes() + prefix.MlaCacheBytes();
      stats.fork_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      seq.state = model.NewSequence();
    }
    seq.sampling = w.sampling;
    seq.seed = w.seed;
    sequences_.emplace(w.sequence_id, std::move(seq));
  }
  std::vector<ForwardInput> inputs;
  inputs.reserve(step.work.size());
  for (const SequenceWork& w : step.work) {
    inputs.push_back({sequences_.at(w.sequence_id).state.get(), w.tokens,
                      w.output == WorkOutput::kScore || w.output == WorkOutput::kLogits});
  }
  std::vector<float> logits;
  // The activation packet to the next stage stays in flight (StageRunner
  // bounds how many): waiting for it here would hold this rank until the next
  // stage takes it, while that stage may be waiting for this rank's leader to
  // collect an earlier step's result.
  const absl::Status status = stage_.Forward(inputs, &logits);
  if (!status.ok()) {
    // Forward changes no state when it refuses a batch; undo the starts.
    for (const SequenceWork& w : step.work) {
      if (w.start) sequences_.erase(w.sequence_id);
    }
    return status;
  }
  std::vector<SequenceResult> results;
  if (!is_output()) return results;

  // Scoring a long document holds one step's rows at a time, never [T, vocab]:
  // the largest buffer is what --stats reports and the score test bounds.
  PipelineStats& stats = stage_.stats();
  stats.peak_logits_bytes = std::max<int64_t>(
      stats.peak_logits_bytes, static_cast<int64_t>(logits.capacity() * sizeof(float)));
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> order;  // AppendTop's scratch
  const float* row = logits.data();
  for (const SequenceWork& w : step.work) {
    Sequence& seq = sequences_.at(w.sequence_id);
    const bool all_rows = w.output == WorkOutput::kScore || w.output == WorkOutput::kLogits;
    const int64_t rows = all_rows ? static_cast<int64_t>(w.tokens.size()) : 1;
    if (w.output == WorkOutput::kNone) {
      row += rows * vocab;
      continue;
    }
    SequenceResult r;
    r.sequence_id = w.sequence_id;
    // Non-finite logits (a corrupt checkpoint, an overflow) end the sequence
    // with the position named, before anything samples or scores them.
    if (const float* bad =
            std::find_if_not(row, row + rows * vocab, [](float x) { return std::isfinite(x); });
        bad != row + rows * vocab) {
      const int64_t position = seq.state->length - rows + (bad - row) / vocab;
      r.error = absl::StrCat("sequence ", w.sequence_id,
                             ": the model's logits are not finite at token position ", position,
                             " (", *bad, " for token id ", (bad - row) % vocab, ")");
    } else if (w.output == WorkOutput::kSample) {
      // The draw depends on the seed and the position only, so a sequence
      // re-run from its tokens so far samples the same (docs/security.md, "Failure, drain and lost
      // workers").
      kernels::Rng rng = kernels::Rng::ForPosition(seq.seed, seq.state->length);
      r.token = kernels::Sample(kernels::Tensor::F32(row, 1, vocab), seq.sampling, rng);
      if (w.logprobs || w.top_logprobs > 0) {
        const double log_z = LogSumExp(row, vocab);
        r.logprob = static_cast<float>(row[r.token] - log_z);
        AppendTop(row, vocab, log_z, w.top_logprobs, order, r);
      }
    } else if (w.output == WorkOutput::kLogits) {
      r.logits.assign(row, row + rows * vocab);
    } else {
      // kScore: per row the target's log-prob and, when asked, the top
      // alternatives ([rows, top_logprobs] in top_ids / top_logprobs); only
      // these leave the step, never the rows themselves.
      for (int64_t t = 0; t < rows; ++t) {
        const float* logits = row + t * vocab;
        const double log_z = LogSumExp(logits, vocab);
        const int32_t target = w.targets[t];
        r.target_logprobs.push_back(
            target < 0 || target >= vocab ? 0.0f : static_cast<float>(logits[target] - log_z));
        AppendTop(logits, vocab, log_z, w.top_logprobs, order, r);
      }
    }
    row += rows * vocab;
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace deltaserve
