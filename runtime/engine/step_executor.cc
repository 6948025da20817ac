#include "runtime/engine/step_executor.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/logsoftmax.h"
#include "kernels/workspace.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {

namespace {

// The log-prob statistics of logit rows: appends the top `top_k`
// alternatives of each row to `r` and returns the log-prob of each row's
// target (none without `targets`).
std::vector<float> LogProbs(const kernels::Tensor& logits, const std::vector<int32_t>* targets,
                            int64_t top_k, SequenceResult& r) {
  using namespace kernels;
  const int64_t rows = logits.rows, k = std::min(top_k, logits.cols);
  std::vector<double> log_z(static_cast<size_t>(rows));
  std::vector<float> target_lp(targets != nullptr ? rows : 0);
  const size_t before = r.top_ids.size();
  r.top_ids.resize(before + rows * k);
  r.top_logprobs.resize(before + rows * k);
  LogSoftmaxTopKArgs args;
  args.logits = logits;
  if (targets != nullptr) {
    args.targets = Tensor::I32(targets->data(), rows, 1);
    args.target_logprobs = MutableTensor::F32(target_lp.data(), rows, 1);
  }
  args.top_k = k;
  args.log_z = MutableTensor::F64(log_z.data(), rows, 1);
  args.top_ids = MutableTensor::I32(r.top_ids.data() + before, rows, k);
  args.top_logprobs = MutableTensor::F32(r.top_logprobs.data() + before, rows, k);
  LogSoftmaxTopK(args);
  return target_lp;
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
    held.tokens += seq.state->length;
  }
  // Pages a fork shares with its prefix are held once.
  const StatePool& pool = stage_.model().state_pool();
  held.mla_bytes = pool.used_pages() * pool.page_bytes();
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
  // Forgets the sequences this step started, when it fails.
  const auto undo_starts = [&] {
    for (const SequenceWork& w : step.work) {
      if (w.start) sequences_.erase(w.sequence_id);
    }
  };
  for (const SequenceWork& w : step.work) {
    if (!w.start) continue;
    Sequence seq;
    // A fork takes the prefix's state as it is before this step's work: its
    // full MLA pages shared, the rest copied.
    const auto t0 = std::chrono::steady_clock::now();
    const SequenceState* prefix = w.fork_from ? sequences_.at(*w.fork_from).state.get() : nullptr;
    absl::StatusOr<std::unique_ptr<SequenceState>> state =
        prefix != nullptr ? prefix->Fork() : model.NewSequence();
    if (!state.ok()) {
      undo_starts();
      return absl::Status(state.status().code(),
                          absl::StrCat("step ", step.id, ": sequence ", w.sequence_id,
                                       prefix != nullptr ? " cannot fork: " : " cannot start: ",
                                       state.status().message()));
    }
    seq.state = *std::move(state);
    if (prefix != nullptr) {
      PipelineStats& stats = stage_.stats();
      stats.fork_bytes += prefix->ForkCopyBytes();
      stats.fork_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
    undo_starts();
    return status;
  }
  // The step's sync point: an error a kernel reported asynchronously fails
  // the step, naming the op. The step's sequences may have advanced part of
  // the way, so their state goes; the scheduler fails them, and the replica
  // takes the next step.
  const kernels::Device device = model.state_pool().device();
  if (const kernels::DeviceError error = kernels::Workspace::Of(device).Synchronize();
      !error.ok()) {
    for (const SequenceWork& w : step.work) sequences_.erase(w.sequence_id);
    return absl::InternalError(absl::StrCat("step ", step.id, ": ", error.op, " failed on the ",
                                            kernels::DeviceName(device), ": ", error.message));
  }
  std::vector<SequenceResult> results;
  if (!is_output()) return results;

  // Scoring a long document holds one step's rows at a time, never [T, vocab]:
  // the largest buffer is what --stats reports and the score test bounds.
  PipelineStats& stats = stage_.stats();
  stats.peak_logits_bytes = std::max<int64_t>(
      stats.peak_logits_bytes, static_cast<int64_t>(logits.capacity() * sizeof(float)));
  const int64_t vocab = model.config().vocab_size;
  int64_t row = 0;  // the first logits row of the work item
  for (const SequenceWork& w : step.work) {
    Sequence& seq = sequences_.at(w.sequence_id);
    const bool all_rows = w.output == WorkOutput::kScore || w.output == WorkOutput::kLogits;
    const int64_t rows = all_rows ? static_cast<int64_t>(w.tokens.size()) : 1;
    const int64_t first = row;
    const kernels::Tensor mine = kernels::Tensor::F32(logits.data() + first * vocab, rows, vocab);
    row += rows;
    if (w.output == WorkOutput::kNone) continue;
    SequenceResult r;
    r.sequence_id = w.sequence_id;
    // Non-finite logits (a corrupt checkpoint, an overflow) end the sequence
    // with the position named, before anything samples or scores them.
    if (const int64_t bad = kernels::FindNonFinite(mine); bad >= 0) {
      const int64_t position = seq.state->length - rows + bad / vocab;
      r.error = absl::StrCat("sequence ", w.sequence_id,
                             ": the model's logits are not finite at token position ", position,
                             " (", logits[first * vocab + bad], " for token id ", bad % vocab, ")");
    } else if (w.output == WorkOutput::kSample) {
      // The draw depends on the seed and the position only, so a sequence
      // re-run from its tokens so far samples the same (docs/security.md,
      // "Failure, drain and lost workers").
      kernels::Rng rng = kernels::Rng::ForPosition(seq.seed, seq.state->length);
      r.token = kernels::Sample(mine, seq.sampling, rng);
      if (w.logprobs || w.top_logprobs > 0) {
        const std::vector<int32_t> sampled = {r.token};
        r.logprob = LogProbs(mine, &sampled, w.top_logprobs, r)[0];
      }
    } else if (w.output == WorkOutput::kLogits) {
      r.logits.assign(logits.begin() + first * vocab, logits.begin() + row * vocab);
    } else {
      // kScore: per row the target's log-prob and, when asked, the top
      // alternatives ([rows, top_logprobs] in top_ids / top_logprobs); only
      // these leave the step, never the rows themselves.
      r.target_logprobs = LogProbs(mine, &w.targets, w.top_logprobs, r);
    }
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace deltaserve
