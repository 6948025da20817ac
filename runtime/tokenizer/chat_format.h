// Chat formats: OpenAI-style messages -> the prompt a model was trained on,
// and the text it generates -> content, reasoning and tool calls. One
// implementation per model family (chat_kimi_k3.cc, chat_kimi_linear.cc),
// each reproducing its published Jinja chat template exactly as transformers
// renders it (tests/data/chat/ holds the templates and their renderings, the
// test's oracle), but returning the prompt as segments: ordinary text and the
// special tokens the template itself wrote. Encoding ordinary segments with
// special tokens disallowed keeps a user who types "<|im_end|>" from ending
// a turn: the text is the template's, the token ids are not spoofable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

struct ChatToolCall {
  std::string id;         // the client's; Kimi K3 generates none (empty)
  std::string name;       // the function's
  std::string arguments;  // JSON text (an object), as in the OpenAI API
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::string reasoning_content;         // assistant only
  std::vector<ChatToolCall> tool_calls;  // assistant only
  std::string tool_call_id;              // tool only
  std::string name;                      // optional; empty: none
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  std::string tools_json;  // the OpenAI `tools` array as JSON text; empty: none
  bool add_generation_prompt = true;
  // Kimi K3's thinking switch (the template's default: on); Kimi Linear has
  // none and ignores it.
  bool thinking = true;
  // Kimi K3 with thinking on: "low", "high" or "max"; empty: the template's
  // default, "max". Ignored otherwise.
  std::string thinking_effort;
};

// A piece of a rendering: text encoded as ordinary text, or one special token.
struct ChatSegment {
  std::string text;
  bool special = false;
};

// What an assistant turn said.
struct ChatReply {
  std::string content;
  std::string reasoning_content;
  std::vector<ChatToolCall> tool_calls;
};

// Implementations are immutable: every method is safe to call from many
// threads at once.
class ChatFormat {
 public:
  virtual ~ChatFormat() = default;
  // "kimi_k3" or "kimi_linear".
  virtual std::string name() const = 0;
  // The prompt, adjacent ordinary text merged into one segment. InvalidArgument
  // naming the message and field for what the template would refuse or
  // cannot express (an unknown role, a tool call without a name, tool-call
  // arguments that are not JSON where the format needs an object).
  virtual absl::StatusOr<std::vector<ChatSegment>> Render(const ChatRequest& request) const = 0;
  // The text generated after Render's generation prompt (a trailing end token
  // may be there or not) -> content / reasoning / tool calls. `thinking`: the
  // request's, which decides what the generation prompt left open. A tool
  // call that does not parse, or text where the format allows none, is
  // InvalidArgument naming what is wrong, never silently content. Text is
  // matched as text: ordinary text that spells a special token reads as one.
  virtual absl::StatusOr<ChatReply> Parse(std::string_view generated, bool thinking) const = 0;
  // The special tokens (text) that end an assistant turn, for stop ids.
  virtual std::vector<std::string> end_tokens() const = 0;
};

// `format`'s Parse of a reply the model generated, where a text the format
// cannot read is the server's failure, not the client's: INTERNAL, "the
// model's reply does not parse as its chat format: ...", the same from every
// front end (gRPC, HTTP, batch).
absl::StatusOr<ChatReply> ParseReply(const ChatFormat& format, std::string_view generated,
                                     bool thinking);

// The segments' text, concatenated: what the Jinja template renders.
std::string RenderText(const std::vector<ChatSegment>& segments);

// Encodes each segment: ordinary segments with allow_special=false (so user
// text never becomes a special token); a special one must encode to exactly
// one id, else FailedPrecondition naming the token (the tokenizer does not
// belong to this format).
absl::StatusOr<std::vector<int32_t>> EncodeChat(const std::vector<ChatSegment>& segments,
                                                const Tokenizer& tokenizer);

// Picks the format from a model directory's tokenizer files: the chat
// template (tokenizer_config.json's chat_template, or chat_template.jinja)
// when it names one, else tokenizer_config.json's added tokens. `<|open|>` and
// `<|sep|>`: kimi_k3; `<|im_user|>` and `<|im_middle|>`: kimi_linear (K3 is
// looked for first: its tokenizer may carry the older tokens too). NotFound
// naming the directory when neither; InvalidArgument for a malformed file.
absl::StatusOr<std::unique_ptr<ChatFormat>> LoadChatFormat(const std::string& model_dir);

// The formats by name ("kimi_k3", "kimi_linear"); NotFound for another.
absl::StatusOr<std::unique_ptr<ChatFormat>> NewChatFormat(std::string_view name);

// Bounds on ParseChatMessages' input.
inline constexpr int64_t kMaxChatMessages = 4096;
inline constexpr int64_t kMaxChatTools = 128;                    // OpenAI's limit
inline constexpr int64_t kMaxChatTextBytes = int64_t{64} << 20;  // all strings together
inline constexpr int64_t kMaxChatJsonBytes = int64_t{128} << 20;

// The OpenAI `messages` array (JSON text) -> ChatMessages. InvalidArgument
// naming the field for anything malformed, e.g.
//   messages[2].role: "robot" is not one of system, user, assistant, tool
//   messages[1].content[0].type: image_url: this model takes text only
// content is a string (null for an assistant) or an array of
// {"type": "text", "text": ...} parts, which are concatenated; image, audio,
// video and file parts are refused by name. tool_calls and reasoning_content
// belong to assistant messages, tool_call_id to tool messages; a field the
// API does not define is refused unless null. At most kMaxChatMessages
// messages, kMaxChatTextBytes of strings in all, kMaxChatJsonBytes of JSON.
absl::StatusOr<std::vector<ChatMessage>> ParseChatMessages(std::string_view json_text);

}  // namespace deltaserve
