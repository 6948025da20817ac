// The OpenAI API's JSON, mapped onto the request model (request.h) and back:
// the bodies of POST /v1/completions and /v1/chat/completions become a
// GenerateInput plus what only HTTP asks (streaming, the shape of
// logprobs); results become OpenAI's response objects, server-sent-event
// chunks and error objects. The transport is http_api.h; docs/api.md is the
// user's side. Pure functions of their arguments: tested without a server.
//
// What is refused by name rather than ignored: a parameter the runtime
// does not implement (n > 1, best_of > 1, echo, suffix, penalties other than
// 0, logit_bias, a response_format other than text, tool_choice "required"
// or a named function), and any field OpenAI does not define, except the
// extensions top_k, ignore_eos, stop_token_ids, return_tokens_as_token_ids
// and chat_template_kwargs (as vLLM takes them).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/serving/coordinator.h"
#include "runtime/serving/request.h"
#include "runtime/tokenizer/chat_format.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

enum class OpenAiEndpoint { kCompletions, kChat };

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;
  GenerateInput input;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Completions: `logprobs` N asks for N alternatives per token (legacy
  // form); chat: `logprobs` true, with `top_logprobs` alternatives.
  bool logprobs = false;
  // Log-probs name tokens "token_id:ID" rather than by their text (vLLM's
  // extension): exact where a token's bytes are not text.
  bool tokens_as_ids = false;
};

// The body of a request to `endpoint`: JSON of at most the transport's
// limit, holding at most `max_values` JSON values. INVALID_ARGUMENT naming
// the parameter ("n: 2: ...") for anything malformed or unsupported; the
// values' ranges are the validator's (request_validation.h). When the
// request gives no seed, `random_seed` is its seed (OpenAI's sampling is
// not reproducible unless seeded).
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, std::string_view body,
                                                 uint64_t random_seed, int64_t max_values);

// What identifies one response's objects.
struct OpenAiResponseId {
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// The generated tokens' text and log-probs, as the response carries them.
struct OpenAiTokens {
  std::string text;
  std::vector<TokenEvent> tokens;  // with logprobs only
};

// "stop" or "length" (OpenAI's values; a model's context reached is
// "length").
std::string FinishReasonName(FinishReason reason);

// The non-streamed response object.
std::string CompletionResponse(const OpenAiRequest& req, const OpenAiResponseId& id,
                               const OpenAiTokens& out, const RequestOutcome& outcome,
                               const Tokenizer* tokenizer);

// One server-sent event's data (without "data: " and the blank line): a
// chunk with `out`, whose text starts `text_offset` bytes into the
// completion (the first chat chunk also says role "assistant"), or, with
// `finish`, the last chunk of the choice. UsageChunk: the final chunk of
// stream_options.include_usage.
std::string CompletionChunk(const OpenAiRequest& req, const OpenAiResponseId& id,
                            const OpenAiTokens& out, int64_t text_offset, bool first,
                            const std::string* finish, const Tokenizer* tokenizer);
std::string UsageChunk(const OpenAiRequest& req, const OpenAiResponseId& id,
                       const RequestOutcome& outcome);

// A chat's reply, not streamed: the format's parse of what was generated
// (content, reasoning_content, tool_calls); finish_reason "tool_calls" when
// the reply calls tools.
std::string ChatResponse(const OpenAiRequest& req, const OpenAiResponseId& id,
                         const ChatReply& reply, const OpenAiTokens& out,
                         const RequestOutcome& outcome, const Tokenizer* tokenizer);

// A chat's reply, streamed: the generated text as it grows becomes delta
// chunks of reasoning_content and content, each sent once the format's
// parse of the text so far says what it is; tool calls come whole at the
// end, when they have parsed. Not thread-safe (one per stream).
class ChatStream {
 public:
  ChatStream(const OpenAiRequest& req, const OpenAiResponseId& id, const ChatFormat& format,
             const Tokenizer* tokenizer)
      : req_(req), id_(id), format_(format), tokenizer_(tokenizer) {}
  // The chunks (event data) for `text`, all that was generated so far, and
  // `tokens`, those made since the last call (for their log-probs).
  std::vector<std::string> Update(const std::string& text, std::vector<TokenEvent> tokens);
  // The last chunks: what is left, the tool calls and the finish.
  // ParseReply's INTERNAL when the reply does not parse (a malformed tool
  // call).
  absl::StatusOr<std::vector<std::string>> Finish(const std::string& text,
                                                  const RequestOutcome& outcome);

 private:
  std::vector<std::string> Deltas(const ChatReply& reply, std::vector<TokenEvent> tokens);

  const OpenAiRequest& req_;
  const OpenAiResponseId& id_;
  const ChatFormat& format_;
  const Tokenizer* tokenizer_;
  bool first_ = true;
  std::string sent_content_, sent_reasoning_;
};

// GET /v1/models.
std::string ModelList(const std::string& model, int64_t created);

// OpenAI's error object for `status`, and the HTTP status that goes with it
// (400 invalid, with `param` the field the message starts with; 401
// unauthenticated, 403, 404 not found, 409, 429 busy, 500, 501, 503
// unavailable, 504 deadline).
struct OpenAiError {
  int http_status = 500;
  std::string body;
};
OpenAiError ErrorResponse(const absl::Status& status);

}  // namespace deltaserve
