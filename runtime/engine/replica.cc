#include "runtime/engine/replica.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/engine/message_tags.h"
#include "runtime/engine/step_codec.h"

namespace deltaserve {
namespace {

absl::Status SendBytes(Communicator& control, const std::string& bytes, int dest, int tag) {
  const uint64_t size = bytes.size();
  DELTASERVE_RETURN_IF_ERROR(control.Send(&size, sizeof(size), dest, tag));
  if (size == 0) return absl::OkStatus();
  return control.Send(bytes.data(), size, dest, tag);
}

// Messages larger than this are refused before allocating: far above any
// real step or result (a [chunk, vocab] float block of logits is the largest).
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 34;

absl::StatusOr<std::string> RecvBytes(Communicator& control, int src, int tag) {
  uint64_t size = 0;
  DELTASERVE_RETURN_IF_ERROR(control.Recv(&size, sizeof(size), src, tag));
  if (size > kMaxMessageBytes) {
    return absl::DataLossError(
        absl::StrCat("rank ", src, " announced a message of ", size, " bytes (tag ", tag, ")"));
  }
  std::string bytes(size, '\0');
  if (size > 0) DELTASERVE_RETURN_IF_ERROR(control.Recv(bytes.data(), size, src, tag));
  return bytes;
}

bool SameReplica(const StageRunner& stage, int rank) {
  return stage.layout().CoordOf(rank).replica == stage.coord().replica;
}

}  // namespace

Replica::Replica(StepExecutor& executor) : executor_(executor) {}

Replica::~Replica() {
  if (is_leader() && !stopped_) (void)Stop();
  (void)WaitForSends(UINT64_MAX);
}

bool Replica::is_leader() const {
  return executor_.stage().control().rank() == executor_.stage().leader_rank();
}

absl::Status Replica::SendToFollowers(uint64_t step_id, std::string bytes) {
  StageRunner& stage = executor_.stage();
  Communicator& control = stage.control();
  Sends sends;
  sends.step_id = step_id;
  sends.size = std::make_unique<uint64_t>(bytes.size());
  sends.bytes = std::make_unique<std::string>(std::move(bytes));
  for (int r = 0; r < control.size(); ++r) {
    if (r == control.rank() || !SameReplica(stage, r)) continue;
    DELTASERVE_ASSIGN_OR_RETURN(
        auto request, control.Isend(sends.size.get(), sizeof(uint64_t), r, message_tags::kStep));
    sends.requests.push_back(std::move(request));
    if (!sends.bytes->empty()) {
      DELTASERVE_ASSIGN_OR_RETURN(
          request, control.Isend(sends.bytes->data(), sends.bytes->size(), r, message_tags::kStep));
      sends.requests.push_back(std::move(request));
    }
  }
  sends_.push_back(std::move(sends));
  return absl::OkStatus();
}

absl::Status Replica::WaitForSends(uint64_t step_id) {
  absl::Status status = absl::OkStatus();
  while (!sends_.empty() && sends_.front().step_id <= step_id) {
    for (auto& request : sends_.front().requests) {
      if (absl::Status s = request->Wait(); status.ok()) status = s;
    }
    sends_.pop_front();
  }
  return status;
}

absl::StatusOr<Replica::Local> Replica::Execute(const Step& step) {
  StageRunner& stage = executor_.stage();
  Communicator& control = stage.control();
  const int leader = stage.leader_rank();
  const double compute_before = stage.stats().compute_s;
  Local local;
  local.step_id = step.id;
  auto outputs = executor_.Run(step);
  if (!outputs.ok()) local.error = std::string(outputs.status().message());
  if (executor_.is_output() && outputs.ok()) local.outputs = std::move(*outputs);
  if (executor_.is_output() && control.rank() != leader) {
    DELTASERVE_RETURN_IF_ERROR(
        SendBytes(control, EncodeResults(local.outputs), leader, message_tags::kResults));
  }
  const HeldState held = executor_.Held();
  local.report = {held.kda_bytes, held.mla_bytes, held.sequences, stage.coord().stage,
                  stage.stats().compute_s - compute_before};
  if (control.rank() != leader) {
    DELTASERVE_RETURN_IF_ERROR(
        control.Send(&local.report, sizeof(local.report), leader, message_tags::kReport));
  }
  return local;
}

bool Replica::FeedsReady(const Step& step) const {
  return std::none_of(step.work.begin(), step.work.end(), [&](const SequenceWork& w) {
    auto it = sampled_.find(w.sequence_id);
    return w.feed_sampled && it != sampled_.end() && it->second < 0;
  });
}

absl::Status Replica::Start(const Step& given) {
  if (!is_leader()) return absl::FailedPreconditionError("only the leader rank starts steps");
  if (stopped_) return absl::FailedPreconditionError("the replica was stopped");
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t id : given.release) sampled_.erase(id);
  // The tokens sent ahead of their sampling step's result: fed here, so the
  // other ranks get plain tokens.
  std::optional<Step> fed;
  for (size_t i = 0; i < given.work.size(); ++i) {
    if (!given.work[i].feed_sampled) continue;
    const uint64_t id = given.work[i].sequence_id;
    auto it = sampled_.find(id);
    if (it == sampled_.end() || it->second < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("step ", given.id, " feeds sequence ", id,
                       "'s sampled token, which no collected step sampled"));
    }
    if (!fed) fed = given;
    fed->work[i].tokens = {it->second};
    fed->work[i].feed_sampled = false;
  }
  const Step& step = fed ? *fed : given;
  DELTASERVE_RETURN_IF_ERROR(SendToFollowers(step.id, EncodeStep(step)));
  DELTASERVE_ASSIGN_OR_RETURN(Local local, Execute(step));
  local.start = start;
  for (const SequenceWork& w : step.work) {
    if (w.output != WorkOutput::kSample) continue;
    local.samples.push_back(w.sequence_id);
    sampled_[w.sequence_id] = -1;  // known when this step is collected
  }
  outstanding_.push_back(std::move(local));
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Replica::Collect() {
  if (outstanding_.empty()) return absl::FailedPreconditionError("no step to collect");
  Local local = std::move(outstanding_.front());
  outstanding_.pop_front();
  StageRunner& stage = executor_.stage();
  Communicator& control = stage.control();
  StepResult result;
  result.step_id = local.step_id;
  result.error = std::move(local.error);
  if (executor_.is_output()) {
    result.outputs = std::move(local.outputs);
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(std::string bytes,
                                RecvBytes(control, stage.output_rank(), message_tags::kResults));
    DELTASERVE_ASSIGN_OR_RETURN(result.outputs, DecodeResults(bytes));
  }
  const int pp = stage.layout().pp;
  result.stage_compute_s.assign(pp, 0.0);
  result.stage_compute_s[0] = local.report.compute_s;
  result.kda_state_bytes = local.report.kda_bytes;
  result.mla_cache_bytes = local.report.mla_bytes;
  result.live_sequences = local.report.sequences;
  for (int r = 0; r < control.size(); ++r) {
    if (r == control.rank() || !SameReplica(stage, r)) continue;
    Report other;
    DELTASERVE_RETURN_IF_ERROR(control.Recv(&other, sizeof(other), r, message_tags::kReport));
    if (other.stage < 0 || other.stage >= pp) {
      return absl::DataLossError(
          absl::StrCat("rank ", r, " reported stage ", other.stage, " of ", pp));
    }
    result.kda_state_bytes += other.kda_bytes;
    result.mla_cache_bytes += other.mla_bytes;
    result.stage_compute_s[other.stage] =
        std::max(result.stage_compute_s[other.stage], other.compute_s);
  }
  // Every rank has taken this step by now (it answered it). Waiting for the
  // sends before taking the answers could hold the leader while a rank waits
  // for it to take a large result.
  DELTASERVE_RETURN_IF_ERROR(WaitForSends(result.step_id));
  result.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - local.start).count();
  // The tokens later steps may feed, of the sequences not released since.
  // One that failed here (logits not finite) has none: the scheduler ends
  // it, and a step already sent ahead runs it on token 0, whose output is
  // dropped.
  for (uint64_t id : local.samples) {
    auto it = sampled_.find(id);
    if (it == sampled_.end()) continue;
    it->second = 0;
    for (const SequenceResult& out : result.outputs) {
      if (out.sequence_id == id && out.token >= 0) it->second = out.token;
    }
  }
  return result;
}

absl::StatusOr<StepResult> Replica::Run(const Step& step) {
  DELTASERVE_RETURN_IF_ERROR(Start(step));
  StepResult last;
  while (!outstanding_.empty()) {
    DELTASERVE_ASSIGN_OR_RETURN(last, Collect());
  }
  return last;
}

absl::Status Replica::Stop() {
  if (!is_leader() || stopped_) return absl::OkStatus();
  stopped_ = true;
  DELTASERVE_RETURN_IF_ERROR(SendToFollowers(UINT64_MAX, ""));  // a size of zero: stop
  return WaitForSends(UINT64_MAX);
}

absl::Status Replica::Follow() {
  if (is_leader()) return absl::FailedPreconditionError("the leader rank does not follow");
  StageRunner& stage = executor_.stage();
  while (true) {
    DELTASERVE_ASSIGN_OR_RETURN(
        std::string bytes, RecvBytes(stage.control(), stage.leader_rank(), message_tags::kStep));
    if (bytes.empty()) return absl::OkStatus();
    DELTASERVE_ASSIGN_OR_RETURN(Step step, DecodeStep(bytes));
    DELTASERVE_RETURN_IF_ERROR(Execute(step).status());
  }
}

}  // namespace deltaserve
