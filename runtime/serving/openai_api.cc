#include "runtime/serving/openai_api.h"

#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "runtime/common/json_reader.h"
#include "runtime/serving/request_json.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

// The legacy completions API returns at most 5 alternatives; this server's
// limit (kMaxTopLogprobs, checked by the validator) is the larger.
constexpr int64_t kMaxLegacyLogprobs = 20;

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool AllIntegers(const json& list) {
  for (const json& v : list) {
    if (!v.is_number_integer()) return false;
  }
  return true;
}

// The completions API's prompt: a string, token ids, or a list of one of
// either (a list of several asks for several completions in one request).
void ReadPrompt(const json* v, JsonFields& f, PromptInput* out) {
  if (v == nullptr) {
    f.Fail("prompt", "missing: give text or token ids");
    return;
  }
  if (v->is_string()) {
    *out = PromptInput::Text(v->get<std::string>());
    return;
  }
  if (!v->is_array()) {
    f.Fail("prompt", "must be a string or a list of token ids");
    return;
  }
  if (v->empty()) {
    f.Fail("prompt", "empty");
    return;
  }
  if (AllIntegers(*v)) {
    if (auto ids = f.Ids(*v, "prompt")) *out = PromptInput::Ids(std::move(*ids));
    return;
  }
  if (v->size() > 1) {
    f.Fail("prompt", absl::StrCat(v->size(), " prompts: this server completes one per request"));
    return;
  }
  const json& only = (*v)[0];
  if (only.is_string()) {
    *out = PromptInput::Text(only.get<std::string>());
  } else if (only.is_array() && AllIntegers(only)) {
    if (auto ids = f.Ids(only, "prompt[0]")) *out = PromptInput::Ids(std::move(*ids));
  } else {
    f.Fail("prompt[0]", "must be a string or a list of token ids");
  }
}

// OpenAI's parameters of each endpoint, and this server's extensions (top_k,
// ignore_eos, stop_token_ids, return_tokens_as_token_ids, cache_salt), as vLLM and
// SGLang take them: those both endpoints share (ReadCommon reads them), and
// each one's own.
bool KnownField(OpenAiEndpoint endpoint, const std::string& key) {
  static const std::set<std::string> shared = {"model",
                                               "max_tokens",
                                               "temperature",
                                               "top_p",
                                               "n",
                                               "stream",
                                               "stream_options",
                                               "logprobs",
                                               "stop",
                                               "presence_penalty",
                                               "frequency_penalty",
                                               "logit_bias",
                                               "user",
                                               "seed",
                                               "top_k",
                                               "ignore_eos",
                                               "stop_token_ids",
                                               "return_tokens_as_token_ids",
                                               "cache_salt"};
  static const std::set<std::string> completions = {"prompt", "echo", "best_of", "suffix"};
  static const std::set<std::string> chat = {
      "messages",    "max_completion_tokens", "top_logprobs",    "tools",
      "tool_choice", "parallel_tool_calls",   "response_format", "chat_template_kwargs"};
  return shared.count(key) > 0 ||
         (endpoint == OpenAiEndpoint::kChat ? chat : completions).count(key) > 0;
}

// What both endpoints share.
void ReadCommon(const json& o, JsonFields& f, uint64_t random_seed, OpenAiRequest* req) {
  GenerateInput& in = req->input;
  if (auto model = f.String("model")) {
    req->model = *model;
  } else if (f.error().ok()) {
    f.Fail("model", "missing: give the model's name (GET /v1/models lists it)");
  }
  // OpenAI's defaults: sampling at temperature 1, unseeded.
  in.temperature = f.Number("temperature").value_or(1.0);
  in.top_p = f.Number("top_p");
  if (auto k = f.Integer("top_k")) in.top_k = *k;
  if (auto seed = f.Integer("seed")) {
    in.seed = static_cast<uint64_t>(*seed);
  } else {
    in.seed = random_seed;
  }
  f.Unsupported("n", 1, "this server makes one choice per request");
  f.Unsupported("presence_penalty", 0, "penalties are not supported; leave it at 0");
  f.Unsupported("frequency_penalty", 0, "penalties are not supported; leave it at 0");
  f.Unsupported("logit_bias", json::object(), "logit_bias is not supported");
  if (const json* u = f.Get("user"); u != nullptr && !u->is_string()) {
    f.Fail("user", "must be a string");
  }
  if (auto salt = f.String("cache_salt")) in.cache_salt = *salt;
  req->stream = f.Bool("stream").value_or(false);
  if (const json* so = f.Get("stream_options")) {
    if (!req->stream) {
      f.Fail("stream_options", "only allowed when stream is true");
    } else if (!so->is_object()) {
      f.Fail("stream_options", "must be an object");
    } else {
      for (const auto& [key, value] : so->items()) {
        if (key != "include_usage") {
          f.Fail(absl::StrCat("stream_options.", key), "not a stream option");
        } else if (!value.is_boolean()) {
          f.Fail("stream_options.include_usage", "must be true or false");
        } else {
          req->include_usage = value.get<bool>();
        }
      }
    }
  }
  ReadStops(f, &in);
  in.ignore_eos = f.Bool("ignore_eos").value_or(false);
  req->tokens_as_ids = f.Bool("return_tokens_as_token_ids").value_or(false);
  if (auto max = f.Integer("max_tokens")) in.max_tokens = *max;
  (void)o;
}

// The chat endpoint's own parameters: the conversation, its tools and the
// template's switches, and the chat form of logprobs.
void ReadChat(JsonFields& f, OpenAiRequest* req) {
  GenerateInput& in = req->input;
  ChatRequest chat;
  ReadConversation(f, &chat);
  if (const json* choice = f.Get("tool_choice")) {
    // "none" leaves the tools out of the prompt; "auto" lets the model
    // choose. Forcing a call needs constrained decoding, which this server
    // does not do.
    if (*choice == "none") {
      chat.tools_json.clear();
    } else if (*choice != "auto") {
      f.Fail("tool_choice",
             absl::StrCat(ShownJson(*choice), ": only \"auto\" and \"none\" are supported"));
    }
  }
  if (const json* parallel = f.Get("parallel_tool_calls");
      parallel != nullptr && !parallel->is_boolean()) {
    f.Fail("parallel_tool_calls", "must be true or false");
  }
  if (const json* format = f.Get("response_format")) {
    if (!format->is_object() || format->value("type", json()) != "text" || format->size() != 1) {
      f.Fail("response_format",
             absl::StrCat(ShownJson(*format), ": only {\"type\": \"text\"} is supported"));
    }
  }
  // max_completion_tokens is the current name, max_tokens the deprecated
  // one; unset, the reply may run to the end of the context.
  if (auto max = f.Integer("max_completion_tokens")) in.max_tokens = *max;
  in.max_tokens_to_context =
      f.Get("max_completion_tokens") == nullptr && f.Get("max_tokens") == nullptr;
  if (auto lp = f.Bool("logprobs")) {
    req->logprobs = *lp;
    in.logprobs = *lp;
  }
  if (auto top = f.Integer("top_logprobs")) {
    if (!req->logprobs && *top > 0) {
      f.Fail("top_logprobs", "needs logprobs: true");
    } else {
      in.top_logprobs = *top;
    }
  }
  in.prompt = PromptInput::Chat(std::move(chat));
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, std::string_view body,
                                                 uint64_t random_seed, int64_t max_values) {
  // Deep enough for a tool's JSON-schema parameters.
  absl::StatusOr<json> parsed = ParseJson(body, JsonLimits{32, max_values, "the body"});
  if (!parsed.ok()) return parsed.status();
  const json& o = *parsed;
  if (!o.is_object()) return absl::InvalidArgumentError("the body: not a JSON object");
  for (const auto& [key, value] : o.items()) {
    if (!KnownField(endpoint, key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, ": not a parameter this server takes (",
          endpoint == OpenAiEndpoint::kChat ? "/v1/chat/completions" : "/v1/completions", ")"));
    }
  }
  OpenAiRequest req;
  req.endpoint = endpoint;
  JsonFields f(o);
  ReadCommon(o, f, random_seed, &req);
  GenerateInput& in = req.input;
  if (endpoint == OpenAiEndpoint::kCompletions) {
    ReadPrompt(f.Get("prompt"), f, &in.prompt);
    f.Unsupported("echo", false, "echoing the prompt is not supported");
    f.Unsupported("best_of", 1, "this server makes one choice per request");
    f.Unsupported("suffix", "", "suffixes are not supported");
    if (const json* lp = f.Get("logprobs")) {
      auto n = f.IntegerOf(lp, "logprobs");
      if (n && (*n < 0 || *n > kMaxLegacyLogprobs)) {
        f.Fail("logprobs", absl::StrCat(*n, ": must be in [0, ", kMaxLegacyLogprobs, "]"));
      } else if (n) {
        req.logprobs = true;
        in.logprobs = true;
        in.top_logprobs = *n;
      }
    }
  } else {
    ReadChat(f, &req);
  }
  if (!f.error().ok()) return f.error();
  return req;
}

std::string FinishReasonName(FinishReason reason) {
  return reason == FinishReason::kStop ? "stop" : "length";
}

namespace {

// A token's own text: its bytes, with what is not UTF-8 replaced when
// dumped; "token_id:ID" with return_tokens_as_token_ids (or no tokenizer).
std::string TokenText(const OpenAiRequest& req, const Tokenizer* tokenizer, int32_t id) {
  if (req.tokens_as_ids || tokenizer == nullptr) return absl::StrCat("token_id:", id);
  auto bytes = tokenizer->TokenBytes(id);
  return bytes.ok() ? *bytes : "";
}

json LegacyLogprobs(const OpenAiRequest& req, const OpenAiTokens& out, const Tokenizer* tokenizer,
                    int64_t text_offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  int64_t offset = text_offset;
  for (const TokenEvent& e : out.tokens) {
    tokens.push_back(TokenText(req, tokenizer, e.id));
    lps.push_back(e.logprob);
    json top = json::object();
    for (size_t i = 0; i < e.top_ids.size(); ++i) {
      top[TokenText(req, tokenizer, e.top_ids[i])] = e.top_logprobs[i];
    }
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(e.text.size());
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

json Bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

json ChatLogprobs(const OpenAiRequest& req, const OpenAiTokens& out, const Tokenizer* tokenizer) {
  json content = json::array();
  for (const TokenEvent& e : out.tokens) {
    const std::string text = TokenText(req, tokenizer, e.id);
    json top = json::array();
    for (size_t i = 0; i < e.top_ids.size(); ++i) {
      const std::string alt = TokenText(req, tokenizer, e.top_ids[i]);
      top.push_back({{"token", alt}, {"logprob", e.top_logprobs[i]}, {"bytes", Bytes(alt)}});
    }
    content.push_back({{"token", text},
                       {"logprob", e.logprob},
                       {"bytes", Bytes(text)},
                       {"top_logprobs", std::move(top)}});
  }
  return json{{"content", std::move(content)}};
}

json Usage(const RequestOutcome& outcome) {
  return json{{"prompt_tokens", outcome.prompt_tokens},
              {"completion_tokens", outcome.completion_tokens},
              {"total_tokens", outcome.prompt_tokens + outcome.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", outcome.cached_tokens}}}};
}

json Head(const OpenAiResponseId& id, const char* object) {
  return json{{"id", id.id}, {"object", object}, {"created", id.created}, {"model", id.model}};
}

}  // namespace

std::string CompletionResponse(const OpenAiRequest& req, const OpenAiResponseId& id,
                               const OpenAiTokens& out, const RequestOutcome& outcome,
                               const Tokenizer* tokenizer) {
  const bool chat = req.endpoint == OpenAiEndpoint::kChat;
  json choice = {{"index", 0}, {"finish_reason", FinishReasonName(outcome.reason)}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", out.text}};
    choice["logprobs"] = req.logprobs ? ChatLogprobs(req, out, tokenizer) : json(nullptr);
  } else {
    choice["text"] = out.text;
    choice["logprobs"] = req.logprobs ? LegacyLogprobs(req, out, tokenizer, 0) : json(nullptr);
  }
  json response = Head(id, chat ? "chat.completion" : "text_completion");
  response["choices"] = json::array({std::move(choice)});
  response["usage"] = Usage(outcome);
  return Dump(response);
}

std::string CompletionChunk(const OpenAiRequest& req, const OpenAiResponseId& id,
                            const OpenAiTokens& out, int64_t text_offset, bool first,
                            const std::string* finish, const Tokenizer* tokenizer) {
  const bool chat = req.endpoint == OpenAiEndpoint::kChat;
  json choice = {{"index", 0}, {"finish_reason", finish ? json(*finish) : json(nullptr)}};
  const bool with_logprobs = req.logprobs && !out.tokens.empty();
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!out.text.empty() || finish == nullptr) delta["content"] = out.text;
    choice["delta"] = std::move(delta);
    choice["logprobs"] = with_logprobs ? ChatLogprobs(req, out, tokenizer) : json(nullptr);
  } else {
    choice["text"] = out.text;
    choice["logprobs"] =
        with_logprobs ? LegacyLogprobs(req, out, tokenizer, text_offset) : json(nullptr);
  }
  json chunk = Head(id, chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array({std::move(choice)});
  return Dump(chunk);
}

std::string UsageChunk(const OpenAiRequest& req, const OpenAiResponseId& id,
                       const RequestOutcome& outcome) {
  json chunk =
      Head(id, req.endpoint == OpenAiEndpoint::kChat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array();
  chunk["usage"] = Usage(outcome);
  return Dump(chunk);
}

namespace {

json ToolCalls(const std::vector<ChatToolCall>& calls, bool indexed) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json call = {{"id", calls[i].id.empty() ? absl::StrCat("call_", i) : calls[i].id},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) call["index"] = i;
    out.push_back(std::move(call));
  }
  return out;
}

std::string ChatFinishReason(const ChatReply& reply, FinishReason reason) {
  if (!reply.tool_calls.empty() && reason == FinishReason::kStop) return "tool_calls";
  return FinishReasonName(reason);
}

}  // namespace

std::string ChatResponse(const OpenAiRequest& req, const OpenAiResponseId& id,
                         const ChatReply& reply, const OpenAiTokens& out,
                         const RequestOutcome& outcome, const Tokenizer* tokenizer) {
  json message = {
      {"role", "assistant"},
      {"content",
       reply.content.empty() && !reply.tool_calls.empty() ? json(nullptr) : json(reply.content)}};
  if (!reply.reasoning_content.empty()) message["reasoning_content"] = reply.reasoning_content;
  if (!reply.tool_calls.empty()) message["tool_calls"] = ToolCalls(reply.tool_calls, false);
  json choice = {{"index", 0},
                 {"message", std::move(message)},
                 {"logprobs", req.logprobs ? ChatLogprobs(req, out, tokenizer) : json(nullptr)},
                 {"finish_reason", ChatFinishReason(reply, outcome.reason)}};
  json response = Head(id, "chat.completion");
  response["choices"] = json::array({std::move(choice)});
  response["usage"] = Usage(outcome);
  return Dump(response);
}

std::vector<std::string> ChatStream::Deltas(const ChatReply& reply,
                                            std::vector<TokenEvent> tokens) {
  json delta = json::object();
  if (first_) delta["role"] = "assistant";
  // Sent only while it extends what was sent: a parse that changes its mind
  // about earlier text (rare: a tag still incomplete) waits for more.
  auto extend = [&](const std::string& now, std::string& sent, const char* key) {
    if (now.size() > sent.size() && now.compare(0, sent.size(), sent) == 0) {
      delta[key] = now.substr(sent.size());
      sent = now;
    }
  };
  extend(reply.reasoning_content, sent_reasoning_, "reasoning_content");
  extend(reply.content, sent_content_, "content");
  const bool logprobs = req_.logprobs && !tokens.empty();
  if (delta.empty() && !logprobs) return {};
  first_ = false;
  OpenAiTokens out;
  out.tokens = std::move(tokens);
  json choice = {{"index", 0},
                 {"delta", std::move(delta)},
                 {"logprobs", logprobs ? ChatLogprobs(req_, out, tokenizer_) : json(nullptr)},
                 {"finish_reason", nullptr}};
  json chunk = Head(id_, "chat.completion.chunk");
  chunk["choices"] = json::array({std::move(choice)});
  return {Dump(chunk)};
}

std::vector<std::string> ChatStream::Update(const std::string& text,
                                            std::vector<TokenEvent> tokens) {
  absl::StatusOr<ChatReply> reply = format_.Parse(text, req_.input.prompt.chat.thinking);
  // Text that does not parse yet (a tool call begun) waits for the rest.
  if (!reply.ok()) reply = ChatReply();
  return Deltas(*reply, std::move(tokens));
}

absl::StatusOr<std::vector<std::string>> ChatStream::Finish(const std::string& text,
                                                            const RequestOutcome& outcome) {
  absl::StatusOr<ChatReply> reply = ParseReply(format_, text, req_.input.prompt.chat.thinking);
  if (!reply.ok()) return reply.status();
  std::vector<std::string> chunks = Deltas(*reply, {});
  json delta = json::object();
  if (first_) delta["role"] = "assistant";
  if (!reply->tool_calls.empty()) delta["tool_calls"] = ToolCalls(reply->tool_calls, true);
  json choice = {{"index", 0},
                 {"delta", std::move(delta)},
                 {"logprobs", nullptr},
                 {"finish_reason", ChatFinishReason(*reply, outcome.reason)}};
  json chunk = Head(id_, "chat.completion.chunk");
  chunk["choices"] = json::array({std::move(choice)});
  chunks.push_back(Dump(chunk));
  return chunks;
}

std::string ModelList(const std::string& model, int64_t created) {
  return Dump(json{{"object", "list"},
                   {"data", json::array({json{{"id", model},
                                              {"object", "model"},
                                              {"created", created},
                                              {"owned_by", "deltaserve"}}})}});
}

OpenAiError ErrorResponse(const absl::Status& status) {
  struct Mapping {
    absl::StatusCode code;
    int http_status;
    const char* type;
  };
  static constexpr Mapping kMappings[] = {
      {absl::StatusCode::kInvalidArgument, 400, "invalid_request_error"},
      {absl::StatusCode::kOutOfRange, 400, "invalid_request_error"},
      {absl::StatusCode::kFailedPrecondition, 400, "invalid_request_error"},
      {absl::StatusCode::kUnauthenticated, 401, "authentication_error"},
      {absl::StatusCode::kPermissionDenied, 403, "permission_error"},
      {absl::StatusCode::kNotFound, 404, "invalid_request_error"},
      {absl::StatusCode::kAlreadyExists, 409, "invalid_request_error"},
      {absl::StatusCode::kResourceExhausted, 429, "rate_limit_error"},
      {absl::StatusCode::kUnimplemented, 501, "server_error"},
      {absl::StatusCode::kUnavailable, 503, "server_error"},
      {absl::StatusCode::kDeadlineExceeded, 504, "server_error"},
  };
  OpenAiError e;
  const char* type = "server_error";
  for (const Mapping& m : kMappings) {
    if (m.code == status.code()) {
      e.http_status = m.http_status;
      type = m.type;
    }
  }
  const std::string message(status.message());
  json param = nullptr;
  // The validators' errors start with the field: "temperature: -1: ...".
  if (e.http_status == 400) {
    const size_t colon = message.find(": ");
    if (colon != std::string::npos && colon > 0 &&
        message.find_first_not_of("abcdefghijklmnopqrstuvwxyz_.[]0123456789") >= colon) {
      param = message.substr(0, colon);
    }
  }
  e.body = Dump(
      json{{"error", {{"message", message}, {"type", type}, {"param", param}, {"code", nullptr}}}});
  return e;
}

}  // namespace deltaserve
