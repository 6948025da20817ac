#include "runtime/serving/grpc_request.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace deltaserve {
namespace {

// A request model integer in a proto's int32: one out of its range is held
// at the nearest end, which the server's checks then refuse as out of range
// (no value past int32 is valid anywhere it is used).
int32_t Int32(int64_t v) {
  return static_cast<int32_t>(std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
}

ChatToolCall FromProto(const v1::ChatToolCall& call) {
  return ChatToolCall{call.id(), call.name(), call.arguments()};
}

ChatRequest FromProto(const v1::Chat& chat) {
  ChatRequest out;
  out.messages.reserve(chat.messages_size());
  for (const v1::ChatMessage& m : chat.messages()) {
    ChatMessage message;
    message.role = m.role();
    message.content = m.content();
    message.reasoning_content = m.reasoning_content();
    for (const v1::ChatToolCall& call : m.tool_calls()) {
      message.tool_calls.push_back(FromProto(call));
    }
    message.tool_call_id = m.tool_call_id();
    message.name = m.name();
    out.messages.push_back(std::move(message));
  }
  out.tools_json = chat.tools_json();
  if (chat.has_thinking()) out.thinking = chat.thinking();
  out.thinking_effort = chat.thinking_effort();
  return out;
}

// Both requests' text or token ids.
template <typename Req>
PromptInput TextOrIds(const Req& req) {
  if (req.has_text()) return PromptInput::Text(req.text());
  if (req.has_tokens()) {
    const auto& ids = req.tokens().ids();
    return PromptInput::Ids(std::vector<int64_t>(ids.begin(), ids.end()));
  }
  return PromptInput();
}

template <typename Req>
void SetTextOrIds(const PromptInput& input, Req* req) {
  if (input.form == PromptInput::Form::kText) {
    req->set_text(input.text);
  } else if (input.form == PromptInput::Form::kIds) {
    auto* ids = req->mutable_tokens()->mutable_ids();
    ids->Reserve(static_cast<int>(input.ids.size()));
    for (int64_t id : input.ids) ids->Add(Int32(id));
  } else if (input.form == PromptInput::Form::kChat) {
    ToProto(input.chat, req->mutable_chat());
  }
}

void ToProto(const ChatToolCall& call, v1::ChatToolCall* out) {
  out->set_id(call.id);
  out->set_name(call.name);
  out->set_arguments(call.arguments);
}

}  // namespace

void ToProto(const ChatRequest& chat, v1::Chat* out) {
  for (const ChatMessage& m : chat.messages) {
    v1::ChatMessage* message = out->add_messages();
    message->set_role(m.role);
    message->set_content(m.content);
    message->set_reasoning_content(m.reasoning_content);
    for (const ChatToolCall& call : m.tool_calls) ToProto(call, message->add_tool_calls());
    message->set_tool_call_id(m.tool_call_id);
    message->set_name(m.name);
  }
  out->set_tools_json(chat.tools_json);
  out->set_thinking(chat.thinking);
  out->set_thinking_effort(chat.thinking_effort);
}

void ToProto(const ChatReply& reply, v1::ChatReply* out) {
  out->set_content(reply.content);
  out->set_reasoning_content(reply.reasoning_content);
  for (const ChatToolCall& call : reply.tool_calls) ToProto(call, out->add_tool_calls());
}

ChatReply FromProto(const v1::ChatReply& reply) {
  ChatReply out;
  out.content = reply.content();
  out.reasoning_content = reply.reasoning_content();
  for (const v1::ChatToolCall& call : reply.tool_calls()) out.tool_calls.push_back(FromProto(call));
  return out;
}

GenerateInput FromProto(const v1::GenerateRequest& req) {
  GenerateInput in;
  in.request_id = req.request_id();
  in.prompt = req.has_chat() ? PromptInput::Chat(FromProto(req.chat())) : TextOrIds(req);
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
  in.cache_prefix_tokens = req.cache_prefix_tokens();
  in.cache_salt = req.cache_salt();
  return in;
}

ScoreInput FromProto(const v1::ScoreRequest& req) {
  ScoreInput in;
  in.request_id = req.request_id();
  if (req.has_chat()) {
    // Scored as it stands: no generation prompt after its last message.
    in.input = PromptInput::Chat(FromProto(req.chat()));
    in.input.chat.add_generation_prompt = false;
  } else {
    in.input = TextOrIds(req);
  }
  return in;
}

v1::GenerateRequest ToProto(const GenerateInput& in) {
  v1::GenerateRequest req;
  req.set_request_id(in.request_id);
  SetTextOrIds(in.prompt, &req);
  v1::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(static_cast<float>(in.temperature));
  s->set_top_k(Int32(in.top_k));
  if (in.top_p.has_value()) s->set_top_p(static_cast<float>(*in.top_p));
  s->set_seed(in.seed);
  req.set_max_tokens(Int32(in.max_tokens));
  for (const std::string& stop : in.stop) req.add_stop(stop);
  for (int64_t id : in.stop_token_ids) req.add_stop_token_ids(Int32(id));
  req.set_logprobs(in.logprobs);
  req.set_top_logprobs(Int32(in.top_logprobs));
  req.set_ignore_eos(in.ignore_eos);
  req.set_cache_prefix_tokens(Int32(in.cache_prefix_tokens));
  req.set_cache_salt(in.cache_salt);
  return req;
}

v1::ScoreRequest ToProto(const ScoreInput& in) {
  v1::ScoreRequest req;
  req.set_request_id(in.request_id);
  SetTextOrIds(in.input, &req);
  return req;
}

}  // namespace deltaserve
