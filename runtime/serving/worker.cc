#include "runtime/serving/worker.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "deltaserve/v1/worker.grpc.pb.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

constexpr int kPlanTag = 10;
constexpr int kResultTag = 11;
constexpr int kHeldTag = 12;

Step FromProto(const v1::StepPlan& plan) {
  Step step;
  step.id = plan.step_id();
  step.release.assign(plan.release().begin(), plan.release().end());
  for (const auto& w : plan.work()) {
    SequenceWork work;
    work.sequence_id = w.sequence_id();
    work.start = w.start();
    work.tokens.assign(w.tokens().begin(), w.tokens().end());
    work.output = w.output() == v1::SequenceWork::OUTPUT_SAMPLE  ? WorkOutput::kSample
                  : w.output() == v1::SequenceWork::OUTPUT_SCORE ? WorkOutput::kScore
                                                                 : WorkOutput::kNone;
    work.sampling.temperature = w.sampling().temperature();
    work.sampling.top_k = w.sampling().top_k();
    work.sampling.top_p = w.sampling().top_p();
    work.seed = w.sampling().seed();
    work.logprobs = w.logprobs();
    work.top_logprobs = w.top_logprobs();
    work.targets.assign(w.targets().begin(), w.targets().end());
    step.work.push_back(std::move(work));
  }
  return step;
}

void ToProto(const SequenceResult& r, v1::SequenceOutput* out) {
  out->set_sequence_id(r.sequence_id);
  out->set_token(r.token);
  out->set_logprob(r.logprob);
  out->mutable_top_ids()->Add(r.top_ids.begin(), r.top_ids.end());
  out->mutable_top_logprobs()->Add(r.top_logprobs.begin(), r.top_logprobs.end());
  out->mutable_target_logprobs()->Add(r.target_logprobs.begin(), r.target_logprobs.end());
}

// A step plan from the leader to the other ranks of its replica: the size,
// then the bytes (a size of zero: stop), received with RecvBytes. Sent without waiting, so the
// leader can start the next plan while later stages still work on earlier ones (a broadcast would
// hold it until every rank had taken the plan); the sends are waited for when their step is
// collected.
class PlanSends {
 public:
  absl::Status Start(Communicator& world, const StageRunner& stage, std::string bytes) {
    auto size = std::make_unique<uint64_t>(bytes.size());
    auto data = std::make_unique<std::string>(std::move(bytes));
    for (int r = 0; r < world.size(); ++r) {
      if (r == world.rank() || stage.layout().CoordOf(r).replica != stage.coord().replica) {
        continue;
      }
      DELTASERVE_ASSIGN_OR_RETURN(auto request,
                                  world.Isend(size.get(), sizeof(uint64_t), r, kPlanTag));
      requests_.push_back(std::move(request));
      if (!data->empty()) {
        DELTASERVE_ASSIGN_OR_RETURN(request, world.Isend(data->data(), data->size(), r, kPlanTag));
        requests_.push_back(std::move(request));
      }
    }
    sizes_.push_back(std::move(size));
    buffers_.push_back(std::move(data));
    return absl::OkStatus();
  }
  absl::Status Wait() {
    for (auto& request : requests_) DELTASERVE_RETURN_IF_ERROR(request->Wait());
    requests_.clear();
    sizes_.clear();
    buffers_.clear();
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<uint64_t>> sizes_;
  std::vector<std::unique_ptr<std::string>> buffers_;
  std::vector<std::unique_ptr<SendRequest>> requests_;
};

absl::Status SendBytes(Communicator& world, const std::string& bytes, int dest, int tag) {
  const uint64_t size = bytes.size();
  DELTASERVE_RETURN_IF_ERROR(world.Send(&size, sizeof(size), dest, tag));
  if (size == 0) return absl::OkStatus();
  return world.Send(bytes.data(), size, dest, tag);
}

absl::StatusOr<std::string> RecvBytes(Communicator& world, int src, int tag) {
  uint64_t size = 0;
  DELTASERVE_RETURN_IF_ERROR(world.Recv(&size, sizeof(size), src, tag));
  std::string bytes(size, '\0');
  if (size > 0) DELTASERVE_RETURN_IF_ERROR(world.Recv(bytes.data(), size, src, tag));
  return bytes;
}

}  // namespace

absl::StatusOr<LocalStep> ExecuteStep(StepExecutor& executor, const v1::StepPlan& plan) {
  StageRunner& stage = executor.stage();
  Communicator& world = stage.world();
  const int leader = stage.leader_rank();
  const bool is_leader = world.rank() == leader;
  const double compute_before = stage.stats().compute_s;
  LocalStep local;
  local.step_id = plan.step_id();
  auto outputs = executor.Run(FromProto(plan));
  // A refused step is refused on every rank alike (the same validation runs
  // everywhere before any communication); it is reported, not fatal.
  if (!outputs.ok()) local.error = std::string(outputs.status().message());
  if (executor.is_output() && outputs.ok()) {
    for (const auto& r : *outputs) ToProto(r, local.outputs.add_outputs());
  }
  if (executor.is_output() && !is_leader) {
    DELTASERVE_RETURN_IF_ERROR(
        SendBytes(world, local.outputs.SerializeAsString(), leader, kResultTag));
  }
  const HeldState held = executor.Held();
  local.report = {held.kda_bytes, held.mla_bytes, held.sequences, stage.coord().stage,
                  stage.stats().compute_s - compute_before};
  if (!is_leader) {
    DELTASERVE_RETURN_IF_ERROR(world.Send(&local.report, sizeof(local.report), leader, kHeldTag));
  }
  return local;
}

absl::Status CollectStep(StepExecutor& executor, LocalStep local, v1::StepResult* result) {
  StageRunner& stage = executor.stage();
  Communicator& world = stage.world();
  const int leader = stage.leader_rank();
  if (executor.is_output()) {
    *result = std::move(local.outputs);
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(std::string bytes,
                                RecvBytes(world, stage.output_rank(), kResultTag));
    if (!result->ParseFromString(bytes)) {
      return absl::DataLossError("the output rank's step result does not parse");
    }
  }
  result->set_step_id(local.step_id);
  if (!local.error.empty()) result->set_error(local.error);
  std::vector<double> stage_compute(stage.layout().pp, 0.0);
  int64_t kda = local.report.kda_bytes, mla = local.report.mla_bytes;
  stage_compute[0] = local.report.compute_s;
  for (int r = 0; r < world.size(); ++r) {
    if (r == leader || stage.layout().CoordOf(r).replica != stage.coord().replica) continue;
    RankReport other;
    DELTASERVE_RETURN_IF_ERROR(world.Recv(&other, sizeof(other), r, kHeldTag));
    kda += other.kda_bytes;
    mla += other.mla_bytes;
    stage_compute[other.stage] = std::max(stage_compute[other.stage], other.compute_s);
  }
  result->set_live_sequences(local.report.sequences);
  result->set_kda_state_bytes(kda);
  result->set_mla_cache_bytes(mla);
  for (double s : stage_compute) result->add_stage_compute_s(s);
  return absl::OkStatus();
}

absl::Status RunStep(StepExecutor& executor, const v1::StepPlan& plan, v1::StepResult* result) {
  DELTASERVE_ASSIGN_OR_RETURN(LocalStep local, ExecuteStep(executor, plan));
  if (executor.stage().world().rank() != executor.stage().leader_rank()) {
    return absl::OkStatus();
  }
  return CollectStep(executor, std::move(local), result);
}

v1::WorkerHello MakeWorkerHello(const ModelConfig& config, const WorldLayout& layout,
                                const std::string& description) {
  v1::WorkerHello h;
  h.set_model_type(config.model_type);
  h.set_num_layers(static_cast<int32_t>(config.num_layers));
  h.set_vocab_size(config.vocab_size);
  h.set_context_length(config.max_position_embeddings);
  h.set_hidden_size(config.hidden_size);
  h.set_replicas(layout.replicas);
  h.set_pipeline_stages(layout.pp);
  h.set_tensor_parallel(layout.tp);
  h.set_description(description);
  h.set_config_json(ModelConfigToJson(config));
  return h;
}

namespace {

absl::Status RunLeader(StepExecutor& executor, const ModelConfig& config,
                       const WorkerOptions& options) {
  Communicator& world = executor.stage().world();
  auto stub = v1::WorkerLink::NewStub(options.channel);
  grpc::ClientContext context;
  // Wait for the coordinator to come up rather than failing at once.
  context.set_wait_for_ready(true);
  if (!options.channel->WaitForConnected(
          std::chrono::system_clock::now() +
          std::chrono::milliseconds(static_cast<int64_t>(options.connect_timeout_s * 1e3)))) {
    PlanSends stop;
    if (stop.Start(world, executor.stage(), "").ok()) (void)stop.Wait();
    return absl::UnavailableError(
        absl::StrCat("cannot reach the coordinator within ", options.connect_timeout_s, " s"));
  }
  auto stream = stub->Attach(&context);
  v1::WorkerMessage hello;
  *hello.mutable_hello() = MakeWorkerHello(config, executor.stage().layout(), options.description);
  absl::Status status = absl::OkStatus();
  if (!stream->Write(hello)) {
    status = absl::UnavailableError("the coordinator closed the link before the hello");
  }
  v1::CoordinatorMessage message;
  bool told_to_stop = false;
  const int pp = executor.stage().layout().pp;
  std::deque<std::pair<LocalStep, std::chrono::steady_clock::time_point>> outstanding;
  PlanSends sends;
  while (status.ok() && stream->Read(&message)) {
    if (message.has_refused()) {
      status = absl::FailedPreconditionError(
          absl::StrCat("the coordinator refused this worker: ", message.refused()));
      break;
    }
    const v1::StepPlan& plan = message.step();
    if (plan.shutdown()) {
      told_to_stop = true;
      break;
    }
    const auto start = std::chrono::steady_clock::now();
    // A size of zero tells the other ranks to stop; a real plan is never empty.
    DELTASERVE_RETURN_IF_ERROR(sends.Start(world, executor.stage(), plan.SerializeAsString()));
    DELTASERVE_ASSIGN_OR_RETURN(LocalStep local, ExecuteStep(executor, plan));
    outstanding.push_back({std::move(local), start});
    // With more to come, answer the older steps only: the later stages are
    // still working on them while this rank starts the next plan.
    const size_t keep = plan.more_coming() ? static_cast<size_t>(pp - 1) : 0;
    bool link_ok = true;
    if (outstanding.size() > keep) DELTASERVE_RETURN_IF_ERROR(sends.Wait());
    while (outstanding.size() > keep && link_ok) {
      v1::WorkerMessage reply;
      DELTASERVE_RETURN_IF_ERROR(
          CollectStep(executor, std::move(outstanding.front().first), reply.mutable_result()));
      reply.mutable_result()->set_wall_s(
          std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                        outstanding.front().second)
              .count());
      outstanding.pop_front();
      link_ok = stream->Write(reply);
    }
    if (!link_ok) break;
  }
  DELTASERVE_RETURN_IF_ERROR(sends.Start(world, executor.stage(), ""));
  DELTASERVE_RETURN_IF_ERROR(sends.Wait());
  stream->WritesDone();
  const grpc::Status finish = stream->Finish();
  if (!status.ok()) return status;
  if (!finish.ok() && !told_to_stop) {
    return absl::UnavailableError(
        absl::StrCat("the link to the coordinator ended: ", finish.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWorker(StepExecutor& executor, const ModelConfig& config,
                       const WorkerOptions& options) {
  Communicator& world = executor.stage().world();
  const int leader = executor.stage().leader_rank();
  if (world.rank() == leader) return RunLeader(executor, config, options);
  while (true) {
    DELTASERVE_ASSIGN_OR_RETURN(std::string bytes, RecvBytes(world, leader, kPlanTag));
    if (bytes.empty()) return absl::OkStatus();
    v1::StepPlan plan;
    if (!plan.ParseFromString(bytes)) {
      return absl::DataLossError("the leader's step plan does not parse");
    }
    v1::StepResult unused;
    DELTASERVE_RETURN_IF_ERROR(RunStep(executor, plan, &unused));
  }
}

}  // namespace deltaserve
