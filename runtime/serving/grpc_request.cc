#include "runtime/serving/grpc_request.h"

namespace deltaserve {
namespace {

template <typename Req>
PromptInput Prompt(const Req& req) {
  if (req.has_text()) return PromptInput::Text(req.text());
  if (req.has_tokens()) {
    const auto& ids = req.tokens().ids();
    return PromptInput::Ids(std::vector<int64_t>(ids.begin(), ids.end()));
  }
  return PromptInput();
}

}  // namespace

GenerateInput FromProto(const v1::GenerateRequest& req) {
  GenerateInput in;
  in.request_id = req.request_id();
  in.prompt = Prompt(req);
  const v1::SamplingParams& s = req.sampling();
  in.temperature = s.temperature();
  in.top_k = s.top_k();
  if (s.has_top_p()) in.top_p = s.top_p();
  in.seed = s.seed();
  in.max_tokens = req.max_tokens();
  in.stop.assign(req.stop().begin(), req.stop().end());
  in.stop_token_ids.assign(req.stop_token_ids().begin(), req.stop_token_ids().end());
  in.logprobs = req.logprobs();
  in.top_logprobs = req.top_logprobs();
  in.ignore_eos = req.ignore_eos();
  return in;
}

ScoreInput FromProto(const v1::ScoreRequest& req) {
  ScoreInput in;
  in.request_id = req.request_id();
  in.input = Prompt(req);
  return in;
}

}  // namespace deltaserve
