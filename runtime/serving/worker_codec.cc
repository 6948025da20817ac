#include "runtime/serving/worker_codec.h"

#include "absl/strings/str_cat.h"

namespace deltaserve {

void StepToProto(const Step& step, v1::StepPlan* plan) {
  plan->set_step_id(step.id);
  plan->mutable_release()->Add(step.release.begin(), step.release.end());
  plan->set_more_coming(step.more_coming);
  for (const SequenceWork& w : step.work) {
    v1::SequenceWork* p = plan->add_work();
    p->set_sequence_id(w.sequence_id);
    p->set_start(w.start);
    p->mutable_tokens()->Add(w.tokens.begin(), w.tokens.end());
    p->set_output(w.output == WorkOutput::kSample  ? v1::SequenceWork::OUTPUT_SAMPLE
                  : w.output == WorkOutput::kScore ? v1::SequenceWork::OUTPUT_SCORE
                                                   : v1::SequenceWork::OUTPUT_NONE);
    if (w.start) {
      v1::StepSampling* s = p->mutable_sampling();
      s->set_temperature(w.sampling.temperature);
      s->set_top_k(static_cast<int32_t>(w.sampling.top_k));
      s->set_top_p(w.sampling.top_p);
      s->set_seed(w.seed);
    }
    p->set_logprobs(w.logprobs);
    p->set_top_logprobs(w.top_logprobs);
    p->mutable_targets()->Add(w.targets.begin(), w.targets.end());
    if (w.fork_from) p->set_fork_from(*w.fork_from);
    p->set_feed_sampled(w.feed_sampled);
  }
}

absl::StatusOr<Step> StepFromProto(const v1::StepPlan& plan) {
  Step step;
  step.id = plan.step_id();
  step.more_coming = plan.more_coming();
  step.release.assign(plan.release().begin(), plan.release().end());
  for (const auto& p : plan.work()) {
    SequenceWork w;
    w.sequence_id = p.sequence_id();
    w.start = p.start();
    w.tokens.assign(p.tokens().begin(), p.tokens().end());
    switch (p.output()) {
      case v1::SequenceWork::OUTPUT_NONE:
        w.output = WorkOutput::kNone;
        break;
      case v1::SequenceWork::OUTPUT_SAMPLE:
        w.output = WorkOutput::kSample;
        break;
      case v1::SequenceWork::OUTPUT_SCORE:
        w.output = WorkOutput::kScore;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("step ", plan.step_id(), ": sequence ",
                                                       p.sequence_id(), " has output kind ",
                                                       static_cast<int>(p.output())));
    }
    w.sampling.temperature = p.sampling().temperature();
    w.sampling.top_k = p.sampling().top_k();
    w.sampling.top_p = p.sampling().top_p();
    w.seed = p.sampling().seed();
    w.logprobs = p.logprobs();
    w.top_logprobs = p.top_logprobs();
    w.targets.assign(p.targets().begin(), p.targets().end());
    if (p.has_fork_from()) w.fork_from = p.fork_from();
    w.feed_sampled = p.feed_sampled();
    if (w.feed_sampled &&
        (!w.tokens.empty() || w.output != WorkOutput::kSample || w.start || w.fork_from)) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", plan.step_id(), ": sequence ", p.sequence_id(),
                       " feeds its sampled token but also has tokens, another output than a "
                       "sample, or starts"));
    }
    step.work.push_back(std::move(w));
  }
  return step;
}

void ResultToProto(const StepResult& result, v1::StepResult* proto) {
  proto->set_step_id(result.step_id);
  proto->set_error(result.error);
  proto->set_wall_s(result.wall_s);
  proto->mutable_stage_compute_s()->Add(result.stage_compute_s.begin(),
                                        result.stage_compute_s.end());
  proto->set_live_sequences(result.live_sequences);
  proto->set_kda_state_bytes(result.kda_state_bytes);
  proto->set_mla_cache_bytes(result.mla_cache_bytes);
  for (const SequenceResult& r : result.outputs) {
    v1::SequenceOutput* out = proto->add_outputs();
    out->set_sequence_id(r.sequence_id);
    out->set_token(r.token);
    out->set_logprob(r.logprob);
    out->mutable_top_ids()->Add(r.top_ids.begin(), r.top_ids.end());
    out->mutable_top_logprobs()->Add(r.top_logprobs.begin(), r.top_logprobs.end());
    out->mutable_target_logprobs()->Add(r.target_logprobs.begin(), r.target_logprobs.end());
    out->set_error(r.error);
  }
}

StepResult ResultFromProto(const v1::StepResult& proto) {
  StepResult result;
  result.step_id = proto.step_id();
  result.error = proto.error();
  result.wall_s = proto.wall_s();
  result.stage_compute_s.assign(proto.stage_compute_s().begin(), proto.stage_compute_s().end());
  result.live_sequences = proto.live_sequences();
  result.kda_state_bytes = proto.kda_state_bytes();
  result.mla_cache_bytes = proto.mla_cache_bytes();
  for (const auto& out : proto.outputs()) {
    SequenceResult r;
    r.sequence_id = out.sequence_id();
    r.token = out.token();
    r.logprob = out.logprob();
    r.top_ids.assign(out.top_ids().begin(), out.top_ids().end());
    r.top_logprobs.assign(out.top_logprobs().begin(), out.top_logprobs().end());
    r.target_logprobs.assign(out.target_logprobs().begin(), out.target_logprobs().end());
    r.error = out.error();
    result.outputs.push_back(std::move(r));
  }
  return result;
}

v1::WorkerHello MakeWorkerHello(const ModelConfig& config, const WorldLayout& layout,
                                const std::string& description, StatePoolSize state,
                                StateUnitBytes unit) {
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
  h.set_cache_pages(state.pages);
  h.set_state_slots(state.slots);
  h.set_page_bytes(unit.page);
  h.set_slot_bytes(unit.slot);
  return h;
}

WorkerInfo InfoFromHello(const v1::WorkerHello& hello) {
  WorkerInfo info;
  info.replicas = hello.replicas();
  info.pipeline_stages = hello.pipeline_stages();
  info.tensor_parallel = hello.tensor_parallel();
  info.description = hello.description();
  info.config_json = hello.config_json();
  info.cache_pages = hello.cache_pages();
  info.state_slots = hello.state_slots();
  info.unit_bytes = {hello.page_bytes(), hello.slot_bytes()};
  return info;
}

}  // namespace deltaserve
