// Kimi Linear's chat format (that of Kimi K2 Instruct), as
// tests/data/chat/Kimi-K2-Instruct.jinja renders it:
//   <|im_system|>tool_declare<|im_middle|>[tools as JSON]<|im_end|>
//   <|im_system|>system<|im_middle|>You are Kimi, ...<|im_end|>\n  (when the
//                                         first message is not a system one)
//   <|im_user|>user<|im_middle|>...<|im_end|>
//   <|im_assistant|>assistant<|im_middle|>content<|tool_calls_section_begin|>
//   <|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{...}
//   <|tool_call_end|><|tool_calls_section_end|><|im_end|>
//   <|im_system|>tool<|im_middle|>## Return of functions.f:0\n...<|im_end|>
// The role line is the message's name when it has one. Call ids are the
// template's own, numbered across the conversation; tool results take them
// in order, whatever tool_call_id they carry. No reasoning channel: reasoning
// is not rendered, and the thinking switch is ignored.
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/tokenizer/chat_format.h"
#include "runtime/tokenizer/chat_formats.h"

namespace deltaserve::chat_internal {
namespace {

constexpr std::string_view kImSystem = "<|im_system|>";
constexpr std::string_view kImUser = "<|im_user|>";
constexpr std::string_view kImAssistant = "<|im_assistant|>";
constexpr std::string_view kImMiddle = "<|im_middle|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kSectionBegin = "<|tool_calls_section_begin|>";
constexpr std::string_view kSectionEnd = "<|tool_calls_section_end|>";
constexpr std::string_view kCallBegin = "<|tool_call_begin|>";
constexpr std::string_view kArgumentBegin = "<|tool_call_argument_begin|>";
constexpr std::string_view kCallEnd = "<|tool_call_end|>";

constexpr std::string_view kDefaultSystem = "You are Kimi, an AI assistant created by Moonshot AI.";
constexpr std::string_view kFunctionsPrefix = "functions.";

absl::StatusOr<std::vector<ChatSegment>> RenderLinear(const ChatRequest& request) {
  SegmentBuilder out;
  if (!request.tools_json.empty()) {
    DELTASERVE_ASSIGN_OR_RETURN(const std::optional<std::string> tools,
                                ToolsJson(request.tools_json, JsonStyle::kPythonSorted));
    if (tools) {
      out.Special(kImSystem);
      out.Text("tool_declare");
      out.Special(kImMiddle);
      out.Text(*tools);
      out.Special(kImEnd);
    }
  }
  std::deque<std::string> pending_ids;  // of calls not yet answered
  int64_t calls_so_far = 0;
  const std::vector<ChatMessage>& messages = request.messages;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (i == 0 && message.role != "system") {
      out.Special(kImSystem);
      out.Text("system");
      out.Special(kImMiddle);
      out.Text(kDefaultSystem);
      out.Special(kImEnd);
      out.Text("\n");  // the template's line break after its default
    }
    if (message.role == "user") {
      out.Special(kImUser);
    } else if (message.role == "assistant") {
      out.Special(kImAssistant);
    } else if (message.role == "system" || message.role == "tool") {
      out.Special(kImSystem);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".role: ", QuoteJson(Snippet(message.role)),
                       " is not one of system, user, assistant, tool"));
    }
    out.Text(message.name.empty() ? message.role : message.name);
    out.Special(kImMiddle);
    if (message.role == "assistant" && !message.tool_calls.empty()) {
      out.Text(message.content);
      out.Special(kSectionBegin);
      for (size_t k = 0; k < message.tool_calls.size(); ++k) {
        const ChatToolCall& call = message.tool_calls[k];
        const std::string field = absl::StrCat(where, ".tool_calls[", k, "].function");
        if (call.name.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ".name: required, a non-empty string"));
        }
        // As vLLM hands arguments to the template: "" is {}, the rest
        // json.loads, which the template writes back with tojson.
        std::string arguments = "{}";
        if (!call.arguments.empty()) {
          const std::string arguments_field = absl::StrCat(field, ".arguments");
          DELTASERVE_ASSIGN_OR_RETURN(const ToolArguments parsed,
                                      ReadToolArguments(call.arguments, arguments_field));
          if (!parsed.is_json) {
            return absl::InvalidArgumentError(
                absl::StrCat(arguments_field, ": '", Snippet(call.arguments), "' is not JSON"));
          }
          arguments = parsed.python;
        }
        std::string id = absl::StrCat(View(kFunctionsPrefix), call.name, ":", calls_so_far++);
        out.Special(kCallBegin);
        out.Text(id);
        out.Special(kArgumentBegin);
        out.Text(arguments);
        out.Special(kCallEnd);
        pending_ids.push_back(std::move(id));
      }
      out.Special(kSectionEnd);
    } else if (message.role == "tool") {
      std::string id;
      if (!pending_ids.empty()) {
        id = std::move(pending_ids.front());
        pending_ids.pop_front();
      } else {
        id = absl::StrCat(View(kFunctionsPrefix), message.name.empty() ? "unknown" : message.name,
                          ":", calls_so_far);
      }
      out.Text(absl::StrCat("## Return of ", id, "\n"));
      out.Text(message.content);
    } else {
      out.Text(message.content);
    }
    out.Special(kImEnd);
  }
  if (request.add_generation_prompt) {
    out.Special(kImAssistant);
    out.Text("assistant");
    out.Special(kImMiddle);
  }
  return out.Take();
}

// functions.<name>:<n> -> name (the prefix is optional, as models vary).
absl::StatusOr<std::string> CallName(std::string_view id, const std::string& where) {
  const size_t colon = id.rfind(':');
  const auto digits = colon == std::string_view::npos ? std::string_view() : id.substr(colon + 1);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": id '", Snippet(id), "' is not of the form functions.<name>:<number>"));
  }
  std::string_view name = id.substr(0, colon);
  if (name.substr(0, kFunctionsPrefix.size()) == kFunctionsPrefix) {
    name.remove_prefix(kFunctionsPrefix.size());
  }
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": id '", Snippet(id), "' names no function"));
  }
  return std::string(name);
}

// At <|tool_call_begin|>: the calls, through <|tool_calls_section_end|>, or
// when the section had no opener, through the end of the turn as well.
absl::Status ReadToolCalls(TextReader& reader, bool opened, std::vector<ChatToolCall>* calls) {
  for (size_t index = 1;; ++index) {
    if (reader.Consume(kSectionEnd)) return absl::OkStatus();
    if (!opened && (reader.AtEnd() || reader.LookingAt(kImEnd))) return absl::OkStatus();
    const std::string where = absl::StrCat("Kimi Linear reply: tool call ", index);
    if (reader.AtEnd()) {
      return absl::InvalidArgumentError(
          "Kimi Linear reply: cut off in the tool calls (no <|tool_calls_section_end|>)");
    }
    if (!reader.Consume(kCallBegin)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected <|tool_call_begin|> or <|tool_calls_section_end|>, got '",
                       Snippet(reader.Rest()), "'"));
    }
    bool found = false;
    const std::string_view id = reader.Until({kArgumentBegin, kCallEnd, kSectionEnd}, &found);
    if (!reader.Consume(kArgumentBegin)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": no <|tool_call_argument_begin|> after its id '", Snippet(id), "'"));
    }
    ChatToolCall call;
    call.id = std::string(StripPythonSpace(id));
    DELTASERVE_ASSIGN_OR_RETURN(call.name, CallName(call.id, where));
    const std::string arguments_where = absl::StrCat(where, " (", call.name, ")");
    const std::string_view arguments = reader.Until({kCallEnd}, &found);
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat(arguments_where, ": cut off (no <|tool_call_end|>)"));
    }
    reader.Consume(kCallEnd);
    call.arguments = std::string(StripPythonSpace(arguments));
    DELTASERVE_ASSIGN_OR_RETURN(const ToolArguments parsed,
                                ReadToolArguments(call.arguments, arguments_where));
    if (!parsed.is_object) {
      return absl::InvalidArgumentError(absl::StrCat(
          arguments_where, ": arguments '", Snippet(call.arguments), "' are not a JSON object"));
    }
    calls->push_back(std::move(call));
  }
}

class KimiLinearChatFormat final : public ChatFormat {
 public:
  std::string name() const override { return "kimi_linear"; }

  absl::StatusOr<std::vector<ChatSegment>> Render(const ChatRequest& request) const override {
    return RenderLinear(request);
  }

  // After the generation prompt: content, then optionally the tool calls
  // section (its opener may be missing before the first call), then
  // optionally <|im_end|>. The arguments are kept as the model wrote them.
  absl::StatusOr<ChatReply> Parse(std::string_view generated, bool /*thinking*/) const override {
    TextReader reader(generated);
    ChatReply reply;
    bool found = false;
    reply.content = std::string(reader.Until({kSectionBegin, kCallBegin, kImEnd}, &found));
    const bool opened = reader.Consume(kSectionBegin);
    if (opened || reader.LookingAt(kCallBegin)) {
      DELTASERVE_RETURN_IF_ERROR(ReadToolCalls(reader, opened, &reply.tool_calls));
    }
    reader.Consume(kImEnd);
    if (!reader.AtEnd()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Kimi Linear reply: unexpected text after the end of the turn: '",
                       Snippet(reader.Rest()), "'"));
    }
    return reply;
  }

  std::vector<std::string> end_tokens() const override { return {std::string(kImEnd)}; }
};

}  // namespace

std::unique_ptr<ChatFormat> NewKimiLinearChatFormat() {
  return std::make_unique<KimiLinearChatFormat>();
}

}  // namespace deltaserve::chat_internal
