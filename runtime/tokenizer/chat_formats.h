// Internals of the chat formats (chat_format.h), shared by chat_format.cc and
// the per-format files chat_kimi_k3.cc and chat_kimi_linear.cc: the
// factories, a segment builder, and JSON written byte for byte as Python's
// json.dumps writes it (the templates' `tojson`), behind a text-only
// interface so that no header carries nlohmann-json.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/tokenizer/chat_format.h"

namespace deltaserve::chat_internal {

std::unique_ptr<ChatFormat> NewKimiK3ChatFormat();
std::unique_ptr<ChatFormat> NewKimiLinearChatFormat();

// Appends segments, merging adjacent ordinary text (a rendering is tokenized
// as the template's string would be: text between two special tokens is one
// piece) and dropping empty text.
class SegmentBuilder {
 public:
  void Text(std::string_view text);
  void Special(std::string_view token);
  std::vector<ChatSegment> Take() { return std::move(segments_); }

 private:
  std::vector<ChatSegment> segments_;
};

// A cursor over generated text, for the formats' Parse.
class TextReader {
 public:
  explicit TextReader(std::string_view text) : text_(text) {}

  bool AtEnd() const { return pos_ == text_.size(); }
  std::string_view Rest() const { return text_.substr(pos_); }
  bool LookingAt(std::string_view literal) const {
    return Rest().substr(0, literal.size()) == literal;
  }
  bool Consume(std::string_view literal) {
    if (!LookingAt(literal)) return false;
    pos_ += literal.size();
    return true;
  }
  // The text up to the first of `stops`, or to the end (*found false); the
  // cursor moves to the stop, not past it.
  std::string_view Until(std::initializer_list<std::string_view> stops, bool* found) {
    size_t at = std::string_view::npos;
    for (const std::string_view stop : stops) at = std::min(at, text_.find(stop, pos_));
    *found = at != std::string_view::npos;
    if (!*found) at = text_.size();
    const std::string_view part = text_.substr(pos_, at - pos_);
    pos_ = at;
    return part;
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

// Debian's abseil has its own string_view, which absl::StrCat takes and
// std::string_view does not convert to.
inline absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

// Whether `text` is empty or all Python whitespace (str.isspace: ASCII
// whitespace, U+001C..U+001F, U+0085, U+00A0 and the Unicode spaces), as the
// templates' `trim` and the serving stack's `.strip()` see it.
bool IsPythonBlank(std::string_view text);

// How JSON is written. Keys keep the text's order unless sorted; a repeated
// key keeps its first place and its last value, as Python's json.loads does.
enum class JsonStyle {
  kPython,        // json.dumps(value, ensure_ascii=False): ", " and ": "
  kPythonSorted,  // the same after every object's keys are sorted (deep_sort_dict)
  // Kimi K3's json_sorted macro over deep-sorted input: "," and ":", keys
  // sorted as Jinja's dictsort sorts them (case-insensitively: ASCII letters
  // only), ties in byte order.
  kKimiK3Sorted,
};

// A string as JSON (json.dumps with ensure_ascii=False: quotes, backslash
// and control characters escaped, the rest as is).
std::string QuoteJson(std::string_view text);

// The OpenAI `tools` array in `style`; nullopt when it is empty (the
// templates write no declaration then). InvalidArgument "tools: ..." when it
// is not JSON or not an array.
absl::StatusOr<std::optional<std::string>> ToolsJson(std::string_view tools_json, JsonStyle style);

// One member of a tool call's arguments object, as Kimi K3 writes it.
struct JsonMember {
  std::string key;
  std::string type;   // "boolean", "null", "number", "string", "object", "array"
  std::string value;  // a string's own text; any other value as JSON (kPython)
};

// Tool-call arguments (JSON text) as the templates see them once the serving
// stack has run json.loads on them.
struct ToolArguments {
  bool is_json = false;             // else the text does not parse
  bool is_object = false;           // is_json and an object
  std::string python;               // is_json: the value as JSON (kPython)
  std::vector<JsonMember> members;  // is_object: in order
};
// InvalidArgument naming `what` only for text past the bounds on JSON (size,
// nesting); text that is not JSON is is_json = false.
absl::StatusOr<ToolArguments> ReadToolArguments(std::string_view text, const std::string& what);

// `text`, which must be JSON of `type` (one of JsonMember's), as JSON
// (kPython). InvalidArgument naming `what` otherwise.
absl::StatusOr<std::string> TypedJsonValue(std::string_view text, std::string_view type,
                                           const std::string& what);

// OK when `text` is JSON of at most `max_values` values (-1: any number);
// else InvalidArgument "<what>: not JSON: <the parser's words>" or naming the
// limit. Builds no tree.
absl::Status ScanJson(std::string_view text, int64_t max_values, const std::string& what);

// The text with Python whitespace removed from both ends.
std::string_view StripPythonSpace(std::string_view text);

// `text` cut to a few dozen characters (on a UTF-8 boundary) for a message.
std::string Snippet(std::string_view text);

}  // namespace deltaserve::chat_internal
