#include "runtime/serving/grpc_request.h"

namespace deltaserve {
namespace {

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
  return in;
}

ScoreInput FromProto(const v1::ScoreRequest& req) {
  ScoreInput in;
  in.request_id = req.request_id();
  in.input = TextOrIds(req);
  return in;
}

}  // namespace deltaserve
