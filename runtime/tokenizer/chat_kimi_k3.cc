// Kimi K3's chat format, as tests/data/chat/Kimi-K3.jinja renders it: XTML
// tags whose markers <|open|> <|close|> <|sep|> are special tokens and whose
// names and attributes are ordinary text,
//   <|open|>message role="user"<|sep|>...<|close|>message<|sep|><|end_of_msg|>
// an assistant turn holding a think channel (with thinking on), a response
// channel and typed tool-call tags,
//   <|open|>call tool="f" index="1"<|sep|>
//   <|open|>argument key="k" type="number"<|sep|>2<|close|>argument<|sep|>
//   <|close|>call<|sep|>
// tool results that follow their calls' order, and a generation prompt that
// leaves the think (or response) channel open. Tools are declared as
// key-sorted compact JSON; with thinking on, a system message states the
// thinking effort. No default system prompt.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/common/status_macros.h"
#include "runtime/tokenizer/chat_format.h"
#include "runtime/tokenizer/chat_formats.h"

namespace deltaserve::chat_internal {
namespace {

constexpr std::string_view kOpen = "<|open|>";
constexpr std::string_view kClose = "<|close|>";
constexpr std::string_view kSep = "<|sep|>";
constexpr std::string_view kEndOfMsg = "<|end_of_msg|>";

// The tags as they read in generated text.
constexpr std::string_view kAssistantStart = "<|open|>message role=\"assistant\"<|sep|>";
constexpr std::string_view kThinkStart = "<|open|>think<|sep|>";
constexpr std::string_view kThinkEnd = "<|close|>think<|sep|>";
constexpr std::string_view kResponseStart = "<|open|>response<|sep|>";
constexpr std::string_view kResponseEnd = "<|close|>response<|sep|>";
constexpr std::string_view kToolsStart = "<|open|>tools<|sep|>";
constexpr std::string_view kToolsEnd = "<|close|>tools<|sep|>";
constexpr std::string_view kCallOpen = "<|open|>call";
constexpr std::string_view kCallEnd = "<|close|>call<|sep|>";
constexpr std::string_view kArgumentOpen = "<|open|>argument";
constexpr std::string_view kArgumentEnd = "<|close|>argument<|sep|>";
constexpr std::string_view kJsonOpen = "<|open|>json";
constexpr std::string_view kJsonEnd = "<|close|>json<|sep|>";
constexpr std::string_view kMessageEnd = "<|close|>message<|sep|>";

constexpr std::string_view kToolsPreamble =
    "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
constexpr std::string_view kEffortPreamble =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the "
    "system is invoked with `thinking_effort=";

using Attributes = std::vector<std::pair<std::string_view, std::string>>;

std::string EscapeAttribute(std::string_view value) {
  std::string out;
  for (const char c : value) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out += c;
    }
  }
  return out;
}

void OpenTag(SegmentBuilder& out, std::string_view tag, const Attributes& attributes = {}) {
  out.Special(kOpen);
  out.Text(tag);
  for (const auto& [key, value] : attributes) {
    out.Text(absl::StrCat(" ", View(key), "=\"", EscapeAttribute(value), "\""));
  }
  out.Special(kSep);
}

void CloseTag(SegmentBuilder& out, std::string_view tag) {
  out.Special(kClose);
  out.Text(tag);
  out.Special(kSep);
}

void EndMessage(SegmentBuilder& out) {
  CloseTag(out, "message");
  out.Special(kEndOfMsg);
}

// One Render call: the template's loop and its `state` namespace.
class Renderer {
 public:
  explicit Renderer(const ChatRequest& request) : request_(request) {}

  absl::StatusOr<std::vector<ChatSegment>> Run() {
    const std::string effort = request_.thinking_effort.empty() ? "max" : request_.thinking_effort;
    if (request_.thinking && effort != "low" && effort != "high" && effort != "max") {
      return absl::InvalidArgumentError(absl::StrCat(
          "thinking_effort: ", QuoteJson(Snippet(effort)), " is not one of low, high, max"));
    }
    if (!request_.tools_json.empty()) {
      DELTASERVE_ASSIGN_OR_RETURN(const std::optional<std::string> tools,
                                  ToolsJson(request_.tools_json, JsonStyle::kKimiK3Sorted));
      if (tools) {
        OpenTag(out_, "message", {{"role", "system"}, {"type", "tool-declare"}});
        out_.Text(absl::StrCat(View(kToolsPreamble), *tools, "\n```"));
        EndMessage(out_);
      }
    }
    if (request_.thinking) {
      OpenTag(out_, "message", {{"role", "system"}, {"type", "thinking-effort"}});
      out_.Text(absl::StrCat(View(kEffortPreamble), effort, "`."));
      EndMessage(out_);
    }
    const std::vector<ChatMessage>& messages = request_.messages;
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& message = messages[i];
      const std::string where = absl::StrCat("messages[", i, "]");
      if (message.role == "user" || message.role == "system") {
        OpenTag(out_, "message", RoleAttributes(message));
        out_.Text(message.content);
        EndMessage(out_);
      } else if (message.role == "assistant") {
        tool_calls_ = &message.tool_calls;
        tool_index_ = 0;
        OpenTag(out_, "message", RoleAttributes(message));
        DELTASERVE_RETURN_IF_ERROR(RenderAssistant(message, where));
        EndMessage(out_);
      } else if (message.role == "tool") {
        if (i > 0 && messages[i - 1].role == "tool") continue;  // rendered with its run
        size_t end = i;
        while (end < messages.size() && messages[end].role == "tool") ++end;
        DELTASERVE_RETURN_IF_ERROR(RenderToolRun(i, end));
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".role: ", QuoteJson(Snippet(message.role)),
                         " is not one of system, user, assistant, tool"));
      }
    }
    if (request_.add_generation_prompt) {
      OpenTag(out_, "message", {{"role", "assistant"}});
      OpenTag(out_, request_.thinking ? "think" : "response");
    }
    return out_.Take();
  }

 private:
  static Attributes RoleAttributes(const ChatMessage& message) {
    Attributes attributes = {{"role", message.role}};
    if (!message.name.empty()) attributes.emplace_back("name", message.name);
    return attributes;
  }

  absl::Status RenderAssistant(const ChatMessage& message, const std::string& where) {
    if (request_.thinking) {
      OpenTag(out_, "think");
      if (!IsPythonBlank(message.reasoning_content)) out_.Text(message.reasoning_content);
      CloseTag(out_, "think");
    }
    OpenTag(out_, "response");
    out_.Text(message.content);
    CloseTag(out_, "response");
    if (message.tool_calls.empty()) return absl::OkStatus();
    OpenTag(out_, "tools");
    for (size_t k = 0; k < message.tool_calls.size(); ++k) {
      const ChatToolCall& call = message.tool_calls[k];
      const std::string field = absl::StrCat(where, ".tool_calls[", k, "]");
      if (call.name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".function.name: required, a non-empty string"));
      }
      OpenTag(out_, "call", {{"tool", call.name}, {"index", absl::StrCat(k + 1)}});
      // As the serving stack hands arguments to the template: blank is {},
      // text that is not JSON is kept as a raw JSON block.
      if (!IsPythonBlank(call.arguments)) {
        const std::string arguments_field = absl::StrCat(field, ".function.arguments");
        DELTASERVE_ASSIGN_OR_RETURN(const ToolArguments arguments,
                                    ReadToolArguments(call.arguments, arguments_field));
        if (!arguments.is_json) {
          OpenTag(out_, "json", {{"type", "object"}});
          out_.Text(call.arguments);
          CloseTag(out_, "json");
        } else if (!arguments.is_object) {
          return absl::InvalidArgumentError(absl::StrCat(
              arguments_field, ": '", Snippet(call.arguments), "' is not a JSON object"));
        } else {
          for (const JsonMember& member : arguments.members) {
            OpenTag(out_, "argument", {{"key", member.key}, {"type", member.type}});
            out_.Text(member.value);
            CloseTag(out_, "argument");
          }
        }
      }
      CloseTag(out_, "call");
    }
    CloseTag(out_, "tools");
    return absl::OkStatus();
  }

  bool MatchesACall(const std::string& id) const {
    return !id.empty() && tool_calls_ != nullptr &&
           std::any_of(tool_calls_->begin(), tool_calls_->end(),
                       [&](const ChatToolCall& call) { return call.id == id; });
  }

  // Tool messages [first, end): in the order of the calls they answer when
  // every one names a call of the last assistant message, else as they come.
  absl::Status RenderToolRun(size_t first, size_t end) {
    const std::vector<ChatMessage>& messages = request_.messages;
    bool all_match = true;
    for (size_t i = first; i < end; ++i) {
      if (!MatchesACall(messages[i].tool_call_id)) all_match = false;
    }
    if (!all_match) {
      for (size_t i = first; i < end; ++i) DELTASERVE_RETURN_IF_ERROR(RenderTool(i, nullptr));
      return absl::OkStatus();
    }
    std::vector<std::string_view> emitted;
    for (const ChatToolCall& call : *tool_calls_) {
      if (call.id.empty() || std::find(emitted.begin(), emitted.end(), call.id) != emitted.end()) {
        continue;
      }
      emitted.push_back(call.id);
      for (size_t i = first; i < end; ++i) {
        if (messages[i].tool_call_id == call.id) {
          DELTASERVE_RETURN_IF_ERROR(RenderTool(i, &call.name));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status RenderTool(size_t i, const std::string* call_name) {
    const ChatMessage& message = request_.messages[i];
    ++tool_index_;
    std::string tool;
    if (call_name != nullptr) {
      tool = *call_name;
    } else if (!message.name.empty()) {
      tool = message.name;
    } else if (tool_calls_ != nullptr && tool_index_ <= tool_calls_->size()) {
      tool = (*tool_calls_)[tool_index_ - 1].name;
    }
    if (tool.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i,
          "]: a Kimi K3 tool message needs its tool's name: give `name`, or a tool_call_id of "
          "the last assistant message's tool calls, or answer them in order"));
    }
    OpenTag(out_, "message",
            {{"role", "tool"}, {"tool", tool}, {"index", absl::StrCat(tool_index_)}});
    out_.Text(message.content);
    EndMessage(out_);
    return absl::OkStatus();
  }

  const ChatRequest& request_;
  SegmentBuilder out_;
  const std::vector<ChatToolCall>* tool_calls_ = nullptr;  // the last assistant message's
  size_t tool_index_ = 0;                                  // tool messages since it
};

std::string UnescapeAttribute(std::string_view value) {
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value.substr(i, 6) == "&quot;") {
      out += '"';
      i += 5;
    } else if (value.substr(i, 5) == "&amp;") {
      out += '&';
      i += 4;
    } else {
      out += value[i];
    }
  }
  return out;
}

bool IsAttributeNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

// The ` key="value"` pairs of a tag, up to and past its <|sep|>.
absl::StatusOr<Attributes> ReadAttributes(TextReader& reader, const std::string& where) {
  bool found = false;
  const std::string_view header = reader.Until({kSep}, &found);
  if (!found) return absl::InvalidArgumentError(absl::StrCat(where, ": cut off inside a tag"));
  reader.Consume(kSep);
  const auto malformed = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": malformed tag attributes '", Snippet(header), "'"));
  };
  if (header.find(kOpen) != std::string_view::npos ||
      header.find(kClose) != std::string_view::npos) {
    return malformed();
  }
  Attributes attributes;
  size_t pos = 0;
  while (pos < header.size()) {
    if (header[pos] != ' ') return malformed();
    ++pos;
    const size_t name_start = pos;
    while (pos < header.size() && IsAttributeNameChar(header[pos])) ++pos;
    const std::string_view name = header.substr(name_start, pos - name_start);
    if (name.empty() || header.substr(pos, 2) != "=\"") return malformed();
    pos += 2;
    const size_t close = header.find('"', pos);
    if (close == std::string_view::npos) return malformed();
    attributes.emplace_back(name, UnescapeAttribute(header.substr(pos, close - pos)));
    pos = close + 1;
  }
  return attributes;
}

const std::string* FindAttribute(const Attributes& attributes, std::string_view name) {
  for (const auto& [key, value] : attributes) {
    if (key == name) return &value;
  }
  return nullptr;
}

// After <|open|>tools<|sep|>: the calls, through <|close|>tools<|sep|>.
absl::Status ReadToolCalls(TextReader& reader, std::vector<ChatToolCall>* calls) {
  for (size_t index = 1;; ++index) {
    if (reader.Consume(kToolsEnd)) return absl::OkStatus();
    std::string where = absl::StrCat("Kimi K3 reply: tool call ", index);
    if (reader.AtEnd()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Kimi K3 reply: cut off in the tool calls (no <|close|>tools<|sep|>)"));
    }
    if (!reader.Consume(kCallOpen)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected <|open|>call or <|close|>tools<|sep|>, got '",
                       Snippet(reader.Rest()), "'"));
    }
    DELTASERVE_ASSIGN_OR_RETURN(const Attributes call_attributes, ReadAttributes(reader, where));
    const std::string* tool = FindAttribute(call_attributes, "tool");
    if (tool == nullptr || tool->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the call names no tool"));
    }
    absl::StrAppend(&where, " (", *tool, ")");
    std::vector<std::pair<std::string, std::string>> members;  // key, JSON value
    std::optional<std::string> block;
    while (!reader.Consume(kCallEnd)) {
      if (reader.AtEnd()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": cut off (no <|close|>call<|sep|>)"));
      }
      const bool argument = reader.Consume(kArgumentOpen);
      if (!argument && !reader.Consume(kJsonOpen)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": expected <|open|>argument, <|open|>json or <|close|>call<|sep|>, got '",
            Snippet(reader.Rest()), "'"));
      }
      DELTASERVE_ASSIGN_OR_RETURN(const Attributes attributes, ReadAttributes(reader, where));
      bool found = false;
      const std::string_view value = reader.Until({argument ? kArgumentEnd : kJsonEnd}, &found);
      if (!found) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": cut off in ", argument ? "an argument" : "its JSON block"));
      }
      reader.Consume(argument ? kArgumentEnd : kJsonEnd);
      if (block || (!argument && !members.empty())) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": a JSON block and other arguments together"));
      }
      if (!argument) {
        DELTASERVE_ASSIGN_OR_RETURN(const ToolArguments parsed, ReadToolArguments(value, where));
        if (!parsed.is_object) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": its JSON block '", Snippet(value), "' is not a JSON object"));
        }
        block = std::string(value);
        continue;
      }
      const std::string* key = FindAttribute(attributes, "key");
      const std::string* type = FindAttribute(attributes, "type");
      if (key == nullptr || type == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": an argument tag without key=\"...\" and type=\"...\""));
      }
      const std::string argument_where = absl::StrCat(where, ": argument ", QuoteJson(*key));
      static constexpr std::string_view kTypes[] = {"string", "number", "boolean",
                                                    "null",   "object", "array"};
      if (std::find(std::begin(kTypes), std::end(kTypes), *type) == std::end(kTypes)) {
        return absl::InvalidArgumentError(
            absl::StrCat(argument_where, ": type ", QuoteJson(Snippet(*type)),
                         " is not one of string, number, boolean, null, object, array"));
      }
      if (std::any_of(members.begin(), members.end(),
                      [&](const auto& member) { return member.first == *key; })) {
        return absl::InvalidArgumentError(absl::StrCat(argument_where, ": given twice"));
      }
      std::string json_value;
      if (*type == "string") {
        json_value = QuoteJson(value);
      } else {
        DELTASERVE_ASSIGN_OR_RETURN(json_value, TypedJsonValue(value, *type, argument_where));
      }
      members.emplace_back(*key, std::move(json_value));
    }
    ChatToolCall call;
    call.name = *tool;
    if (block) {
      call.arguments = *block;
    } else {
      call.arguments = absl::StrCat("{",
                                    absl::StrJoin(members, ", ",
                                                  [](std::string* out, const auto& member) {
                                                    absl::StrAppend(out, QuoteJson(member.first),
                                                                    ": ", member.second);
                                                  }),
                                    "}");
    }
    calls->push_back(std::move(call));
  }
}

class KimiK3ChatFormat final : public ChatFormat {
 public:
  std::string name() const override { return "kimi_k3"; }

  absl::StatusOr<std::vector<ChatSegment>> Render(const ChatRequest& request) const override {
    return Renderer(request).Run();
  }

  // After the generation prompt: [reasoning <|close|>think<|sep|>]
  // [<|open|>response<|sep|>] content [<|close|>response<|sep|>] [tools]
  // [<|close|>message<|sep|>] [<|end_of_msg|>]; the openers the prompt
  // already wrote may be repeated, and text cut off in the reasoning or the
  // content is kept.
  absl::StatusOr<ChatReply> Parse(std::string_view generated, bool thinking) const override {
    TextReader reader(generated);
    ChatReply reply;
    reader.Consume(kAssistantStart);
    bool found = false;
    if (thinking) {
      reader.Consume(kThinkStart);
      reply.reasoning_content = std::string(reader.Until({kThinkEnd, kResponseStart}, &found));
      if (!found) return reply;
      reader.Consume(kThinkEnd);
    }
    reader.Consume(kResponseStart);
    reply.content =
        std::string(reader.Until({kResponseEnd, kToolsStart, kMessageEnd, kEndOfMsg}, &found));
    reader.Consume(kResponseEnd);
    if (reader.Consume(kToolsStart)) {
      DELTASERVE_RETURN_IF_ERROR(ReadToolCalls(reader, &reply.tool_calls));
    }
    reader.Consume(kMessageEnd);
    reader.Consume(kEndOfMsg);
    if (!reader.AtEnd()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Kimi K3 reply: unexpected text after the response: '", Snippet(reader.Rest()), "'"));
    }
    return reply;
  }

  std::vector<std::string> end_tokens() const override { return {std::string(kEndOfMsg)}; }
};

}  // namespace

std::unique_ptr<ChatFormat> NewKimiK3ChatFormat() { return std::make_unique<KimiK3ChatFormat>(); }

}  // namespace deltaserve::chat_internal
